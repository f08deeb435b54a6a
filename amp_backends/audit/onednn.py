"""oneDNN's verbose records (``ONEDNN_VERBOSE=1``): what each executed primitive was, in what dtype, on what ISA.

Every primitive oneDNN executes prints one line. The formats, all read here (checked against real output,
see ``tests/test_audit_onednn.py`` for the recorded lines and where each comes from):

- oneDNN >= 3.4 (TensorFlow 2.21 ships 3.7): ``onednn_verbose,v1,primitive,exec,cpu,convolution,
  brg_conv_fwd:avx512_core_bf16,forward_training,src:bf16::blocked:acdb::f0 wei:bf16:a:blocked:...
  dst:bf16::...,attr-scratchpad:user attr-post-ops:eltwise_relu,alg:convolution_direct,
  mb64_ic1oc32_ih28oh26kh3sh1dh0ph0_iw28ow26kw3sw1dw0pw0,0.247803`` (time in ms, last);
- oneDNN 3.1-3.3 (ITEX 2.15 ships 3.3): ``onednn_verbose,primitive,exec,cpu,...`` with ``src_f32::blocked...``;
- oneDNN 3.0 / DNNL 1.x-2.x: ``onednn_verbose,exec,cpu,...`` / ``dnnl_verbose,exec,cpu,...``;
- MKL-DNN 0.x: ``mkldnn_verbose,exec,convolution,jit:avx2,forward_training,fsrc:nChw8c ...,alg:...,mb1_...,1.1``
  (no engine field, and no data types: its records are kept with dtype ``unknown``).

A timestamp (``ONEDNN_VERBOSE_TIMESTAMP=1``) between the marker and ``primitive`` is skipped. Lines that
are not execution records (``info``, ``create``) are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

PREFIXES = ("onednn_verbose", "dnnl_verbose", "mkldnn_verbose")
# Primitives that do the matrix work (their time is "compute time"); the rest is memory-bound.
COMPUTE_KINDS = frozenset({"convolution", "deconvolution", "matmul", "inner_product", "gemm_api", "rnn", "gemm"})
REORDER_KINDS = frozenset({"reorder"})

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


@dataclass(frozen=True)
class Record:
    """One executed oneDNN primitive.

    ``kind``: ``convolution``, ``matmul``, ``inner_product``, ``gemm_api``, ``reorder``, ``pooling``...;
    ``implementation`` as oneDNN names it; ``isa`` the instruction set in it (``None``: not named, as in
    ``x64:gemm:jit``); ``prop``: ``forward_training``, ``backward_data``...; ``dtypes``: argument -> oneDNN
    data type (``src``, ``wei``, ``dst``...); ``problem`` oneDNN's shape descriptor; ``time_ms``.
    """

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
        return self.kind in COMPUTE_KINDS

    @property
    def is_reorder(self) -> bool:
        return self.kind in REORDER_KINDS

    @property
    def dtype(self) -> str:
        """The dtype the primitive computes in: ``bfloat16``, ``float32``, ``float16``, ``float8``, ``int8``...

        Read from the weights, else the source, else the destination; ``unknown`` when the record names
        none (MKL-DNN 0.x). float32 data under ``attr-fpmath:bf16`` (``ONEDNN_DEFAULT_FPMATH_MODE=BF16``)
        is computed in bfloat16, and says so.
        """
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
        """What executed it: ``AMX``, ``AVX512-BF16``, ``AVX512-FP16``, ``AVX512-VNNI``, ``AVX-512``, ``AVX2``...

        ``unknown`` when the implementation names no ISA (``x64:gemm:jit``, ``gemm_api``): never guessed.
        """
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
        dtype, isa = self.dtype, self.isa or ""
        if dtype == "bfloat16":
            return (bool(isa) and isa not in ("uni", "any")
                    and not any(s in isa for s in ("bf16", "amx", "fp16", "avx10")))
        if dtype == "float16":
            return bool(isa) and isa not in ("uni", "any") and not any(s in isa for s in ("fp16", "amx_fp16", "avx10"))
        return False

    def shape(self) -> dict[str, int]:
        """The problem descriptor's sizes: ``mb``, ``ic``, ``oc``, ``kh``, ``kw``... (convolution, inner
        product, pooling), or ``M``, ``K``, ``N`` (and ``batch``) for ``AxB:BxC`` matmuls."""
        return parse_problem(self.problem)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(dtype=self.dtype, unit=self.unit, on_matrix_unit=self.on_matrix_unit)
        return out


def parse_problem(problem: str) -> dict[str, int]:
    """``mb64_ic32oc64_ih26oh24kh3...`` -> ``{"mb": 64, "ic": 32, ...}``; ``64x9216:9216x128`` -> M, K, N."""
    problem = problem.strip()
    if re.fullmatch(r"[\dx:*]+", problem) and ":" in problem:
        tensors = [[int(d) for d in t.split("x") if d.isdigit()] for t in problem.split(":")]
        a, b = tensors[0], tensors[1]
        if len(a) >= 2 and len(b) >= 2:
            out = {"M": a[-2], "K": a[-1], "N": b[-1]}
            batch = 1
            for d in a[:-2]:
                batch *= d
            out["batch"] = batch
            return out
        return {}
    return {key: int(value) for key, value in re.findall(r"([a-z]+)(\d+)", problem)}


def _dtypes(descriptors: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for token in descriptors.split():
        m = _MD.match(token)
        if m and m.group("arg") not in found:
            found[m.group("arg")] = m.group("dt")
    return found


def parse_line(line: str) -> Record | None:
    """One verbose line -> a `Record`, or ``None`` for anything that is not an execution record."""
    line = line.strip()
    if not line.startswith(PREFIXES):
        return None
    fields = line.split(",")
    try:
        at = fields.index("exec")
    except ValueError:
        return None
    rest = fields[at + 1:]
    engine = "cpu"
    if rest and rest[0] in ("cpu", "gpu"):
        engine, rest = rest[0], rest[1:]
    if len(rest) < 5:
        return None
    try:
        time_ms = float(rest[-1])
    except ValueError:
        return None
    kind, implementation, prop, descriptors = rest[0], rest[1], rest[2], rest[3]
    middle = rest[4:-2]  # attributes and auxiliary (alg:...) fields; MKL-DNN 0.x has only the latter
    problem = rest[-2]
    isa_match = _ISA.search(implementation.split("+")[0])
    return Record(kind=kind, implementation=implementation, isa=isa_match.group(1) if isa_match else None,
                  prop=prop, dtypes=_dtypes(descriptors), attrs=" ".join(m.strip() for m in middle if m.strip()),
                  problem=problem, time_ms=time_ms, engine=engine)


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


def cpu_has_avx512() -> bool | None:
    """Whether this machine's CPU has AVX-512 (TensorFlow sends bfloat16 to oneDNN only there); None on Arm.

    Returns:
        True or False on x86, ``None`` where the question does not apply (Arm) or the CPU cannot be read.
    """
    from ..registry import default_registry

    try:
        cpu = default_registry().get("cpu").probe().cpu  # the CPU backend reads it, as the plan did
    except Exception:  # noqa: BLE001  # a fact for a message: never worth failing the audit
        return None
    if cpu is None:
        return None
    return None if cpu.is_arm else "avx512f" in cpu.flags
