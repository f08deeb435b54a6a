"""Contradictions between what ran and the plan, each as a warning with a stable ``code`` and its fix (pure functions).

The codes (``eigen-bfloat16``, ``float32-kernels``, ``reduced-precision-kernels``, ``emulated-kernels``) are
explained, with cause and fix, on the documentation's Troubleshooting page.
"""

from __future__ import annotations

from typing import Any

# A kind of kernel whose time is at least this share in float32 under a reduced-precision plan is reported
# (the float32 output layer alone is expected and stays below it on the models we measured).
FLOAT32_KIND_SHARE = 0.10
# ... and at least this share of all the compute time (a small float32 output layer is expected).
MIN_TOTAL_SHARE = 0.01
FAMILY = {"convolution": "convolution", "deconvolution": "convolution", "conv": "convolution",
          "inner_product": "matmul", "gemm_api": "matmul", "gemm": "matmul", "matmul": "matmul"}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def contradictions(audit: Any) -> list[dict[str, str]]:
    """The warnings for an `Audit` (its plan, compute entries and per-kind figures)."""
    plan = audit.plan
    want = plan.get("compute_dtype")
    out: list[dict[str, str]] = []
    if audit.outside_onednn and want == "bfloat16":
        out.append({"code": "eigen-bfloat16",
                    "what": f"the plan says bfloat16, but the matrix kernels {audit.outside_onednn}; "
                            "TensorFlow's own (Eigen) kernels have no fast bfloat16 path",
                    "fix": "unset TF_ENABLE_ONEDNN_OPTS=0 (or set it to 1), or plan float32 (--policy float32)"})
    if want in ("bfloat16", "float16", "float8"):
        total = sum(e.time_ms for e in audit.compute)
        for family in ("convolution", "matmul"):
            entries = [e for e in audit.compute if FAMILY.get(e.kind, e.kind) == family]
            family_time = sum(e.time_ms for e in entries)
            # float32 in a layer the layer plan keeps in float32 is as planned, never a contradiction
            f32 = [e for e in entries if e.dtype == "float32" and not audit.planned_float32(e.layers)]
            f32_time = sum(e.time_ms for e in f32)
            if not family_time or f32_time / family_time < FLOAT32_KIND_SHARE or f32_time / total < MIN_TOTAL_SHARE:
                continue
            layers = sorted({layer for e in f32 for layer in e.layers})
            where = f" (layers: {', '.join(layers)})" if layers else " (not matched to a layer)"
            out.append({"code": "float32-kernels",
                        "what": f"the plan says {want}; {_pct(f32_time / family_time)} of the {family} time ran in "
                                f"float32 kernels{where}",
                        "fix": "leave in float32 only the layers the layer plan keeps there (prepare_model: the output "
                               "layer, the plan's float32 layer kinds): the layers named are pinned to float32 "
                               "(dtype=\"float32\") or cast inside; `amp-backends check` names why"})
    if want == "float32":
        reduced = {d: s for d, s in audit.time_share_by_dtype().items() if d in ("bfloat16", "float16", "float8")}
        if reduced:
            d, s = max(reduced.items(), key=lambda kv: kv[1])
            out.append({"code": "reduced-precision-kernels",
                        "what": f"the plan says float32; {_pct(s)} of the compute time ran in {d} kernels",
                        "fix": "unset ONEDNN_DEFAULT_FPMATH_MODE (or other reduced-precision math modes) and build the "
                               "model after auto_configure(), so that no layer keeps a mixed policy"})
    emulated = sum(e.time_ms for e in audit.compute if e.emulated)
    total = sum(e.time_ms for e in audit.compute)
    if total and emulated / total >= 0.01:
        out.append({"code": "emulated-kernels",
                    "what": f"{_pct(emulated / total)} of the compute time ran reduced-precision kernels on an ISA "
                            "without instructions for them (emulated: slower than float32)",
                    "fix": "plan float32 on this CPU (--policy float32)"})
    return out


def outside_onednn_reason(doc: dict[str, Any], has_compute_records: bool) -> str | None:
    """Why no oneDNN matrix kernel was seen, or None when some were."""
    if has_compute_records:
        return None
    opts = str(doc.get("onednn_opts") or "").strip().lower()
    if opts in ("0", "false"):
        return "ran outside oneDNN (Eigen): TF_ENABLE_ONEDNN_OPTS=0 turns TensorFlow's oneDNN kernels off"
    low = (doc.get("plan") or {}).get("compute_dtype")
    if low == "bfloat16" and doc.get("cpu_avx512") is False:
        return ("ran outside oneDNN (Eigen): TensorFlow sends bfloat16 ops to oneDNN only on CPUs with AVX-512, and "
                "this CPU has none, so they ran in Eigen's emulated bfloat16 kernels"
                + (" although TF_ENABLE_ONEDNN_OPTS=1 is set" if opts in ("1", "true") else "")
                + "; plan float32 on this CPU (--policy float32, or drop the forced bfloat16 policy)")
    if opts in ("1", "true"):
        return ("ran outside oneDNN: no oneDNN matmul or convolution was executed although TF_ENABLE_ONEDNN_OPTS=1 "
                "is set (TensorFlow read it at import: was it set after the program started?)")
    if (doc.get("plan") or {}).get("xla"):
        return "ran outside oneDNN: XLA compiled the step (its CPU kernels are its own), so oneDNN reports nothing"
    return ("ran outside oneDNN (Eigen): no oneDNN matmul or convolution was executed; TensorFlow leaves oneDNN off "
            "by default on CPUs without AVX512-VNNI, AVX512-BF16, AVX-VNNI or AMX "
            "(TF_ENABLE_ONEDNN_OPTS=1 turns it on)")
