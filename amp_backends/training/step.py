r"""The compiled training step: per-replica gradients, one finite flag for all replicas, apply or skip, scale update.

A step is a sequence of `Update`\ s, each with its own `LossScaler`. `StepProgram` builds the compiled calls of
several steps each: on resident arrays, batches gathered from the epoch's permutation (unrolled under XLA on a CPU,
up to `UNROLL_LIMIT`, else a loop whose length is an argument); on a ``tf.data`` iterator, batches pulled inside
the call (under XLA each step is compiled: iterators cannot be). Random draws in a step use `step_seed`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import tensorflow as tf

from ..errors import AmpConfigError, AmpError, InputError, batch_error, lookup_error, mixed_dtypes_error
from ..keras_compat import user_code
from .loss_scaling import LossScaler, apply_groups
from .runs import Position

logger = logging.getLogger("amp_backends.train")

# With XLA on a CPU, up to this many steps per call are unrolled into one graph: in an XLA while loop a step ran 10x
# slower (MNIST CNN, 2 cores). On a GPU the loop is the default: XLA autotunes every copy's fusions, and on an H200
# 16 unrolled steps failed or were still compiling after 67-188 s where a 58-step loop ran in 18.5 s (results/).
UNROLL_LIMIT = 16


def device_type(device: str) -> str:
    """``"GPU"`` of ``"/GPU:0"`` or of ``".../device:GPU:0"`` (``tf.DeviceSpec`` knows no XPU without ITEX)."""
    return device.rsplit("/", 1)[-1].split(":")[-2].upper()


@tf.autograph.experimental.do_not_convert
def float32_outputs(outputs: Any) -> Any:
    """A model's outputs with their floating-point tensors in float32 (losses and metrics computed on them keep their
    digits whatever the policy, as Keras's own ``Loss.__call__`` does); other tensors as they are."""
    return tf.nest.map_structure(lambda t: tf.cast(t, tf.float32) if t.dtype.is_floating else t, outputs)


@dataclass(frozen=True)
class Evaluation:
    """How an update's model is evaluated and asked for predictions (validation, metrics, ``evaluate``, ``predict``).
    Set by `classifier_updates`.

    Attributes:
        predict: ``predict(x)``: the model's outputs with ``training=False``.
        loss: ``loss(y_true, y_pred)``: one float32 loss per example, as the update trains on.
        binary: Whether the loss is a binary cross-entropy (``"accuracy"`` is then binary).
        outputs: How many outputs the model has.
        check: ``check(x)``: refuses data the model cannot take, before it is traced.
        own: ``own()``, right after ``predict``: the model's own losses (regularizers, ``add_loss``), a float32
            scalar added to each example's loss as Keras's ``evaluate`` adds them, or ``None``.
    """

    predict: Callable[[Any], Any]
    loss: Callable[[Any, Any], Any]
    binary: bool = False
    outputs: int = 1
    check: Callable[[Any], None] = lambda x: None
    own: Callable[[], Any] = lambda: None


@dataclass
class Update:
    """One optimisation inside a training step.

    Attributes:
        name: The update's name in logs, checkpoints and results (``"generator"``).
        loss_fn: ``loss_fn(batch)`` runs the forward pass (with ``training=True``) and returns the loss: a scalar,
            or per-example values (of any shape), of which the trainer takes the mean.
        groups: ``(variables, optimizer)`` pairs updated from that one loss.
        validate: ``validate(sample)``, called once before training with the data (all the arrays as ``(x, y)``,
            or a dataset's first batch); raises ``ValueError`` with the fix for data the loss cannot use.
        state: Variables the forward pass changes besides the trained ones, put back by a skipped step.
        check: ``check(batch) -> (ok, batch)`` on every batch in the compiled step: ``ok`` a boolean scalar tensor,
            ``batch`` one the loss can compute on even when not ``ok``; then the step is skipped, and the trainer
            raises `InputError` naming it and ``check_message``.
        check_message: What a batch that fails ``check`` should have been, and the fix.
        evaluation: How validation, metrics, ``Trainer.evaluate`` and ``Trainer.predict`` use the model (an
            `Evaluation`); a ``loss_fn`` that calls `record_predictions` gets metrics on training batches too.
    """

    name: str
    loss_fn: Callable[[Any], Any]
    groups: Sequence[tuple[Sequence[Any], Any]]
    validate: Callable[[Any], None] | None = None
    state: Sequence[Any] = ()
    check: Callable[[Any], tuple[Any, Any]] | None = None
    check_message: str = ""
    evaluation: Evaluation | None = None

    @property
    def variables(self) -> list[Any]:
        """Every variable the update trains, over its groups."""
        return [v for vs, _ in self.groups for v in vs]


# ------------------------------------------------------------------------------------- the program
@tf.autograph.experimental.do_not_convert  # Python checks on static shapes, run while tracing
def _checked_loss(update: Update, loss: Any) -> Any:
    """The update's loss as a float32 scalar; per-example losses are averaged. Raised at trace time: before any step."""
    if not hasattr(loss, "dtype"):  # (None, a number, a list: not a tensor)
        raise AmpConfigError(
            f"The loss_fn of update {update.name!r} must return a float tensor (a scalar, or one value per "
            f"example). Received: {loss!r} (of type {type(loss).__name__}).")
    loss = tf.convert_to_tensor(loss)
    if not loss.dtype.is_floating:
        raise AmpConfigError(
            f"The loss_fn of update {update.name!r} returned a {loss.dtype.name} tensor; a loss must be a "
            "floating-point tensor. Fix: compute it in float32 (tf.cast(..., tf.float32)).")
    if loss.shape.rank != 0:
        if not getattr(update, "_reduced_noted", False):
            logger.info(f"Update {update.name!r}: its loss_fn returned per-example losses of shape {loss.shape}; the "
                        "trainer uses their mean (return a scalar to reduce them another way).")
            update._reduced_noted = True  # type: ignore[attr-defined]
        loss = tf.reduce_mean(loss)
    return tf.cast(loss, tf.float32)


def unrolls(kind: str, xla: bool, steps: int, unroll_steps: bool | None = None) -> bool:
    """Whether a compiled call of ``steps`` training steps copies the step ``steps`` times (else a loop).

    Args:
        kind: The type of device the call runs on (``"CPU"``, ``"GPU"``, ``"XPU"``).
        xla: Whether the call is compiled with XLA.
        steps: The steps per call.
        unroll_steps: The user's choice, or ``None``: unrolled under XLA on a CPU up to `UNROLL_LIMIT` steps.

    Returns:
        ``True`` to unroll.
    """
    if unroll_steps is not None:
        return unroll_steps
    return xla and kind == "CPU" and steps <= UNROLL_LIMIT


class StepProgram:
    """Builds and caches the compiled calls for a list of updates under a plan and a strategy."""

    def __init__(self, updates: Sequence[Update], scalers: dict[str, LossScaler], *, strategy: tf.distribute.Strategy,
                 xla: bool, position: Position, seed: int, device: str = "/CPU:0",
                 unroll_steps: bool | None = None) -> None:
        self.updates, self.scalers, self.strategy, self.xla = list(updates), scalers, strategy, xla
        self.replicas = int(strategy.num_replicas_in_sync)
        self.batch_size, self.seed, self.unroll_steps = position.batch_size, seed, unroll_steps
        self.position = position  # the compiled calls advance it on the device
        self._calls: dict[Any, Any] = {}  # the compiled calls (and the XLA-compiled replica passes) by key
        self._trace_error: InputError | None = None
        self.diagnose: Callable[[], Exception | None] | None = None  # why the models cannot run the batches (or None)
        # XLA per replica needs each replica on its own accelerator: logical CPU devices share one XLA CPU device,
        # where a replica's variables are out of reach of the compiled function
        devices = tuple(strategy.extended.worker_devices) if self.replicas > 1 else ()
        self.device_type = device_type(devices[0] if devices else device)
        self.replica_jit = xla and self.replicas > 1 and bool(devices) and all(
            device_type(d) in ("GPU", "XPU") for d in devices)
        if xla and self.replicas > 1 and not self.replica_jit:
            logger.info(f"XLA is not used for the {self.replicas} replicas on {', '.join(devices)}: compiled per "
                        "replica it needs one accelerator per replica.")

    @contextlib.contextmanager
    def own_errors(self, first_step: int | None = None, steps: int = 1) -> Iterator[None]:
        """Around a call (``steps`` steps from ``first_step``): the library's error raised while tracing comes out as
        itself; TensorFlow's as `lookup_error`, `diagnose` (the model cannot run the batches) or `batch_error` says."""
        self._trace_error = None
        try:
            yield
        except Exception as exc:
            error: Exception | None = self._trace_error
            self._trace_error = None
            invalid = str(exc.message) if isinstance(exc, tf.errors.InvalidArgumentError) else None
            error = error or (lookup_error(invalid, first_step, steps) if invalid is not None else None)
            if error is None and self.diagnose is not None and not isinstance(exc, AmpError) and (
                    type(exc) in (ValueError, TypeError, tf.errors.InvalidArgumentError)):  # (not OOM, not a peer)
                error = self.diagnose()
            error = error or mixed_dtypes_error(exc) or (batch_error(invalid, first_step, steps) if invalid else None)
            if error is not None:
                raise error from None
            raise

    def without_xla(self, reason: str) -> None:
        """Compile the calls without XLA from now on (the data or the model holds what XLA cannot compile)."""
        if not (self.xla or self.replica_jit):
            return
        logger.warning(f"XLA is not used for this training, although the plan has it on: {reason}.")
        self.xla = self.replica_jit = False
        self._calls.clear()

    # -- one step ------------------------------------------------------------------------------
    def _replica_grads(self, u: Update, make_batch: Callable[..., Any], step: Any, *args: Any) -> Any:
        """In each replica: its batch, the scaled loss, unscaled gradients and a non-finite flag."""
        ctx = tf.distribute.get_replica_context()
        n = ctx.num_replicas_in_sync
        with _step_context(self.seed, step, ctx.replica_id_in_sync_group, n):
            batch = make_batch(*args)
            ok, batch = user_code(u.check)(batch) if u.check is not None else (tf.constant(True), batch)
            scaler = self.scalers[u.name]
            with tf.GradientTape() as tape:
                try:
                    loss = _checked_loss(u, user_code(u.loss_fn)(batch))
                except InputError as exc:  # raised while tracing: comes out as itself (see own_errors)
                    self._trace_error = exc
                    raise
                # each replica's mean loss / n: the optimizer sums gradients over replicas, giving the global mean
                scaled = scaler.scale(loss / n if n > 1 else loss)
            grads = scaler.unscale(tape.gradient(scaled, u.variables), u.variables)
        nonfinite = tf.cast(tf.logical_not(scaler.all_finite(grads)), tf.int32)
        return loss, grads, nonfinite, tf.cast(tf.logical_not(ok), tf.int32)

    @staticmethod
    def _apply(u: Update, grads: Sequence[Any]) -> None:
        ends = itertools.accumulate(len(vs) for vs, _ in u.groups)  # (an optimizer of the user's own: converted)
        apply_groups([(user_code(opt.apply_gradients), grads[end - len(vs):end], vs)
                      for (vs, opt), end in zip(u.groups, ends, strict=True)], f"the update {u.name!r}")

    def _grads_fn(self, u: Update, kind: str, make_batch: Callable[..., Any]) -> Any:
        fn = lambda step, *args: self._replica_grads(u, make_batch, step, *args)  # noqa: E731
        if not self.replica_jit:
            return fn
        # the outer step holds the all-reduces and cannot be XLA-compiled: the replica's passes are, once per update
        key = ("replica", u.name, kind)
        if key not in self._calls:
            self._calls[key] = tf.function(fn, jit_compile=True, autograph=False)
        return self._calls[key]

    def one_step(self, kind: str, make_batch: Callable[..., Any], step: Any, replica_args: tuple,
                 stopped: Any = None) -> tuple[Any, Any]:
        """One training step in cross-replica context; returns ``(losses[U], flags[U])``: 1 for a step applied,
        0 for one skipped for non-finite gradients, -1 for a batch its update's ``check`` refused (skipped too).

        Non-finite gradients in *any* replica skip the step in all, so every loss scale changes alike. The apply
        runs in ``tf.cond`` here, outside the replica function: optimizers all-reduce inside ``apply_gradients``.
        A refused batch stops the call: with ``stopped`` (a batch of this call was refused before) every update is
        skipped as refused, and after an update that refuses, the step's later updates are.
        """
        losses, flags = [], []
        stop = tf.constant(False) if stopped is None else stopped
        for u in self.updates:
            before = [tf.identity(v) for v in u.state]  # what a skipped step puts back
            loss, grads, nonfinite, bad = self.strategy.run(self._grads_fn(u, kind, make_batch),
                                                            args=(step, *replica_args))
            finite = tf.equal(self.strategy.reduce(tf.distribute.ReduceOp.SUM, nonfinite, axis=None), 0)
            usable = tf.logical_and(tf.equal(self.strategy.reduce(tf.distribute.ReduceOp.SUM, bad, axis=None), 0),
                                    tf.logical_not(stop))

            def apply(u=u, grads=grads):
                self.strategy.run(self._apply, args=(u, grads))
                return tf.constant(True)

            def skip(u=u, before=before):
                for v, value in zip(u.state, before, strict=True):
                    v.assign(value)
                return tf.constant(False)

            def count(u=u, finite=finite):
                self.scalers[u.name].update(finite)
                return tf.constant(True)

            tf.cond(tf.logical_and(finite, usable), apply, skip)
            tf.cond(usable, count, lambda: tf.constant(False))  # a refused batch changes no loss scale
            stop = tf.logical_or(stop, tf.logical_not(usable))
            losses.append(self.strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None))
            flags.append(tf.where(usable, tf.cast(finite, tf.int32), -1))
        return tf.stack(losses), tf.stack(flags)

    # -- calls on resident arrays --------------------------------------------------------------
    def unrolled(self, k: int) -> bool:
        """Whether a call of ``k`` steps copies the step ``k`` times (else a loop): `unrolls` on this program."""
        return unrolls(self.device_type, self.xla, k, self.unroll_steps)

    def resident_call(self, k: int, batch_fn: Callable[[Any, Any, Any], Any], capacity: int) -> Any:
        """``call(x, y, perm, offset, steps)`` running ``steps`` steps from sample ``offset`` of the permutation.

        Unrolled calls are compiled per ``k``. Looped calls run any ``steps`` up to ``capacity``: their outputs
        always hold ``capacity`` rows (the first ``steps`` meaningful), so no call size compiles them again.
        """
        unroll = self.unrolled(k)
        key = ("resident", "unrolled" if unroll else "loop", k if unroll else capacity, batch_fn)
        if key in self._calls:
            return self._calls[key]
        B = self.batch_size

        def make_batch(x, y, idx):
            ctx = tf.distribute.get_replica_context()
            n = ctx.num_replicas_in_sync
            if n > 1:  # this replica's slice of the global batch
                local = tf.range(B // n, dtype=tf.int64)
                idx = tf.gather(idx, tf.cast(ctx.replica_id_in_sync_group, tf.int64) * (B // n) + local)
            return user_code(batch_fn)(x, y, idx)

        def step_at(x, y, perm, offset, i, stopped):
            # a gather of B positions: a static shape, and no slice bounds that XLA would treat as compile-time
            # constants (recompiling for every call's starting sample)
            idx = tf.gather(perm, offset + tf.cast(i, tf.int64) * B + tf.range(B, dtype=tf.int64))
            return self.one_step("resident", make_batch, self.position.global_step + tf.cast(i, tf.int64), (x, y, idx),
                                 stopped)

        def run(x, y, perm, offset, steps):
            if unroll:  # k copies of the step in one graph: longer compilation, no loop overhead
                outs, stopped = [], tf.constant(False)
                for i in range(k):
                    outs.append(step_at(x, y, perm, offset, i, stopped))
                    stopped = tf.logical_or(stopped, tf.reduce_any(outs[-1][1] < 0))
                losses, flags = tf.stack([o[0] for o in outs]), tf.stack([o[1] for o in outs])
            else:
                def body(i, ta_l, ta_f, stopped):
                    step_losses, step_flags = step_at(x, y, perm, offset, i, stopped)
                    return (i + 1, ta_l.write(i, step_losses), ta_f.write(i, step_flags),
                            tf.reduce_any(step_flags < 0))

                # the bound is the constant capacity (XLA needs one); the condition stops after ``steps``, or after
                # a refused batch
                _, ta_l, ta_f, _ = tf.while_loop(
                    lambda i, _l, _f, stopped: tf.logical_and(i < steps, tf.logical_not(stopped)), body,
                    (tf.constant(0), tf.TensorArray(tf.float32, size=capacity, element_shape=[len(self.updates)]),
                     tf.TensorArray(tf.int32, size=capacity, element_shape=[len(self.updates)]), tf.constant(False)),
                    maximum_iterations=capacity)
                losses, flags = ta_l.stack(), ta_f.stack()
            done = steps_done(flags, steps)
            self._advance(tf.cast(done, tf.int64))
            return losses, flags, done

        self._calls[key] = tf.function(run, jit_compile=self.xla and self.replicas == 1, autograph=False)
        return self._calls[key]

    def _advance(self, steps: Any) -> None:
        """The position moves on by ``steps`` (an int64 tensor) on the device."""
        self.position.global_step.assign_add(steps)
        self.position.samples_in_epoch.assign_add(steps * self.batch_size)

    # -- calls on a tf.data iterator -----------------------------------------------------------
    def stream_call(self) -> Any:
        """``call(iterator, k)``: up to ``k`` steps, fewer where the data ends or a batch is refused; returns
        ``(batches, steps, losses, flags)``: the batches taken, the steps done of them (`steps_done`), and their losses
        and flags. The loop is TensorFlow's own ops (traced without AutoGraph, as all the step's calls)."""
        if "stream" in self._calls:
            return self._calls["stream"]
        step_fn = lambda batch, step: self.one_step("stream", lambda b: b, step, (batch,))  # noqa: E731
        if self.xla and self.replicas == 1:  # iterators cannot be XLA-compiled: the step is, the loop around it not
            step_fn = tf.function(step_fn, jit_compile=True, autograph=False)

        def run(iterator, k):
            def body(done, ta_l, ta_f, ended):  # a batch if there is one; the loop ends without, or after a refused one
                optional = iterator.get_next_as_optional()

                def step():
                    losses, flags = step_fn(optional.get_value(), self.position.global_step + done)
                    i = tf.cast(done, tf.int32)
                    return done + 1, ta_l.write(i, losses), ta_f.write(i, flags), tf.reduce_any(flags < 0)
                return tf.cond(optional.has_value(), step, lambda: (done, ta_l, ta_f, tf.constant(True)))

            array = lambda dtype: tf.TensorArray(dtype, size=0, dynamic_size=True, element_shape=[len(self.updates)])  # noqa: E731
            done, ta_l, ta_f, _ = tf.while_loop(
                lambda done, _l, _f, ended: tf.logical_and(done < tf.cast(k, tf.int64), tf.logical_not(ended)), body,
                (tf.constant(0, tf.int64), array(tf.float32), array(tf.int32), tf.constant(False)))
            flags = ta_f.stack()
            steps = tf.cast(steps_done(flags, tf.cast(done, tf.int32)), tf.int64)
            self._advance(steps)
            return done, steps, ta_l.stack(), flags

        self._calls["stream"] = tf.function(run, autograph=False)
        return self._calls["stream"]


def steps_done(flags: Any, steps: Any) -> Any:
    """How many of a call's ``steps`` count as done, from its flags (``[rows, updates]``, rows past ``steps`` unused):
    all, or those before the first batch refused, which a fit with corrected data runs again (unless an update of
    that step was applied before another refused it: then it counts, so that no update applies one batch twice)."""
    rows = tf.shape(flags)[0]
    refused = tf.logical_and(tf.reduce_any(flags < 0, axis=1), tf.range(rows) < steps)
    first = tf.argmax(tf.cast(tf.concat([refused, [True]], 0), tf.int32), output_type=tf.int32)  # rows: none
    padded = tf.concat([flags, tf.zeros([1, tf.shape(flags)[1]], flags.dtype)], 0)  # (a call of no batch too)
    applied = tf.reduce_any(tf.gather(padded, first) > 0)
    return tf.where(first < rows, first + tf.cast(applied, tf.int32), tf.cast(steps, tf.int32))


# ------------------------------------------------------------------------------------- seeds
_context = threading.local()


def step_seed(salt: int = 0) -> Any:
    """A seed for stateless random ops in a training step: ``tf.random.stateless_uniform(shape, seed=step_seed(1))``.

    From the trainer's seed, the global step, the replica and ``salt``: reproducible, different in every step and
    replica, and continued exactly by a resumed run. Only valid inside a trainer's step.

    Args:
        salt: Tells apart the random draws of one step (a different salt for each).

    Returns:
        A ``[2]`` int64 tensor for ``tf.random.stateless_*``'s ``seed``.

    Raises:
        AmpConfigError: Called outside a training step run by the trainer.
    """
    ctx = getattr(_context, "current", None)
    if ctx is None:
        raise AmpConfigError("step_seed() is only available inside a training step run by amp_backends' Trainer (in "
                             "an Update's loss_fn). Outside, seed random ops yourself (tf.random.stateless_*).")
    seed, step, replica, replicas = ctx
    return tf.stack([tf.constant(seed * 1_000_003 + salt, tf.int64),
                     tf.cast(step, tf.int64) * replicas + tf.cast(replica, tf.int64)])


@contextlib.contextmanager
def _step_context(seed: int, step: tf.Tensor, replica: tf.Tensor, replicas: int) -> Iterator[None]:
    saved = getattr(_context, "current", None)
    _context.current = (seed, step, replica, replicas)
    try:
        yield
    finally:
        _context.current = saved
