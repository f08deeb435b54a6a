r"""Loss scaling that behaves the same on Keras 3 (TF 2.21) and Keras 2 (TF 2.15), sparse gradients included.

Keras 3's ``LossScaleOptimizer`` is dynamic-only and dropped ``get_scaled_loss`` / ``get_unscaled_gradients``;
so the trainer scales losses itself with `LossScaler`, whose state lives in ``tf.Variable``\ s (checkpointed with
the model, usable in XLA steps). A step runs, in this order::

    scale(loss) -> unscale(grads) -> all_finite(grads) -> [apply if finite] -> update(finite)

``dynamic`` halves the scale on a non-finite step (down to ``min_scale``) and doubles it after ``growth_interval``
finite steps; ``fixed`` never changes it; ``none`` is scale 1. Every mode skips a non-finite step, and
`LossScaler.stalled` says when skipping can no longer help. Sparse gradients (``tf.IndexedSlices``) stay sparse.
A ``tf.GradientTape`` loop of your own uses `LossScaler` in place of Keras 2's ``get_scaled_loss`` /
``get_unscaled_gradients`` (docs/custom-loop.md).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

import tensorflow as tf

from ..errors import AmpConfigError, NonFiniteError
from ..keras_compat import build_optimizer, loss_scale_of, not_an_optimizer
from ..plan import Plan
from ..request import LossScale

logger = logging.getLogger("amp_backends.train")


def _map_values(g: Any, fn: Any) -> Any:
    """``fn`` applied to a dense gradient, or to the values of a sparse one (which stays sparse)."""
    if g is None:
        return None
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(fn(g.values), g.indices, g.dense_shape)
    return fn(g)


class LossScaler(tf.__internal__.tracking.Trackable):
    """The loss-scale state of one update (one loss, one or several optimizers).

    In a loop of your own, ``LossScaler(optimizer)`` scales as the applied plan says: per step ``scaled =
    scaler.scale(loss)`` inside the tape, then ``scaler.apply(tape.gradient(scaled, variables), variables)``.
    The trainer makes it from a `LossScale` instead, and drives the steps itself. A checkpoint keeps its state
    beside the model's and the optimizer's: ``tf.train.Checkpoint(model=model, optimizer=optimizer,
    scaler=scaler)`` (the variables of `variables`; a resumed loop goes on at the saved scale).

    Args:
        optimizer: The optimizer of a loop of your own (or, the trainer's form, a `LossScale`).
        name: The name of its variables in checkpoints.
        min_scale: The lowest scale dynamic scaling halves down to.
        plan: The plan whose loss scaling to follow (default: the applied one).
    """

    def __init__(self, optimizer: Any = None, name: str = "loss_scale", min_scale: float = 1.0, *,
                 plan: Plan | None = None) -> None:
        if isinstance(optimizer, LossScale):  # the trainer's form: the loss scaling itself
            self.config, self.optimizer = optimizer, None
        else:
            self.config, self.optimizer = plan_loss_scale(optimizer, plan), optimizer
        self.name, self.min_scale = name, float(min_scale)
        self._built_optimizers: set[int] = set()
        initial = 1.0 if self.config.mode == "none" else float(self.config.initial)
        with tf.init_scope():
            self.scale_var = tf.Variable(initial, dtype=tf.float32, trainable=False, name=f"{name}/scale")
            self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}/good_steps")
            self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}/skipped")
            self.consecutive = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}/consecutive_nonfinite")
        for key, variable in self.variables().items():  # what tf.train.Checkpoint(scaler=...) saves and restores
            self._track_trackable(variable, name=key)

    # -- the step ------------------------------------------------------------------------------
    def scale(self, loss: Any) -> Any:
        """The loss times the scale, in float32 (a float16 loss times 65536 would be Inf).

        Args:
            loss: The loss, inside the ``tf.GradientTape``.

        Returns:
            The scaled loss to differentiate (the loss itself without loss scaling).
        """
        if self.config.mode == "none":
            return loss
        loss = tf.convert_to_tensor(loss)
        if loss.dtype in (tf.float16, tf.bfloat16):
            loss = tf.cast(loss, tf.float32)
        return loss * tf.cast(self.scale_var, loss.dtype)

    def apply(self, grads: Any, variables: Any, optimizer: Any = None) -> Any:
        """One step of a loop of your own, after `scale`: unscale ``grads``, apply them if all are finite in every
        replica (else skip the step), then update the scale; in ``tf.function`` (XLA too) and ``strategy.run``.
        Call it once a step: groups with optimizers of their own go in one call, one finite check for all.

        Args:
            grads: ``tape.gradient`` of the scaled loss (groups nested alike: ``[emb_grads, dense_grads]``).
            variables: The variables the gradients belong to (``[emb_vars, dense_vars]``).
            optimizer: The optimizer (default: the scaler's), or a list of one optimizer per variable group.

        Returns:
            Whether the step was applied (a boolean tensor).

        Raises:
            TypeError: No optimizer, here or at construction.
            ValueError: Not one gradient per variable, or not one variable group per optimizer.
        """
        optimizer = self.optimizer if optimizer is None else optimizer
        if optimizer is None:
            raise AmpConfigError(
                "LossScaler.apply() needs the optimizer: make the scaler with it (LossScaler(optimizer)) "
                "or pass apply(grads, variables, optimizer=...).")
        groups = _groups(optimizer, grads, variables)
        for opt, _, vs in groups:
            if id(opt) not in self._built_optimizers:  # its state made once, before the first tf.cond
                if not (getattr(opt, "built", False) or getattr(opt, "_built", False)):
                    with tf.init_scope():  # (no variable may be made inside a branch)
                        build_optimizer(opt, vs)
                self._built_optimizers.add(id(opt))
        grads = [self.unscale(g, vs) for _, g, vs in groups]
        finite = self.all_finite([g for gs in grads for g in gs])
        ctx = tf.distribute.get_replica_context()
        if ctx is None or not tf.distribute.has_strategy():  # one replica (or called in cross-replica context)
            tf.cond(finite, lambda: _apply(groups, grads), lambda: tf.constant(False))
            self.update(finite)
            return finite
        # as the trainer: whether *any* replica's gradients are non-finite, agreed by all; the apply runs under a
        # tf.cond in cross-replica context, because optimizers synchronise (all-reduce) inside apply_gradients
        nonfinite = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), tf.int32))

        def cross_replica(strategy: Any, grads: Any, nonfinite: Any) -> Any:
            agreed = tf.equal(strategy.experimental_local_results(nonfinite)[0], 0)

            def apply() -> Any:
                strategy.extended.call_for_each_replica(lambda g: _apply(groups, g), args=(grads,))
                return tf.constant(True)

            tf.cond(agreed, apply, lambda: tf.constant(False))
            self.update(agreed)
            return agreed

        return ctx.merge_call(cross_replica, args=(grads, nonfinite))

    def unscale(self, grads: Sequence[Any], variables: Sequence[Any] | None = None) -> list[Any]:
        """Gradients divided by the scale; those of ``variables`` that Keras overwrites with their "gradient"
        (float8 layers' scale and amax history, ``overwrite_with_gradient``) are new values, left as they are.

        Args:
            grads: Gradients of the scaled loss.
            variables: The variables they belong to (to find those Keras overwrites).

        Returns:
            The unscaled gradients.
        """
        if self.config.mode == "none":
            return list(grads)
        inv = 1.0 / self.scale_var
        keep = [getattr(v, "overwrite_with_gradient", False) for v in (variables or [None] * len(grads))]
        return [g if k else _map_values(g, lambda t: t * tf.cast(inv, t.dtype))
                for g, k in zip(grads, keep, strict=True)]

    @staticmethod
    def all_finite(grads: Sequence[Any]) -> Any:
        """Whether every gradient is finite.

        Args:
            grads: Gradients (``None`` entries are left out).

        Returns:
            A boolean scalar tensor.
        """
        checks = [tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
                  for g in grads if g is not None]
        return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)

    def update(self, finite: Any) -> None:
        """Advance the state after a step: count a skipped step, and grow or halve a dynamic scale.

        Args:
            finite: Whether the step's gradients were finite (a boolean tensor).
        """
        finite = tf.convert_to_tensor(finite)
        zero, one = tf.constant(0, tf.int64), tf.constant(1, tf.int64)
        self.skipped.assign_add(tf.where(finite, zero, one))
        self.consecutive.assign(tf.where(finite, zero, self.consecutive + one))
        if self.config.mode != "dynamic":
            return
        grow = tf.logical_and(finite, self.good_steps + one >= self.config.growth_interval)
        new_scale = tf.where(finite, tf.where(grow, self.scale_var * 2.0, self.scale_var),
                             tf.maximum(self.scale_var * 0.5, self.min_scale))
        # never grow to infinity (a float32 overflow would poison every later step)
        new_scale = tf.where(tf.math.is_finite(new_scale), new_scale, self.scale_var)
        self.scale_var.assign(new_scale)
        self.good_steps.assign(tf.where(tf.logical_and(finite, tf.logical_not(grow)), self.good_steps + one, zero))

    # -- when skipping cannot help any more ------------------------------------------------------
    def stalled(self, limit: int) -> bool:
        """True after ``limit`` non-finite steps in a row that lowering the scale can no longer cure: for ``dynamic``,
        only once its scale sits at ``min_scale`` too (``none`` and ``fixed`` never change their scale).

        Args:
            limit: How many non-finite steps in a row count as stalled.

        Returns:
            Whether training cannot go on.
        """
        if int(self.consecutive.numpy()) < limit:
            return False
        return self.config.mode != "dynamic" or self.current <= self.min_scale

    def remedy(self) -> str:
        """What to do when `stalled`, by the loss scale's mode.

        Returns:
            The remedy, naming what a caller changes (the plan's overrides: ``auto_configure(loss_scale=...)`` or
            ``$AMP_LOSS_SCALE``); a command line says its own flags.
        """
        if self.config.mode == "fixed":
            lower = f"fixed:{max(self.current / 64, 1):g}"
            return (f"the fixed loss scale {self.current:g} is too high: lower it with the plan override "
                    f"loss_scale='{lower}' (auto_configure(loss_scale='{lower}'), or AMP_LOSS_SCALE={lower}), or use "
                    "dynamic loss scaling (loss_scale='dynamic')")
        cause = ("the gradients stay non-finite even at loss scale 1, so" if self.config.mode == "dynamic" else
                 "without loss scaling") + " the loss or the forward pass itself is NaN or Inf"
        return (f"{cause}: check the inputs for NaN/Inf, lower the learning rate, and check the model in float32 "
                "(the plan overrides policy='float32' and tf32='off', or AMP_POLICY=float32 AMP_TF32=off: TF32 "
                "and ITEX's BF32 run float32 matmuls in reduced precision) to see whether the reduced precision "
                "is the cause (float16's range ends at 65504; bfloat16 keeps about 2 significant digits)")

    def stalled_error(self, saved: str | None) -> NonFiniteError:
        """The error that ends training when `stalled`, carrying what to change for a command line to say in its own
        flags: ``overrides`` (``{"loss_scale": "fixed:16"}``, say) and ``resume`` (whether a saved state continues).

        Args:
            saved: Where the last finite state was saved, or ``None``.

        Returns:
            The error, for the caller to raise.
        """
        return NonFiniteError(
            f"{int(self.consecutive.numpy())} consecutive steps of '{self.name}' had non-finite gradients "
            f"({self.config.mode} loss scaling, scale {self.current:g}): every one was skipped, so training made no "
            f"progress. Remedy: {self.remedy()}."
            + (f" The last finite state was saved to {saved}; continue from it with fit(..., resume=True) after the "
               "fix." if saved else ""),
            overrides=({"loss_scale": f"fixed:{max(self.current / 64, 1):g}"} if self.config.mode == "fixed"
                       else {"policy": "float32", "tf32": "off"}),  # (the remedy's float32 check: TF32/BF32 off too)
            resume=bool(saved))

    # -- state -----------------------------------------------------------------------------------
    def restart(self) -> None:
        """Back to the state a new run starts in: the config's initial scale (1 for ``none``), no good steps in a
        row. For a state restored from a checkpoint written under other loss scaling (`resume`)."""
        self.scale_var.assign(1.0 if self.config.mode == "none" else float(self.config.initial))
        self.good_steps.assign(0)
        self.consecutive.assign(0)

    def follow(self, then: Mapping[str, Any] | None, say: bool = True) -> str | None:
        """After a restore: where the checkpoint's loss scaling differs from this one, start afresh at the plan's
        initial scale (`restart`); the same dynamic scaling continues from the restored scale.

        Args:
            then: The checkpoint's loss scaling (its config as a dict); ``None`` (an older one): followed as is.
            say: Log the line that says what changed.

        Returns:
            That line, or ``None`` when nothing changed.
        """
        new = self.config.to_dict()
        if then is None or then == new or (then.get("mode") == new["mode"] == "dynamic"):
            return None
        restored = self.current
        self.restart()
        mode = then.get("mode")
        kind = f"fixed ({then.get('scale', 0):g})" if mode == "fixed" else str(mode)
        was = "without loss scaling" if mode == "none" else f"with {kind} loss scaling"
        if self.config.mode == "none":
            now = f"this plan scales no losses: the restored scale {restored:g} of {self.name!r} is dropped"
        else:
            now = (f"this plan's loss scaling is {self.config}: {self.name!r} starts at scale {self.current:g}, as a "
                   f"new run does, not at the restored {restored:g}")
        line = f"The checkpoint was written {was}; {now}."
        if say:
            logger.info(line)
        return line

    def variables(self) -> dict[str, Any]:
        """The scaler's state to checkpoint.

        Returns:
            The scale, the finite steps since it changed, and the steps skipped, as TensorFlow variables by name.
        """
        return {"scale": self.scale_var, "good_steps": self.good_steps, "skipped": self.skipped,
                "consecutive": self.consecutive}

    @property
    def current(self) -> float:
        """The loss scale now."""
        return float(self.scale_var.numpy())

    def __repr__(self) -> str:
        return f"LossScaler({self.name}: {self.config}, scale={self.current:g}, skipped={int(self.skipped.numpy())})"


def check_stalled(scalers: Mapping[str, LossScaler], limit: int, save: Callable[[], str | None]) -> None:
    """The error of the first update whose steps were all skipped ``limit`` times in a row, after ``save()`` (which
    writes a checkpoint where it can and returns its path)."""
    for s in scalers.values():
        if s.stalled(limit):
            raise s.stalled_error(save())


def plan_loss_scale(optimizer: Any, plan: Plan | None) -> LossScale:
    """The loss scaling of ``plan`` (by default the one `amp_backends.auto_configure` applied) for a loop
    that trains with ``optimizer``; a clear error for an optimizer that already scales losses or a missing plan."""
    if optimizer is not None:
        if (got := not_an_optimizer(optimizer)) is not None or not hasattr(optimizer, "build"):
            raise AmpConfigError("LossScaler() takes the Keras optimizer your loop applies gradients with, such as "
                                 f"keras.optimizers.Adam(1e-3). Received: {got or repr(optimizer)}. Fix: "
                                 "LossScaler(optimizer)" + (
                                     ", and a plan by keyword: LossScaler(optimizer, plan=plan)."
                                     if isinstance(optimizer, Plan) else "."))
        if (mode := loss_scale_of(optimizer)[0]) != "none":
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
        raise AmpConfigError("LossScaler(plan=...) takes an amp_backends Plan (from auto_configure() or plan_for()). "
                             f"Received: {plan!r} (of type {type(plan).__name__}).")
    return config


def _groups(optimizer: Any, grads: Any, variables: Any) -> list[tuple[Any, list[Any], list[Any]]]:
    """``(optimizer, gradients, variables)`` per optimizer, as flat lists (each may be nested alike, e.g. ``[emb,
    dense]`` groups): one group, or one per optimizer of a list."""
    n = [len(x) if isinstance(x, (list, tuple)) else 1 for x in (grads, variables)]  # (traced: no ":=")
    if not isinstance(optimizer, (list, tuple)):
        optimizer, grads, variables = [optimizer], [grads], [variables]
    elif n != [len(optimizer)] * 2:
        raise AmpConfigError(
            f"LossScaler.apply(grads, variables, optimizer=[...]) takes one variable group per optimizer. "
            f"Received: {len(optimizer)} optimizers, {n[0]} gradient and {n[1]} variable groups. Fix: "
            "apply([emb_grads, dense_grads], [emb_vars, dense_vars], optimizer=[emb_opt, dense_opt]).")
    groups = []
    for o, g, v in zip(optimizer, grads, variables, strict=True):
        flat_g, flat_v = (tf.nest.flatten(a if isinstance(a, (list, tuple)) else list(a)) for a in (g, v))
        if len(flat_g) != len(flat_v):
            raise AmpConfigError(
                f"LossScaler.apply(grads, variables) takes one gradient per variable, as tape.gradient("
                f"loss, variables) returns them. Received: {len(flat_g)} gradients for {len(flat_v)} "
                "variables.")
        for grad, var in ((g, v) for g, v in zip(flat_g, flat_v, strict=True) if hasattr(g, "shape")):
            shapes = tf.TensorShape(grad.shape), tf.TensorShape(var.shape)
            if all(s.is_fully_defined() for s in shapes) and shapes[0] != shapes[1]:
                raise AmpConfigError(
                    f"LossScaler.apply(grads, variables) takes each variable's gradient, of its shape. Received a "
                    f"gradient of shape {tuple(shapes[0])} for {getattr(var, 'name', 'a variable')} of shape "
                    f"{tuple(shapes[1])}. Fix: pass the gradients in the variables' order, as tape.gradient(loss, "
                    "variables) returns them.")
        groups.append((o, flat_g, flat_v))
    return groups


def _apply(groups: Sequence[tuple[Any, list[Any], list[Any]]], grads: Sequence[Sequence[Any]]) -> Any:
    apply_groups([(optimizer.apply_gradients, gs, variables) for (optimizer, _, variables), gs
                  in zip(groups, grads, strict=True)], "the loss given to LossScaler.apply")
    return tf.constant(True)


def build_optimizers(groups: Sequence[tuple[Sequence[Any], Any]]) -> None:
    """Create each optimizer's state now (before a restore, outside ``tf.cond``), once, for all the variables it
    updates: one optimizer may serve several groups or updates.

    Args:
        groups: ``(variables, optimizer)`` pairs: every update's groups (``Update.groups``).
    """
    owned: dict[int, tuple[Any, list[Any]]] = {}
    for variables, opt in groups:
        owned.setdefault(id(opt), (opt, []))[1].extend(variables)
    for opt, variables in owned.values():
        build_optimizer(opt, list({id(v): v for v in variables}.values()))


def apply_groups(groups: Sequence[tuple[Callable[[Any], Any], Sequence[Any], Sequence[Any]]], whose: str) -> None:
    """Apply each variable group's gradients with its optimizer, leaving out the variables without a gradient (Keras's
    ``apply_gradients`` takes no ``None``) and a group the loss does not reach at all (frozen by ``tf.stop_gradient``).

    Args:
        groups: ``(apply_gradients, grads, variables)`` per group: an optimizer's ``apply_gradients``, then
            ``tape.gradient(loss, variables)`` (``None`` where the loss does not depend on the variable) and the
            variables, one per gradient.
        whose: Whose loss it is, for the message (``"the update 'model'"``).

    Raises:
        AmpConfigError: No variable of any group has a gradient (Keras would fail inside its optimizer).
    """
    pairs = [[(g, v) for g, v in zip(grads, variables, strict=True) if g is not None] for _, grads, variables in groups]
    every = [v for _, _, variables in groups for v in variables]
    if every and not any(pairs):
        names = ", ".join(str(getattr(v, "path", None) or getattr(v, "name", "?")) for v in every[:3])
        raise AmpConfigError(
            f"The loss of {whose} has no gradient with respect to any of the {len(every)} variables it trains "
            f"({names}{', ...' if len(every) > 3 else ''}): it is not computed from them. Expected a loss computed "
            "from the variables it trains. Fix: train the variables of the model the loss calls "
            "(model.trainable_variables), and take tf.stop_gradient out of the loss.")
    for (apply_gradients, _, _), group in zip(groups, pairs, strict=True):
        if group:
            apply_gradients(group)
