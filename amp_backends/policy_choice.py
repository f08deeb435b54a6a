"""Whether a model trains faster with every layer in float32 than as its layer plan has it: measured, cached.

A plan is decided from the hardware, before the model exists; a few models run against it. On a CPU with
AVX512-BF16 and no AMX, a model built from depthwise convolutions and sigmoid-type activations (MobileNetV3,
EfficientNet) spends most of its step in ops bfloat16 does not speed up — TensorFlow runs sigmoid and swish
in Eigen, slower in bfloat16 than in float32 (``results/cpu-activations-zen4.json``) — and the plan's float32
layers take away only the worst of it: such a model can still train slower under mixed_bfloat16 than in
float32.

So where the plan keeps layers in float32 and the model has such layers (`worth_measuring`), the
choice can be measured on the model itself (`measure`): its forward and backward pass on one real batch,
as its layer plan has it and with every layer in float32, interleaved (`amp_backends.timing.interleaved`).
A side is chosen only when it wins **every** round by more than `MARGIN`; otherwise the plan stays and
the measurement says "within noise". The answer is cached (`cached`, `remember`) per model
architecture, device, and TensorFlow and Keras versions, so the same model on the same machine gets the same
layer plan every run, measured once. Nothing else changes: the variables are float32 either way (mixed policies
keep them so), and the state a training-mode call updates (BatchNormalization's moving statistics) is put back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import measurement as _measurement
from .layer_plan import worth_measuring
from .measurement import FLOAT32, MARGIN, NOISE, PLAN, Measurement, cached, remember, verdict_of
from .timing import interleaved

if TYPE_CHECKING:
    from .layer_plan import LayerPlan
    from .plan import Plan

__all__ = ["FLOAT32", "MARGIN", "NOISE", "PLAN", "Measurement", "PolicyChoice", "cached", "measure",
           "not_measurable", "remember", "verdict_of", "worth_measuring"]

logger = logging.getLogger("amp_backends")

ROUNDS = 5
STEPS = 2
PolicyChoice = Measurement  # the name earlier releases gave it


def not_measurable(model: Any, plan: Plan) -> str:
    """Why `measure` has nothing to compare on ``model`` ("" when it has)."""
    from .layer_plan import low_precision_paths

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



# ---------------------------------------------------------------------------------------------- measuring
def measure(model: Any, plan: Plan, layer_plan: LayerPlan, x: Any, *, rounds: int = ROUNDS, steps: int = STEPS,
            clock: Callable[[], float] | None = None) -> Measurement:
    """Time ``model``'s forward and backward pass on the batch ``x`` as ``layer_plan`` has it and with every layer
    in float32, interleaved; the model is left as ``layer_plan`` has it, whatever the verdict (the caller applies
    the layer plan with the measurement: `amp_backends.layer_plan.with_measurement`).

    ``x`` is what the model takes (one batch). Raises whatever the model's call raises, with the model's policies
    and non-trainable state as they were.
    """
    import time

    import tensorflow as tf

    from . import layer_plan as lp

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
    verdict = verdict_of(timings.rates[PLAN], timings.rates[FLOAT32], _measurement.MARGIN)
    return Measurement(verdict, plan.policy, timings.median(PLAN), timings.median(FLOAT32), timings.spread(PLAN),
                       timings.spread(FLOAT32), rounds, steps, MARGIN)
