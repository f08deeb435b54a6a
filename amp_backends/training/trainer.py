"""The trainer: compiled calls in a loop under a plan (dtype policy, XLA, loss scaling), and what ``fit`` returns."""

from __future__ import annotations

import functools
import inspect
import logging
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, cast

import tensorflow as tf

from ..errors import AmpConfigError, xla_compile_failure
from ..keras_compat import loss_scale_of
from ..plan import Plan, require_plan
from .distribute import is_chief, worker_id
from .inputs import BatchFn, Ran, Source, input_for, is_count
from .loss_scaling import LossScaler, build_optimizers, check_stalled
from .observers import WARMUP_CALLS, Observer, default_observers, training_line
from .precision import FirstBatch, TrainedModels, trained_models
from .resume import Checkpointing, nothing_left
from ..seeds import current_seed
from .runs import At, Position, check_directory, parse_profile_steps
from .step import StepProgram, Update
from .tasks import check_fit_arguments, check_trainer_keywords
from .metrics import Progress
from .validation import Evaluator, Validation

__all__ = ["Trainer", "TrainResult"]

logger = logging.getLogger("amp_backends.train")


class Trainer:
    """Train ``updates`` under a plan, on arrays or a ``tf.data`` pipeline (see `fit`).

    Before the first step each trained model gets its layer plan (`amp_backends.prepare_model`, decided on the first
    batch): ``trainer.layer_plans``, kept by the checkpoints for a resumed run.

    Args:
        updates: What one step does (`Update`, from `classifier_updates` or `gan_updates`).
        plan: The plan to train under (`auto_configure`).
        batch_size: The global batch: under a ``tf.distribute`` strategy each replica takes its slice.
        checkpoint_objects: What checkpoints hold besides the loss scales and position (default: the updates').
        images_per_step: Samples a step counts for throughput (default: the batch size; the GAN counts ``2 * batch``).
        steps_per_call: Training steps per compiled call.
        log_every: Log a training line every this many steps.
        logdir: Where TensorBoard's scalars go (relative or absolute); ``None``: none.
        checkpoint_dir: Where checkpoints go (relative or absolute); ``None``: no checkpoints.
        checkpoint_every: Save a checkpoint every this many steps (``None``: at the end of each ``fit``).
        keep_checkpoints: How many checkpoints to keep (the newest).
        profile_steps: ``(start, stop)``, ``0 <= start < stop``: the steps TensorFlow's profiler records in ``logdir``.
        max_consecutive_nonfinite: Stop with `NonFiniteError` after this many non-finite steps in a row.
        progress: Show a progress bar (``None``: when the output is a terminal).
        seed: The run's seed, an int >= 0 (shuffling, Dropout, step draws); ``None``: `seed_everything`'s (or 0).
        batch_fn: How arrays become a batch (default: gather every array at the batch's indices).
        strategy: A ``tf.distribute`` strategy (default: the current one).
        unroll_steps: Unroll a compiled call's steps instead of looping (``None``: up to 16 under XLA on a CPU).
        observers: Your own `Observer` objects, called around every compiled call.
        check_models: Check each trained Keras model before the first step (`check_model`), warning as `AmpWarning`.
        audit: ``True`` (after the warm-up calls) or ``(start, stop)``: the kernels run, in ``trainer.audit.result``.
        measure_float32: Whether to measure if a model trains faster all in float32: ``None`` where it has layers
            the plan keeps in float32, ``False`` never, ``True`` any model under a mixed plan (one replica only).
        metrics: Keras metric names or objects, reported per epoch on the training batches and ``validation_data``.
        keep_best: A logged value's name (``"val_accuracy"``): keep the best checkpoint in ``<checkpoint_dir>/best``.
        monitor: The value ``patience`` watches (default: ``keep_best``'s, else ``val_loss``).
        mode: ``"auto"``, ``"min"`` or ``"max"``: which way the monitored value improves.
        patience: Stop after this many values of ``monitor`` without an improvement (``None``: never).
        min_delta: The least change that counts as an improvement.
        **fit_keywords: Keras ``fit``'s keywords (``epochs``, ``callbacks``...): refused, saying where they go.

    Raises:
        AmpConfigError: An argument is out of range (a ``ValueError``); the message says what was expected.
        TypeError: ``updates`` is not a non-empty list of `Update`, or ``plan`` not a `Plan` (a policy name, say).
    """

    WARMUP_CALLS = WARMUP_CALLS  # calls excluded from the throughput summary (tracing, XLA compilation)

    def __init__(self, updates: Sequence[Update], plan: Plan, *, batch_size: int,
                 checkpoint_objects: Mapping[str, Any] | None = None, images_per_step: int | None = None,
                 steps_per_call: int = 1, log_every: int = 1, logdir: str | None = None,
                 checkpoint_dir: str | None = None, checkpoint_every: int | None = None, keep_checkpoints: int = 3,
                 profile_steps: tuple[int, int] | None = None, max_consecutive_nonfinite: int = 25,
                 progress: bool | None = None, seed: int | None = None, batch_fn: BatchFn | None = None,
                 strategy: tf.distribute.Strategy | None = None, unroll_steps: bool | None = None,
                 observers: Sequence[Observer] = (), check_models: bool = True, audit: bool | tuple[int, int] = False,
                 measure_float32: bool | None = None, metrics: Sequence[Any] | None = None,
                 keep_best: str | bool | None = None, monitor: str | None = None, mode: str = "auto",
                 patience: int | None = None, min_delta: float = 0.0, **fit_keywords: Any) -> None:
        self.strategy, self.plan = (chosen := strategy or tf.distribute.get_strategy()), plan
        self.updates, logdir, profile_steps = checked_arguments(
            updates, plan, (replicas := int(chosen.num_replicas_in_sync)), batch_size=batch_size, log_every=log_every,
            keep_checkpoints=keep_checkpoints, max_consecutive_nonfinite=max_consecutive_nonfinite,
            checkpoint_every=checkpoint_every, logdir=logdir, seed=seed, profile_steps=profile_steps,
            images_per_step=images_per_step, steps_per_call=steps_per_call, fit_keywords=fit_keywords)
        self.is_chief, self.worker, self.replicas = is_chief(chosen), worker_id(chosen), replicas
        self.batch_size, self.steps_per_call = int(batch_size), int(steps_per_call)
        self.images_per_step = int(images_per_step or self.batch_size)
        self.checkpoint_every, self.max_consecutive_nonfinite = checkpoint_every, max_consecutive_nonfinite
        self.seed, self.batch_fn = current_seed() if seed is None else seed, batch_fn
        with self.strategy.scope():
            self.scalers = {u.name: LossScaler(plan.loss_scale, name=u.name) for u in self.updates}
            build_optimizers([g for u in self.updates for g in u.groups])
            self.position = Position(self.batch_size)
        self.global_step = self.position.global_step
        self.program = StepProgram(self.updates, self.scalers, strategy=self.strategy, xla=plan.xla, device=plan.device,
                                   position=self.position, seed=self.seed, unroll_steps=unroll_steps)
        trained = trained_models(self.updates, checkpoint_objects)
        self.observers: list[Observer] = list(observers)
        self.validation = Validation(self.updates, metrics=metrics, keep_best=keep_best, monitor=monitor, mode=mode,
                                     patience=patience, min_delta=min_delta, strategy=self.strategy,
                                     batch_size=self.batch_size, device=plan.device, xla=plan.xla, batch_fn=batch_fn,
                                     observers=self.observers, checkpointing=checkpoint_dir is not None,
                                     chief=self.is_chief)
        self.checkpointing = Checkpointing(  # the store, saves, resuming, stopping on a signal
            checkpoint_dir, objects=checkpoint_objects, keep=keep_checkpoints, every=checkpoint_every, plan=plan,
            updates=self.updates, scalers=self.scalers, position=self.position, seed=self.seed, trained=trained,
            strategy=self.strategy, is_chief=self.is_chief, worker=self.worker, validation=self.validation)
        self.store, self.checkpoint_dir = self.checkpointing.store, self.checkpointing.directory
        self.observers += [self.validation.monitor, *default_observers(self.is_chief, log_every, logdir, progress,
                                                                       profile_steps)]
        self._called: set[Any] = set()  # the calls compiled so far
        self._last_input: tuple[Any, Source] | None = None  # (reused when fit gets the same input again)
        self.models = TrainedModels(trained, plan, check=check_models, measure=measure_float32, store=self.store,
                                    batch_size=self.batch_size, replicas=self.replicas, is_chief=self.is_chief,
                                    audit=audit, steps_per_call=steps_per_call,
                                    on_applied=self.validation.forget_compiled)  # (the evaluator's compiled calls)
        self.layer_plans, self.audit = self.models.layer_plans, self.models.audit
        self.observers += [cast(Observer, self.audit)] if self.audit else []  # (an Observer by its hooks)

    def save(self) -> str | None:
        """Write a checkpoint now (atomically; with the other workers).

        Returns:
            The checkpoint's path (``None`` on a worker other than the chief, or without a ``checkpoint_dir``).

        Raises:
            NonFiniteError: The weights hold NaN or Inf (the latest good checkpoint stays).
            CheckpointError: The checkpoint could not be written.
        """
        return self.checkpointing.save()

    def restore(self) -> int | None:
        """Restore the newest intact checkpoint, if any.

        Returns:
            The restored global step, or ``None`` when there is no checkpoint to restore.
        """
        return self.checkpointing.restore(self.models)

    def fit(self, x: Any, y: Any = None, *, epochs: int = 1, max_steps: int | None = None, resume: bool = False,
            steps_per_epoch: int | None = None, validation_data: Any = None,
            validation_every: int | str = 1, **keras_fit: Any) -> TrainResult:
        """Train until ``epochs`` epochs are complete (counted over the whole run) or ``max_steps`` steps.

        Calling ``fit`` again continues where the last call stopped (the same arrays are not copied or checked
        again); a run already at ``max_steps`` or ``epochs`` trains nothing and warns. Ctrl-C (or SIGTERM): `resume`.

        Args:
            x: The inputs: arrays (a tuple, list or dict of them for several inputs) or a dataset of batches.
            y: The labels for array inputs (``None`` with a dataset, or for updates that need none).
            epochs: Train until this many epochs are complete, counted over the whole run.
            max_steps: Stop at this step instead, counted over the whole run.
            resume: Continue from the newest intact checkpoint (without it, another run's checkpoints are refused).
            steps_per_epoch: The steps of an epoch, for a dataset that repeats forever.
            validation_data: ``(x_val, y_val)`` arrays or a dataset of batches, evaluated with the metrics.
            validation_every: Evaluate every this many epochs, or ``"500 steps"`` (needs ``validation_data``).
            **keras_fit: Keras ``fit``'s other keywords, refused with what does their work here.

        Returns:
            What the run did (`TrainResult`).

        Raises:
            AmpConfigError: An argument is out of range, or needs another (a ``ValueError``).
            InputError: The data is unusable; the message says what was expected.
            CheckpointError: ``checkpoint_dir`` holds another run's checkpoints, or one cannot be saved or read.
            NonFiniteError: Training cannot go on: too many non-finite steps, or non-finite weights.
            TrainingInterrupted: Ctrl-C or SIGTERM, after the last call ended and its checkpoint was saved.
        """
        check_fit_arguments(keras_fit, epochs=epochs, max_steps=max_steps, resume=resume, store=self.store)
        self._last_input = input_for(self._last_input, x, y, self.updates, batch_size=self.batch_size,
                                     device=self.plan.device, seed=self.seed, strategy=self.strategy,
                                     batch_fn=self.batch_fn, steps_per_epoch=steps_per_epoch)
        self.program.diagnose = functools.partial(self.models.diagnose, source := self._last_input[1])  # (failing)
        self.validation.start(validation_data, validation_every, self.store, self.checkpointing.together)
        if source.has_strings:
            self.program.without_xla("the data holds strings (a StringLookup's input), which XLA cannot compile")
        with self.checkpointing.fitting(resume, self.models, source) as at:
            if not nothing_left(at, source.left_in_epoch(at.offset) == 0, epochs, max_steps, say=self.is_chief):
                if self.is_chief:  # the line that says what a call is; each model's layer plan, the precision check
                    logger.info(training_line(source, self.batch_size, self.steps_per_call, self.checkpoint_every))
                self.models.before_first_step(source)
            progress = Progress([u.name for u in self.updates], self.observers, self._called, self.images_per_step,
                                self.WARMUP_CALLS)
            progress.start(at.step, self.position.total_steps(source.steps_per_epoch, epochs, max_steps, self.is_chief))
            with closing(progress):  # Ctrl-C, SIGTERM: every worker stops after one call, saves, raises
                self._loop(source, epochs, max_steps, progress)
        at = self.position.now()  # an epoch whose last batch is done counts, before the position rolls over
        result = TrainResult(steps=at.step, epochs_completed=at.epoch + int(source.left_in_epoch(at.offset) == 0),
                             **progress.results(at.step, self.scalers), **self.validation.results())
        if self.is_chief:
            logger.info(result.summary())
        return result

    def _loop(self, source: Source, epochs: int, max_steps: int | None, progress: Progress) -> None:
        """Calls until training is done or every worker agreed to stop on a signal (`resume.Checkpointing`)."""
        source.start()
        while not self.checkpointing.stop_agreed():
            at = self.position.now()
            left = source.left_in_epoch(at.offset)
            if left == 0 and at.epoch < epochs:  # (also where max_steps ends an epoch: it is recorded, validated)
                self._epoch_over(at.epoch)
                source.epoch_over()
                continue
            if at.epoch >= epochs or (max_steps is not None and at.step >= max_steps) or self.validation.stop:
                return
            k = source.call_size(self.steps_per_call, left, None if max_steps is None else max_steps - at.step,
                                 self.program)
            progress.before_call(at.step, k)  # one compiled call of up to k steps, the observers told
            with self.checkpointing.together(at.step), self.program.own_errors(at.step, k), self.validation.recording:
                ran = run_call(self.program, source, at, k, self.steps_per_call, self.checkpointing.stop_requested)
            if ran is None:
                continue  # stopped while XLA compiled the call
            progress.after_call(ran, at, self.position.batch_in_epoch(at), self.scalers)
            ran.check_refused(at, self.position.batch_in_epoch(at), self.updates)
            if ran.pass_ended:
                self._epoch_over(at.epoch)
            if ran.done == 0:
                continue
            check_stalled(self.scalers, self.max_consecutive_nonfinite, self.checkpointing.before_failing)
            self.validation.after_call(at.epoch, at.step, ran.done)
            self.checkpointing.after_call(at.step, ran.done)  # a checkpoint every checkpoint_every steps

    def _epoch_over(self, epoch: int) -> None:  # the position moves on; the epoch's values, validated when due
        self.position.next_epoch()
        self.validation.epoch_end(epoch, self.position.step)

    def evaluate(self, x: Any, y: Any = None) -> dict[str, float]:
        """``{"loss": ..., <metric>: ...}`` over every sample of ``x``/``y`` or a dataset, under the layer plans.

        Args:
            x: The inputs: arrays or a dataset of batches (of ``(x, y)`` pairs).
            y: The labels for array inputs.

        Returns:
            The mean loss and each metric over every sample, the last partial batch too.

        Raises:
            InputError: The data does not fit the model; the message says what was expected.
        """
        return self._evaluator(x, "evaluate()").evaluate(x, y)

    def predict(self, x: Any) -> Any:
        """The model's outputs for every sample of ``x``, as NumPy arrays (under the layer plans, as `evaluate`).

        Args:
            x: The inputs: arrays, or a dataset of batches.

        Returns:
            The outputs, one row per sample (a structure of arrays for a model with several outputs).

        Raises:
            InputError: The data does not fit the model.
        """
        return self._evaluator(x, "predict()").predict(x)

    def _evaluator(self, x: Any, what: str) -> Evaluator:
        """The evaluator, after the models' layer plans are applied (``evaluate`` or ``predict`` before ``fit``)."""
        evaluator = self.validation.evaluator_for(what)
        self.models.prepare(FirstBatch(x))
        return evaluator

    def restore_best(self) -> str:
        """Load the best checkpoint (``keep_best``) into what checkpoints hold.

        Returns:
            The best checkpoint's path.

        Raises:
            AmpConfigError: There is no best checkpoint (no ``keep_best``, or none saved yet).
        """
        return self.validation.restore_best(self.store)


@dataclass
class TrainResult:
    """What `Trainer.fit` did.

    Attributes:
        steps: The step the run reached, counted over the whole run (resumes included).
        epochs_completed: The epochs completed over the whole run.
        median_throughput: The median samples per second of this ``fit``'s calls after the warm-up (or ``None``).
        throughputs: Each timed call's samples per second.
        last_losses: The last loss of each update.
        skipped: Steps per update skipped for non-finite gradients, over the whole run.
        applied: Steps per update applied, over the whole run.
        loss_scales: Each update's loss scale at the end.
        history: A row per compiled call of this ``fit``.
        epochs: A row per completed epoch over the whole run (``epoch``, ``step``, the mean training ``loss``,
            the training metrics, and ``val_*`` when the epoch ended with a validation).
        validations: A row per validation.
        best: The best value of the monitored name (``monitor``, ``mode``, ``value``, ``epoch``, ``step``, and
            ``path``: the best checkpoint, with ``keep_best``), or ``None``.
        stopped_early: Why training stopped before its end (``patience``), else ``None``.
    """

    steps: int
    epochs_completed: int
    median_throughput: float | None
    throughputs: list[float]
    last_losses: dict[str, float]
    skipped: dict[str, int]
    applied: dict[str, int]
    loss_scales: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)
    validations: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    stopped_early: str | None = None

    def summary(self) -> str:
        """The run in one line, as the trainer logs it at the end.

        Returns:
            Steps applied and skipped, the median throughput, the loss scales and the last losses.
        """
        tp = f"{self.median_throughput:.4g} img/s" if self.median_throughput else "n/a (too few steps after warm-up)"
        steps = ", ".join(f"{k}: {self.applied[k]} applied, {self.skipped[k]} skipped" for k in self.applied)
        best = (f", best {self.best['monitor']} {self.best['value']:.5g} (epoch {self.best['epoch']}, step "
                f"{self.best['step']})" if self.best else "")
        return (f"Summary: {self.steps} steps ({steps}), median throughput {tp}, loss scales "
                + ", ".join(f"{k}={v:g}" for k, v in self.loss_scales.items()) + ", last losses "
                + (", ".join(f"{k}: {v:.5g}" for k, v in self.last_losses.items()) or "none (no step ran)") + best
                + (f"; stopped early: {self.stopped_early}" if self.stopped_early else ""))


def run_call(program: StepProgram, source: Source, at: At, k: int, capacity: int,
             stopping: Callable[[], bool]) -> Ran | None:
    """``k`` steps from ``at`` in one call of ``program`` on ``source`` (compiled for ``capacity`` steps). Where XLA
    fails to compile it and nothing of it can have run (one replica, batches of one shape), it runs again without
    XLA from now on; ``None`` where a stop was requested meanwhile (a Ctrl-C stops XLA's compiler processes too).

    Raises:
        AmpConfigError: XLA failed to compile a call of which a part may have run: the fix is XLA off.
    """
    try:
        return source.run(program, at, k, capacity)
    except tf.errors.OpError as exc:
        why = xla_compile_failure(exc) if (program.xla or program.replica_jit) else None
        if why is None:
            raise
        if program.replicas > 1 or not source.fixed_shape:
            several = f"{program.replicas} replicas" if program.replicas > 1 else "batches of several shapes"
            raise AmpConfigError(
                f"XLA could not compile the training call at step {at.step}: {why}. Expected a model XLA compiles, as "
                f"the plan has XLA on; with {several} a part of the call may have run, so it is not run again without "
                "XLA. Fix: train with XLA off (auto_configure(xla='off'), AMP_XLA=off or --xla off; resume=True "
                "continues from the last checkpoint, if any)" + ("." if source.fixed_shape else ", or pad every batch "
                "to one shape (padded_batch(..., padded_shapes=<fixed>)): then it falls back itself.")) from None
        source.start()
        if stopping():
            return None
        program.without_xla(why)
        return source.run(program, at, k, capacity)


def checked_arguments(updates: Sequence[Update], plan: Plan, replicas: int, *, checkpoint_every: int | None,
                      logdir: str | None, seed: Any, profile_steps: Any, images_per_step: Any,
                      fit_keywords: Mapping[str, Any], **positive: Any
                      ) -> tuple[list[Update], str | None, tuple[int, int] | None]:
    """The updates as a list, ``logdir`` absolute (later chdirs change nothing) and the profiler's window, after
    checking every argument of the trainer that can be checked alone (`AmpConfigError`, or ``TypeError``)."""
    check_trainer_keywords(fit_keywords, [p for p in inspect.signature(Trainer).parameters if p != "fit_keywords"])
    require_plan(plan, "Trainer(updates, plan, ...)")
    if bad := next((name for name, value in positive.items() if not is_count(value)), None):
        raise AmpConfigError(f"{bad} must be an integer >= 1. Received: {bad}={positive[bad]!r} (of type "
                             f"{type(positive[bad]).__name__}). Fix: pass a whole number, such as {bad}=32.")
    for name, value, least in (("checkpoint_every", checkpoint_every, 1), ("seed", seed, 0),
                               ("images_per_step", images_per_step, 1)):
        if value is not None and not is_count(value, least):
            raise AmpConfigError(f"{name} must be an integer >= {least} or None. Received: {name}={value!r} (of type "
                                 f"{type(value).__name__}). Fix: pass an int, or None (leave it out).")
    if (batch_size := positive["batch_size"]) % replicas:
        raise AmpConfigError(
            f"batch_size is the global batch and must be divisible by the {replicas} replicas in sync. "
            f"Received: batch_size={batch_size}. Fix: use a multiple of {replicas}.")
    if not isinstance(updates, Sequence) or not updates or not all(isinstance(u, Update) for u in updates):
        raise AmpConfigError(
            f"updates must be a non-empty list of Update. Received: {updates!r:.80} (of type "
            f"{type(updates).__name__}). Fix: pass classifier_updates(model, optimizer), gan_updates(...).")
    if len(set(names := [u.name for u in updates])) != len(names):
        raise AmpConfigError(f"Update names must be unique (they name losses, scales and logs). Received: {names}. "
                             "Fix: give each Update its own name=.")
    for u in updates:
        if pair := next((g for g in u.groups if not (isinstance(g, (tuple, list)) and len(g) == 2 and callable(
                getattr(g[1], "apply_gradients", None)))), None):
            kinds = [type(x).__name__ for x in pair] if isinstance(pair, (tuple, list)) else []
            got = f"({', '.join(kinds[:3])}{', ...' if len(kinds) > 3 else ''})" if kinds else type(pair).__name__
            bare = len(u.groups) == 2 and callable(getattr(u.groups[1], "apply_gradients", None))
            raise AmpConfigError(f"The groups of update {u.name!r} must be a list of (variables, optimizer) pairs. "
                                 f"Received: {'one pair, not in a list' if bare else got}. Fix: "
                                 "groups=[(model.trainable_variables, optimizer)].")
        if not u.variables:
            raise AmpConfigError(f"Update {u.name!r} has no variables to train: its model is not built yet (or every "
                                 "layer is frozen). Fix: build the model before the Trainer (start it with "
                                 "keras.Input(shape), or call model.build(shape)).")
        for _, opt in u.groups:
            if (mode := loss_scale_of(opt)[0]) != "none":
                raise AmpConfigError(f"The optimizer of update {u.name!r} scales losses itself ({mode} loss scaling: "
                                     "a LossScaleOptimizer or loss_scale_factor). The Trainer scales losses as the "
                                     "plan says, so they would be scaled twice. Fix: give the Trainer the plain "
                                     "optimizer (plan.wrap_optimizer is for Keras fit).")
    if (window := parse_profile_steps(profile_steps, "profile_steps")) and not logdir:
        raise AmpConfigError(f"profile_steps={profile_steps!r} records a profile into logdir, and logdir is None. "
                             "Fix: pass logdir=<a folder, relative or absolute>, or leave profile_steps out.")
    return list(updates), str(check_directory(logdir, "logdir")) if logdir else logdir, window
