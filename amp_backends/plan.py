"""The plan: a pure decision from probe data and the user's request.

:func:`make_plan` picks the backend (the highest-priority one available, or the one asked for), asks it
to :meth:`~amp_backends.registry.Backend.assess` its hardware, and resolves each setting — dtype policy,
loss scaling, TF32, XLA, ITEX auto mixed precision — against that assessment and the request:

* ``auto``: the backend's first *native* choice;
* a request the hardware supports natively: honoured;
* *functional* (runs, little speed-up): honoured, with a warning;
* *emulated* (runs slower than float32) or *unsupported*: downgraded to the automatic choice with a
  warning that says why; honoured with ``force``; an error with ``strict``;
* *unsafe* (known to abort the process): always refused — downgraded, or an error with ``strict``.

No I/O happens here: tests pass fake :class:`~amp_backends.hardware.Hardware`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import UnsupportedRequestError
from .hardware import Hardware
from .options import POLICIES, LossScale, Request, format_value
from .registry import EMULATED, FUNCTIONAL, NATIVE, UNSAFE, UNSUPPORTED, Assessment, BackendRegistry, Support


@dataclass(frozen=True)
class Rejected:
    """An alternative that lost, and why."""

    setting: str
    value: str
    why: str


@dataclass(frozen=True)
class BackendStatus:
    name: str
    available: bool
    reason: str
    selected: bool


@dataclass(frozen=True)
class Plan:
    """The mixed-precision configuration chosen for this machine, with the reason for each choice.

    ``policy`` is the Keras dtype policy; ``loss_scale`` how the trainer scales losses; ``tf32`` whether
    float32 matmuls/convolutions may use TF32 (or ITEX's math mode); ``xla`` whether training steps are
    compiled with XLA (``jit_compile``). ``reasons`` explains each, ``rejected`` says why the
    alternatives lost, ``warnings`` lists every downgraded or risky request.
    """

    backend: str
    devices: tuple[str, ...]
    policy: str
    loss_scale: LossScale
    tf32: bool
    xla: bool
    itex_amp: str | None
    math_mode: str | None
    reasons: Mapping[str, str]
    rejected: tuple[Rejected, ...]
    warnings: tuple[str, ...]
    backends: tuple[BackendStatus, ...]
    request: Request = field(default_factory=Request, compare=False)
    notes: tuple[str, ...] = ()

    # -- convenience for training code ---------------------------------------------------------
    @property
    def compute_dtype(self) -> str:
        return {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}[self.policy]

    @property
    def variable_dtype(self) -> str:
        return "float32"

    @property
    def device(self) -> str:
        return self.devices[0] if self.devices else "/CPU:0"

    def compile_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``model.compile`` that follow the plan (``jit_compile``)."""
        return {"jit_compile": self.xla}

    # -- output --------------------------------------------------------------------------------
    def summary(self) -> str:
        """One line: what was chosen."""
        parts = [
            f"backend={self.backend}",
            f"devices={','.join(self.devices) or '-'}",
            f"policy={self.policy}",
            f"loss_scale={self.loss_scale.mode if self.loss_scale.mode != 'fixed' else self.loss_scale}",
            f"tf32={format_value(self.tf32)}",
            f"xla={format_value(self.xla)}",
        ]
        if self.itex_amp:
            parts.append(f"itex_amp={self.itex_amp}")
        if self.math_mode:
            parts.append(f"math_mode={self.math_mode}")
        return "amp_backends plan: " + " ".join(parts) + f" ({self.reasons.get('policy', '')})"

    def explain(self) -> str:
        """Several lines: each choice with its reason, the rejected alternatives, the warnings."""
        lines = [self.summary().split(" (", 1)[0]]
        for key, reason in self.reasons.items():
            lines.append(f"  {key}: {reason}")
        if self.rejected:
            lines.append("  rejected:")
            lines += [f"    {r.setting}={r.value}: {r.why}" for r in self.rejected]
        if self.warnings:
            lines.append("  warnings:")
            lines += [f"    {w}" for w in self.warnings]
        return "\n".join(lines)

    __str__ = explain

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "devices": list(self.devices),
            "policy": self.policy,
            "compute_dtype": self.compute_dtype,
            "loss_scale": self.loss_scale.to_dict(),
            "tf32": self.tf32,
            "xla": self.xla,
            "itex_amp": self.itex_amp,
            "math_mode": self.math_mode,
            "reasons": dict(self.reasons),
            "rejected": [r.__dict__ for r in self.rejected],
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "backends": [b.__dict__ for b in self.backends],
            "overrides": self.request.overrides(),
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)


class _Resolver:
    """Applies the downgrade / strict / force rules uniformly, collecting warnings."""

    def __init__(self, request: Request, backend: str) -> None:
        self.request = request
        self.backend = backend
        self.warnings: list[str] = []

    def check(self, setting: str, value: str, support: Support, fallback: str) -> bool:
        """True if ``value`` is honoured; otherwise a warning is recorded (or strict raises)."""
        source = self.request.sources.get(setting, "argument")
        asked = f"{setting}={value} (from {source})"
        if support.level == NATIVE:
            return True
        if support.level == FUNCTIONAL:
            self.warnings.append(f"{asked} honoured, but expect little or no speed-up: {support.why}")
            return True
        if support.level == EMULATED and self.request.force:
            self.warnings.append(f"{asked} honoured because force is on, although it is slow here: {support.why}")
            return True
        kind = "unsafe" if support.level == UNSAFE else "not supported" if support.level == UNSUPPORTED else "slow"
        fix = (
            "remove the override, or set force=True / AMP_FORCE=1 to run it anyway"
            if support.level == EMULATED
            else "remove the override"
        )
        if support.level == UNSAFE and self.request.force:
            fix += " (force cannot enable an unsafe setting)"
        if self.request.strict:
            raise UnsupportedRequestError(
                f"{asked} is {kind} on backend {self.backend!r}: {support.why}. "
                f"Expected a setting this hardware supports (the automatic choice is {setting}={fallback}). "
                f"Fix: {fix}, or turn strict off to downgrade with a warning."
            )
        self.warnings.append(f"{asked} is {kind} here and was downgraded to {setting}={fallback}: {support.why}")
        return False


def _choose_backend(
    hardware: Hardware, request: Request, registry: BackendRegistry
) -> tuple[str, list[BackendStatus], list[str]]:
    statuses: list[BackendStatus] = []
    available: list[str] = []
    for backend in registry:
        probe = hardware.get(backend.name)
        if probe is None:
            reason, ok = "not probed", False
        else:
            ok, reason = probe.available, probe.reason
            device_type = backend.tf_device_type
            if ok and device_type and hardware.tf_device_types is not None and device_type not in hardware.tf_device_types:
                ok = False
                reason = (
                    f"{reason}, but TensorFlow lists no {device_type} device (a CPU-only TensorFlow build, missing "
                    f"device libraries or a plugin that did not load): check `python -m amp_backends.info`"
                )
        if ok:
            available.append(backend.name)
        statuses.append(BackendStatus(backend.name, ok, reason, False))
    for name, err in registry.load_errors.items():
        statuses.append(BackendStatus(name, False, f"failed to load: {err}", False))
    if not available:
        raise RuntimeError(
            "No backend is available, not even the CPU: " + "; ".join(f"{s.name}: {s.reason}" for s in statuses)
        )

    warnings: list[str] = []
    chosen = available[0]
    if request.backend != "auto":
        if request.backend in available:
            chosen = request.backend
        else:
            why = next((s.reason for s in statuses if s.name == request.backend), "not registered")
            source = request.sources.get("backend", "argument")
            if request.strict:
                raise UnsupportedRequestError(
                    f"backend={request.backend} (from {source}) is not available: {why}. "
                    f"Available: {', '.join(available)}. Fix: choose one of those, or remove the override."
                )
            warnings.append(
                f"backend={request.backend} (from {source}) is not available ({why}); using {chosen} instead"
            )
    statuses = [BackendStatus(s.name, s.available, s.reason, s.name == chosen) for s in statuses]
    return chosen, statuses, warnings


def _resolve_switch(r: _Resolver, name: str, requested: bool | None, auto: bool, support: Support,
                    reasons: dict[str, str]) -> bool:
    """An on/off setting: the automatic value, or the request if the hardware honours it (off always can)."""
    value = auto
    if requested is not None and requested != auto:
        value = False if requested is False else r.check(name, "on", support, "off")
    state = "on" if value else "off"
    reasons[name] = (f"{state}: {support.why}" if requested is None
                     else f"{state} as requested ({r.request.sources.get(name, 'argument')}); {support.why}")
    return value


def make_plan(hardware: Hardware, request: Request, registry: BackendRegistry) -> Plan:
    """Decide the plan for ``hardware`` under ``request``. Pure: no TensorFlow, no I/O."""
    chosen, statuses, backend_warnings = _choose_backend(hardware, request, registry)
    backend = registry.get(chosen)
    probe = hardware.get(chosen)
    assert probe is not None
    a: Assessment = backend.assess(probe, hardware)
    missing = set(POLICIES) - set(a.policies)
    if missing:
        raise RuntimeError(f"Backend {chosen!r} assessed no support for {sorted(missing)}: a backend bug.")

    r = _Resolver(request, chosen)
    r.warnings.extend(backend_warnings)
    reasons: dict[str, str] = {}
    rejected: list[Rejected] = []

    # --- dtype policy -------------------------------------------------------------------------
    auto_policy = next(p for p in a.preference if a.policies[p].level == NATIVE)
    policy = auto_policy
    if request.policy != "auto" and request.policy != auto_policy:
        if r.check("policy", request.policy, a.policies[request.policy], auto_policy):
            policy = request.policy
    if policy == request.policy and request.policy != "auto":
        reasons["policy"] = f"requested ({request.sources.get('policy', 'argument')}); {a.policies[policy].why}"
    else:
        reasons["policy"] = a.policies[policy].why
    for p in a.preference:
        if p != policy:
            rejected.append(Rejected("policy", p, a.policies[p].why))

    # --- ITEX auto mixed precision (graph rewrite instead of a Keras policy) ------------------
    itex_amp: str | None = None
    if request.itex_amp and r.check("itex_amp", "on", a.itex_amp, "off"):
        if policy == "float32":
            # ITEX AMP needs a low-precision type to rewrite to: take the backend's best one.
            low = next((p for p in a.preference if p != "float32" and a.policies[p].level == NATIVE), None)
            target = low
        else:
            target = policy
        if target is None:
            r.warnings.append("itex_amp=on ignored: this device has no native float16 or bfloat16")
        else:
            itex_amp = "BFLOAT16" if target == "mixed_bfloat16" else "FLOAT16"
            reasons["itex_amp"] = (
                f"requested: ITEX rewrites the float32 graph to {itex_amp.lower()}; the Keras policy stays float32 "
                f"so the two do not cast twice. {a.itex_amp.why}"
            )
            policy = "float32"
            reasons["policy"] = "float32 for Keras: ITEX auto mixed precision does the casting (itex_amp=on)"
    effective = {"BFLOAT16": "mixed_bfloat16", "FLOAT16": "mixed_float16"}.get(itex_amp or "", policy)

    # --- loss scaling -------------------------------------------------------------------------
    if request.loss_scale is None:
        if effective == "mixed_float16":
            loss_scale = LossScale.dynamic()
            reasons["loss_scale"] = (
                "dynamic: float16 gradients underflow without scaling; dynamic scaling finds the largest safe "
                "scale and skips overflowing steps"
            )
            rejected.append(Rejected("loss_scale", "fixed", "a fixed scale can overflow (every step skipped) or underflow; "
                                     "dynamic adapts at no measurable cost in the trainer"))
        else:
            loss_scale = LossScale.none()
            reasons["loss_scale"] = (
                f"none: {'bfloat16 has float32' if effective == 'mixed_bfloat16' else 'float32 has its full'} exponent "
                "range, so gradients do not underflow"
            )
    else:
        loss_scale = request.loss_scale
        reasons["loss_scale"] = f"requested ({request.sources.get('loss_scale', 'argument')})"
        if loss_scale.mode == "none" and effective == "mixed_float16":
            r.warnings.append(
                "loss_scale=none with float16: small gradients may flush to zero and training may stall; "
                "use dynamic (the default) unless you know the gradients' range"
            )
        elif loss_scale.mode != "none" and effective != "mixed_float16":
            r.warnings.append(
                f"loss_scale={loss_scale.mode} with {effective}: not needed (no float16 underflow), honoured anyway"
            )

    # --- TF32 (or ITEX's FP32 math mode) ------------------------------------------------------
    tf32 = _resolve_switch(r, "tf32", request.tf32, a.tf32.level == NATIVE and a.tf32_default, a.tf32, reasons)
    math_mode = a.math_mode if tf32 else None

    # --- XLA ----------------------------------------------------------------------------------
    xla = _resolve_switch(r, "xla", request.xla, a.xla_default and a.xla.level == NATIVE, a.xla, reasons)

    return Plan(
        backend=chosen,
        devices=a.devices,
        policy=policy,
        loss_scale=loss_scale,
        tf32=tf32,
        xla=xla,
        itex_amp=itex_amp,
        math_mode=math_mode,
        reasons=reasons,
        rejected=tuple(rejected),
        warnings=tuple(r.warnings),
        backends=tuple(statuses),
        request=request,
        notes=a.notes,
    )
