"""Keras metrics in the trainer: resolved from names as ``model.compile`` does, updated on training batches inside the
compiled step, read as one number across replicas and workers.

``metrics=["accuracy", keras.metrics.AUC()]``: a name is resolved as Keras resolves it (``"accuracy"`` is sparse
categorical, categorical or binary accuracy after the shapes of the labels and the predictions, binary after a
binary cross-entropy), an object is taken as it is for training batches (rebuilt from its config inside the
strategy's scope when there are several replicas, so its state is kept per replica) and copied for validation:
each metric has one object for the training batches (reset at each epoch's start) and one for validation (reset
at each evaluation).

Keras keeps a metric's state in variables synchronised on read with a sum: each replica adds its batches, and
reading the result outside the replicas adds them up across replicas and workers — every worker reads the same
number.

On training batches, an update's ``loss_fn`` reports its predictions with `record_predictions` (the
classifier's does); the metrics the trainer is recording for that update are then updated inside the step.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import tensorflow as tf

from ..errors import AmpConfigError

# What the training call being traced records, process-wide: under a tf.distribute strategy the replicas' functions
# are traced in threads of their own, which a thread-local value set around the call would not reach.
_recording: dict[str, dict[str, list[Any]]] = {"current": {}}

ACCURACY_NAMES = ("accuracy", "acc")


def record_predictions(update: str, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
    """Inside a training step: update the trainer's training metrics of ``update`` with this batch (nothing
    happens outside a trainer's step, or when it has no metrics)."""
    metrics = _recording["current"].get(update)
    for m in metrics or ():
        m.update_state(y_true, y_pred, sample_weight)


class Recording:
    """While tracing a training call: `record_predictions` updates these metrics (per update name)."""

    def __init__(self, metrics: Mapping[str, Sequence[Any]]) -> None:
        self.metrics = {k: list(v) for k, v in metrics.items() if v}

    def __enter__(self) -> None:
        self.saved = _recording["current"]
        _recording["current"] = self.metrics

    def __exit__(self, *exc: Any) -> None:
        _recording["current"] = self.saved


class Accuracy(tf.keras.metrics.Mean):
    """``"accuracy"`` as Keras's ``compile`` resolves it, from the shapes it is given: sparse categorical accuracy
    for class ids (labels of one rank less than the predictions, or a last axis of 1 against several classes),
    binary accuracy for one output per sample (threshold 0.5; ``binary=True`` whatever the shapes: the loss is a
    binary cross-entropy), categorical accuracy for one-hot labels."""

    def __init__(self, name: str = "accuracy", binary: bool = False, **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.binary = binary

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        y_pred = tf.convert_to_tensor(y_pred)
        y_true = tf.convert_to_tensor(y_true)
        m = tf.keras.metrics
        width, rank, label_rank = y_pred.shape[-1], y_pred.shape.rank, y_true.shape.rank
        if self.binary or width == 1 or rank == 1:
            if label_rank is not None and rank is not None and label_rank == rank - 1:
                y_true = tf.expand_dims(y_true, -1)
            matches = m.binary_accuracy(tf.cast(y_true, y_pred.dtype), y_pred)
        elif label_rank == rank - 1 or (label_rank == rank and y_true.shape[-1] == 1):
            matches = m.sparse_categorical_accuracy(y_true, y_pred)
        else:
            matches = m.categorical_accuracy(y_true, y_pred)
        return super().update_state(matches, sample_weight)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "binary": self.binary}


def _one(spec: Any, binary: bool, replicas: int, own: bool) -> Any:
    """The metric for ``spec``; ``own``: a new object even for a metric object given (the validation's copy)."""
    if isinstance(spec, str):
        if spec.lower() in ACCURACY_NAMES:
            return Accuracy(binary=binary)
        try:
            found = tf.keras.metrics.get(spec)
            if not callable(found):  # (Keras 2 hands an unknown name back as it is)
                raise ValueError(spec)
        except (ValueError, TypeError):
            raise AmpConfigError(f"Unknown metric {spec!r}. Expected a Keras metric name (such as 'accuracy', "
                                 "'sparse_top_k_categorical_accuracy', 'mae') or a keras.metrics.Metric object. Fix: "
                                 "check the spelling, or pass the metric object.") from None
        if isinstance(found, type):
            found = found()
        return found if isinstance(found, tf.keras.metrics.Metric) else tf.keras.metrics.MeanMetricWrapper(found,
                                                                                                          name=spec)
    if isinstance(spec, tf.keras.metrics.Metric):
        if replicas == 1 and not own:
            return spec
        try:  # a copy of its own: the validation's, or one whose state is kept per replica (in the strategy's scope)
            return type(spec).from_config(spec.get_config())
        except Exception as exc:
            raise AmpConfigError(f"The metric {spec.name!r} ({type(spec).__name__}) cannot be rebuilt from its config "
                                 f"({type(exc).__name__}: {exc}); the trainer keeps a copy for validation (and, under "
                                 "several replicas, builds it inside the strategy's scope). Fix: give the metric a "
                                 "get_config() that from_config() takes, or pass its name.") from None
    if callable(spec):
        return tf.keras.metrics.MeanMetricWrapper(spec, name=getattr(spec, "__name__", "metric"))
    raise TypeError(f"metrics must be a list of Keras metric names, keras.metrics.Metric objects or functions "
                    f"(y_true, y_pred) -> values. Received: {spec!r} (of type {type(spec).__name__}).")


def build_metrics(specs: Sequence[Any] | None, *, binary: bool, strategy: Any, own: bool = False) -> list[Any]:
    """Metric objects for ``specs``, created inside ``strategy``'s scope; names must be unique and not ``loss``.
    ``binary``: the loss is a binary cross-entropy (``"accuracy"`` is then binary accuracy); ``own``: metric
    objects given are copied (the validation's copies), not used themselves."""
    if specs is None:
        return []
    if isinstance(specs, (str, tf.keras.metrics.Metric)) or not isinstance(specs, (list, tuple)):
        raise TypeError(f"metrics must be a list, such as metrics=['accuracy']. Received: {specs!r}.")
    replicas = int(strategy.num_replicas_in_sync)
    with strategy.scope():
        out = [_one(s, binary, replicas, own) for s in specs]
    names = [m.name for m in out]
    clash = sorted({n for n in names if names.count(n) > 1 or n == "loss"})
    if clash:
        raise AmpConfigError(f"Metric names must be unique and not 'loss' (they name the logged values). Received "
                             f"names {names}. Fix: give each metric its own name=...")
    return out


def results(metrics: Sequence[Any]) -> dict[str, float]:
    """Each metric's value (one number, added up across replicas and workers) under its name."""
    out = {}
    for m in metrics:
        value = m.result()
        if isinstance(value, dict):
            out.update({k: _number(v) for k, v in value.items()})
        else:
            out[m.name] = _number(value)
    return out


def _number(value: Any) -> float:
    try:
        return float(tf.reduce_mean(tf.cast(value, tf.float32)).numpy())
    except Exception:
        return math.nan


def reset(metrics: Sequence[Any]) -> None:
    for m in metrics:
        m.reset_state()


def variables(metrics: Sequence[Any]) -> list[Any]:
    """The metrics' state, for a checkpoint (a resumed epoch's training metrics continue from it)."""
    return [v for m in metrics for v in m.variables]
