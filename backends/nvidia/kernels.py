"""The NVIDIA backend's kernel audit: GPU kernels by name (library, dtype, Tensor Cores or not, Volta to
Blackwell), read from TensorFlow's profiler traces.

xprof's own test (``IsKernelUsingTensorCore``: ``884``/``1688``/``xmma``/``hmma``, 16-bit only for fp16 names)
misses Ampere's ``s16816``, Hopper's ``nvjet`` and every bfloat16 kernel, so the names are read here (recorded
examples, with their sources, in ``tests/data/nvidia_kernels.json``): cuBLAS/cuDNN SASS
(``ampere_bf16_s16816gemm_bf16_...``: an MMA shape means Tensor Cores, ``sgemm``/``scudnn`` float32), xmma
(``sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_...``), cuBLAS >= 12.8 ``nvjet_`` (``h`` float16, ``t`` bfloat16,
``s`` float32), CUTLASS, cuDNN's CUDA-core convolutions, and XLA fusions, whose dtype only their attached HLO
says. Anything else is ``other``; a matrix kernel whose name does not say its dtype is ``unknown``, never guessed.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from amp_backends.backend_api import AmpConfigError
from amp_backends.kernel_audit import CONVOLUTION, MATMUL, Capture, KernelAudit, KernelReading, KernelRecord

_DT = {"h": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
       "t": "bfloat16", "bf16": "bfloat16",
       "s": "float32", "f32": "float32", "fp32": "float32", "sgemm": "float32",
       "tf32": "tfloat32", "e4m3": "float8", "e5m2": "float8", "fp8": "float8",
       "i": "int8", "int8": "int8", "s8": "int8", "u8": "int8", "i8": "int8",
       "d": "float64", "f64": "float64", "c": "complex64", "z": "complex128"}
_MMA_SHAPES = ("884", "1688", "16816", "8816", "16832", "1684", "16864", "88128", "8832")
_ARCH = r"(?:maxwell|pascal|volta|turing|ampere|ada|hopper|blackwell|sm\d+a?)"
_LEGACY = re.compile(
    rf"^{_ARCH}_(?:(?P<dt>fp16|bf16|int8|tf32|fp32)_)?(?P<acc>[a-z]{{0,2}}?)(?P<mma>\d+)?(?P<op>gemm|cudnn)"
    r"(?:_(?P<dt2>fp16|bf16|int8|tf32|fp32))?")
_XMMA = re.compile(
    r"\bsm\d+a?_xmma_(?P<op>gemm|fprop|dgrad|wgrad|conv)\w*?_"
    r"(?P<a>bf16|f16|tf32|f32|e4m3|e5m2|s8|i8|f64)(?P<b>bf16|f16|tf32|f32|e4m3|e5m2|s8|i8|f64)_(?P<rest>[a-z0-9]+)")
_NVJET = re.compile(r"^nvjet_(?:sm\d+_)?(?P<a>[a-z])(?P<c>[a-z])(?P<d>[a-z])_")
_CUTLASS = re.compile(
    r"cutlass_(?:\d+_)?(?P<cls>tensorop|simt|wmma_tensorop)_(?:(?P<dt>bf16|f16|tf32|f32|s8|u8|i8|f64|e4m3|e5m2)_)?"
    r"(?P<acc>[a-z]*?)(?P<mma>\d+)?(?P<extra>tf32|bf16|f16)?gemm(?:_[a-z]+)*?(?:_(?P<dt2>bf16|f16|s8|u8|f32|tf32))?_")
_XLA_FUSION = re.compile(
    r"^(?:%?)(?:(?:loop|input|output)_)?(?:[a-z_]+_)?fusion(?:[._]\d+)*$"
    r"|^(?:gemm_fusion_dot|triton_gemm|triton_softmax|triton_)[\w.]*$"
    r"|^(?:fusion|wrapped_)[\w.]*$")
_HLO_TYPE = re.compile(r"=\s*\(?(?P<t>bf16|f16|f32|f64|f8e4m3fn|f8e5m2|f8e4m3|s8|u8|s32|pred)\[")
_HLO_OPERAND = re.compile(r" (?:dot|convolution)\(\s*(?P<t>bf16|f16|f32|f64|f8e4m3fn|f8e5m2|f8e4m3|s8|u8)\[")


@dataclass(frozen=True)
class KernelClass:
    """What a GPU kernel's name (or its HLO) says: ``kind`` ``gemm``/``conv``/``fusion``/``other``;
    ``library``; ``dtype`` of the inputs (``unknown`` when not said); ``tensor_core`` True/False/None
    (None: the name does not say)."""

    name: str
    kind: str
    library: str
    dtype: str
    tensor_core: bool | None

    @property
    def is_compute(self) -> bool:
        """Whether the kernel does matrix work: a ``gemm`` or a ``conv``."""
        return self.kind in ("gemm", "conv")


def _tc_from_dtype(dtype: str) -> bool | None:
    return True if dtype in ("float16", "bfloat16", "tfloat32", "float8", "int8") else None


def _classify_hlo(name: str, hlo: str) -> KernelClass:
    compute = any(s in hlo for s in (" dot(", " convolution(", "__cublas$gemm", "__cudnn$conv", "__cublas$lt"))
    kind = ("conv" if " convolution(" in hlo or "__cudnn$conv" in hlo else "gemm") if compute else "other"
    # the dtype a dot or convolution reads (its first operand's), else the first result type (the fusion's output)
    m = (_HLO_OPERAND.search(hlo) if compute else None) or _HLO_TYPE.search(hlo)
    t = m.group("t") if m else ""
    dtype = _DT.get(t, "float8" if t.startswith("f8") else "unknown")
    return KernelClass(name, kind, "XLA", dtype, _tc_from_dtype(dtype) if compute else False)


def classify(name: str, hlo: str | None = None) -> KernelClass:
    """Classify one kernel name; ``hlo``: the HLO text the trace gives for it, used for XLA fusions."""
    short = name.strip()
    if inner := re.search(r"<\s*(cutlass_\w+)", short):  # "void cutlass::Kernel2<cutlass_80_tensorop_...>(...)"
        short = inner.group(1) + "_"
    if m := _NVJET.match(short):
        dtype = _DT.get(m.group("a"), "unknown")
        return KernelClass(name, "gemm", "cuBLAS", dtype, True if dtype in ("float16", "bfloat16") else None)
    if m := _XMMA.search(short):
        a = m.group("a")
        dtype = "tfloat32" if a == "f32" and "tf32" in m.group("rest") else _DT.get(a, "unknown")
        tc = True if "tensor16x8" in short else _tc_from_dtype(dtype)
        kind = "gemm" if m.group("op") == "gemm" else "conv"
        return KernelClass(name, kind, "cuDNN" if kind == "conv" or "cudnn" in short else "cuBLAS", dtype, tc)
    if m := _CUTLASS.search(short):
        dt = m.group("dt") or m.group("extra") or m.group("dt2")
        dtype = _DT.get(dt, "unknown") if dt else {"h": "float16", "i": "int8"}.get(m.group("acc"), "unknown")
        return KernelClass(name, "gemm", "CUTLASS", dtype, m.group("cls") != "simt")
    if m := _LEGACY.match(short):
        mma, acc = m.group("mma"), m.group("acc")
        dt = m.group("dt") or m.group("dt2")
        if dt:
            dtype = _DT[dt]
        elif mma:
            dtype = {"h": "float16", "i": "int8", "t": "bfloat16"}.get(acc, "unknown")
        else:  # CUDA cores, named by the accumulator: sgemm, dgemm, hgemm, cgemm, zgemm, gcgemm
            dtype = {"s": "float32", "d": "float64", "h": "float16", "c": "complex64", "z": "complex128",
                     "gc": "complex64"}.get(acc, "unknown")
        kind = "conv" if m.group("op") == "cudnn" else "gemm"
        return KernelClass(name, kind, "cuDNN" if kind == "conv" else "cuBLAS", dtype, bool(mma and mma in _MMA_SHAPES))
    if "implicit_convolve" in short or "explicit_convolve" in short:
        dtype = "float32" if "sgemm" in short else ("float16" if "hhgemm" in short else "unknown")
        return KernelClass(name, "conv", "cuDNN", dtype, False if dtype != "unknown" else None)
    if _XLA_FUSION.match(short):
        return _classify_hlo(name, hlo) if hlo else KernelClass(name, "fusion", "XLA", "unknown", None)
    if re.search(r"gemm|gemv|conv|wgrad|dgrad|fprop|matmul", short, re.IGNORECASE):
        return KernelClass(name, "gemm", "unknown", "unknown", None)
    return KernelClass(name, "other", "other", "unknown", False)


# -- traces ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelEvent:
    """One GPU kernel of a trace: its name, duration (microseconds) and the HLO/op the trace attaches."""

    name: str
    duration_us: float
    hlo: str | None = None
    op: str | None = None


def _gpu_pids(events: list[dict[str, Any]]) -> set[Any] | None:
    names = {e.get("pid"): str(e.get("args", {}).get("name", "")) for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    gpu = {pid for pid, n in names.items() if "GPU" in n.upper() and "HOST" not in n.upper()}
    return gpu if names else None


def events_from_trace_json(doc: dict[str, Any]) -> list[KernelEvent]:
    """The GPU kernels of a Chrome trace-events document (``traceEvents``), as TensorFlow's profiler writes it."""
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    gpu = _gpu_pids(events)
    out = []
    for e in events:
        if e.get("ph") != "X" or (gpu is not None and e.get("pid") not in gpu):
            continue
        args = e.get("args", {}) or {}
        hlo = args.get("hlo_text") or args.get("long_name")
        op = args.get("tf_op") or args.get("hlo_op")
        out.append(KernelEvent(str(e.get("name", "")), float(e.get("dur", 0.0)), hlo, op))
    return out


def read_trace(path: str | os.PathLike[str]) -> list[KernelEvent]:
    """The GPU kernels of a TensorFlow profiler run: a ``*.trace.json.gz``/``*.json`` file, an ``*.xplane.pb``
    (converted with ``tensorboard_plugin_profile``/``xprof`` when installed), or a log directory holding one.

    Raises:
        ValueError: Nothing readable is there (the message says what was found and how to fix it).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        found = [os.path.join(d, f) for d, _, files in os.walk(path) for f in files
                 if f.endswith((".trace.json.gz", ".trace.json", ".xplane.pb"))]
        if not found:
            raise AmpConfigError(f"expected a TensorFlow profiler log directory holding *.trace.json.gz or "
                                 f"*.xplane.pb files, but {path!r} has none. "
                                 "Fix: give the logdir passed to tf.profiler.experimental.start")
        found.sort(key=lambda f: (not f.endswith((".json.gz", ".json")), -os.path.getmtime(f)))
        path = found[0]
    if path.endswith(".xplane.pb"):
        return _read_xplane(path)
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return events_from_trace_json(json.load(f))
    except (OSError, json.JSONDecodeError) as exc:
        raise AmpConfigError(
            f"expected a trace-events JSON file (gzip or plain), but reading {path!r} failed: {exc}") from exc


def events_from_xspace(space: Any) -> list[KernelEvent]:
    """The GPU kernels of an ``XSpace`` (TensorFlow's profiler protobuf): the events on the ``Stream #`` lines of
    the ``/device:GPU:N`` planes, with their ``hlo_op``/``tf_op`` and HLO text (``long_name``, ``hlo_text``) stats."""
    out = []
    for plane in space.planes:
        if not plane.name.startswith("/device:GPU:"):
            continue
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            if not (line.name or line.display_name).startswith("Stream"):
                continue
            for ev in line.events:
                meta = plane.event_metadata.get(ev.metadata_id)
                stats = {stat_names.get(s.metadata_id, ""): _stat_value(s, stat_names)
                         for s in [*(meta.stats if meta else ()), *ev.stats]}
                out.append(KernelEvent(meta.name if meta else "", ev.duration_ps / 1e6,
                                       stats.get("hlo_text") or stats.get("long_name") or None,
                                       stats.get("tf_op") or stats.get("hlo_op") or None))
    return out


def _stat_value(stat: Any, names: dict[int, str]) -> str:
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return names.get(stat.ref_value, "")
    return str(getattr(stat, kind)) if kind else ""


def _read_xplane(path: str) -> list[KernelEvent]:
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2  # TensorFlow ships the XSpace protobuf
    except ImportError:
        return events_from_trace_json(_xplane_to_trace(path))
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return events_from_xspace(space)


def _xplane_to_trace(path: str) -> dict[str, Any]:
    for module in ("xprof.convert.raw_to_tool_data", "tensorboard_plugin_profile.convert.raw_to_tool_data"):
        try:
            convert = __import__(module, fromlist=["xspace_to_tool_data"])
        except ImportError:
            continue
        data, _ = convert.xspace_to_tool_data([path], "trace_viewer@^", {})
        return json.loads(data if isinstance(data, str) else data.decode("utf-8"))
    raise AmpConfigError(f"{path!r} is an XPlane protobuf; reading it needs the profiler plugin. Fix: pip install "
                         "tensorboard-plugin-profile (or xprof), or give a *.trace.json.gz file")


# -- the kernel audit --------------------------------------------------------------------------------------
PROBLEMS = {"gemm": MATMUL, "conv": CONVOLUTION}
LAYER_NOTE = ("GPU kernels are matched to layers by their TensorFlow op's name scopes where the trace gives one; XLA "
              "fusions without HLO in the trace are unknown")
NO_GPU = ("not measured: TensorFlow listed no GPU in the audit's process, so no GPU kernel was traced (the model ran "
          "on the CPU)")


def reading(events: Iterable[KernelEvent]) -> KernelReading:
    """The reading of a trace's GPU kernels: one `KernelRecord` a kernel, with its TensorFlow op for matching it to a
    layer (a fusion without HLO may hold a dot: compute, dtype unknown), and the note on that matching."""
    records = []
    for event in events:
        k = classify(event.name, event.hlo)
        unit = "Tensor Cores" if k.tensor_core else ("CUDA cores" if k.tensor_core is False else "unknown")
        records.append(KernelRecord(kind=k.kind, dtype=k.dtype, unit=unit, time_ms=event.duration_us / 1000.0,
                                    compute=k.is_compute or k.kind == "fusion", matrix_unit=k.tensor_core,
                                    problem=PROBLEMS.get(k.kind, ""), op=event.op))
    return KernelReading(device="nvidia", records=tuple(records), source="TensorFlow profiler trace",
                         notes=(LAYER_NOTE,))


class NvidiaKernelAudit(KernelAudit):
    """The measured steps traced with TensorFlow's profiler into the work folder; their GPU kernels classified by
    name."""

    device = "nvidia"
    reads_traces = True

    def __init__(self) -> None:
        self.tracing = False

    def begin(self, workdir: str) -> None:
        """Start TensorFlow's profiler into ``workdir`` where TensorFlow lists a GPU.

        Args:
            workdir: The folder the trace goes to.
        """
        import tensorflow as tf

        self.tracing = bool(tf.config.list_logical_devices("GPU"))
        if self.tracing:
            tf.profiler.experimental.start(workdir)

    def end(self) -> None:
        """Stop the profiler (it writes the trace)."""
        if self.tracing:
            import tensorflow as tf

            tf.profiler.experimental.stop()

    def facts(self) -> dict[str, Any]:
        """Whether the measured steps were traced on a GPU.

        Returns:
            ``{"gpu": ...}``.
        """
        return {"gpu": self.tracing}

    def read(self, capture: Capture) -> KernelReading:
        """The GPU kernels of the trace in the work folder.

        Args:
            capture: The run's document and work folder.

        Returns:
            The kernels, or a reading that says none was traced (no GPU).

        Raises:
            ValueError: The work folder holds no trace TensorFlow's profiler wrote, or one it cannot read.
        """
        if not (capture.doc.get("facts") or {}).get("gpu") or not capture.workdir:
            return KernelReading(device="nvidia", measured=False, notes=(NO_GPU,))
        return reading(read_trace(capture.workdir))

    def read_trace(self, path: str | os.PathLike[str]) -> KernelReading:
        """The GPU kernels of a trace recorded elsewhere (`read_trace`).

        Args:
            path: A ``*.trace.json.gz``, a ``*.xplane.pb``, or the logdir that holds one.

        Returns:
            The kernels.

        Raises:
            ValueError: ``path`` holds no trace TensorFlow's profiler wrote, or one it cannot read.
        """
        return reading(read_trace(path))
