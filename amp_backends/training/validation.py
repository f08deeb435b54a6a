"""The trainer's metrics and validation: what runs at the end of each epoch and on the validation schedule.

`Validation` holds the metrics (training and validation copies, `metrics`), the evaluator
(`evaluation`), the run's history, best value and early stopping (`monitor`), and the best checkpoint's
store. The trainer calls it at each epoch's end and after each call; it tells the observers
(`after_evaluation`: the log line, TensorBoard's ``val/...`` and ``epoch/...`` scalars).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import tensorflow as tf

from ..errors import AmpConfigError, InputError
from . import metrics as metric_lib
from .evaluation import Evaluator, evaluated_update
from .monitor import Every, Monitor, parse_every
from .saving import save_finite
from .step import Update

logger = logging.getLogger("amp_backends.train")

BEST = "best"  # the best checkpoint's folder in the checkpoint directory


class Validation:
    """Metrics, validation, history, best checkpoint and early stopping for one trainer (module docstring)."""

    def __init__(self, updates: Sequence[Update], *, metrics: Sequence[Any] | None, keep_best: str | bool | None,
                 monitor: str | None, mode: str, patience: int | None, min_delta: float, strategy: Any,
                 batch_size: int, device: str, xla: bool, batch_fn: Any, observers: list[Any],
                 checkpointing: bool, chief: bool = True) -> None:
        self.updates = list(updates)
        self.update = next((u for u in updates if u.evaluation is not None), None)
        if metrics and self.update is None:
            evaluated_update(updates, "metrics=")  # raises, saying why
        evaluation = self.update.evaluation if self.update else None
        if metrics and evaluation is not None and evaluation.outputs > 1:
            named = [m for m in metrics if not isinstance(m, tf.keras.metrics.Metric)]
            if named:
                raise AmpConfigError(
                    f"The model has {evaluation.outputs} outputs, and the metrics {named!r} (names or functions) take "
                    "one. Expected, for a model of several outputs, keras.metrics.Metric objects whose update_state "
                    "takes its structures (dicts for named outputs). Fix: write such a metric (e.g. one that reads "
                    "y['class'] and pred['class']), or leave metrics out: validation then reports the loss.")
        binary = bool(evaluation and evaluation.binary)
        self.train_metrics = metric_lib.build_metrics(metrics, binary=binary, strategy=strategy)
        self.val_metrics = metric_lib.build_metrics(metrics, binary=binary, strategy=strategy, own=True)
        self.recording = metric_lib.Recording({self.update.name: self.train_metrics} if self.update else {})
        self.monitor = Monitor([u.name for u in updates], [m.name for m in self.train_metrics], keep_best=keep_best,
                               monitor=monitor, mode=mode, patience=patience, min_delta=min_delta)
        if self.monitor.keep_best and not checkpointing:
            raise AmpConfigError(f"keep_best keeps the best checkpoint (by {self.monitor.monitor}) beside the latest, "
                                 "and this Trainer has no checkpoint_dir. Fix: build the Trainer with "
                                 "checkpoint_dir=..., or leave keep_best out.")
        self.monitor.check_name(validating=None)
        self.evaluator = Evaluator(self.update, self.val_metrics, strategy=strategy, batch_size=batch_size,
                                   device=device, xla=xla, batch_fn=batch_fn) if self.update else None
        self.observers = observers
        self.chief = chief
        self.every: Every | None = None
        self.data: tuple[Any, Any] | None = None
        self.best_store: Any = None
        self._save: Callable[[Any, int], str | None] | None = None

    # ------------------------------------------------------------------ per fit
    def start(self, validation_data: Any, validation_every: Any, store: Any,
              save: Callable[[Any, int], str | None]) -> None:
        """Check ``fit``'s validation arguments before any work; ``save(store, step)`` writes a checkpoint."""
        self.every = parse_every(validation_every)
        self.data = None if validation_data is None else self._split(validation_data)
        self.monitor.check_name(validating=self.data is not None)
        self._say_stopped()
        if self.monitor.keep_best and self.best_store is None:
            self.best_store = store.sibling(BEST, keep=1)
        self._save = save

    def _split(self, data: Any) -> tuple[Any, Any]:
        evaluated_update(self.updates, "validation_data")
        if isinstance(data, tf.data.Dataset):
            if int(data.cardinality().numpy()) == tf.data.INFINITE_CARDINALITY:
                raise InputError("The validation dataset repeats forever, so a validation would never end. Expected a "
                                 "dataset that ends (every sample once). Fix: drop .repeat() from the validation "
                                 "pipeline (or end it with .take(N) batches).")
            assert self.evaluator is not None
            self.evaluator.check_first_batch(data)  # the rest is checked batch by batch as validation runs
            return data, None
        if isinstance(data, (tuple, list)) and len(data) == 2:
            x, y = data
            assert self.evaluator is not None
            self.evaluator.evaluate_check(x, y)  # the arrays' shapes and labels, now
            return x, y
        raise InputError("validation_data must be (x_val, y_val) arrays or a tf.data.Dataset of (x, y) or (x, y, "
                         f"sample_weight) batches. Received: {type(data).__name__}"
                         f"{f' of {len(data)} items' if isinstance(data, (tuple, list)) else ''}. Fix: pass "
                         "validation_data=(x_val, y_val), or a dataset for weighted validation.")

    # ------------------------------------------------------------------ during fit
    def epoch_end(self, epoch: int, step: int) -> None:
        """Epoch ``epoch`` ended at global step ``step``: its values (and validation, when due) recorded."""
        values = {**self.monitor.epoch_values(), **metric_lib.results(self.train_metrics)}
        metric_lib.reset(self.train_metrics)
        if self.data is not None and self.every and self.every.unit == "epochs" and (epoch + 1) % self.every.n == 0:
            values.update(self.validate())
        self._record(epoch, step, values, epoch_end=True)

    def after_call(self, epoch: int, before: int, done: int) -> None:
        """A call of ``done`` steps from global step ``before``: a validation when the step schedule reaches one."""
        n = self.every.n if self.every and self.every.unit == "steps" else 0
        if self.data is not None and n and (before + done) // n > before // n:
            self._record(epoch, before + done, self.validate(), epoch_end=False)

    def validate(self) -> dict[str, float]:
        assert self.evaluator is not None and self.data is not None
        values = self.evaluator.evaluate(*self.data, what="validation_data")
        return {f"val_{k}": v for k, v in values.items()}

    def _record(self, epoch: int, step: int, values: dict[str, float], *, epoch_end: bool) -> None:
        improved = self.monitor.add(epoch, step, values, epoch_end=epoch_end)
        for o in self.observers:
            o.after_evaluation(epoch, step, values)
        if improved and self.best_store is not None and self._save is not None:
            best = self.monitor.best
            self.best_store.annotate("best", best)
            path = self._save(self.best_store, step)
            if path:
                assert best is not None
                logger.info(f"Best {best['monitor']} so far ({best['value']:.5g}): checkpoint {path}")
        if self.monitor.stopped_early and self.monitor.wait == self.monitor.patience and self.chief:
            kept = f" The best checkpoint is in {self.best_store.directory}." if self.best_store else ""
            logger.warning(f"Stopping early at step {step}: {self.monitor.stopped_early}.{kept}")

    def load(self, state: Any) -> None:
        """A resumed run's history, best value and waiting (`monitor.Monitor.load`)."""
        self.monitor.load(state)
        self._say_stopped()

    def _say_stopped(self) -> None:
        if self.stop and self.chief:
            logger.warning(f"This run stopped early ({self.monitor.stopped_early}): nothing is trained. Fix: to go on, "
                           f"resume with a larger patience (now {self.monitor.patience}), or start a new run.")

    def restore_best(self) -> str:
        """The best checkpoint loaded into the objects checkpoints hold (models, optimizers, ...); its path."""
        path = self.best_store.latest if self.best_store is not None else None
        if path is None:
            raise AmpConfigError("No best checkpoint to restore: " + (
                "this Trainer keeps none (build it with keep_best=..., and checkpoint_dir=...)."
                if self.best_store is None else f"{self.best_store.directory} holds none yet (no value of "
                f"{self.monitor.monitor} has been recorded). Fix: train with validation_data first."))
        self.best_store.checkpoint.restore(path).expect_partial()
        return str(path)

    @property
    def stop(self) -> bool:
        return self.monitor.stopped_early is not None

    # ------------------------------------------------------------------ results
    def fill(self, result: Any) -> Any:
        result.epochs = list(self.monitor.epochs)
        result.validations = list(self.monitor.validations)
        result.best = dict(self.monitor.best, path=self.best_store.latest if self.best_store else None) \
            if self.monitor.best else None
        result.stopped_early = self.monitor.stopped_early
        return result

    def forget_compiled(self) -> None:
        """Drop the evaluator's compiled functions (a model's layer policies changed since they were traced)."""
        if self.evaluator is not None:
            self.evaluator.forget_compiled()

    def evaluator_for(self, what: str) -> Evaluator:
        if self.evaluator is None:
            evaluated_update(self.updates, what)
        assert self.evaluator is not None
        return self.evaluator


def save_with(weights: Any, together: Callable[[int], Any]) -> Callable[[Any, int], str | None]:
    """``save(store, step)``: a checkpoint of finite weights, written with the other workers."""
    return lambda store, step: save_finite(store, weights, together(step))
