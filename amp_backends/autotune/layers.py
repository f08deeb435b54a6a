"""Whether a model trains faster with every layer in float32 than as its layer plan has it: measured, cached.

The plan is decided before the model exists: on a CPU with AVX512-BF16 and no AMX, a model of depthwise convolutions
and sigmoid-type activations (MobileNetV3, EfficientNet) can still train slower under mixed_bfloat16 than in float32
(Eigen runs sigmoid and swish slower in bfloat16: ``results/cpu-activations-zen4.json``). So where the layer plan
says it is worth it (`amp_backends.layer_plan.worth_measuring`), `measure` times the model's forward and backward pass
on one batch both ways, interleaved; a side wins only when it wins **every** round by more than `MARGIN`. The
`Measurement` is cached (`amp_backends.autotune.layer_choice`). Variables stay float32 either way, and the state a
training-mode call updates (BatchNormalization's statistics) is put back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .layer_choice import FLOAT32, PLAN, Measurement, verdict_of
from .timing import MARGIN, ROUNDS, interleaved

if TYPE_CHECKING:
    from ..layer_plan import LayerPlan
    from ..plan import Plan

__all__ = ["ROUNDS", "STEPS", "measure", "not_measurable"]

STEPS = 2


def not_measurable(model: Any, plan: Plan) -> str:
    """Why `measure` has nothing to compare on a model.

    Args:
        model: The Keras model.
        plan: The `Plan` it trains under.

    Returns:
        The reason, or ``""`` where there is something to compare.
    """
    from ..layer_plan import low_precision_paths

    if not low_precision_paths(model, plan):
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


def measure(model: Any, plan: Plan, layer_plan: LayerPlan, x: Any, *, rounds: int = ROUNDS, steps: int = STEPS,
            clock: Callable[[], float] | None = None) -> Measurement:
    """Time ``model``'s forward and backward pass, interleaved, as ``layer_plan`` has it and with every layer in
    float32; the model is left as ``layer_plan`` has it (`amp_backends.layer_plan.with_measurement` applies the
    verdict).

    Args:
        model: The Keras model.
        plan: The `Plan` it trains under.
        layer_plan: Its layer plan, as decided.
        x: One batch of what the model takes.
        rounds: Interleaved rounds.
        steps: Steps of each side per round.
        clock: The clock (``time.perf_counter``).

    Returns:
        The `Measurement`: both sides' rates and the verdict.

    Raises:
        Exception: Whatever the model's call raises, the model's policies and non-trainable state put back.
    """
    import time

    import tensorflow as tf

    from .. import layer_plan as lp

    x = tf.nest.map_structure(tf.convert_to_tensor, x)
    if not getattr(model, "built", True):
        model(x, training=False)  # its variables exist before their values are kept
    before = lp.policies(model)
    saved = [(v, v.numpy()) for v in model.non_trainable_variables]
    all_float32 = lp.with_measurement(layer_plan, model, plan, Measurement(FLOAT32, plan.policy))

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
    try:
        lp.apply(model, layer_plan)
        variants = {PLAN: traced()}
        lp.apply(model, all_float32)
        variants[FLOAT32] = traced()
        timings = interleaved(variants, rounds=rounds, steps=steps, units=rows, sync=float,
                              clock=clock or time.perf_counter)
    finally:
        lp.restore(model, before)
        for variable, value in saved:
            variable.assign(value)
    verdict = verdict_of(timings.rates[PLAN], timings.rates[FLOAT32], MARGIN)
    return Measurement(verdict, plan.policy, timings.median(PLAN), timings.median(FLOAT32), timings.spread(PLAN),
                       timings.spread(FLOAT32), rounds, steps, MARGIN)
