"""Loss scaling that behaves the same on Keras 3 (TF 2.21) and Keras 2 (TF 2.15).

Keras 3's ``LossScaleOptimizer`` is dynamic-only and dropped ``get_scaled_loss`` /
``get_unscaled_gradients``; Keras 2's has fixed scaling and those methods. The trainer therefore scales
losses itself with :class:`LossScaler`, whose whole state lives in ``tf.Variable``\\ s so that it is
checkpointed with the model and works inside compiled (XLA) steps.

One training step goes through these states, in this order (calling out of order is a bug)::

    scale(loss) -> unscale(grads) -> all_finite(grads) -> [apply if finite] -> update(finite)

* ``dynamic``: a non-finite gradient skips the step and halves the scale (down to ``min_scale``); after
  ``growth_interval`` finite steps in a row the scale doubles.
* ``fixed``: the scale never changes; a non-finite step is skipped and counted, and ``consecutive``
  lets the trainer stop after too many in a row (the scale is too high).
* ``none``: scale 1; a non-finite step is still skipped, so no NaN ever reaches the weights.
"""

from __future__ import annotations

from typing import Any, Sequence

from .options import LossScale


class LossScaler:
    """The loss-scale state of one optimizer (or one group of optimizers updated from one loss)."""

    def __init__(self, config: LossScale, name: str = "loss_scale", min_scale: float = 1.0) -> None:
        import tensorflow as tf

        self.config = config
        self.name = name
        self.min_scale = float(min_scale)
        initial = 1.0 if config.mode == "none" else float(config.initial)
        with tf.init_scope():
            self.scale_var = tf.Variable(initial, dtype=tf.float32, trainable=False, name=f"{name}/scale")
            self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}/good_steps")
            self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}/skipped")
            self.consecutive = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}/consecutive_nonfinite")

    # -- the step ------------------------------------------------------------------------------
    def scale(self, loss: Any) -> Any:
        import tensorflow as tf

        if self.config.mode == "none":
            return loss
        return loss * tf.cast(self.scale_var, loss.dtype)

    def unscale(self, grads: Sequence[Any]) -> list[Any]:
        import tensorflow as tf

        if self.config.mode == "none":
            return list(grads)
        inv = 1.0 / self.scale_var
        return [None if g is None else g * tf.cast(inv, g.dtype) for g in grads]

    @staticmethod
    def all_finite(grads: Sequence[Any]) -> Any:
        import tensorflow as tf

        checks = [tf.reduce_all(tf.math.is_finite(g)) for g in grads if g is not None]
        return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)

    def update(self, finite: Any) -> None:
        """Advance the state after a step whose gradients were ``finite`` (a boolean tensor)."""
        import tensorflow as tf

        finite = tf.convert_to_tensor(finite)
        one = tf.constant(1, tf.int64)
        self.skipped.assign_add(tf.where(finite, tf.constant(0, tf.int64), one))
        self.consecutive.assign(tf.where(finite, tf.constant(0, tf.int64), self.consecutive + one))
        if self.config.mode != "dynamic":
            return
        grow = tf.logical_and(finite, self.good_steps + one >= self.config.growth_interval)
        new_scale = tf.where(
            finite,
            tf.where(grow, self.scale_var * 2.0, self.scale_var),
            tf.maximum(self.scale_var * 0.5, self.min_scale),
        )
        # never grow to infinity (a float32 overflow would poison every later step)
        new_scale = tf.where(tf.math.is_finite(new_scale), new_scale, self.scale_var)
        self.scale_var.assign(new_scale)
        self.good_steps.assign(tf.where(tf.logical_and(finite, tf.logical_not(grow)), self.good_steps + one,
                                        tf.constant(0, tf.int64)))

    # -- state -----------------------------------------------------------------------------------
    def variables(self) -> dict[str, Any]:
        return {"scale": self.scale_var, "good_steps": self.good_steps, "skipped": self.skipped,
                "consecutive": self.consecutive}

    @property
    def current(self) -> float:
        return float(self.scale_var.numpy())

    def __repr__(self) -> str:
        return f"LossScaler({self.name}: {self.config}, scale={self.current:g}, skipped={int(self.skipped.numpy())})"
