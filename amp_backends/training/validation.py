"""Validation during training, and evaluate/predict on their own.

`Validation` holds a trainer's metrics, the `Evaluator`, the run's history and early stopping (`metrics.Monitor`)
and the best checkpoint's store. `Evaluator` takes data as training does (arrays or a ``tf.data.Dataset``), counts
every sample (the last partial batch too), checks every batch, and sums the float32 loss across replicas and
workers: one number, the same on every worker, from one compiled call per batch traced once for any number of rows.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Callable, ContextManager, Iterator, Sequence

import numpy as np

import tensorflow as tf

from ..errors import AmpConfigError, InputError, batch_error, xla_compile_failure
from .metrics import Every, Monitor, Recording, build_metrics, masked_weights, parse_every
from .observers import Observer
from .checkpoints import CheckpointStore
from ..keras_compat import user_code
from .step import Update, float32_outputs
from ..model_inputs import as_array_nest, rows
from .precision import evaluated_update
from .inputs import BatchFn, batch_dims, contents, gather_batch, on_device, refuse_labels_beside


logger = logging.getLogger("amp_backends.train")

BEST = "best"  # the best checkpoint's folder in the checkpoint directory


class Validation:
    """Metrics, validation, history, best checkpoint and early stopping for one trainer (module docstring)."""

    def __init__(self, updates: Sequence[Update], *, metrics: Sequence[Any] | None, keep_best: str | bool | None,
                 monitor: str | None, mode: str, patience: int | None, min_delta: float,
                 strategy: tf.distribute.Strategy, batch_size: int, device: str, xla: bool, batch_fn: BatchFn | None,
                 observers: list[Observer], checkpointing: bool, chief: bool = True) -> None:
        self.updates = list(updates)
        self.update = evaluated_update(updates, "metrics=") if metrics else next(
            (u for u in updates if u.evaluation is not None), None)
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
        self.train_metrics = build_metrics(metrics, binary=binary, strategy=strategy)
        self.val_metrics = build_metrics(metrics, binary=binary, strategy=strategy, own=True)
        self.recording = Recording({self.update.name: self.train_metrics} if self.update else {})
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
        self.best_store: CheckpointStore | None = None
        self._together: Callable[[int], ContextManager[Any]] | None = None

    # ------------------------------------------------------------------ per fit
    def start(self, validation_data: Any, validation_every: int | str, store: CheckpointStore | None,
              together: Callable[[int], ContextManager[Any]]) -> None:
        """Check ``fit``'s validation arguments; the best checkpoint is saved inside ``together(step)``."""
        self.every = parse_every(validation_every)
        if validation_data is None and self.every != Every(1, "epochs"):
            raise AmpConfigError(f"validation_every={validation_every!r} says when to validate, and this fit has no "
                                 "validation_data: nothing would be validated. Fix: pass validation_data=(x_val, "
                                 "y_val) (or a dataset of batches) to fit, or leave validation_every out.")
        self.data = None if validation_data is None else self._split(validation_data)
        self.monitor.check_name(validating=self.data is not None)
        self._say_stopped()
        if self.monitor.keep_best and self.best_store is None and store is not None:
            self.best_store = store.sibling(BEST, keep=1)
        self._together = together

    def _split(self, data: Any) -> tuple[Any, Any]:
        evaluator = self.evaluator_for("validation_data")
        if isinstance(data, tf.data.Dataset):
            if int(data.cardinality().numpy()) == tf.data.INFINITE_CARDINALITY:
                raise InputError("The validation dataset repeats forever, so a validation would never end. Expected a "
                                 "dataset that ends (every sample once). Fix: drop .repeat() from the validation "
                                 "pipeline (or end it with .take(N) batches).")
            evaluator.check_first_batch(data)  # the rest is checked batch by batch as validation runs
            return data, None
        if isinstance(data, (tuple, list)) and len(data) == 2:
            x, y = data
            evaluator.resident(x, y, "validation_data")  # the arrays' shapes and labels checked now
            return x, y
        raise InputError("validation_data must be (x_val, y_val) arrays or a tf.data.Dataset of (x, y) or (x, y, "
                         f"sample_weight) batches. Received: {type(data).__name__}"
                         f"{f' of {len(data)} items' if isinstance(data, (tuple, list)) else ''}. Fix: pass "
                         "validation_data=(x_val, y_val), or a dataset for weighted validation.")

    # ------------------------------------------------------------------ during fit
    def epoch_end(self, epoch: int, step: int) -> None:
        """Epoch ``epoch`` ended at global step ``step``: its values (and validation, when due) recorded."""
        values = {**self.monitor.epoch_values(), **metric_values(self.train_metrics)}
        for m in self.train_metrics:
            m.reset_state()
        if self.data is not None and self.every and self.every.unit == "epochs" and (epoch + 1) % self.every.n == 0:
            values.update(self.validate())
        self._record(epoch, step, values, epoch_end=True)

    def after_call(self, epoch: int, before: int, done: int) -> None:
        """A call of ``done`` steps from global step ``before``: a validation when the step schedule reaches one."""
        n = self.every.n if self.every and self.every.unit == "steps" else 0
        if self.data is not None and n and (before + done) // n > before // n:
            self._record(epoch, before + done, self.validate(), epoch_end=False)

    def validate(self) -> dict[str, float]:
        """Evaluate ``validation_data`` now: each value under its name with ``val_`` before it."""
        assert self.evaluator is not None and self.data is not None
        values = self.evaluator.evaluate(*self.data, what="validation_data")
        return {f"val_{k}": v for k, v in values.items()}

    def _record(self, epoch: int, step: int, values: dict[str, float], *, epoch_end: bool) -> None:
        improved = self.monitor.add(epoch, step, values, epoch_end=epoch_end)
        for o in self.observers:
            o.after_evaluation(epoch, step, values)
        if improved and self.best_store is not None and self._together is not None:
            best = self.monitor.best
            self.best_store.annotate("best", best)
            path = self.best_store.save_finite(self._together(step))
            if path:
                assert best is not None
                logger.info(f"Best {best['monitor']} so far ({best['value']:.5g}): checkpoint {path}")
        if self.monitor.stopped_early and self.monitor.wait == self.monitor.patience and self.chief:
            kept = f" The best checkpoint is in {self.best_store.directory}." if self.best_store else ""
            logger.warning(f"Stopping early at step {step}: {self.monitor.stopped_early}.{kept}")

    def load(self, state: dict[str, Any] | None) -> None:
        """A resumed run's history, best value and waiting (`metrics.Monitor.load`)."""
        self.monitor.load(state)
        self._say_stopped()

    def _say_stopped(self) -> None:
        if self.stop and self.chief:
            logger.warning(f"This run stopped early ({self.monitor.stopped_early}): nothing is trained. Fix: to go on, "
                           f"resume with a larger patience (now {self.monitor.patience}), or start a new run.")

    def restore_best(self, store: CheckpointStore | None = None) -> str:
        """Load the best checkpoint (before any ``fit``: from ``store``'s best folder); its path."""
        if self.monitor.keep_best and self.best_store is None and store is not None:
            self.best_store = store.sibling(BEST, keep=1)
        store = self.best_store
        path = store.latest if store is not None else None
        if store is None or path is None:
            raise AmpConfigError("No best checkpoint to restore: " + (
                "this Trainer keeps none (build it with keep_best=..., and checkpoint_dir=...)."
                if self.best_store is None else f"{self.best_store.directory} holds none yet (no value of "
                f"{self.monitor.monitor} has been recorded). Fix: train with validation_data first."))
        restored = store.restore()  # (a damaged best checkpoint: our CheckpointError, naming it)
        return str(restored.path if restored else path)

    @property
    def stop(self) -> bool:
        """Whether early stopping ended the run."""
        return self.monitor.stopped_early is not None

    # ------------------------------------------------------------------ results
    def results(self) -> dict[str, Any]:
        """What a `TrainResult` reports of the run's history (the best checkpoint's ``path`` with ``keep_best``)."""
        best = self.monitor.best
        return {"epochs": list(self.monitor.epochs), "validations": list(self.monitor.validations),
                "best": dict(best, path=self.best_store.latest if self.best_store else None) if best else None,
                "stopped_early": self.monitor.stopped_early}

    def forget_compiled(self) -> None:
        """Drop the evaluator's compiled functions (a model's layer policies changed since they were traced)."""
        if self.evaluator is not None:
            self.evaluator.forget_compiled()

    def evaluator_for(self, what: str) -> Evaluator:
        """The `Evaluator` for ``evaluate()`` or ``predict()``.

        Args:
            what: What needs it, as the error says it (``"evaluate()"``).

        Returns:
            The evaluator.

        Raises:
            AmpConfigError: No update says how to evaluate its model (`evaluated_update`).
        """
        if self.evaluator is None:
            evaluated_update(self.updates, what)
        assert self.evaluator is not None
        return self.evaluator


@contextlib.contextmanager
def _said_of(what: str) -> Iterator[None]:
    """The data checks' `InputError` naming the data it is about (``validation_data``, ``evaluate()``)."""
    try:
        yield
    except InputError as exc:
        raise InputError(f"In the data given to {what}: {exc}") from None


def _labelled(batch: Any, what: str) -> None:
    if isinstance(batch, (tuple, list)) and len(batch) in (2, 3) and batch[1] is not None:
        return
    kind = f"dicts (keys {sorted(batch)})" if isinstance(batch, dict) else type(batch).__name__
    raise InputError(f"{what} needs labelled batches: (x, y) or (x, y, sample_weight). Received {kind} without "
                     "labels. Fix: pass the labels (evaluate(x, y), validation_data=(x_val, y_val)), or a dataset of "
                     "(x, y) batches.")


class Evaluator:
    """Evaluates one update's model (its `Evaluation`) with ``metrics``, and predicts with it."""

    def __init__(self, update: Update, metrics: Sequence[Any], *, strategy: Any, batch_size: int, device: str,
                 xla: bool, batch_fn: BatchFn | None = None) -> None:
        assert update.evaluation is not None
        self.update, self.evaluation = update, update.evaluation
        self.metrics = list(metrics)
        self.strategy = strategy
        self.replicas = int(strategy.num_replicas_in_sync)
        self.batch_size = batch_size
        self.device = device
        self.batch_fn = batch_fn or gather_batch
        self.xla = xla and self.replicas == 1
        self._calls: dict[str, Any] = {}
        self._last: tuple[Any, tuple[Any, Any, int]] | None = None  # the last arrays, on the device

    def forget_compiled(self) -> None:
        """Trace the compiled functions anew at their next call (after a layer's policy changed)."""
        self._calls.clear()

    # ------------------------------------------------------------------ evaluate
    def evaluate(self, x: Any, y: Any = None, *, what: str = "evaluate()") -> dict[str, float]:
        """``{"loss": ..., <metric>: ...}`` over all of ``x``/``y`` (or a dataset of batches)."""
        for m in self.metrics:
            m.reset_state()
        total, weight = 0.0, 0.0
        for i, (call, args) in enumerate(self._batches(x, y, what)):
            try:
                loss_sum, weight_sum, refused = call(*args)
            except tf.errors.OpError as exc:
                why = xla_compile_failure(exc) if self.xla and call is self._calls.get("arrays") else None
                if why is None and isinstance(exc, tf.errors.InvalidArgumentError):  # (as the training step's)
                    raise batch_error(str(exc.message), i, of=what) from None
                if why is None:
                    raise
                logger.warning(f"XLA is not used for {what}, although the plan has it on: {why}.")
                self._without_xla()
                loss_sum, weight_sum, refused = self._call("arrays", self._replica_eval_arrays, args)(*args)
            if int(refused.numpy()):
                raise InputError(f"Batch {i} of the data given to {what} {self.update.check_message or 'was refused.'}")
            total, weight = total + float(loss_sum.numpy()), weight + float(weight_sum.numpy())
        return {"loss": total / weight if weight else math.nan, **metric_values(self.metrics)}

    def _batches(self, x: Any, y: Any, what: str) -> Any:
        """``(compiled call, its arguments)`` for each batch of the data."""
        refuse_labels_beside(x, y)
        if isinstance(x, tf.data.Dataset):
            batch_dims(x.element_spec, self.batch_size, keep="")  # (unbatched: training's refusal; every sample counts)
            dataset = x
            if self.replicas > 1 or getattr(self.strategy, "cluster_resolver", None) is not None:
                dataset = self.strategy.experimental_distribute_dataset(x)
            i = -1
            for i, batch in enumerate(dataset):
                if i == 0:
                    _labelled(batch if self.replicas == 1 else self.strategy.experimental_local_results(batch)[0],
                              what)
                yield self._call("dataset", self._replica_eval, (batch,)), (batch,)
            if i < 0:
                raise InputError(f"The dataset given to {what} yields no batch: it is empty. Fix: check the pipeline.")
            return
        if y is None:
            raise InputError(f"{what} needs labels: evaluate(x, y) or validation_data=(x_val, y_val). Received x "
                             "without y. Fix: pass the labels, or a tf.data.Dataset of (x, y) batches.")
        xs, ys, n = self.resident(x, y, what)
        for start in range(0, n, self.batch_size):  # the call asked each time: it compiles without XLA after a failure
            args = (xs, ys, tf.range(start, min(start + self.batch_size, n), dtype=tf.int64))
            yield self._call("arrays", self._replica_eval_arrays, args), args

    def check_first_batch(self, dataset: Any) -> None:
        """A validation dataset's first batch checked before training (later ones as validation reads them)."""
        batch_dims(dataset.element_spec, self.batch_size, keep="")  # (as in _batches)
        for batch in dataset.take(1):
            batch = tf.nest.map_structure(lambda t: t.numpy(), batch)
            _labelled(batch, "validation_data")
            if self.update.validate is not None:
                with _said_of("validation_data"):
                    self.update.validate(batch)
            return
        raise InputError("The validation dataset yields no batch: it is empty. Fix: check the pipeline.")

    def resident(self, x: Any, y: Any, what: str) -> tuple[Any, Any, int]:
        """The arrays checked and on the device, and their rows (the same arrays as last time are not again)."""
        key = contents(x, y)
        if self._last is not None and self._last[0][0] == key[0]:
            return self._last[1]
        with _said_of(what):
            x = as_array_nest(x, "x")
            y = None if y is None else as_array_nest(y, "y")
            n = rows(x, y)
        if n == 0:
            raise InputError(f"The data given to {what} has no rows. Expected at least one sample. Fix: pass the "
                             "samples to evaluate.")
        if self.update.validate is not None and y is not None:
            with _said_of(what):
                self.update.validate((x, y))
        xs, ys, strings = on_device(x, y, self.device)
        if self.xla and strings:
            self._without_xla()  # strings (for the model's own StringLookup): XLA cannot compile them, as in training
        self._last = (key, (xs, ys, n))
        return xs, ys, n

    def _without_xla(self) -> None:
        """Evaluate without XLA from now on (only the calls on arrays are XLA-compiled)."""
        self.xla = False
        self._calls.pop("arrays", None)

    def _call(self, key: str, replica_fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """The compiled evaluation of ``key`` (``"arrays"``, ``"dataset"``; ``"predict"``: ``replica_fn`` itself), first
        called with ``args``: traced once for any number of rows (a trace per shape warns of retracing)."""
        if key not in self._calls:
            def call(*inputs):
                per_replica = self.strategy.run(replica_fn, args=inputs)
                return tuple(self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for v in per_replica)

            self._calls[key] = tf.function(replica_fn if key == "predict" else call, autograph=False,
                                           jit_compile=self.xla and key == "arrays", reduce_retracing=True)
            if all(isinstance(t, tf.Tensor) for t in tf.nest.flatten(args)):  # (not one replica's part of a batch)
                self._calls[key].get_concrete_function(*tf.nest.map_structure(
                    lambda t: tf.TensorSpec([None, *t.shape[1:]] if t.shape.rank else [], t.dtype), args))
        return self._calls[key]

    def _replica_eval_arrays(self, x: Any, y: Any, idx: Any) -> Any:
        return self._replica_eval(user_code(self.batch_fn)(x, y, _replica_slice(idx)))

    def _replica_eval(self, batch: Any) -> Any:
        """In each replica: the batch's loss sum, its weight and whether the update's check refused it."""
        _labelled(batch, "evaluation")
        ok = tf.constant(True)
        if self.update.check is not None:
            ok, batch = user_code(self.update.check)(batch)
        x, y = batch[0], batch[1]
        weights = batch[2] if len(batch) == 3 else None
        raw = user_code(self.evaluation.predict)(x)
        pred = float32_outputs(raw)
        values, own = tf.cast(user_code(self.evaluation.loss)(y, pred), tf.float32), self.evaluation.own()
        values = values if own is None else values + own
        w = masked_weights(values, weights, raw)
        w = tf.ones_like(values) if w is None else w
        for m in self.metrics:
            user_code(m.update_state)(y, pred, weights)
        return tf.reduce_sum(values * w), tf.reduce_sum(w), tf.cast(tf.logical_not(ok), tf.int32)

    # ------------------------------------------------------------------ predict
    def predict(self, x: Any) -> Any:
        """The model's outputs for all of ``x`` (arrays or a dataset), as NumPy arrays (float32 where floating)."""
        if isinstance(x, tf.data.Dataset):
            batches: Any = (b[0] if isinstance(b, (tuple, list)) else b for b in x)
        else:
            self.evaluation.check(x)
            xs, _, n = self.resident(x, None, "predict()")
            batches = (self.batch_fn(xs, None, tf.range(start, min(start + self.batch_size, n), dtype=tf.int64))[0]
                       for start in range(0, n, self.batch_size))
        outs = []
        for xb in batches:
            predict = self._call("predict", lambda b: float32_outputs(user_code(self.evaluation.predict)(b)), (xb,))
            outs.append(tf.nest.map_structure(lambda t: t.numpy(), predict(xb)))
        if not outs:
            raise InputError("predict() was given no samples. Fix: pass at least one row.")
        return tf.nest.map_structure(lambda *parts: np.concatenate(parts, axis=0), *outs)


def metric_values(metrics: Sequence[Any]) -> dict[str, float]:
    """Each metric's value (one number, added up across replicas and workers) under its name.

    Args:
        metrics: Keras metric objects.

    Returns:
        Their values by name (a metric that reports several values gives each under its own name).
    """
    out = {}
    for m in metrics:
        value = m.result()  # (a dict of values for a metric that reports several)
        out.update({k: _number(v) for k, v in (value if isinstance(value, dict) else {m.name: value}).items()})
    return out


def _number(value: Any) -> float:
    try:
        return float(tf.reduce_mean(tf.cast(value, tf.float32)).numpy())
    except Exception:
        return math.nan


def _replica_slice(idx: Any) -> Any:
    """This replica's rows of a global batch of indices (the last replicas get fewer, or none, in a short batch)."""
    ctx = tf.distribute.get_replica_context()
    n = ctx.num_replicas_in_sync
    if n == 1:
        return idx
    size = tf.shape(idx, out_type=tf.int64)[0]
    local = (size + n - 1) // n
    start = tf.minimum(tf.cast(ctx.replica_id_in_sync_group, tf.int64) * local, size)
    return idx[start:tf.minimum(start + local, size)]
