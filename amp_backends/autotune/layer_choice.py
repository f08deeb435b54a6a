"""The float32-layers choice as data (`Measurement`), and its cache: every layer in float32, or the plan's policy kept.

It is kept per model architecture, machine, TensorFlow and Keras versions (``layer_plans.json`` in
`amp_backends.cache.cache_dir`), so the same model on the same machine gets the same layer plan every run. A module
of its own because the layer plan reads it, while the measuring (`amp_backends.autotune.layers`) sets its policies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cache import cache_dir, digest, host_machine, load, store
from .timing import MARGIN, Timings

if TYPE_CHECKING:
    from ..plan import Plan

__all__ = ["CACHE_FILE", "FLOAT32", "MARGIN", "NOISE", "PLAN", "Measurement", "cache_file", "cache_key", "cached",
           "remember", "verdict_of"]

FLOAT32, PLAN, NOISE = "float32", "plan", "within noise"
CACHE_FILE = "layer_plans.json"


@dataclass(frozen=True)
class Measurement:
    """What `measure` found: samples/s (medians, min-max over the rounds) as the layer plan has it and with every
    layer in float32, and the verdict (``float32``, ``plan``, or ``within noise``: the plan stays); ``origin``:
    measured now, ``cached``, or from the ``checkpoint`` of the run this one resumes.

    Attributes:
        verdict: `FLOAT32` (``"float32"``: every layer in float32), `PLAN` (``"plan"``: the layer plan as it is) or
            `NOISE` (``"within noise"``: neither side won every round by ``margin``; the plan stays).
        policy: The plan's dtype policy the layer plan was measured under (``"mixed_bfloat16"``).
        plan_rate: The median rate as the layer plan has it, in samples per second (0.0: not measured).
        float32_rate: The median rate with every layer in float32, in samples per second (0.0: not measured).
        plan_spread: ``(min, max)`` of the rates as the layer plan has it, over the rounds.
        float32_spread: ``(min, max)`` of the rates with every layer in float32, over the rounds.
        rounds: The interleaved rounds timed (0: nothing measured; the verdict alone is told).
        steps: The steps of each side per round.
        margin: The factor a side had to beat the other by in every round to win (`MARGIN`).
        origin: ``"measured"`` now, ``"cached"`` (on this machine before) or ``"checkpoint"`` (kept in the
            checkpoint of the run this one resumes).
    """

    verdict: str
    policy: str
    plan_rate: float = 0.0
    float32_rate: float = 0.0
    plan_spread: tuple[float, float] = (0.0, 0.0)
    float32_spread: tuple[float, float] = (0.0, 0.0)
    rounds: int = 0
    steps: int = 0
    margin: float = MARGIN
    origin: str = "measured"

    @property
    def float32(self) -> bool:
        """Whether the verdict puts every layer in float32."""
        return self.verdict == FLOAT32

    @property
    def ratio(self) -> float:
        """The float32 rate over the plan's rate (0.0 where the plan's was not measured)."""
        return self.float32_rate / self.plan_rate if self.plan_rate else 0.0

    def brief(self) -> str:
        """The measurement in one clause, as a reason quotes it: the speed ratio and rounds, or the verdict alone.

        Returns:
            ``float32 at 1.23x the mixed_float16 speed, 5 interleaved rounds``, with ``, cached`` or ``, from the
            checkpoint`` where it was not measured now; where nothing was measured, the verdict.
        """
        where = {"cached": ", cached", "checkpoint": ", from the checkpoint"}.get(self.origin, "")
        if not self.rounds:
            return f"{self.verdict}{where}"
        return f"float32 at {self.ratio:.2f}x the {self.policy} speed, {self.rounds} interleaved rounds{where}"

    def __str__(self) -> str:
        origin = {"cached": " (cached: measured on this machine before)",
                  "checkpoint": " (as the run this one resumes measured it, kept in its checkpoint)",
                  }.get(self.origin, "")
        figures = ""
        if self.rounds:
            figures = (f": forward and backward on one batch, {self.rounds} interleaved rounds of {self.steps} steps, "
                       f"{self.policy} as planned {self.plan_rate:.4g} samples/s (min-max {self.plan_spread[0]:.4g}-"
                       f"{self.plan_spread[1]:.4g}), every layer float32 {self.float32_rate:.4g} "
                       f"({self.float32_spread[0]:.4g}-{self.float32_spread[1]:.4g}), {self.ratio:.2f}x")
        if self.verdict == FLOAT32:
            head = f"every layer float32: faster than {self.policy} in every round by more than {self.margin - 1:.0%}"
        elif self.verdict == PLAN:
            head = f"the plan's {self.policy} kept: faster than float32 in every round"
        else:
            head = (f"the plan's {self.policy} kept: within noise (neither side won every round by more than "
                    f"{self.margin - 1:.0%})")
        return head + origin + figures

    def to_dict(self) -> dict[str, Any]:
        """The measurement as JSON data (rates and spreads rounded to 3 decimals), as the cache and checkpoints keep it.

        Returns:
            Its fields by name (`from_dict` reads them back).
        """
        return {k: [round(x, 3) for x in v] if k.endswith("_spread") else round(v, 3) if k.endswith("_rate") else v
                for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        """Read a measurement `to_dict` wrote.

        Args:
            data: Its fields by name; ``verdict`` and ``policy`` are required, the others have their defaults.

        Returns:
            The measurement.
        """
        return cls(str(data["verdict"]), str(data["policy"]), float(data.get("plan_rate", 0.0)),
                   float(data.get("float32_rate", 0.0)), _pair(data.get("plan_spread")),
                   _pair(data.get("float32_spread")), int(data.get("rounds", 0)), int(data.get("steps", 0)),
                   float(data.get("margin", MARGIN)), str(data.get("origin", "measured")))


def _pair(value: Any) -> tuple[float, float]:
    return (float(value[0]), float(value[1])) if isinstance(value, (list, tuple)) and len(value) == 2 else (0.0, 0.0)


def verdict_of(plan_rates: Any, float32_rates: Any, margin: float = MARGIN) -> str:
    """``float32``/``plan`` where that side won every round by ``margin``, else ``within noise`` (pure)."""
    timings = Timings({PLAN: tuple(plan_rates), FLOAT32: tuple(float32_rates)})
    return {FLOAT32: FLOAT32, PLAN: PLAN}.get(timings.winner(margin) or "", NOISE)


def cache_key(model: Any, plan: Plan) -> str:
    """The model's architecture (not its names or dtypes), the machine, the TensorFlow and Keras versions, and the
    plan's policy and float32 layer kinds."""
    from ..keras_compat import input_structure, keras_info, walk
    from ..software import tensorflow_version

    parts = []
    for _, layer in walk(model, "m"):
        shapes = [tuple(int(d) for d in getattr(w, "shape", ())) for w in getattr(layer, "weights", [])[:8]]
        activation = getattr(getattr(layer, "activation", None), "__name__", "")
        parts.append(f"{type(layer).__name__}:{shapes}:{getattr(layer, 'strides', '')}:"
                     f"{getattr(layer, 'kernel_size', '')}:{activation}")
    try:
        inputs = str(input_structure(model))
    except Exception:
        inputs = "?"
    import tensorflow as tf

    rules = ",".join(k.describe() for k in getattr(plan, "float32_layers", ()) or ())
    return "|".join([digest("/".join(parts) + inputs), plan.backend, host_machine(), ",".join(plan.devices),
                     f"tf{tensorflow_version()}", f"keras{keras_info(tf).version}", plan.policy, rules])


def cache_file() -> Path:
    """The file the measurements are cached in: `CACHE_FILE` in `amp_backends.cache.cache_dir`."""
    return cache_dir() / CACHE_FILE


def cached(model: Any, plan: Plan) -> Measurement | None:
    """The measurement cached for this model on this machine, if one was made (``origin="cached"``)."""
    try:
        key = cache_key(model, plan)
    except Exception:  # a model whose structure cannot be read has no key
        return None
    try:  # none kept (KeyError), or an entry that is not one `remember` wrote
        return replace(Measurement.from_dict(load(cache_file())[key]), origin="cached")
    except (KeyError, TypeError, ValueError):
        return None


def remember(model: Any, plan: Plan, measurement: Measurement) -> None:
    """Keep ``measurement`` for the next run of this model on this machine."""
    try:
        key = cache_key(model, plan)
    except Exception:
        return
    store(cache_file(), key, measurement.to_dict())
