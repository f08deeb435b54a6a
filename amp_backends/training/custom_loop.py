"""Loss scaling in a training loop of your own (``tf.GradientTape``), as the trainer does it.

The Keras 2 tutorials scale the loss with ``optimizer.get_scaled_loss`` and unscale the gradients with
``optimizer.get_unscaled_gradients``; Keras 3 has neither. `LossScaler` replaces
both, the same on Keras 2 and Keras 3 and under any plan (``dynamic``, ``fixed`` or ``none`` scaling)::

    scaler = amp_backends.LossScaler(optimizer)           # the plan applied by auto_configure()

    @tf.function(jit_compile=plan.xla)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_object(y, model(x, training=True))
            scaled_loss = scaler.scale(loss)
        grads = tape.gradient(scaled_loss, model.trainable_variables)
        scaler.apply(grads, model.trainable_variables)    # unscale, check, apply or skip, update the scale
        return loss

This module holds what that adds to the trainer's `LossScaler`:
the optimizer and plan it is made from, and `apply_step` — the trainer's own sequence
(unscale, one finite flag for all replicas, ``tf.cond`` apply or skip, scale update).
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from ..errors import AmpConfigError
from ..keras_compat import build_optimizer, loss_scale_of
from ..request import LossScale


def plan_loss_scale(optimizer: Any, plan: Any) -> LossScale:
    """The loss scaling of ``plan`` (by default the one `amp_backends.auto_configure` applied) for a loop
    that trains with ``optimizer``; a clear error for an optimizer that already scales losses or a missing plan."""
    if optimizer is not None:
        if not (hasattr(optimizer, "apply_gradients") and hasattr(optimizer, "build")):
            raise TypeError("LossScaler() takes the Keras optimizer your loop applies gradients with, such as "
                            f"keras.optimizers.Adam(1e-3). Received: {optimizer!r} "
                            f"(of type {type(optimizer).__name__}).")
        mode, _ = loss_scale_of(optimizer)
        if mode != "none":
            raise AmpConfigError(
                f"LossScaler() was given an optimizer that scales losses itself ({mode} loss scaling: a "
                "LossScaleOptimizer or loss_scale_factor), so the loss would be scaled twice. Fix: give it the plain "
                "optimizer (a LossScaleOptimizer's inner_optimizer), and drop the LossScaleOptimizer line.")
    if plan is None:
        from ..configure import current_plan

        plan = current_plan()
        if plan is None:
            raise AmpConfigError(
                "LossScaler() scales losses as the plan says, and no plan is applied yet. Fix: call "
                "amp_backends.auto_configure() before building the model, or pass plan=amp_backends.plan_for(...).")
    config = getattr(plan, "loss_scale", plan)
    if not isinstance(config, LossScale):
        raise TypeError("LossScaler(plan=...) takes an amp_backends Plan (from auto_configure() or plan_for()). "
                        f"Received: {plan!r} (of type {type(plan).__name__}).")
    return config


def _pairs(grads: Any, variables: Any) -> tuple[list[Any], list[Any]]:
    """``grads`` and ``variables`` as two flat lists (both may be nested alike, e.g. ``[emb, dense]`` groups)."""
    flat_g = tf.nest.flatten(list(grads) if not isinstance(grads, (list, tuple)) else grads)
    flat_v = tf.nest.flatten(list(variables) if not isinstance(variables, (list, tuple)) else variables)
    if len(flat_g) != len(flat_v):
        raise ValueError(f"LossScaler.apply(grads, variables) takes one gradient per variable, as tape.gradient(loss, "
                         f"variables) returns them. Received: {len(flat_g)} gradients for {len(flat_v)} variables.")
    return flat_g, flat_v


def _build(scaler: Any, optimizer: Any, variables: Sequence[Any]) -> None:
    """Create the optimizer's state once, before the first ``tf.cond`` (no variable may be made inside a branch)."""
    key = id(optimizer)
    if key in scaler._built_optimizers:
        return
    if not (getattr(optimizer, "built", False) or getattr(optimizer, "_built", False)):
        with tf.init_scope():
            build_optimizer(optimizer, variables)
    scaler._built_optimizers.add(key)


def apply_step(scaler: Any, grads: Any, variables: Any, optimizer: Any) -> Any:
    """Unscale ``grads``, check them, apply them with ``optimizer`` if all are finite (in every replica) or skip
    the step, and advance the scale; returns the boolean tensor ``finite`` (whether the step was applied)."""
    grads, variables = _pairs(grads, variables)
    _build(scaler, optimizer, variables)
    grads = scaler.unscale(grads, variables)
    finite = scaler.all_finite(grads)
    ctx = tf.distribute.get_replica_context()
    if ctx is None or not tf.distribute.has_strategy():  # one replica (or called in cross-replica context)
        tf.cond(finite, lambda: _apply(optimizer, grads, variables), lambda: tf.constant(False))
        scaler.update(finite)
        return finite
    # as the trainer: whether *any* replica's gradients are non-finite, agreed by all; the apply runs under a
    # tf.cond in cross-replica context, because optimizers synchronise (all-reduce) inside apply_gradients
    nonfinite = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), tf.int32))

    def cross_replica(strategy: Any, grads: Any, nonfinite: Any) -> Any:
        agreed = tf.equal(strategy.experimental_local_results(nonfinite)[0], 0)

        def apply() -> Any:
            strategy.extended.call_for_each_replica(lambda g: _apply(optimizer, g, variables), args=(grads,))
            return tf.constant(True)

        tf.cond(agreed, apply, lambda: tf.constant(False))
        scaler.update(agreed)
        return agreed

    return ctx.merge_call(cross_replica, args=(grads, nonfinite))


def _apply(optimizer: Any, grads: Sequence[Any], variables: Sequence[Any]) -> Any:
    optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables, strict=True) if g is not None])
    return tf.constant(True)
