"""The vocabulary a backend judges its hardware in: support levels, `Support`, `Assessment` (how well each setting
runs and why, which `MatrixUnit` runs which precision), and `VendorSetting`, a backend's own setting carried
through the plan to its `apply` without the core knowing what it means.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from .evidence import Evidence
from .errors import AmpConfigError

# How well a device supports a setting. Only "native" is chosen automatically.
NATIVE = "native"  # fast hardware support
FUNCTIONAL = "functional"  # runs correctly, little or no speed-up: honoured with a warning when asked for
EMULATED = "emulated"  # runs, but slower than float32: downgraded unless force
UNSAFE = "unsafe"  # known to crash or corrupt: always refused
UNSUPPORTED = "unsupported"  # does not exist here (TF32 on a CPU): downgraded
LEVELS = (NATIVE, FUNCTIONAL, EMULATED, UNSAFE, UNSUPPORTED)

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
MATRIX_DTYPES = ("float16", "bfloat16", "float32", "float8")


@dataclass(frozen=True)
class Support:
    """How a device supports one setting, and why.

    Attributes:
        level: One of `LEVELS`: ``"native"`` (fast hardware support; the only level chosen automatically),
            ``"functional"``, ``"emulated"``, ``"unsafe"`` or ``"unsupported"``.
        why: The reason in full, with the figures it quotes.
        brief: The reason in a few words (`short` falls back to the first clause of ``why``).
        evidence: The measurements ``why`` quotes (committed results, with their machine).

    Raises:
        AmpConfigError: ``level`` is none of `LEVELS`.
    """

    level: str
    why: str
    brief: str = field(default="", compare=False)
    evidence: tuple[Evidence, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise AmpConfigError(f"Support level must be one of {LEVELS}. Received: {self.level!r}.")

    @property
    def short(self) -> str:
        """`brief`, or where a backend gave none, the first clause of `why`."""
        return self.brief or first_clause(self.why)

    def to_dict(self) -> dict[str, Any]:
        """The Support as JSON-ready data."""
        d: dict[str, Any] = {"level": self.level, "why": self.why}
        if self.brief:
            d["brief"] = self.brief
        if self.evidence:
            d["evidence"] = [e.to_dict() for e in self.evidence]
        return d


def first_clause(text: str, limit: int = 90) -> str:
    """The text up to its first colon, semicolon or opening parenthesis, at most ``limit`` characters (cut after a
    whole word)."""
    cut = min((i for i in (text.find(": "), text.find("; "), text.find(" (")) if i > 0), default=len(text))
    head = text[:cut].rstrip(" .,")
    return head if len(head) <= limit else head[: limit - 2].rsplit(" ", 1)[0].rstrip(" ,;:") + "..."


NO_GRAPH_AMP = Support(UNSUPPORTED, "this backend declares no rewrite of the float32 graph to low precision of its own")
GRAPH_AMP_DTYPES = ("float16", "bfloat16")  # the types a graph-level rewrite may target
# Keras's float8 layers run anywhere: without fp8 matrix units they quantize and dequantize around ordinary matmuls.
NO_FP8 = Support(EMULATED, "this backend declares no fp8 matrix units: Keras's float8 layers would only be emulated "
                           "(quantize-dequantize around higher-precision matmuls), slower than without them")
DEFAULT_STEPS_WHY = "Keras's default (one training step per compiled call): not measured for this backend"


@dataclass(frozen=True)
class MatrixUnit:
    """The matrix unit that runs one precision's matmuls and convolutions.

    Attributes:
        name: The unit's name (``"Tensor Cores"``, ``"AMX tiles"``).
        alignment: The multiple (in elements) of the dimensions it runs at full efficiency (16 bytes on Tensor
            Cores: 8 for float16, 4 for TF32, 16 for float8).
    """

    name: str
    alignment: int

    def to_dict(self) -> dict[str, Any]:
        """The MatrixUnit as JSON-ready data."""
        return {"unit": self.name, "alignment": self.alignment}


REQUESTED_FLOAT32 = "requested (float32_layers)"  # the why of a Float32Layer the user listed: nothing measured


@dataclass(frozen=True)
class Float32Layer:
    """Keras layers that train slower in a low-precision compute dtype than in float32 here, casts counted: a plan
    under one of ``dtypes`` keeps them in float32.

    Attributes:
        layer: A Keras layer class name (``"DepthwiseConv2D"``); subclasses match.
        dtypes: The compute dtypes under which they are kept in float32 (``("bfloat16",)``).
        why: The reason, with the figures it quotes.
        strides_over: Only layers with a stride above it match (with ``kernel_over``, either suffices); ``None``:
            any stride.
        kernel_over: Only layers with a kernel dimension above it match; ``None``: any kernel.
        evidence: The measurements ``why`` quotes.
    """

    layer: str
    dtypes: tuple[str, ...]
    why: str
    strides_over: int | None = None
    kernel_over: int | None = None
    evidence: tuple[Evidence, ...] = field(default=(), compare=False)

    def matches(self, classes: Iterable[str], strides: Sequence[int] = (), kernel: Sequence[int] = ()) -> bool:
        """Whether a layer of these class names, strides and kernel size is one this entry keeps in float32.

        Args:
            classes: The layer's class name and its bases' names.
            strides: The layer's strides (none: 1).
            kernel: The layer's kernel size (none: 1).

        Returns:
            True where the class is ``layer`` and any stride or kernel condition holds.
        """
        if self.layer not in set(classes):
            return False
        if self.strides_over is None and self.kernel_over is None:
            return True
        return ((self.strides_over is not None and max(strides, default=1) > self.strides_over)
                or (self.kernel_over is not None and max(kernel, default=1) > self.kernel_over))

    def describe(self) -> str:
        """The entry in words.

        Returns:
            ``DepthwiseConv2D``, or ``DepthwiseConv2D (stride > 1 or kernel > 3)`` with its conditions.
        """
        conditions = ([f"stride > {self.strides_over}"] if self.strides_over is not None else []) + (
            [f"kernel > {self.kernel_over}"] if self.kernel_over is not None else [])
        return self.layer + (f" ({' or '.join(conditions)})" if conditions else "")

    def to_dict(self) -> dict[str, Any]:
        """The Float32Layer as JSON-ready data."""
        return {"layer": self.layer, "dtypes": list(self.dtypes), "why": self.why,
                "strides_over": self.strides_over, "kernel_over": self.kernel_over,
                "evidence": [e.to_dict() for e in self.evidence]}


def describe_layers(rules: Iterable[Float32Layer]) -> str:
    """``"DepthwiseConv2D, SeparableConv2D (stride>1 or kernel>3), LSTM"``: the kinds, each condition said once
    after the run of kinds that share it."""
    groups: list[tuple[str, list[str]]] = []
    for rule in rules:
        condition = rule.describe()[len(rule.layer):]
        if groups and groups[-1][0] == condition:
            groups[-1][1].append(rule.layer)
        else:
            groups.append((condition, [rule.layer]))
    return ", ".join(", ".join(names) + condition.replace(" > ", ">") for condition, names in groups) or "none"


@dataclass(frozen=True)
class PeerVerdict:
    """A configuration a user would pick instead of the plan (a `amp_backends.registry.Peer`), judged from
    committed benchmark runs on a machine of this kind.

    Attributes:
        name: The peer's name in the model zoo (``"fp32 grappler-bf16"``).
        won: Whether it beat the plan in every measured repetition of every model (the plan then warns).
        why: What was measured, with its figures, machine and file, or that nothing was.
        evidence: The figures quoted.
        graph_rewrite: Whether the peer is the backend's own graph rewrite (what ``graph_amp=on`` asks for).
    """

    name: str
    won: bool
    why: str
    evidence: tuple[Evidence, ...] = ()
    graph_rewrite: bool = False


@dataclass(frozen=True)
class Assessment:
    """A backend's judgement of its probe, from which the planner builds a `Plan`.

    Attributes:
        backend: The backend's name.
        devices: TensorFlow's names of the devices it would train on (``"/GPU:0"``).
        policies: The `Support` of each of `POLICIES`, by policy.
        preference: Policies in the backend's order of preference: the planner takes the first whose support is
            ``native`` (so one must be).
        tf32: The support for TF32 (or the backend's TF32-like float32 mode).
        xla: The support for compiling training steps with XLA.
        xla_default: Whether the plan turns XLA on when nobody asked (where its support is native).
        tf32_default: Whether the plan turns TF32 on when nobody asked (where its support is native).
        graph_amp: The support for the backend's own rewrite of a float32 graph to low precision
            (``graph_amp=on``).
        graph_amp_dtypes: The types that rewrite may target (some of ``"float16"``, ``"bfloat16"``).
        notes: What the plan notes about the hardware (``print(plan)`` and the capability report show them).
        fp8: How Keras's float8 layers run here, with XLA on.
        matrix_units: The `MatrixUnit` of each compute dtype (``"float32"``: its TF32-like mode).
        steps_per_execution: Training steps per compiled call that Keras ``fit`` and the trainer should run.
        steps_per_execution_why: Why that number.
        steps_per_execution_evidence: The measurements that reason quotes.
        float32_layers: Layer kinds that train faster kept in float32 here (`Float32Layer`).
        float32_layers_why: Why there are none, where there are none.
        peers: What a user would pick instead of the plan, judged from committed runs (`PeerVerdict`).
    """

    backend: str
    devices: tuple[str, ...]
    policies: Mapping[str, Support]
    preference: tuple[str, ...]
    tf32: Support
    xla: Support
    xla_default: bool
    tf32_default: bool = True
    graph_amp: Support = NO_GRAPH_AMP
    graph_amp_dtypes: tuple[str, ...] = GRAPH_AMP_DTYPES
    notes: tuple[str, ...] = field(default=())
    fp8: Support = NO_FP8
    matrix_units: Mapping[str, MatrixUnit] = field(default_factory=dict)
    steps_per_execution: int = 1
    steps_per_execution_why: str = DEFAULT_STEPS_WHY
    steps_per_execution_evidence: tuple[Evidence, ...] = ()
    float32_layers: tuple[Float32Layer, ...] = ()
    float32_layers_why: str = "no layer kind was measured slower in low precision than in float32 on this backend"
    peers: tuple[PeerVerdict, ...] = ()

    def contract_errors(self) -> list[str]:
        """What this assessment gets wrong about the contract above (empty when it is sound)."""
        errors = []
        missing = [p for p in POLICIES if p not in self.policies]
        if missing:
            errors.append(f"no support level for {', '.join(missing)} (expected one for each of {', '.join(POLICIES)})")
        unknown = [p for p in self.preference if p not in POLICIES]
        if unknown:
            errors.append(f"unknown policies in its preference: {', '.join(map(repr, unknown))}")
        if not any(self.policies.get(p, None) is not None and self.policies[p].level == NATIVE
                   for p in self.preference if p in POLICIES):
            errors.append("no native dtype policy in its preference (expected at least one, such as float32)")
        if not self.graph_amp_dtypes or not set(self.graph_amp_dtypes) <= set(GRAPH_AMP_DTYPES):
            errors.append(f"graph_amp_dtypes={self.graph_amp_dtypes!r} (expected some of {GRAPH_AMP_DTYPES})")
        bad_units = [d for d, u in self.matrix_units.items()
                     if d not in MATRIX_DTYPES or not isinstance(u, MatrixUnit) or u.alignment < 1]
        if bad_units:
            errors.append(f"matrix units for {', '.join(map(repr, bad_units))} (expected MatrixUnit entries with an "
                          f"alignment >= 1, keyed by {', '.join(MATRIX_DTYPES)})")
        if isinstance(self.steps_per_execution, bool) or not isinstance(self.steps_per_execution, int) \
                or self.steps_per_execution < 1:
            errors.append(f"steps_per_execution={self.steps_per_execution!r} (expected an int >= 1)")
        bad_layers = [k for k in self.float32_layers
                      if not isinstance(k, Float32Layer) or not k.layer.isidentifier() or not k.dtypes]
        if bad_layers:
            errors.append(f"float32 layers {bad_layers!r} (expected Float32Layer entries naming a Keras class and at "
                          "least one compute dtype)")
        return errors

    def to_dict(self) -> dict[str, Any]:
        """The support table, as the report and ``Plan.to_dict`` show it."""
        return {
            "policies": {p: s.to_dict() for p, s in self.policies.items()}, "preference": list(self.preference),
            "tf32": self.tf32.to_dict(), "xla": self.xla.to_dict(), "graph_amp": self.graph_amp.to_dict(),
            "fp8": self.fp8.to_dict(), "matrix_units": {d: u.to_dict() for d, u in self.matrix_units.items()},
            "steps_per_execution": {"value": self.steps_per_execution, "why": self.steps_per_execution_why,
                                    "evidence": [e.to_dict() for e in self.steps_per_execution_evidence]},
            "float32_layers": [k.to_dict() for k in self.float32_layers] or self.float32_layers_why,
        }


@dataclass(frozen=True)
class VendorSetting:
    """One backend-owned setting the plan carries, such as ``ITEX_FP32_MATH_MODE=TF32``.

    The backend names it in `vendor_settings` from the resolved plan, reads it back in its `apply`, and the report
    shows it with ``why``.

    Attributes:
        name: The setting's name (``"ITEX_FP32_MATH_MODE"``).
        value: Its value, as text (``"TF32"``).
        why: Why the plan sets it so.
    """

    name: str
    value: str
    why: str

    def to_dict(self) -> dict[str, str]:
        """The VendorSetting as JSON-ready data."""
        return {"name": self.name, "value": self.value, "why": self.why}
