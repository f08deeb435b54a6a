"""The loop: call sizing, position and resume, non-finite and interrupt handling, checkpoints at call ends.

The model code stays the same everywhere; the `Plan` decides the dtype policy
(set before the models are built), whether the step is XLA-compiled and how losses are scaled. The step
itself is in `step`, the input in `inputs`, checkpoints in `checkpoints`, what watches
training in `observers`.

The `Trainer`'s arguments are described where it is defined.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping, Sequence

import tensorflow as tf

from ..plan import Plan
from .arguments import (
    build_optimizers,
    check_fit_arguments,
    checked_arguments,
    saved_weights,
)
from .checkpoints import check_directory, trainer_store
from .distribute import StopAgreement, collectives, is_chief, worker_id
from .inputs import BatchFn, Ran, input_for
from .loss_scaling import LossScaler, check_stalled
from .observers import (
    WARMUP_CALLS,
    audit_observer,
    Observer,
    default_observers,
    parse_profile_steps,
    training_line,
)
from .runs import At, Position
from .precision import FirstBatch, TrainedModels, trained_models
from .results import Progress, TrainResult
from .runs import nothing_left, restore_run, settings
from .runs import holding
from .saving import ready_to_save, save_finite, weights_finite
from .seeding import current_seed
from .signals import StopSignals, raise_interrupted
from .step import StepProgram, Update
from .metrics import variables
from .validation import Validation, save_with

__all__ = ["Trainer", "TrainResult", "parse_profile_steps"]

logger = logging.getLogger("amp_backends.train")


class Trainer:
    """Train ``updates`` under a plan, on arrays or a ``tf.data`` pipeline (see `fit`).

    Before the first step each trained model gets its layer plan (`amp_backends.prepare_model`: the plan's
    float32 layers, a classifier head in float32, float8 where on, and — where a model has layers the plan keeps
    in float32 — whether it trains faster with every layer in float32, cached for the model on this machine or
    measured on the first batch). The layer plans are ``trainer.layer_plans``; the checkpoints keep them and a
    resumed run applies them as they were.

    Args:
        updates: What one step does (`Update`, from
            `classifier_updates` or `gan_updates`).
        plan: The plan to train under (`auto_configure`).
        batch_size: The global batch: under a ``tf.distribute`` strategy each replica takes its slice.
        checkpoint_objects: What is saved besides the loss-scale state and the position (your models and
            optimizers; by default the updates' variables and optimizers).
        images_per_step: Samples a step counts for throughput (default: the batch size; the GAN counts
            ``2 * batch``).
        steps_per_call: Training steps per compiled call.
        log_every: Log a training line every this many steps.
        logdir: Where TensorBoard's scalars go (relative or absolute); ``None``: none.
        checkpoint_dir: Where checkpoints go (relative or absolute); ``None``: no checkpoints.
        checkpoint_every: Save a checkpoint every this many steps (at the end of the call that reaches it);
            ``None``: at the end of each ``fit``.
        keep_checkpoints: How many checkpoints to keep (the newest).
        profile_steps: ``(start, stop)``: the steps TensorFlow's profiler records into ``logdir``.
        max_consecutive_nonfinite: Stop with `NonFiniteError` after this many
            steps in a row whose loss or gradients were not finite.
        progress: Show a progress bar (``None``: when the output is a terminal).
        seed: The run's seed (shuffling, Dropout, the steps' random draws); ``None``: the current one
            (`seed_everything`).
        batch_fn: How arrays become a batch (default: gather every array at the batch's indices).
        strategy: A ``tf.distribute`` strategy (default: the current one).
        unroll_steps: Unroll the steps of a compiled call instead of looping (``None``: under XLA, up to a
            limit).
        observers: Your own `Observer` objects, called around every compiled call.
        check_models: Check the Keras models it trains once, before the first step, at the batch it trains on,
            for what makes mixed precision slow or wrong under the plan (`check_model`);
            warnings are logged and raised as `AmpWarning`.
        audit: ``True`` (the steps after the warm-up calls) or ``(start, stop)``: report the kernels that ran
            in that window (on a CPU it needs ``ONEDNN_VERBOSE=1`` set when the program starts); the result
            is ``trainer.audit.result``.
        measure_float32: Whether to measure if a model trains faster all in float32: ``None`` where it has
            layers the plan keeps in float32, ``False`` never, ``True`` for any model under a mixed plan
            (never across several replicas, which could choose apart).
        metrics: Keras metric names or objects, reported per epoch on the training batches and on ``fit``'s
            ``validation_data``.
        keep_best: The name of a logged value (``"val_accuracy"``): keep the best checkpoint in
            ``<checkpoint_dir>/best``.
        monitor: The value ``patience`` watches (default: ``keep_best``'s, else ``val_loss``).
        mode: ``"auto"``, ``"min"`` or ``"max"``: which way the monitored value improves.
        patience: Stop after this many values of ``monitor`` without an improvement of more than
            ``min_delta`` (``None``: never).
        min_delta: The least change that counts as an improvement.

    Raises:
        AmpConfigError: An argument is out of range (a ``ValueError``); the message says what was expected.
        TypeError: ``updates`` is not a non-empty list of `Update`.
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
        audit: bool | tuple[int, int] = False,
        measure_float32: bool | None = None,
        metrics: Sequence[Any] | None = None,
        keep_best: str | bool | None = None,
        monitor: str | None = None,
        mode: str = "auto",
        patience: int | None = None,
        min_delta: float = 0.0,
    ) -> None:
        self.strategy = strategy or tf.distribute.get_strategy()
        self.replicas = int(self.strategy.num_replicas_in_sync)
        updates = checked_arguments(updates, self.replicas, batch_size=batch_size, steps_per_call=steps_per_call,
                                     log_every=log_every, keep_checkpoints=keep_checkpoints,
                                     max_consecutive_nonfinite=max_consecutive_nonfinite,
                                     checkpoint_every=checkpoint_every)
        self.is_chief, self.worker = is_chief(self.strategy), worker_id(self.strategy)
        self._agree = StopAgreement(self.strategy)  # every worker stops after the same call
        self.updates, self.plan = updates, plan
        self.batch_size = int(batch_size)
        self.images_per_step = images_per_step or self.batch_size
        self.steps_per_call = int(steps_per_call)
        self.checkpoint_every = checkpoint_every
        self.max_consecutive_nonfinite = max_consecutive_nonfinite
        self.seed = current_seed() if seed is None else seed
        self.batch_fn = batch_fn
        if logdir:
            logdir = str(check_directory(logdir, "logdir"))  # absolute: later chdirs change nothing; made when written

        with self.strategy.scope():
            self.scalers = {u.name: LossScaler(plan.loss_scale, name=u.name) for u in self.updates}
            build_optimizers(self.updates)
            self.position = Position(self.batch_size)
        self.global_step = self.position.global_step
        models = [m for m in (checkpoint_objects or {}).values() if hasattr(m, "layers")]
        self._weights = saved_weights(self.updates, models)  # never saved with NaN or Inf
        self.program = StepProgram(self.updates, self.scalers, strategy=self.strategy, xla=plan.xla,
                                   batch_size=self.batch_size, seed=self.seed, global_step=self.global_step,
                                   samples_in_epoch=self.position.samples_in_epoch, unroll_steps=unroll_steps)
        trained = trained_models(self.updates, checkpoint_objects)
        self.observers: list[Observer] = list(observers)
        self.validation = Validation(self.updates, metrics=metrics, keep_best=keep_best, monitor=monitor, mode=mode,
                                     patience=patience, min_delta=min_delta, strategy=self.strategy,
                                     batch_size=self.batch_size, device=plan.device, xla=plan.xla, batch_fn=batch_fn,
                                     observers=self.observers, checkpointing=checkpoint_dir is not None,
                                     chief=self.is_chief)
        self.store = trainer_store(
            checkpoint_dir, updates=self.updates, scalers=self.scalers, position=self.position,
            objects=checkpoint_objects, keep=keep_checkpoints, is_chief=self.is_chief, worker=self.worker,
            plan_headline=str(self.plan.headline), settings=settings(self.seed, self.scalers),
            models=[*models, *trained], metrics=variables(self.validation.train_metrics)) if checkpoint_dir else None
        self.observers += [self.validation.monitor, *default_observers(self.is_chief, log_every, logdir, progress,
                                                                       profile_steps)]
        self._called: set[Any] = set()  # the calls compiled so far; the last input (reused when fit gets it again)
        self._last_input: tuple[Any, Any, Any] | None = None
        self.models = TrainedModels(trained, plan, check=check_models, measure=measure_float32, replicas=self.replicas)
        self.layer_plans = self.models.layer_plans
        self.audit = audit_observer(audit, trained, plan, steps_per_call) if audit and self.is_chief else None
        self.observers += [self.audit] if self.audit else []  # what ran in a window of steps

    @property
    def checkpoint_dir(self) -> str | None:
        return self.store.directory if self.store else None

    def save(self) -> str | None:
        """Write a checkpoint now (atomically; with the other workers): `saving.save_finite`."""
        if self.store is None:
            return None
        self.store.annotate("monitor", self.validation.monitor.state())  # the history, best value, waiting
        return save_finite(self.store, self._weights, self._together(self.position.step))

    def restore(self) -> int | None:
        """Restore the newest intact checkpoint, if any; returns its global step (`runs.restore_run`)."""
        restored = restore_run(self.store, self.position, seed=self.seed, scalers=self.scalers, updates=self.updates,
                               batch_size=self.batch_size, plan_headline=str(self.plan.headline),
                               is_chief=self.is_chief) if self.store else None
        if restored is None:
            return None
        step, stored = restored
        self.models.restored(stored.get("layer_plans") or stored.get("float32_choice"))
        self.validation.load(stored.get("monitor"))
        return step

    # ------------------------------------------------------------------ the loop
    def fit(self, x: Any, y: Any = None, *, epochs: int = 1, max_steps: int | None = None, resume: bool = False,
            steps_per_epoch: int | None = None, validation_data: Any = None,
            validation_every: int | str = 1) -> TrainResult:
        """Train until ``epochs`` epochs are complete (counted over the whole run) or ``max_steps`` steps.

        ``x`` is an array, a tuple/list or dict of arrays (several inputs, named features), with optional
        labels ``y`` of the same kinds — kept on the device, each step gathering its batch — or a
        ``tf.data.Dataset`` of batches (``steps_per_epoch`` for one that repeats forever); see
        `amp_backends.training.inputs`. ``validation_data`` (``(x_val, y_val)`` arrays or a dataset of
        batches) is evaluated with the trainer's metrics every ``validation_every`` epochs (or ``"500 steps"``);
        see `metrics` for the history, ``keep_best`` and ``patience``. ``resume`` continues from the newest
        intact checkpoint (under its seed; loss scaling that differs from the checkpoint's starts afresh and is
        logged: `runs`); without it, a checkpoint directory holding another run's checkpoints is refused.
        While it trains, no other process may train in the checkpoint directory (`runs.holding`). Calling
        ``fit`` again continues where the last call stopped; a run already at ``max_steps`` or ``epochs`` trains
        nothing and warns.
        Ctrl-C (or SIGTERM): see `signals`.

        Args:
            x: The inputs: arrays (a tuple, list or dict of them for several inputs) or a ``tf.data.Dataset``
                of batches.
            y: The labels for array inputs (``None`` with a dataset, or for updates that need none).
            epochs: Train until this many epochs are complete, counted over the whole run.
            max_steps: Stop at this step instead, counted over the whole run.
            resume: Continue from the newest intact checkpoint in ``checkpoint_dir``.
            steps_per_epoch: The steps of an epoch, for a dataset that repeats forever.
            validation_data: ``(x_val, y_val)`` arrays or a dataset of batches, evaluated with the metrics.
            validation_every: Evaluate every this many epochs, or ``"500 steps"``.

        Returns:
            What the run did (`TrainResult`).

        Raises:
            ValueError: ``epochs`` or ``max_steps`` is not a positive integer.
            AmpConfigError: ``resume=True`` without a ``checkpoint_dir``.
            InputError: The data is unusable; the message says what was expected.
            CheckpointError: ``checkpoint_dir`` holds another run's checkpoints (without ``resume``), or a
                checkpoint cannot be saved or read.
            NonFiniteError: Training cannot go on: too many non-finite steps, or non-finite weights.
            TrainingInterrupted: Ctrl-C or SIGTERM, after the last call ended and its checkpoint was saved.
        """
        check_fit_arguments(epochs=epochs, max_steps=max_steps, resume=resume, checkpoints=self.store is not None)
        # the same arrays as in the last call are reused (not copied or checked again)
        self._last_input = input_for(self._last_input, x, y, self.updates, batch_size=self.batch_size,
                                     device=self.plan.device, seed=self.seed, strategy=self.strategy,
                                     batch_fn=self.batch_fn, steps_per_epoch=steps_per_epoch)
        source = self._last_input[2]
        self.validation.start(validation_data, validation_every, self.store, save_with(self._weights, self._together))
        if source.has_strings:
            self.program.without_xla("the data holds strings (for the model's own StringLookup or TextVectorization)")
        with holding(self.store.directory if self.store and self.is_chief else None):  # one run at a time there
            if self.store and not resume:
                self.store.ensure_fresh()
            elif self.store and self.restore() is None and self.is_chief:
                logger.info(f"Nothing to resume in {self.store.directory}: starting from the beginning.")
            if self.store:
                ready_to_save(self.store)  # an interrupted run's unfinished saves removed; room for a checkpoint
            at = self.position.now()
            left = nothing_left(at, source.left_in_epoch(at.offset) == 0, epochs, max_steps)
            if left and self.is_chief:
                logger.warning(left)
            elif not left:
                self._before_first_step(source)
            progress = Progress([u.name for u in self.updates], self.WARMUP_CALLS)
            for o in self.observers:
                o.on_fit_start(at.step, self.position.total_steps(source.steps_per_epoch, epochs, max_steps))
            try:
                with StopSignals() as stop:
                    signum = self._loop(source, epochs, max_steps, progress, stop)
                    if signum is not None:  # every worker stopped here: save together, say where
                        raise_interrupted(signum, self.position.step, self.store, self.save, self._together,
                                          self._agree, self.is_chief)
            finally:
                for o in self.observers:
                    o.close()
            if self.store and self.store.last_saved_step != self.position.step:
                self.save()
        return self._result(source, progress)

    def _before_first_step(self, source: Any) -> None:
        """Each trained model's layer plan, the precision check, and the line that says what a call is."""
        if self.is_chief:
            logger.info(training_line(source, self.batch_size, self.steps_per_call, self.checkpoint_every))
        if self.models.before_first_step(source, batch_size=self.batch_size, replicas=self.replicas,
                                         is_chief=self.is_chief, store=self.store, audit=self.audit):
            self.validation.forget_compiled()  # evaluated before: compiled under the policies before the plan

    def _loop(self, source: Any, epochs: int, max_steps: int | None, progress: Progress,
              stop: StopSignals) -> int | None:
        """Calls until training is done (``None``) or every worker agreed to stop on a signal (returned)."""
        source.start()
        while (signum := self._agree.at(stop.signum, self._together(self.position.step))) is None:
            at = self.position.now()
            left = source.left_in_epoch(at.offset)
            if left == 0 and at.epoch < epochs:  # (also where max_steps ends an epoch: it is recorded, validated)
                self._epoch_over(at.epoch)
                source.epoch_over()
                continue
            if at.epoch >= epochs or (max_steps is not None and at.step >= max_steps) or self.validation.stop:
                return None
            k = source.call_size(self.steps_per_call, left, None if max_steps is None else max_steps - at.step,
                                 self.program)
            ran = self._call_and_record(source, k, at, progress)
            if ran.done == 0:
                continue
            ran.check_refused(at, self.position.batch_in_epoch(at), self.updates)
            check_stalled(self.scalers, self.max_consecutive_nonfinite, lambda: self.save() if self.store and getattr(
                self.strategy, "cluster_resolver", None) is None and weights_finite(self._weights) else None)
            self.validation.after_call(at.epoch, at.step, ran.done)
            every = self.checkpoint_every
            if every and (at.step + ran.done) // every > at.step // every:
                self.save()  # at the end of the call that reached a multiple of checkpoint_every
        return signum

    def _call_and_record(self, source: Any, k: int, at: At, progress: Progress) -> Ran:
        """Run one compiled call of up to ``k`` steps and tell the observers."""
        for o in self.observers:
            o.before_call(at.step, k)
        t0 = time.perf_counter()
        with self._together(at.step), self.program.own_errors(at.step, k), self.validation.recording:
            ran = source.run(self.program, at, k, self.steps_per_call)
        dt = time.perf_counter() - t0
        compiling = ran.key not in self._called
        self._called.add(ran.key)
        if ran.done:
            record = progress.add(ran, at.epoch, self.position.batch_in_epoch(at), at.step + ran.done,
                                  self.images_per_step, dt, compiling, self.scalers)
            for o in self.observers:
                o.after_call(record)
        if ran.pass_ended:
            self._epoch_over(at.epoch)
        return ran

    def _epoch_over(self, epoch: int) -> None:  # the position moves on; the epoch's values, validated when due
        self.position.next_epoch()
        self.validation.epoch_end(epoch, self.position.step)

    def _result(self, source: Any, progress: Progress) -> TrainResult:
        at = self.position.now()
        # an epoch whose last batch is done counts, even before the position rolls over to the next one
        result = self.validation.fill(progress.result(at.step, at.epoch + int(source.left_in_epoch(at.offset) == 0),
                                                      self.scalers))
        if self.is_chief:
            logger.info(result.summary())
        return result

    def evaluate(self, x: Any, y: Any = None) -> dict[str, float]:
        """``{"loss": ..., <metric>: ...}`` over every sample of ``x``/``y`` or a dataset (`validation.Evaluator`).

        Before the first ``fit`` it applies the models' layer plans first, decided on ``x``'s first batch: what
        it computes is what training and validation will compute.

        Args:
            x: The inputs: arrays or a dataset of batches (of ``(x, y)`` pairs).
            y: The labels for array inputs.

        Returns:
            The mean loss and each metric over every sample, the last partial batch too.

        Raises:
            InputError: The data does not fit the model; the message says what was expected.
        """
        evaluator = self.validation.evaluator_for("evaluate()")
        self._layer_plans_in_force(x)
        return evaluator.evaluate(x, y)

    def predict(self, x: Any) -> Any:
        """The model's outputs for every sample of ``x``, as NumPy arrays (under the models' layer plans, as
        `evaluate`).

        Args:
            x: The inputs: arrays, or a dataset of batches.

        Returns:
            The outputs, one row per sample (a structure of arrays for a model with several outputs).

        Raises:
            InputError: The data does not fit the model.
        """
        evaluator = self.validation.evaluator_for("predict()")
        self._layer_plans_in_force(x)
        return evaluator.predict(x)

    def _layer_plans_in_force(self, x: Any) -> None:
        """The models' layer plans applied before anything computes (``evaluate`` or ``predict`` before ``fit``)."""
        if self.models.prepare(FirstBatch(x), batch_size=self.batch_size, is_chief=self.is_chief, store=self.store,
                               audit=self.audit):
            self.validation.forget_compiled()

    def restore_best(self) -> str:
        """Load the best checkpoint (``keep_best``) into what checkpoints hold; returns its path."""
        return self.validation.restore_best()

    def _together(self, step: int) -> Any:
        """A call or save made with the other workers: a failure says who to restart and from where."""
        return collectives(self.strategy, self.worker, step, lambda: self.store.latest if self.store else None)

