"""What the planned device does with each precision: which matrix units run it, at what alignment.

Matrix units (NVIDIA Tensor Cores, Intel XMX, AMX) run a matmul or convolution at full efficiency only on
dimensions that are multiples of 16 bytes (NVIDIA's "Tensor Core Requirements"; XMX and AMX tiles are multiples
of it). Everything is read from the `Plan` and the support table it carries (``plan.assessment``,
`MatrixUnit`), so a plan built on fake hardware is checked as that hardware, wherever the check runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NATIVE, FUNCTIONAL, EMULATED = "native", "functional", "emulated"
REDUCED = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}


@dataclass(frozen=True)
class Target:
    """The planned device, as far as precision and shapes go: ``units`` maps a compute dtype to the matrix unit
    that runs it and the alignment it needs (none where absent); ``policy_level`` is how the hardware supports the
    plan's policy (``native``, ``functional``, ``emulated``), with ``policy_why``."""

    backend: str
    policy: str
    compute_dtype: str
    policy_level: str
    policy_why: str
    units: dict[str, tuple[str, int]] = field(default_factory=dict)
    fp8: bool = False
    graph_amp: str | None = None
    rejected: dict[str, str] = field(default_factory=dict)
    float32_layers: tuple[Any, ...] = ()  # the plan's Float32Layer entries: the layers it keeps in float32
    float32_layers_why: str = ""

    @property
    def mixed(self) -> bool:
        """Whether the Keras policy computes in float16/bfloat16 (not the backend's own graph rewrite)."""
        return self.compute_dtype != "float32"

    @property
    def effective_dtype(self) -> str:
        """The dtype matmuls run in: the policy's, or the graph rewrite's (``graph_amp``) for float32 ones."""
        return self.graph_amp or self.compute_dtype

    def unit_for(self, dtype: str, fp8_layer: bool = False) -> tuple[str, int] | None:
        """The matrix unit and alignment for an op computing in ``dtype`` (``fp8_layer``: a float8 layer); under a
        graph rewrite (``graph_amp``) float32 ops run in the rewrite's dtype."""
        if fp8_layer and "float8" in self.units:
            return self.units["float8"]
        if dtype == "float32" and self.graph_amp in self.units:
            return self.units[self.graph_amp]
        return self.units.get(dtype)

    def to_dict(self) -> dict[str, Any]:
        """The target as JSON-ready data (part of the check's ``plan``).

        Returns:
            The backend, the policy, its compute dtype and support, the graph rewrite, fp8, and the matrix units by
            compute dtype (``unit``, ``alignment``).
        """
        return {"backend": self.backend, "policy": self.policy, "compute_dtype": self.compute_dtype,
                "policy_support": self.policy_level, "graph_amp": self.graph_amp, "fp8": self.fp8,
                "matrix_units": {d: {"unit": u, "alignment": a} for d, (u, a) in self.units.items()}}


def fp8_enabled(plan: Any) -> bool:
    """Whether the plan trains eligible layers in float8 (``plan.fp8``; plans without the setting: no)."""
    value = getattr(plan, "fp8", None)
    value = getattr(value, "enabled", value)
    if isinstance(value, str):
        return value.strip().lower() not in ("", "off", "false", "no", "none", "0", "unsupported")
    return bool(value)


def policy_support(plan: Any, policy: str) -> tuple[str, str] | None:
    """(level, why) of ``policy`` on the plan's device, from the support table the plan carries."""
    assessment = getattr(plan, "assessment", None)
    if assessment is not None:
        support = assessment.policies.get(policy)
        if support is not None:
            return support.level, support.why
    if policy != plan.policy:
        return None
    # Without a support table, the plan records every setting it honoured below native, with its level.
    level = dict(getattr(plan, "honoured", {}) or {}).get("policy")
    why = next((w for w in plan.warnings if w.startswith(f"policy={policy} ")), plan.reasons.get("policy", ""))
    return (level, why) if level in (EMULATED, FUNCTIONAL) else (NATIVE, plan.reasons.get("policy", ""))


def matrix_units(plan: Any) -> dict[str, tuple[str, int]]:
    """The matrix units the plan's device runs each compute dtype on, as its backend assessed them: the float32
    one (TF32) only where the plan's ``tf32`` is on, the float8 one where its ``fp8`` is; none without a support
    table (a plan built by hand: shapes are then not judged)."""
    units = getattr(getattr(plan, "assessment", None), "matrix_units", None) or {}
    return {dtype: (unit.name, unit.alignment) for dtype, unit in units.items()
            if not (dtype == "float32" and not plan.tf32) and not (dtype == "float8" and not fp8_enabled(plan))}


def make_target(plan: Any, hardware: Any = None) -> Target:
    """The `Target` of ``plan``, from the support table it carries (``hardware``, which that table was made
    from, adds nothing)."""
    level, why = policy_support(plan, plan.policy) or (NATIVE, "")
    rejected = {r.value: r.why for r in getattr(plan, "rejected", ()) if getattr(r, "setting", None) == "policy"}
    graph_amp = getattr(plan, "graph_amp", None) or getattr(plan, "itex_amp", None)
    return Target(backend=plan.backend, policy=plan.policy, compute_dtype=REDUCED.get(plan.policy, "float32"),
                  policy_level=level, policy_why=why, units=matrix_units(plan), fp8=fp8_enabled(plan),
                  graph_amp=str(graph_amp).lower() if graph_amp else None, rejected=rejected,
                  float32_layers=tuple(getattr(plan, "float32_layers", ()) or ()),
                  float32_layers_why=str(getattr(plan, "reasons", {}).get("float32_layers", "")))
