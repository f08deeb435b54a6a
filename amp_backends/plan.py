"""The `Plan`: the mixed-precision configuration chosen for a machine, with its reasons.

`make_plan` decides it; `auto_configure` applies it. Each setting is a `Decision`: its value, a short reason,
the whole reason and the measurements it rests on (`Evidence`). A plan is frozen data that carries the support
table it was decided from (`Plan.assessment`), so no tool assesses again; what it does to a model is
`amp_backends.prepare_model`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .assessment import Assessment, Float32Layer, Support, VendorSetting, first_clause
from .evidence import Evidence
from .override_sources import format_value
from .request import LossScale, Request, parse_policy
from .errors import AmpConfigError

COMPUTE_DTYPES = {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}
WIDTH = 120  # the longest line str(plan) prints
WHERE_THE_EVIDENCE_IS = "  the reasons in full, with their measurements: plan.explain(), or amp-backends info --why"


@dataclass(frozen=True)
class Decision:
    """One setting of the plan and why.

    Attributes:
        setting: The setting (``"policy"``, ``"loss_scale"``, ``"xla"``...).
        value: Its value, as text (``"mixed_bfloat16"``).
        reason: The reason in a few words.
        detail: The whole reason, with the figures it quotes.
        evidence: The measurements those figures come from (committed results, with their machine).
    """

    setting: str
    value: str
    reason: str
    detail: str
    evidence: tuple[Evidence, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The Decision as JSON-ready data."""
        return {"setting": self.setting, "value": self.value, "reason": self.reason, "detail": self.detail,
                "evidence": [e.to_dict() for e in self.evidence]}


class Decisions(dict[str, Decision]):
    """A plan's decisions as the planner makes them, by setting."""

    def add(self, setting: str, value: str, detail: str, reason: str = "", evidence: tuple[Evidence, ...] = ()) -> None:
        """Add the decision on ``setting`` (it replaces one made before).

        Args:
            setting: The setting (``"policy"``, ``"loss_scale"``, ``"xla"``...).
            value: Its value, as text.
            detail: The whole reason, with the figures it quotes.
            reason: The reason in a few words; empty: the first clause of ``detail``.
            evidence: The measurements those figures come from.
        """
        self[setting] = Decision(setting, value, reason or first_clause(detail), detail, evidence)

    def supported(self, setting: str, value: str, support: Support, prefix: str = "", said: str = "") -> None:
        """A value the support table explains: its whole reason, its short one, its evidence (``said``, when given,
        says the short reason instead, such as ``requested (AMP_XLA)``)."""
        self.add(setting, value, prefix + support.why, said or support.short, support.evidence)


@dataclass(frozen=True)
class Rejected:
    """An alternative that lost, and why.

    Attributes:
        setting: The setting it was a value of (``"policy"``, ``"loss_scale"``, ``"peer"``...).
        value: The value that lost (``"mixed_float16"``, a peer's name such as ``"fp32 grappler-bf16"``).
        why: Why it lost, with the figures it quotes.
        evidence: The measurements those figures come from (committed results, with their machine).
    """

    setting: str
    value: str
    why: str
    evidence: tuple[Evidence, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The rejected value as JSON data (``evidence`` only where there is some).

        Returns:
            ``{"setting", "value", "why"}``, and ``"evidence"`` as a list of `Evidence.to_dict` where any.
        """
        d: dict[str, Any] = {"setting": self.setting, "value": self.value, "why": self.why}
        if self.evidence:
            d["evidence"] = [e.to_dict() for e in self.evidence]
        return d


@dataclass(frozen=True)
class BackendStatus:
    """A registered backend as the planner saw it.

    Attributes:
        name: The backend's name (``"nvidia"``, ``"intel"``, ``"cpu"``, or a third party's).
        available: Whether it found hardware it can plan for.
        reason: Why it is available or not, in words.
        selected: Whether it made the plan.
        failed: Whether it broke (a load error, or a method that raised), rather than merely found no hardware.
    """

    name: str
    available: bool
    reason: str
    selected: bool
    failed: bool = False


@dataclass(frozen=True)
class Plan:
    """The mixed-precision configuration chosen for this machine, with the reason for each choice.

    `auto_configure` applies it; Keras ``fit`` follows it through `wrap_optimizer` and `compile_kwargs`;
    ``print(plan)`` or `to_json` says what it chose and why.

    Attributes:
        backend: The backend that won (``"nvidia"``, ``"intel"``, ``"cpu"``).
        devices: TensorFlow's names of the devices used (``"/GPU:0"``).
        policy: The Keras dtype policy (``"float32"``, ``"mixed_float16"``, ``"mixed_bfloat16"``).
        loss_scale: How the trainer scales losses (`LossScale`).
        tf32: Whether float32 matmuls and convolutions may use TF32 (or the backend's equivalent, ITEX's BF32).
        xla: Whether training steps are compiled with XLA (``jit_compile``).
        decisions: Each choice with its reasons and evidence (`Decision`).
        rejected: Why the alternatives lost (`Rejected`).
        warnings: Every downgraded or risky request, in words.
        backends: Every registered backend's status (`BackendStatus`).
        request: The overrides the plan answered (keywords and ``AMP_*`` variables).
        notes: What else the backend said about the machine.
        graph_amp: The type the backend rewrites the float32 graph to itself, if requested (the policy stays float32).
        vendor_settings: The backend's own settings (ITEX's math mode).
        assessment: The backend's judgement the plan was made from.
        fp8: Whether the eligible Dense layers train in float8 (``prepare_model`` applies it to a model).
        steps_per_execution: How many training steps Keras ``fit`` runs per compiled call.
        float32_layers: The Keras layers kept in float32, as slower in the policy's dtype here (`Float32Layer`).
        device_names: The devices' names as the probe read them (``"AMD EPYC (Zen 5)"``).
        honoured: The requested settings honoured below native support, with the level they run at.
        tensorflow: The TensorFlow version planned for.
        keras: The Keras version planned for.
    """

    backend: str
    devices: tuple[str, ...]
    policy: str
    loss_scale: LossScale
    tf32: bool
    xla: bool
    decisions: tuple[Decision, ...]
    rejected: tuple[Rejected, ...]
    warnings: tuple[str, ...]
    backends: tuple[BackendStatus, ...]
    request: Request = field(default_factory=Request, compare=False)
    notes: tuple[str, ...] = ()
    graph_amp: str | None = None
    vendor_settings: tuple[VendorSetting, ...] = ()
    assessment: Assessment | None = field(default=None, compare=False, repr=False)
    fp8: bool = False
    steps_per_execution: int = 1
    float32_layers: tuple[Float32Layer, ...] = ()
    device_names: tuple[str, ...] = ()
    honoured: Mapping[str, str] = field(default_factory=dict, compare=False)
    tensorflow: str | None = None
    keras: str | None = None

    @property
    def reasons(self) -> Mapping[str, str]:
        """Each setting's whole reason (`Decision.detail`), by setting."""
        return {d.setting: d.detail for d in self.decisions}

    def decision(self, setting: str) -> Decision | None:
        """The decision about one setting.

        Args:
            setting: ``"policy"``, ``"loss_scale"``, ``"tf32"``, ``"xla"``, ``"fp8"``, ...

        Returns:
            Its `Decision`, or ``None`` if the plan decided no such setting.
        """
        return next((d for d in self.decisions if d.setting == setting), None)

    # -- convenience for training code ---------------------------------------------------------
    @property
    def compute_dtype(self) -> str:
        """The dtype layers compute in under the policy (``float16``, ``bfloat16`` or ``float32``)."""
        return COMPUTE_DTYPES[self.policy]

    @property
    def variable_dtype(self) -> str:
        """The dtype variables are kept in: ``float32`` under every policy."""
        return "float32"

    @property
    def device(self) -> str:
        """The first device the plan runs on, as ``tf.device`` takes it: ``/GPU:0`` (``/CPU:0`` when none is listed);
        another kind in the full form, ``/device:XPU:0`` (``tf.DeviceSpec`` reads the short one for CPU and GPU only).
        """
        first = self.devices[0] if self.devices else "/CPU:0"
        short = first.count("/") == 1 and first.count(":") == 1
        return f"/device:{first[1:]}" if short and first[1:4].upper() not in ("CPU", "GPU") else first

    def compile_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``model.compile`` that follow the plan, with `wrap_optimizer`:

        ```python
        model.compile(optimizer=plan.wrap_optimizer(opt), loss=..., **plan.compile_kwargs())
        ```

        ``jit_compile``, ``steps_per_execution``, and on Keras 3 ``auto_scale_loss=False`` (else Keras 3 adds its
        own dynamic loss scaling under ``mixed_float16``, whatever `wrap_optimizer` decided).

        Returns:
            The keyword arguments, by name.
        """
        from .keras_compat import compile_kwargs

        return compile_kwargs(self.xla, self.steps_per_execution)

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """The optimizer, as this plan scales losses, for ``model.compile`` (with `compile_kwargs`).

        ``dynamic``: a Keras ``LossScaleOptimizer`` (an overflowing step is skipped, the scale halved); ``fixed``:
        Keras 3's ``loss_scale_factor`` set in place, Keras 2's ``LossScaleOptimizer(dynamic=False)`` (neither skips
        an overflowing step: an ``AmpWarning`` says so under float16); ``none``: the optimizer unchanged (on Keras 2
        under float16, a fixed scale of 1, to keep its ``compile`` from adding dynamic scaling).

        Args:
            optimizer: A Keras optimizer, or its name (``"adam"``).

        Returns:
            The optimizer to pass to ``model.compile``.

        Raises:
            ValueError: The optimizer already scales losses in another way.
        """
        from .keras_compat import wrap_optimizer

        return wrap_optimizer(optimizer, self.loss_scale, self.compute_dtype)

    def vendor_setting(self, name: str) -> str | None:
        """The value of one of the backend's own settings in this plan.

        Args:
            name: The setting's name (``"ITEX_FP32_MATH_MODE"``).

        Returns:
            Its value, or ``None`` where the plan has no such setting.
        """
        return next((s.value for s in self.vendor_settings if s.name == name), None)

    def training_key(self) -> str:
        """Everything that changes how a model trains under this plan (workers of one distributed job compare it).

        Returns:
            The settings as one string.
        """
        ls = self.loss_scale
        parts = [f"policy={self.policy}", f"loss_scale={ls.mode}:{ls.initial:g}:{ls.growth_interval}",
                 f"xla={self.xla}", f"tf32={self.tf32}", f"graph_amp={self.graph_amp}", f"fp8={self.fp8}",
                 f"float32_layers={';'.join(k.describe() for k in self.float32_layers)}"]
        parts += [f"{s.name}={s.value}" for s in sorted(self.vendor_settings, key=lambda s: s.name)]
        return "|".join(parts)

    # -- output --------------------------------------------------------------------------------
    @property
    def headline(self) -> str:
        """One line: what was chosen (``amp_backends plan: backend=cpu devices=/CPU:0 policy=...``)."""
        parts = [f"backend={self.backend}", f"devices={','.join(self.devices) or '-'}", f"policy={self.policy}",
                 f"loss_scale={self.loss_scale.mode if self.loss_scale.mode != 'fixed' else self.loss_scale}",
                 f"tf32={format_value(self.tf32)}", f"xla={format_value(self.xla)}"]
        if self.graph_amp:
            parts.append(f"graph_amp={self.graph_amp}")
        if self.fp8:
            parts.append("fp8=on")
        if self.float32_layers:
            parts.append(f"float32_layers={','.join(k.layer for k in self.float32_layers)}")
        parts += [f"{s.name}={s.value}" for s in self.vendor_settings]
        return "amp_backends plan: " + " ".join(parts)

    def summary(self) -> str:
        """What was chosen, and why, in one line.

        Returns:
            The `headline` and the policy's reason in a few words.
        """
        policy = self.decision("policy")
        return f"{self.headline} ({policy.reason if policy else ''})"

    def target(self) -> str:
        """What the plan is for.

        Returns:
            The device, TensorFlow and Keras, such as ``"/CPU:0 AMD EPYC (Zen 5), TensorFlow 2.21.0, Keras 3.15.1"``.
        """
        names = self.device_names
        if len(self.devices) == 1:
            device = f"{self.devices[0]} {names[0]}" if names else self.devices[0]
        elif names and len(set(names)) == 1:
            device = f"{len(self.devices)}x {names[0]} ({self.devices[0]} to {self.devices[-1]})"
        else:
            device = ", ".join(self.devices) or "-"
        return f"{device}, TensorFlow {self.tensorflow or '?'}, Keras {self.keras or '?'}"

    def brief(self, model_float32: Sequence[str] | None = None, steps_per_call: int | None = None) -> str:
        """At most a dozen lines of at most 120 characters: what the plan is for, each setting with its short
        reason, the first warning.

        Args:
            model_float32: The paths of a model's layers the plan keeps in float32, or ``None``: given, the
                float32 layers line is about that model instead of the kinds kept.
            steps_per_call: A trainer's steps per compiled call, or ``None``: given and other than the plan's
                ``steps_per_execution`` (Keras fit's), the steps line says the trainer's.

        Returns:
            The lines, joined.
        """
        lines = [f"amp_backends plan ({self.backend}) for {self.target()}"]
        for d in self.decisions:
            value, reason = d.value, d.reason
            if d.setting == "float32_layers" and model_float32 is not None:
                value = (f"{len(model_float32)} of this model's layers: {', '.join(model_float32)}" if model_float32
                         else "none in this model")
                reason = d.reason if model_float32 or not self.float32_layers else ""
            if d.setting == "steps_per_execution" and steps_per_call is not None and str(steps_per_call) != d.value:
                value, reason = str(steps_per_call), f"steps per compiled call, as asked (Keras fit's stays {d.value})"
            lines.append(_fit(f"  {d.setting}: {value}", reason))
        lines += [_fit(f"  {s.name}={s.value}", first_clause(s.why)) for s in self.vendor_settings]
        if self.warnings:
            more = f" (+{len(self.warnings) - 1} more)" if len(self.warnings) > 1 else ""
            lines.append(_fit(f"  warning{more}:", self.warnings[0], sep=" "))
        return "\n".join(lines + [WHERE_THE_EVIDENCE_IS])

    def __str__(self) -> str:
        return self.brief()

    def __repr__(self) -> str:  # one line (a message that quotes a plan received by mistake stays readable)
        return f"<Plan {self.headline.removeprefix('amp_backends plan: ')}>"

    def explain(self) -> str:
        """The plan at length.

        Returns:
            Several lines: each choice with its whole reason and the figures it quotes, the rejected alternatives,
            the warnings.
        """
        lines = [self.headline, f"  for: {self.target()}", *(f"  {d.setting}: {d.detail}" for d in self.decisions),
                 *(f"  {s.name}={s.value}: {s.why}" for s in self.vendor_settings)]
        if self.rejected:
            lines.append("  rejected:")
            lines += [f"    {r.setting}={r.value}: {r.why}" for r in self.rejected]
        if self.warnings:
            lines.append("  warnings:")
            lines += [f"    {w}" for w in self.warnings]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (the ``plan`` part of ``amp-backends info --json``).

        Returns:
            Every setting with its decision, the rejected alternatives, warnings, notes, overrides, backends and
            the backend's support table.
        """
        return {
            "backend": self.backend, "devices": list(self.devices), "policy": self.policy,
            "compute_dtype": self.compute_dtype, "loss_scale": self.loss_scale.to_dict(), "tf32": self.tf32,
            "xla": self.xla, "graph_amp": self.graph_amp, "fp8": self.fp8,
            "steps_per_execution": self.steps_per_execution,
            "float32_layers": [k.to_dict() for k in self.float32_layers],
            "vendor_settings": [s.to_dict() for s in self.vendor_settings], "reasons": dict(self.reasons),
            "decisions": [d.to_dict() for d in self.decisions], "device_names": list(self.device_names),
            "tensorflow": self.tensorflow, "keras": self.keras, "rejected": [r.to_dict() for r in self.rejected],
            "warnings": list(self.warnings), "notes": list(self.notes), "overrides": self.request.overrides(),
            "backends": [b.__dict__ for b in self.backends],
            "support": self.assessment.to_dict() if self.assessment else None,
        }

    def to_json(self, **kwargs: Any) -> str:
        """The plan as JSON (``amp-backends info --json``'s ``plan``).

        Args:
            **kwargs: Passed to `json.dumps` (``indent=2``).

        Returns:
            The JSON text.
        """
        return json.dumps(self.to_dict(), **kwargs)


def require_plan(plan: Any, caller: str) -> None:
    """A `TypeError` where the ``plan`` given to ``caller`` (``"Trainer(plan=...)"``) is not a `Plan` (a policy
    name, a dict of overrides), saying where a plan comes from (for a policy name, the ``auto_configure`` call)."""
    if isinstance(plan, Plan):
        return
    try:
        policy = parse_policy(plan) if isinstance(plan, str) and plan.strip() else None
    except ValueError:
        policy = None
    make = f"amp_backends.auto_configure(policy={policy!r})" if policy else "amp_backends.auto_configure()"
    raise AmpConfigError(f"{caller} takes an amp_backends Plan (from amp_backends.auto_configure(), plan_for() or "
                         f"current_plan()){', not a policy name' if policy else ''}. Received: {plan!r} (of type "
                         f"{type(plan).__name__}). Fix: plan = {make}, then pass that plan.")


def _fit(head: str, reason: str, sep: str = " - ", width: int = WIDTH) -> str:
    """``head`` and ``reason`` on one line of at most ``width`` characters: the reason cut first, then the head."""
    line = f"{head}{sep}{reason}" if reason else head
    if len(line) <= width:
        return line
    if reason and len(head) + len(sep) + 16 <= width:
        return line[: width - 3].rsplit(" ", 1)[0].rstrip(" ,;:") + "..."
    return head if len(head) <= width else head[: width - 3].rstrip() + "..."
