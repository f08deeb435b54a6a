"""Whether a model trains faster with every layer in float32 than as the plan has it, measured on the model.

A plan is decided from the hardware, before the model exists; a few models run against it. On a CPU with
AVX512-BF16 and no AMX, a model built from depthwise convolutions and sigmoid-type activations (MobileNetV3,
EfficientNet) spends most of its step in ops bfloat16 does not speed up — TensorFlow runs sigmoid and swish
in Eigen, slower in bfloat16 than in float32 (``results/cpu-activations-zen4.json``) — and the plan's float32
layers take away only the worst of it (``plan.float32_layers``): such a model can still train slower under
mixed_bfloat16 than in float32.

So where the plan keeps layers in float32 and the model has such layers (:func:`worth_measuring`), the
choice is measured on the model itself (:func:`measure`): its forward and backward pass on one real batch,
as the plan has it and with every layer in float32, interleaved, and float32 is kept when it is faster by
more than :data:`MARGIN`. Nothing else changes: the variables are float32 either way (mixed policies keep
them so), and the state a training-mode call updates (BatchNormalization's moving statistics) is put back.
:func:`amp_backends.prepare_model` does it when given a batch, and the trainer on its first batch.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("amp_backends")

MARGIN = 1.05  # float32 must be this much faster: the two are within noise of each other below it
MARK = "_amp_backends_float32_choice"  # the PolicyChoice, on a model set to float32 by measure()


def float32_choice(model: Any) -> PolicyChoice | None:
    """The measurement that set every layer of ``model`` to float32, if one did."""
    return getattr(model, MARK, None)


@dataclass(frozen=True)
class PolicyChoice:
    """What :func:`measure` found: samples/s (forward and backward) as the plan has it and in float32, and
    whether every layer was set to float32 (``layers``: those it changed)."""

    float32: bool
    plan_rate: float
    float32_rate: float
    layers: tuple[str, ...] = ()
    rounds: int = 0
    steps: int = 0
    policy: str = ""
    resumed: bool = False  # taken from the checkpoint of the run this one continues, not measured again

    @property
    def ratio(self) -> float:
        return self.float32_rate / self.plan_rate if self.plan_rate else 0.0

    def __str__(self) -> str:
        if self.resumed:
            return (f"every layer float32 ({len(self.layers)} layers changed), as measured by the run this one "
                    "resumes (kept in its checkpoint)" if self.float32 else
                    f"the plan's {self.policy} kept, as measured by the run this one resumes")
        figures = (f"forward and backward on one batch, median of {self.rounds} interleaved rounds of {self.steps} "
                   f"steps: {self.policy} as planned {self.plan_rate:.4g} samples/s, every layer float32 "
                   f"{self.float32_rate:.4g} ({self.ratio:.2f}x)")
        if self.float32:
            return (f"every layer float32 ({len(self.layers)} layers changed): this model trained faster in float32 "
                    f"than under {self.policy} here ({figures})")
        return f"the plan's {self.policy} kept: float32 was not more than {MARGIN - 1:.0%} faster ({figures})"

    def to_dict(self) -> dict[str, Any]:
        return {"float32": self.float32, "plan_rate": round(self.plan_rate, 2),
                "float32_rate": round(self.float32_rate, 2), "rounds": self.rounds, "steps": self.steps,
                "policy": self.policy, "layers": list(self.layers), "resumed": self.resumed}


def worth_measuring(model: Any, plan: Any) -> bool:
    """Whether the plan keeps some layers in float32 and ``model`` has such layers (in either dtype)."""
    from .assessment import kept_in_float32
    from .model_check._keras import walk

    rules = tuple(getattr(plan, "float32_layers", ()) or ())
    if not rules or getattr(plan, "compute_dtype", "float32") == "float32":
        return False
    return any(layer is not model and kept_in_float32(rules, layer)
               for _, layer in walk(model, getattr(model, "name", "model")))


def not_measurable(model: Any, plan: Any) -> str:
    """Why :func:`measure` has nothing to compare on ``model`` ("" when it has)."""
    if float32_choice(model) is not None:
        return "already measured: every layer is float32"
    if not low_precision_layers(model, plan):
        return f"no layer computes in {plan.policy}'s low precision"
    try:
        import tensorflow as tf

        replicas = tf.distribute.get_strategy().num_replicas_in_sync if tf.distribute.has_strategy() else 1
    except Exception:
        replicas = 1
    if replicas > 1:
        return (f"not measured under a distribution strategy of {replicas} replicas: each could choose apart "
                "(measure before entering its scope, or set the layers' dtypes yourself)")
    return ""


def apply_float32(model: Any, plan: Any, float32: bool) -> PolicyChoice:
    """A choice taken from elsewhere (a resumed run's checkpoint): every layer float32, or the plan kept."""
    layers = set_float32(low_precision_layers(model, plan)) if float32 else ()
    choice = PolicyChoice(float32, 0.0, 0.0, layers, policy=plan.policy, resumed=True)
    if float32:
        object.__setattr__(model, MARK, choice)
    return choice


def low_precision_layers(model: Any, plan: Any) -> list[tuple[str, Any]]:
    """The layers that follow the plan's policy (float8 and user-set dtypes are not among them)."""
    from .model_check._keras import policy_name, walk

    return [(path, layer) for path, layer in walk(model, getattr(model, "name", "model"))
            if layer is not model and policy_name(layer) == plan.policy]


def set_float32(layers: list[tuple[str, Any]]) -> tuple[str, ...]:
    """Every given layer to the ``float32`` policy; their paths."""
    from .keras_compat import set_layer_policy

    for _, layer in layers:
        set_layer_policy(layer, "float32")
    return tuple(path for path, _ in layers)


def measure(model: Any, plan: Any, x: Any, *, rounds: int = 3, steps: int = 2) -> PolicyChoice:
    """Time ``model``'s forward and backward pass on the batch ``x`` as the plan has it and with every layer in
    float32, interleaved, and leave the model in the faster (float32 only when more than :data:`MARGIN` faster).

    ``x`` is what the model takes (one batch). Raises whatever the model's call raises, with the model as it
    was (its policies and its non-trainable state).
    """
    import tensorflow as tf

    from .keras_compat import set_layer_policy

    x = tf.nest.map_structure(tf.convert_to_tensor, x)
    if not getattr(model, "built", True):
        model(x, training=False)  # its variables exist before their values are kept
    low = low_precision_layers(model, plan)
    saved = [(v, v.numpy()) for v in model.non_trainable_variables]

    def traced() -> Any:
        @tf.function
        def step() -> Any:
            with tf.GradientTape() as tape:
                out = model(x, training=True)
                total = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32)) for o in tf.nest.flatten(out)])
            grads = [g for g in tape.gradient(total, model.trainable_variables) if g is not None]
            return tf.add_n([tf.reduce_sum(tf.cast(g, tf.float32)) for g in grads]) if grads else total

        step()  # traced now: under the layers' policies of this moment
        return step

    rows = int(tf.nest.flatten(x)[0].shape[0] or 1)
    rates: dict[str, list[float]] = {"plan": [], "float32": []}
    try:
        variants = {"plan": traced()}
        set_float32(low)
        variants["float32"] = traced()
        for r in range(rounds):
            for name in (("plan", "float32") if r % 2 == 0 else ("float32", "plan")):
                start = time.perf_counter()
                for _ in range(steps):
                    out = variants[name]()
                float(out)
                rates[name].append(rows * steps / (time.perf_counter() - start))
    except BaseException:
        for _, layer in low:
            set_layer_policy(layer, plan.policy)
        raise
    finally:
        for variable, value in saved:
            variable.assign(value)
    plan_rate, f32_rate = statistics.median(rates["plan"]), statistics.median(rates["float32"])
    faster = f32_rate > plan_rate * MARGIN
    choice = PolicyChoice(faster, plan_rate, f32_rate, tuple(p for p, _ in low) if faster else (), rounds, steps,
                          plan.policy)
    if faster:
        object.__setattr__(model, MARK, choice)  # past Keras's attribute tracking: the check reads it
    else:
        for _, layer in low:
            set_layer_policy(layer, plan.policy)
    return choice
