"""The loop: call sizing, position and resume, non-finite and interrupt handling, checkpoints at call ends.

The model code stays the same everywhere; the :class:`~amp_backends.plan.Plan` decides the dtype policy
(set before the models are built), whether the step is XLA-compiled and how losses are scaled. The step
itself is in :mod:`.step`, the input in :mod:`.inputs`, checkpoints in :mod:`.checkpoints`, what watches
training in :mod:`.observers`.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import tensorflow as tf

from ..errors import AmpConfigError, DistributedFailure, InputError, NonFiniteError, TrainingInterrupted
from ..keras_compat import build_optimizer, loss_scale_of
from ..plan import Plan
from .checkpoints import CheckpointStore, ensure_directory
from .distribute import is_chief, worker_id
from .inputs import BatchFn, ResidentArrays, Stream, make_input
from .loss_scaling import LossScaler
from .observers import WARMUP_CALLS, CallRecord, LogLine, Observer, ProfilerWindow, ProgressBar, TensorBoardScalars
from .seeding import current_seed
from .step import StepProgram, Update

logger = logging.getLogger("amp_backends.train")


@dataclass
class _Progress:
    """What one ``fit`` call collects as it goes."""

    throughputs: list[float] = field(default_factory=list)
    history: list[dict[str, float]] = field(default_factory=list)
    last: dict[str, float] = field(default_factory=dict)
    calls: int = 0


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` did. ``skipped``/``applied`` count steps per update over the whole run (resumes included)."""

    steps: int
    epochs_completed: int
    median_throughput: float | None
    throughputs: list[float]
    last_losses: dict[str, float]
    skipped: dict[str, int]
    applied: dict[str, int]
    loss_scales: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)

    def summary(self) -> str:
        tp = f"{self.median_throughput:.4g} img/s" if self.median_throughput else "n/a (too few steps after warm-up)"
        steps = ", ".join(f"{k}: {self.applied[k]} applied, {self.skipped[k]} skipped" for k in self.applied)
        return (f"Summary: {self.steps} steps ({steps}), median throughput {tp}, loss scales "
                + ", ".join(f"{k}={v:g}" for k, v in self.loss_scales.items()) + ", last losses "
                + ", ".join(f"{k}: {v:.5g}" for k, v in self.last_losses.items()))


def parse_profile_steps(text: str | None) -> tuple[int, int] | None:
    """``"20:30"`` -> (20, 30): steps 20..29 are traced. ``None``/``""`` -> no profiling."""
    if not text:
        return None
    try:
        a, b = (int(p) for p in text.split(":"))
    except ValueError:
        raise AmpConfigError(f"--profile-steps must be START:STOP, such as 20:30. Received: {text!r}.") from None
    if not 0 <= a < b:
        raise AmpConfigError(f"--profile-steps must be START:STOP with 0 <= START < STOP, such as 20:30. Received: "
                             f"{text!r}.")
    return a, b


def _checked_arguments(updates: Sequence[Update], replicas: int, *, checkpoint_every: int | None,
                       **positive: Any) -> list[Update]:
    """The updates as a list, after checking every argument of the trainer that can be checked alone.

    Problems raise :class:`AmpConfigError` (a ``ValueError``), or ``TypeError`` for arguments of the wrong kind.
    """
    for name, value in positive.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise AmpConfigError(f"{name} must be an integer >= 1. Received: {name}={value!r}.")
    if checkpoint_every is not None and (not isinstance(checkpoint_every, int) or checkpoint_every < 1):
        raise AmpConfigError(f"checkpoint_every must be an integer >= 1 or None. Received: {checkpoint_every!r}.")
    batch_size = positive["batch_size"]
    if batch_size % replicas:
        raise AmpConfigError(
            f"batch_size is the global batch and must be divisible by the {replicas} replicas in sync. "
            f"Received: batch_size={batch_size}. Fix: use a multiple of {replicas}.")
    updates = list(updates)
    if not updates or not all(isinstance(u, Update) for u in updates):
        raise TypeError(f"updates must be a non-empty list of Update. Received: {updates!r}.")
    names = [u.name for u in updates]
    if len(set(names)) != len(names):
        raise AmpConfigError(f"Update names must be unique (they name losses, scales and logs). Received: {names}.")
    for u in updates:
        if not u.variables:
            raise AmpConfigError(
                f"Update {u.name!r} has no variables to train: its model is not built yet (or every layer is frozen). "
                "Fix: build the model before the Trainer (start it with keras.Input(shape), or call model.build(shape)).")
        for _, opt in u.groups:
            mode, _ = loss_scale_of(opt)
            if mode != "none":
                raise AmpConfigError(
                    f"The optimizer of update {u.name!r} scales losses itself ({mode} loss scaling: a LossScaleOptimizer "
                    "or loss_scale_factor). The Trainer scales losses as the plan says, so they would be scaled twice. "
                    "Fix: give the Trainer the plain optimizer (plan.wrap_optimizer is for Keras fit).")
    return updates


def _build_optimizers(updates: Sequence[Update]) -> None:
    """Create each optimizer's state now (before restore, outside tf.cond), once, for all the variables it updates:
    one optimizer may serve several groups or updates."""
    owned: dict[int, tuple[Any, list[Any]]] = {}
    for u in updates:
        for variables, opt in u.groups:
            owned.setdefault(id(opt), (opt, []))[1].extend(variables)
    for opt, variables in owned.values():
        unique = list({id(v): v for v in variables}.values())
        build_optimizer(opt, unique)


def _default_observers(chief: bool, log_every: int, logdir: str | None, progress: bool | None,
                       profile_steps: tuple[int, int] | None) -> list[Observer]:
    """The log line, TensorBoard and the progress bar (on the chief), the profiler window (everywhere)."""
    out: list[Observer] = []
    if chief:
        out.append(LogLine(log_every))
        if logdir:
            out.append(TensorBoardScalars(logdir))
        if sys.stdout.isatty() if progress is None else progress:
            out.append(ProgressBar())
    if profile_steps and logdir:
        out.append(ProfilerWindow(logdir, profile_steps))
    return out


class _StopSignals:
    """Turn the first Ctrl-C (or SIGTERM) into a request to stop after the current call; a second one acts at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # ignored on purpose (nohup, a background job): it stays ignored
                try:
                    previous = signal.signal(sig, self._handle)
                except (ValueError, OSError):
                    continue
                # None: a handler installed outside Python; the default is the closest we can give back
                self._previous[sig] = signal.SIG_DFL if previous is None else previous
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
        logger.warning(f"{signal.Signals(signum).name} received: stopping after the current call "
                       "(again to stop at once, without a checkpoint).")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Trainer:
    """Train ``updates`` under a plan, on arrays or a ``tf.data`` pipeline (see :meth:`fit`).

    ``checkpoint_objects`` names what is saved besides the loss-scale state and the position (your models
    and optimizers; by default the updates' variables and optimizers). ``images_per_step`` defaults to
    the batch size (the GAN counts ``2 * batch``). ``batch_size`` is the global batch: under a
    ``tf.distribute`` strategy each replica takes its slice. With ``check_models`` the Keras models among
    ``checkpoint_objects`` are checked once, before the first step, for what makes mixed precision slow
    or wrong under the plan (:func:`amp_backends.check_model`), and the findings are logged.
    """

    WARMUP_CALLS = WARMUP_CALLS  # calls excluded from the throughput summary (tracing, XLA compilation)

    def __init__(
        self,
        updates: Sequence[Update],
        plan: Plan,
        *,
        batch_size: int,
        checkpoint_objects: Mapping[str, Any] | None = None,
        images_per_step: int | None = None,
        steps_per_call: int = 1,
        log_every: int = 1,
        logdir: str | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_every: int | None = None,
        keep_checkpoints: int = 3,
        profile_steps: tuple[int, int] | None = None,
        max_consecutive_nonfinite: int = 25,
        progress: bool | None = None,
        seed: int | None = None,
        batch_fn: BatchFn | None = None,
        strategy: Any = None,
        unroll_steps: bool | None = None,
        observers: Sequence[Observer] = (),
        check_models: bool = True,
    ) -> None:
        self.strategy = strategy or tf.distribute.get_strategy()
        self.replicas = int(self.strategy.num_replicas_in_sync)
        updates = _checked_arguments(updates, self.replicas, batch_size=batch_size, steps_per_call=steps_per_call,
                                     log_every=log_every, keep_checkpoints=keep_checkpoints,
                                     max_consecutive_nonfinite=max_consecutive_nonfinite,
                                     checkpoint_every=checkpoint_every)
        self.is_chief = is_chief(self.strategy)
        self.worker = worker_id(self.strategy)
        self.updates = updates
        self.plan = plan
        self.batch_size = int(batch_size)
        self.images_per_step = images_per_step or self.batch_size
        self.steps_per_call = int(steps_per_call)
        self.checkpoint_every = checkpoint_every
        self.max_consecutive_nonfinite = max_consecutive_nonfinite
        self.seed = current_seed() if seed is None else seed
        self.batch_fn = batch_fn
        if logdir:
            ensure_directory(logdir, "logdir")

        with self.strategy.scope():
            self.scalers = {u.name: LossScaler(plan.loss_scale, name=u.name) for u in self.updates}
            _build_optimizers(self.updates)
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
            self.samples_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="samples_in_epoch")
            self.position_batch_size = tf.Variable(self.batch_size, dtype=tf.int64, trainable=False, name="batch_size")
        models = [m for m in (checkpoint_objects or {}).values() if hasattr(m, "layers")]
        # every variable a checkpoint holds and a step can change: never saved with NaN or Inf
        self._weights = [v for v in {id(v): v for v in [*(v for u in self.updates for v in [*u.variables, *u.state]),
                                                       *(v for m in models for v in m.variables)]}.values()
                         if tf.as_dtype(v.dtype).is_floating]  # (not the dropout seed generators' int state)
        self.program = StepProgram(self.updates, self.scalers, strategy=self.strategy, xla=plan.xla,
                                   batch_size=self.batch_size, seed=self.seed, global_step=self.global_step,
                                   samples_in_epoch=self.samples_in_epoch, unroll_steps=unroll_steps)
        self.store = self._make_store(checkpoint_dir, checkpoint_objects, keep_checkpoints) if checkpoint_dir else None
        self.observers = list(observers) + _default_observers(self.is_chief, log_every, logdir, progress, profile_steps)
        self._called: set[Any] = set()
        self._last_input: tuple[Any, Any, Any] | None = None
        self._to_check = models if check_models else []

    # ------------------------------------------------------------------ checkpoints
    def _make_store(self, directory: str, objects: Mapping[str, Any] | None, keep: int) -> CheckpointStore:
        """What a checkpoint holds: the given objects (default: the updates' variables and optimizers), each
        update's loss-scale state and the position (global step, epoch, sample in epoch, batch size)."""
        objects = dict(objects) if objects else {
            **{f"{u.name}_{i}_{part}": obj for u in self.updates for i, (vs, opt) in enumerate(u.groups)
               for part, obj in (("variables", list(vs)), ("optimizer", opt))},
            **{f"{u.name}_state": list(u.state) for u in self.updates if u.state}}
        scaler_state = {name: tf.train.Checkpoint(**s.variables()) for name, s in self.scalers.items()}
        position = tf.train.Checkpoint(global_step=self.global_step, epoch=self.epoch,
                                       samples_in_epoch=self.samples_in_epoch, batch_size=self.position_batch_size)
        return CheckpointStore(
            {**objects, "loss_scale": tf.train.Checkpoint(**scaler_state), "position": position}, directory,
            step_counter=self.global_step, keep=keep, is_chief=self.is_chief, worker=self.worker,
            extra={"batch_size": self.batch_size, "plan": self.plan.summary().split(" (")[0]})

    @property
    def checkpoint_dir(self) -> str | None:
        return self.store.directory if self.store else None

    def weights_finite(self) -> bool:
        return bool(tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in self._weights]).numpy())

    def save(self) -> str | None:
        """Write a checkpoint now (atomically). Non-finite weights are never written: :class:`NonFiniteError`."""
        if not self.store:
            return None
        if not self.weights_finite():
            raise NonFiniteError(
                f"Not saving step {int(self.global_step.numpy())}: the weights contain NaN or Inf. The latest good "
                f"checkpoint is {self.store.latest}. Lower the learning rate or use dynamic loss scaling.")
        with self._collectives(int(self.global_step.numpy())):  # several workers save together
            return self.store.save()

    def restore(self) -> int | None:
        """Restore the newest intact checkpoint, if any; returns its global step."""
        if not self.store:
            return None
        restored = self.store.restore()
        if restored is None:
            return None
        step = int(self.global_step.numpy())
        old_batch = int(self.position_batch_size.numpy())
        samples = int(self.samples_in_epoch.numpy())
        if self.is_chief:
            optimizers = {f"{u.name}[{i}]": int(opt.iterations.numpy()) for u in self.updates
                          for i, (_, opt) in enumerate(u.groups) if hasattr(opt, "iterations")}
            logger.info(f"Resumed from {restored.path}: global step {step}, epoch {int(self.epoch.numpy())}, step in "
                        f"epoch {samples // old_batch}, loss scales "
                        + ", ".join(f"{n}={s.current:g}" for n, s in self.scalers.items())
                        + ", optimizer iterations " + ", ".join(f"{k}={v}" for k, v in optimizers.items()))
            if old_batch != self.batch_size:
                logger.info(f"The checkpoint was written with batch size {old_batch}; this run uses {self.batch_size}: "
                            f"it continues at sample {samples} of epoch {int(self.epoch.numpy())} (the position is "
                            "kept in samples, so no sample is read twice or skipped).")
            then = (restored.stored or {}).get("plan")
            now = self.plan.summary().split(" (")[0]
            if then and then != now:
                logger.info(f"The checkpoint was written under another plan ({then}); this run: {now}.")
        self.position_batch_size.assign(self.batch_size)
        return step

    # ------------------------------------------------------------------ the loop
    def fit(self, x: Any, y: Any = None, *, epochs: int = 1, max_steps: int | None = None, resume: bool = False,
            steps_per_epoch: int | None = None) -> TrainResult:
        """Train until ``epochs`` epochs are complete (counted over the whole run) or ``max_steps`` steps.

        ``x`` is an array, a tuple/list or dict of arrays (several inputs, named features), with optional
        labels ``y`` of the same kinds — kept on the device, each step gathering its batch — or a
        ``tf.data.Dataset`` of batches (``steps_per_epoch`` for one that repeats forever); see
        :mod:`amp_backends.training.inputs`. ``resume`` continues from the newest intact checkpoint; without
        it, a checkpoint directory holding another run's checkpoints is refused. Calling ``fit`` again
        continues where the last call stopped.

        Ctrl-C (or SIGTERM) stops after the current call, saves a checkpoint when checkpointing is on, and
        raises :class:`TrainingInterrupted` (a ``KeyboardInterrupt``) saying where.
        """
        for name, value in (("epochs", epochs), ("max_steps", max_steps)):
            if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive integer{' or None' if name == 'max_steps' else ''}. "
                                 f"Received: {name}={value!r}.")
        if resume and not self.store:
            raise AmpConfigError("fit(resume=True) continues from checkpoints, but this Trainer has no checkpoint_dir. "
                                 "Fix: build the Trainer with checkpoint_dir=..., or leave resume out.")
        source = self._input(x, y, steps_per_epoch)
        if self.store:
            if resume:
                if self.restore() is None and self.is_chief:
                    logger.info(f"Nothing to resume in {self.store.directory}: starting from the beginning.")
            else:
                self.store.ensure_fresh()
        self._announce(source)
        self._check_models()

        progress = _Progress()
        for o in self.observers:
            o.on_fit_start(int(self.global_step.numpy()), self._total_steps(source, epochs, max_steps))
        try:
            with _StopSignals() as stop:
                self._loop(source, epochs, max_steps, progress, stop)
                if stop.signum is not None:
                    self._interrupted(stop.signum)
        finally:
            for o in self.observers:
                o.close()
        if self.store and self.store.last_saved_step != int(self.global_step.numpy()):
            self.save()
        return self._result(source, progress)

    def _loop(self, source: Any, epochs: int, max_steps: int | None, progress: "_Progress", stop: _StopSignals) -> None:
        iterator, fresh = None, False
        while stop.signum is None:
            epoch, step, offset = (int(v.numpy()) for v in (self.epoch, self.global_step, self.samples_in_epoch))
            if epoch >= epochs or (max_steps is not None and step >= max_steps):
                return
            left = self._left_in_epoch(source, offset)
            if left == 0:
                self._next_epoch()
                if not (isinstance(source, Stream) and source.continuous):
                    iterator = None
                continue
            if isinstance(source, Stream) and iterator is None:
                iterator, fresh = source.iterator(self._stream_position(source, epoch, offset)), True
            k = self._call_size(source, left, None if max_steps is None else max_steps - step)
            done = self._call_and_record(source, iterator, k, epoch, offset, step, progress)
            if isinstance(source, Stream) and done < k:  # the data ended inside this call (or at its start)
                if done == 0 and (fresh or offset == 0):
                    raise InputError(f"The dataset yielded no batch of {self.batch_size}: it is empty (or smaller than "
                                     "one batch). Fix: check the pipeline.")
                iterator = None  # a new pass: the next epoch's, or the rest of this one when steps_per_epoch is set
                if not source.continuous:
                    self._next_epoch()
            fresh = fresh and done == 0
            if done == 0:
                continue
            self._check_nonfinite()
            if self.checkpoint_every and (step + done) // self.checkpoint_every > step // self.checkpoint_every:
                self.save()  # at the end of the call that reached a multiple of checkpoint_every

    def _stream_position(self, source: "Stream", epoch: int, offset: int) -> int:
        """Batches of the current pass already trained on: a resumed run skips them."""
        done = offset // self.batch_size
        if not source.continuous:
            return done
        done += epoch * source.fixed_steps  # one stream across epochs, passes restarting at its end
        return done % source.cardinality if source.cardinality else done

    def _call_and_record(self, source: Any, iterator: Any, k: int, epoch: int, offset: int, step: int,
                         progress: "_Progress") -> int:
        """Run one compiled call of up to ``k`` steps and tell the observers; returns the steps it ran."""
        for o in self.observers:
            o.before_call(step, k)
        fn, key = self._call(source, k)
        t0 = time.perf_counter()
        done, losses, finite = self._run(fn, source, iterator, k, epoch, offset, step)
        dt = time.perf_counter() - t0
        compiling = key not in self._called
        self._called.add(key)
        if done == 0:
            return 0
        progress.calls += 1
        step_time = dt / done
        throughput = self.images_per_step / step_time
        if progress.calls > self.WARMUP_CALLS and not compiling:
            progress.throughputs.append(throughput)
        names = [u.name for u in self.updates]
        progress.last = {n: float(losses[-1][j]) for j, n in enumerate(names)}
        progress.history.append({"step": step + done, "throughput": throughput, **progress.last})
        record = CallRecord(epoch, offset // self.batch_size, step + done, done, names, losses, finite, step_time,
                            throughput, {n: s.current for n, s in self.scalers.items()},
                            {n: int(s.skipped.numpy()) for n, s in self.scalers.items()})
        for o in self.observers:
            o.after_call(record)
        return done

    def _result(self, source: Any, progress: "_Progress") -> TrainResult:
        skipped = {n: int(s.skipped.numpy()) for n, s in self.scalers.items()}
        steps = int(self.global_step.numpy())
        # an epoch whose last batch is done counts, even before the position rolls over to the next one
        ended = self._left_in_epoch(source, int(self.samples_in_epoch.numpy())) == 0
        result = TrainResult(
            steps=steps,
            epochs_completed=int(self.epoch.numpy()) + int(ended),
            median_throughput=statistics.median(progress.throughputs) if progress.throughputs else None,
            throughputs=progress.throughputs,
            last_losses=progress.last,
            skipped=skipped,
            applied={n: steps - s for n, s in skipped.items()},
            loss_scales={n: s.current for n, s in self.scalers.items()},
            history=progress.history,
        )
        if self.is_chief:
            logger.info(result.summary())
        return result

    # ------------------------------------------------------------------ helpers of the loop
    def _input(self, x: Any, y: Any, steps_per_epoch: int | None) -> ResidentArrays | Stream:
        """The input for ``fit(x, y)``, validated by the updates. The same arrays as in the last call (the same
        objects) are not copied to the device or checked again: calling ``fit`` once per epoch costs nothing."""
        cached = self._last_input
        if cached is not None and cached[0] is x and cached[1] is y and isinstance(cached[2], ResidentArrays):
            return cached[2]
        source = make_input(x, y, batch_size=self.batch_size, device=self.plan.device, seed=self.seed,
                            strategy=self.strategy, batch_fn=self.batch_fn, steps_per_epoch=steps_per_epoch)
        for u in self.updates:
            if u.validate is not None:
                u.validate(source.sample_batch())
        self._last_input = (x, y, source)
        return source

    def _left_in_epoch(self, source: Any, offset: int) -> int | None:
        """Steps left in the epoch from sample ``offset`` (``None``: a stream of unknown length)."""
        return source.steps_in_epoch(offset if isinstance(source, ResidentArrays) else offset // self.batch_size)

    def _next_epoch(self) -> None:
        self.epoch.assign_add(1)
        self.samples_in_epoch.assign(0)

    def _total_steps(self, source: Any, epochs: int, max_steps: int | None) -> int | None:
        per_epoch = source.steps_per_epoch
        if per_epoch is None:
            return max_steps
        done_epochs = int(self.epoch.numpy())
        rest = (epochs - done_epochs) * per_epoch - int(self.samples_in_epoch.numpy()) // self.batch_size
        total = int(self.global_step.numpy()) + max(rest, 0)
        return total if max_steps is None else min(total, max_steps)

    def _epoch_remainder(self, source: Any) -> int | None:
        per_epoch = source.steps_per_epoch
        return None if per_epoch is None else per_epoch % self.steps_per_call

    def _call_size(self, source: Any, left: int | None, budget: int | None) -> int:
        """Full calls of ``steps_per_call``; a shorter stretch runs as one call where the call size is free."""
        k = self.steps_per_call
        room = min(v for v in (k, left, budget) if v is not None)
        if room == k or isinstance(source, Stream) or not self.program.unrolled(k):
            return room  # streams and looped calls take their length as an argument: no new compilation
        # unrolled calls compile per size: the epoch's regular last call gets its own; other short stretches
        # (a resumed mid-epoch start, --max-steps) run as single steps
        return room if room == self._epoch_remainder(source) else 1

    def _call(self, source: Any, k: int) -> tuple[Any, Any]:
        """The compiled call for ``k`` steps, and the key under which it was compiled."""
        if isinstance(source, Stream):
            return self.program.stream_call(), "stream"
        fn = self.program.resident_call(k, source.batch_fn, capacity=self.steps_per_call)
        return fn, (k if self.program.unrolled(k) else "loop")

    def _run(self, fn: Any, source: Any, iterator: Any, k: int, epoch: int, offset: int, step: int) -> tuple[int, Any, Any]:
        with self._collectives(step):
            if isinstance(source, ResidentArrays):
                losses, finite = fn(source.x, source.y, source.permutation(epoch), tf.constant(offset, tf.int64),
                                    tf.constant(k, tf.int32))
                return k, losses.numpy()[:k], finite.numpy()[:k]
            done, losses, finite = fn(iterator, tf.constant(k, tf.int32))
            return int(done.numpy()), losses.numpy(), finite.numpy()

    @contextlib.contextmanager
    def _collectives(self, step: int) -> Iterator[None]:
        """Work with the other workers (a training call, a collective save): a failure says who to restart, how."""
        try:
            yield
        except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.CancelledError,
                tf.errors.AbortedError, tf.errors.InternalError) as exc:
            if getattr(self.strategy, "cluster_resolver", None) is None:
                raise
            latest = self.store.latest if self.store else None
            raise DistributedFailure(
                f"Worker {self.worker}: a collective with the other workers failed at step {step} "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:300]}). Another worker died, hung past the "
                f"cluster timeout or cannot be reached. Restart every worker with --resume to continue from "
                f"{latest or 'the start (no checkpoint yet)'}."
            ) from None

    def _announce(self, source: Any) -> None:
        if not self.is_chief:
            return
        k = self.steps_per_call
        per_epoch = source.steps_per_epoch
        what = (f"{source.samples} samples resident on {self.plan.device}" if isinstance(source, ResidentArrays)
                else "a tf.data pipeline")
        lines = [f"Training on {what}: batch {self.batch_size}, "
                 + (f"{per_epoch} steps per epoch" if per_epoch is not None else "epochs end with the data")
                 + f", {k} step{'s' if k > 1 else ''} per compiled call"]
        rem = self._epoch_remainder(source)
        if k > 1 and per_epoch is not None and rem:
            lines.append(f"each epoch: {per_epoch // k} full calls and one of {rem} steps")
        if self.checkpoint_every and k > 1 and self.checkpoint_every % k:
            lines.append(f"checkpoints at the end of the call that reaches each multiple of {self.checkpoint_every} "
                         f"steps (calls are never cut)")
        logger.info("; ".join(lines))

    def _check_models(self) -> None:
        """Log the precision check of each model once; a check that fails never stops training."""
        models, self._to_check = self._to_check, []
        if not self.is_chief:
            return
        from ..model_check import check_model

        for model in models:
            try:
                result = check_model(model, self.plan, batch_size=self.batch_size // self.replicas)
            except Exception as exc:
                logger.warning(f"The precision check of {getattr(model, 'name', model)!r} failed ({type(exc).__name__}: "
                               f"{str(exc)[:200]}); training goes on.")
                continue
            for line in result.log_lines():
                logger.info(line)

    def _check_nonfinite(self) -> None:
        for name, s in self.scalers.items():
            if not s.stalled(self.max_consecutive_nonfinite):
                continue
            saved = None
            if self.store and self.weights_finite() and getattr(self.strategy, "cluster_resolver", None) is None:
                saved = self.save()
            raise NonFiniteError(
                f"{int(s.consecutive.numpy())} consecutive steps of '{name}' had non-finite gradients "
                f"({s.config.mode} loss scaling, scale {s.current:g}): every one was skipped, so training made no "
                f"progress. Remedy: {s.remedy()}."
                + (f" The last finite state was saved to {saved}; continue with --resume after the fix." if saved else ""))

    def _interrupted(self, signum: int) -> None:
        step = int(self.global_step.numpy())
        name = signal.Signals(signum).name
        path = None
        if self.store and getattr(self.strategy, "cluster_resolver", None) is None:
            # (several workers save collectively: one interrupted worker cannot; their last checkpoint stands)
            path = self.save() if self.store.last_saved_step != step else self.store.latest
        if path:
            message = f"Interrupted ({name}) at step {step}: checkpoint saved to {path}. Continue with --resume."
        elif self.store:
            message = (f"Interrupted ({name}) at step {step}: the last checkpoint is "
                       f"{self.store.latest or 'none'} (several workers save together; this one could not alone).")
        else:
            message = f"Interrupted ({name}) at step {step}: checkpointing is off, nothing was saved."
        if self.is_chief:
            logger.warning(message)
        raise TrainingInterrupted(signum, step, path, message)

