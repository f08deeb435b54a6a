"""Contradictions between what ran and the plan, each as a warning with a stable ``code`` and its fix (pure functions).

The codes (a backend's own come with its reading: `KernelReading.warnings`) are explained on the Troubleshooting page.
"""

from __future__ import annotations

from typing import Any

from ..kernel_audit import CONVOLUTION, INNER_PRODUCT, MATMUL

# A kind of kernel is reported when at least this share of its time, and this share of all the compute time, ran in
# float32 under a reduced-precision plan (the float32 output layer alone stays below them on the models we measured).
FLOAT32_KIND_SHARE = 0.10
MIN_TOTAL_SHARE = 0.01
# The families a kernel's problem (`KernelRecord.problem`; an entry without one: its kind) groups it in.
FAMILY = {CONVOLUTION: "convolution", INNER_PRODUCT: "matmul", MATMUL: "matmul"}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def family(entry: Any) -> str:
    """The family of an entry's kernel: ``convolution``, ``matmul``, or its problem or kind otherwise.

    Args:
        entry: An `Entry`.

    Returns:
        The family.
    """
    problem = entry.problem or entry.kind
    return FAMILY.get(problem, problem)


def contradictions(audit: Any) -> list[dict[str, str]]:
    """The generic warnings for an `Audit` (its plan, compute entries and per-kind figures).

    Args:
        audit: The `Audit`.

    Returns:
        The warnings, each with ``code``, ``what`` and ``fix``.
    """
    want = audit.plan.get("compute_dtype")
    out: list[dict[str, str]] = []
    if want in ("bfloat16", "float16", "float8"):
        total = sum(e.time_ms for e in audit.compute)
        for kind in ("convolution", "matmul"):
            entries = [e for e in audit.compute if family(e) == kind]
            kind_time = sum(e.time_ms for e in entries)
            # float32 in a layer the layer plan keeps in float32 is as planned, never a contradiction
            f32 = [e for e in entries if e.dtype == "float32" and not audit.planned_float32(e.layers)]
            f32_time = sum(e.time_ms for e in f32)
            if not kind_time or f32_time / kind_time < FLOAT32_KIND_SHARE or f32_time / total < MIN_TOTAL_SHARE:
                continue
            layers = sorted({layer for e in f32 for layer in e.layers})
            where = f" (layers: {', '.join(layers)})" if layers else " (not matched to a layer)"
            out.append({"code": "float32-kernels",
                        "what": f"the plan says {want}; {_pct(f32_time / kind_time)} of the {kind} time ran in "
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
                        "fix": "unset the math libraries' reduced-precision modes for float32 (oneDNN's "
                               "ONEDNN_DEFAULT_FPMATH_MODE, TF32, ITEX's BF32) and build the model after "
                               "auto_configure(), so that no layer keeps a mixed policy"})
    emulated, total = sum(e.time_ms for e in audit.compute if e.emulated), sum(e.time_ms for e in audit.compute)
    if total and emulated / total >= 0.01:
        out.append({"code": "emulated-kernels",
                    "what": f"{_pct(emulated / total)} of the compute time ran reduced-precision kernels on an ISA "
                            "without instructions for them (emulated: slower than float32)",
                    "fix": "plan float32 here (--policy float32)"})
    return out
