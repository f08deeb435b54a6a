"""The CPU backend's kernel audit: oneDNN's verbose records (``ONEDNN_VERBOSE=1``): what each executed
primitive was, in what dtype, on what ISA, and what the audit says when matrix kernels ran outside oneDNN.

Every executed primitive prints one line, in one of the formats read here (recorded lines and their sources:
``tests/backends/cpu/test_audit_onednn.py``): oneDNN >= 3.4 ``onednn_verbose,v1,primitive,exec,cpu,...``
(``src:bf16::blocked...``), 3.1-3.3 ``onednn_verbose,primitive,exec,cpu,...`` (``src_f32::blocked...``), 3.0 /
DNNL ``onednn_verbose,exec,cpu,...`` / ``dnnl_verbose,exec,cpu,...``, and MKL-DNN 0.x ``mkldnn_verbose,exec,...``
(no engine, no dtypes: ``unknown``). A timestamp after the marker is skipped; non-execution lines are ignored.
Kernels outside oneDNN (Eigen, XLA) print nothing: the reading says so (`outside_onednn_reason`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from amp_backends.hardware import CpuInfo
from amp_backends.kernel_audit import (CONVOLUTION, INNER_PRODUCT, MATMUL, Capture, KernelAudit, KernelReading,
                                      KernelRecord)

PREFIXES = ("onednn_verbose", "dnnl_verbose", "mkldnn_verbose")
# Primitives that do the matrix work (their time is "compute time"); the rest is memory-bound.
COMPUTE_KINDS = frozenset({"convolution", "deconvolution", "matmul", "inner_product", "gemm_api", "rnn", "gemm"})
# What each matrix primitive's problem descriptor describes (`KernelRecord.problem`).
PROBLEMS = {"convolution": CONVOLUTION, "deconvolution": CONVOLUTION, "inner_product": INNER_PRODUCT,
            "matmul": MATMUL, "gemm_api": MATMUL, "gemm": MATMUL}

# oneDNN data types -> the names the report uses
DTYPES = {
    "f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64",
    "f8_e5m2": "float8", "f8_e4m3": "float8", "e8m0": "float8", "f4_e2m1": "float4", "f4_e3m0": "float4",
    "s8": "int8", "u8": "int8", "s4": "int4", "u4": "int4", "s32": "int32", "tf32": "tfloat32",
}
_DT = "|".join(sorted(DTYPES, key=len, reverse=True))
# "src:bf16::blocked..." (>= 3.4), "src_f32::blocked..." (1.x-3.3), "in:f32_oihw" (0.x reorder)
_MD = re.compile(rf"^(?P<arg>[a-z_]+?)[:_](?P<dt>{_DT}|undef)(?=[:_]|$)")
# ISA names oneDNN puts after the implementation (``brg_conv_fwd:avx512_core_bf16``)
_ISA = re.compile(r"(avx512_core_amx_fp16|avx512_core_amx|avx512_core_fp16|avx512_core_bf16|avx512_core_vnni|"
                  r"avx512_core|avx512_common|avx512_mic_4ops|avx512_mic|avx10_1_512_amx_fp16|avx10_1_512_amx|"
                  r"avx10_1_512|avx2_vnni_2|avx2_vnni|avx2|avx|sse41|sve_512|sve_256|sve_128|asimd|"
                  r"amx_fp16|amx_bf16|amx)")
# The ISA name parts that hold instructions for a reduced-precision dtype; without them it is emulated.
NATIVE_ISA = {"bfloat16": ("bf16", "amx", "fp16", "avx10"), "float16": ("fp16", "avx10")}


@dataclass(frozen=True)
class Record:
    """One executed oneDNN primitive: its ``kind`` (``convolution``, ``reorder``...), ``implementation`` and the
    ``isa`` named in it (``None``: none, as in ``x64:gemm:jit``), ``prop``, ``dtypes`` (argument -> oneDNN data
    type), ``problem`` (oneDNN's shape descriptor) and ``time_ms``."""

    kind: str
    implementation: str
    isa: str | None
    prop: str
    dtypes: dict[str, str]
    attrs: str
    problem: str
    time_ms: float
    engine: str = "cpu"

    @property
    def is_compute(self) -> bool:
        """Whether the primitive does matrix work (a kind of `COMPUTE_KINDS`), counted in the compute time."""
        return self.kind in COMPUTE_KINDS

    @property
    def is_reorder(self) -> bool:
        """Whether the primitive is a ``reorder``: a layout copy, counted apart."""
        return self.kind == "reorder"

    @property
    def dtype(self) -> str:
        """The dtype the primitive computes in, from the weights, else the source, else the destination
        (``unknown``: none named); float32 under ``attr-fpmath:bf16`` computes in bfloat16, and says so."""
        for arg in ("wei", "src", "data", "diff", "dst", "in"):
            raw = self.dtypes.get(arg)
            if raw and raw != "undef":
                dtype = DTYPES.get(raw, raw)
                if dtype == "float32" and self.is_compute:
                    fpmath = re.search(r"fpmath:(bf16|f16|tf32)", self.attrs)
                    if fpmath:
                        return DTYPES[fpmath.group(1)]
                return dtype
        return "unknown"

    @property
    def unit(self) -> str:
        """What executed it: ``AMX``, ``AVX512-BF16``, ``AVX-512``, ``AVX2``...; ``unknown`` (never guessed) where
        the implementation names no ISA."""
        isa = self.isa
        if isa is None or isa in ("uni", "any"):
            return "unknown"
        if "amx" in isa:
            return "AMX"
        dtype = self.dtype
        if "fp16" in isa:
            return "AVX512-FP16" if dtype == "float16" else "AVX-512"
        if "bf16" in isa:
            return "AVX512-BF16" if dtype == "bfloat16" else "AVX-512"
        if "vnni" in isa:
            return ("AVX2-VNNI" if isa.startswith("avx2") else "AVX512-VNNI") if dtype == "int8" else (
                "AVX2" if isa.startswith("avx2") else "AVX-512")
        if isa.startswith(("avx512", "avx10")):
            return "AVX-512"
        if isa.startswith("sve"):
            return "SVE"
        return {"avx2": "AVX2", "avx": "AVX", "sse41": "SSE4.1", "asimd": "NEON"}.get(isa, "unknown")

    @property
    def on_matrix_unit(self) -> bool:
        """True on AMX tiles, the only matrix unit of an x86 CPU (the AVX-512 BF16/FP16 dot products are vector)."""
        return self.unit == "AMX"

    @property
    def emulated(self) -> bool:
        """A reduced-precision primitive on an ISA without instructions for it (bf16 on plain AVX-512 or AVX2)."""
        native, isa = NATIVE_ISA.get(self.dtype), self.isa
        return bool(native and isa and isa not in ("uni", "any") and not any(s in isa for s in native))

    def shape(self) -> dict[str, int]:
        """The problem descriptor's sizes: ``mb``, ``ic``, ``oc``, ``kh``, ``kw``... (convolution, inner
        product, pooling), or ``M``, ``K``, ``N`` (and ``batch``) for ``AxB:BxC`` matmuls."""
        return parse_problem(self.problem)

    def kernel_record(self) -> KernelRecord:
        """The record as the audit counts it (`KernelRecord`), its problem's sizes kept for matching it to a layer."""
        return KernelRecord(kind=self.kind, dtype=self.dtype, unit=self.unit, time_ms=self.time_ms,
                            compute=self.is_compute, reorder=self.is_reorder, matrix_unit=self.on_matrix_unit,
                            emulated=self.emulated, problem=PROBLEMS.get(self.kind, ""), shape=self.shape())


def parse_problem(problem: str) -> dict[str, int]:
    """``mb64_ic32oc64_ih26oh24kh3...`` -> ``{"mb": 64, "ic": 32, ...}``; ``64x9216:9216x128`` -> M, K, N."""
    problem = problem.strip()
    if re.fullmatch(r"[\dx:*]+", problem) and ":" in problem:
        a, b = ([int(d) for d in t.split("x") if d.isdigit()] for t in problem.split(":")[:2])
        if len(a) < 2 or len(b) < 2:
            return {}
        return {"M": a[-2], "K": a[-1], "N": b[-1], "batch": math.prod(a[:-2])}
    return {key: int(value) for key, value in re.findall(r"([a-z]+)(\d+)", problem)}


def parse_line(line: str) -> Record | None:
    """One verbose line -> a `Record`, or ``None`` for anything that is not an execution record."""
    line = line.strip()
    if not line.startswith(PREFIXES):
        return None
    fields = line.split(",")
    if "exec" not in fields:
        return None
    rest = fields[fields.index("exec") + 1:]
    engine = "cpu"
    if rest and rest[0] in ("cpu", "gpu"):
        engine, rest = rest[0], rest[1:]
    if len(rest) < 5:
        return None
    try:
        time_ms = float(rest[-1])
    except ValueError:
        return None
    kind, implementation, prop, descriptors = rest[:4]
    middle, problem = rest[4:-2], rest[-2]  # middle: attributes and auxiliary (alg:...) fields; MKL-DNN 0.x: the latter
    isa_match = _ISA.search(implementation.split("+")[0])
    named = [m for m in map(_MD.match, descriptors.split()) if m]  # an argument named twice: its first dtype
    return Record(kind=kind, implementation=implementation, isa=isa_match.group(1) if isa_match else None,
                  prop=prop, dtypes={m["arg"]: m["dt"] for m in reversed(named)},
                  attrs=" ".join(m.strip() for m in middle if m.strip()), problem=problem, time_ms=time_ms,
                  engine=engine)


def parse(lines: Iterable[str]) -> list[Record]:
    """Every execution record among ``lines`` (other output mixed in is skipped)."""
    return [r for r in (parse_line(line) for line in lines) if r is not None]


def library_version(lines: Iterable[str]) -> str | None:
    """``oneDNN v3.7.3`` from the ``info`` header, if printed."""
    for line in lines:
        m = re.search(r"(oneDNN|DNNL|MKL-DNN|Intel MKL-DNN) v(\d[\w.]*)", line)
        if m and line.startswith(PREFIXES):
            return f"{m.group(1)} v{m.group(2)}"
    return None


def outside_onednn_reason(facts: Mapping[str, Any], plan: Mapping[str, Any], has_compute_records: bool) -> str | None:
    """Why no oneDNN matrix kernel was seen (``None``: ``has_compute_records``, some were), from what the audited
    process recorded (`CpuKernelAudit.facts`) and the plan it ran under, as data (``compute_dtype``, ``xla``)."""
    if has_compute_records:
        return None
    opts = str(facts.get("onednn_opts") or "").strip().lower()
    if opts in ("0", "false"):
        return "ran outside oneDNN (Eigen): TF_ENABLE_ONEDNN_OPTS=0 turns TensorFlow's oneDNN kernels off"
    low = plan.get("compute_dtype")
    if low == "bfloat16" and facts.get("cpu_avx512") is False:
        return ("ran outside oneDNN (Eigen): TensorFlow sends bfloat16 ops to oneDNN only on CPUs with AVX-512, and "
                "this CPU has none, so they ran in Eigen's emulated bfloat16 kernels"
                + (" although TF_ENABLE_ONEDNN_OPTS=1 is set" if opts in ("1", "true") else "")
                + "; plan float32 on this CPU (--policy float32, or drop the forced bfloat16 policy)")
    if opts in ("1", "true"):
        return ("ran outside oneDNN: no oneDNN matmul or convolution was executed although TF_ENABLE_ONEDNN_OPTS=1 "
                "is set (TensorFlow read it at import: was it set after the program started?)")
    if plan.get("xla"):
        return "ran outside oneDNN: XLA compiled the step (its CPU kernels are its own), so oneDNN reports nothing"
    return ("ran outside oneDNN (Eigen): no oneDNN matmul or convolution was executed; TensorFlow leaves oneDNN off "
            "by default on CPUs without AVX512-VNNI, AVX512-BF16, AVX-VNNI or AMX "
            "(TF_ENABLE_ONEDNN_OPTS=1 turns it on)")


class CpuKernelAudit(KernelAudit):
    """oneDNN's verbose records: the child starts with ``ONEDNN_VERBOSE=1``; the trainer's observer keeps the
    ``onednn_verbose`` lines of its window.

    Args:
        read_cpu: The CPU probe, for the facts the reading needs (whether the CPU has AVX-512).
    """

    device = "cpu"
    environment = (("ONEDNN_VERBOSE", "1"),)
    record_prefix = "onednn_verbose"
    records_name = "oneDNN's verbose records"

    def __init__(self, read_cpu: Callable[[], CpuInfo]) -> None:
        self.read_cpu = read_cpu

    def capturing(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether oneDNN prints its records in a process started with ``environ``.

        Args:
            environ: The process's environment (default: this one's).

        Returns:
            True where ``ONEDNN_VERBOSE`` or ``DNNL_VERBOSE`` is set to anything but 0.
        """
        env = os.environ if environ is None else environ
        return any(env.get(name, "0").strip().lower() not in ("", "0", "none")
                   for name in ("ONEDNN_VERBOSE", "DNNL_VERBOSE"))

    def facts(self) -> dict[str, Any]:
        """``TF_ENABLE_ONEDNN_OPTS`` at the start, and whether the CPU has AVX-512 (TensorFlow sends bfloat16 to
        oneDNN only there; ``None`` on Arm or where the CPU cannot be read).

        Returns:
            ``{"onednn_opts": ..., "cpu_avx512": ...}``.
        """
        try:
            cpu = self.read_cpu()
            avx512 = None if cpu.is_arm else "avx512f" in cpu.flags
        except Exception:  # noqa: BLE001  # a fact for a message: never worth failing the audit
            avx512 = None
        return {"onednn_opts": os.environ.get("TF_ENABLE_ONEDNN_OPTS"), "cpu_avx512": avx512}

    def read(self, capture: Capture) -> KernelReading:
        """The measured steps' verbose records (``capture.lines``; oneDNN's version banner may be in
        ``capture.header``), read under the run's document (its ``plan``, ``steps`` and ``facts``).

        Args:
            capture: The run's standard output and document.

        Returns:
            The records and what the CPU backend says of them.
        """
        lines, doc = capture.lines, capture.doc
        records = [r.kernel_record() for r in parse(lines)]
        plan = doc.get("plan") or {}
        # Eigen's float32 contractions call oneDNN's sgemm (``gemm_api``) even with TensorFlow's oneDNN ops off:
        # only a oneDNN convolution/matmul/inner-product primitive shows that TensorFlow's matrix ops ran in oneDNN.
        has_compute = any(r.compute and r.kind != "gemm_api" for r in records)
        eigen_sgemm = 0.0
        if not has_compute:
            eigen_sgemm = sum(r.time_ms for r in records if r.compute)
            records = [replace(r, compute=False) for r in records]
        version = library_version(capture.header) or library_version(lines)
        outside = outside_onednn_reason(doc.get("facts") or {}, plan, has_compute)
        notes = []
        if outside:
            notes.append("kernels outside oneDNN are not visible to the audit: their dtypes are not reported "
                         "(never guessed)")
            if eigen_sgemm:
                notes.append(f"{eigen_sgemm:.1f} ms of oneDNN sgemm calls (gemm_api, float32) were seen: Eigen's "
                             "float32 contractions use it; they are not counted as compute time")
        elif records:
            total = sum(r.time_ms for r in records) / max(doc.get("steps") or 1, 1)
            notes.append(f"oneDNN's own times sum to {total:.1f} ms per step; TensorFlow runs independent ops "
                         "side by side, so this may exceed the step time")
        warnings = ({"code": "eigen-bfloat16",
                     "what": f"the plan says bfloat16, but the matrix kernels {outside}; "
                             "TensorFlow's own (Eigen) kernels have no fast bfloat16 path",
                     "fix": "unset TF_ENABLE_ONEDNN_OPTS=0 (or set it to 1), or plan float32 (--policy float32)"},
                    ) if outside and plan.get("compute_dtype") == "bfloat16" else ()
        return KernelReading(device="cpu", records=tuple(records), source=f"{version or 'oneDNN'} verbose "
                             f"({len(records)} records)", not_visible=outside, notes=tuple(notes), warnings=warnings)
