"""Metrics, and what watches them across epochs: the history, the best checkpoint, early stopping.

Metric names resolve as ``model.compile`` resolves them, objects are used as given (rebuilt in the strategy's scope
under several replicas), and validation has copies; Keras sums their state across replicas and workers when read.
`Monitor` records the epochs and validations (`parse_every`), the best monitored value (``keep_best``) and early
stopping (``patience``); all of it is in every checkpoint, so a resumed run goes on as the uninterrupted one would.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import tensorflow as tf
from typing_extensions import override

from ..errors import AmpConfigError, warn
from .inputs import Ran
from .loss_scaling import LossScaler
from .observers import WARMUP_CALLS, CallRecord, Observer
from ..keras_compat import user_code
from .runs import At


# process-wide, not thread-local: under a tf.distribute strategy the replicas' functions are traced in other threads
_recording: dict[str, dict[str, list[Any]]] = {"current": {}}

ACCURACY_NAMES = ("accuracy", "acc")


@tf.autograph.experimental.do_not_convert  # (the library's; the metrics are converted: user_code)
def record_predictions(update: str, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
    """Inside a trainer's step: update its training metrics of ``update`` with this batch (else nothing).

    Args:
        update: The update's name.
        y_true: The batch's labels.
        y_pred: The model's outputs on it.
        sample_weight: Per-sample weights, or ``None``.
    """
    for m in _recording["current"].get(update) or ():
        user_code(m.update_state)(y_true, y_pred, sample_weight)


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
    """``"accuracy"`` as Keras's ``compile`` resolves it from the shapes: binary for one output per sample (or
    ``binary=True``: a binary cross-entropy), sparse categorical for class ids, categorical for one-hot labels."""

    def __init__(self, name: str = "accuracy", binary: bool = False, **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.binary = binary

    @override
    @tf.autograph.experimental.do_not_convert
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

    @override
    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "binary": self.binary}


def _one(spec: Any, binary: bool, replicas: int, own: bool) -> Any:
    """The metric for ``spec``; ``own``: a new object even for a metric object given (the validation's copy)."""
    if isinstance(spec, str):
        if spec.lower() in ACCURACY_NAMES:
            return Accuracy(binary=binary)
        try:
            found = tf.keras.metrics.get(spec)
        except (ValueError, TypeError):
            found = None
        if not callable(found):  # (an unknown name: Keras 3 raises, Keras 2 hands it back as it is)
            raise AmpConfigError(f"Unknown metric {spec!r}. Expected a Keras metric name (such as 'accuracy', "
                                 "'sparse_top_k_categorical_accuracy', 'mae') or a keras.metrics.Metric object. Fix: "
                                 "check the spelling, or pass the metric object.")
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
    raise AmpConfigError(f"metrics must be a list of Keras metric names, keras.metrics.Metric objects or functions "
                         f"(y_true, y_pred) -> values. Received: {spec!r} (of type {type(spec).__name__}). Fix: "
                         "pass such as metrics=['accuracy'] or metrics=[keras.metrics.AUC()].")


def build_metrics(specs: Sequence[Any] | None, *, binary: bool, strategy: Any, own: bool = False) -> list[Any]:
    """Metric objects for ``specs`` (unique names, not ``loss``), made in ``strategy``'s scope; ``binary``: the loss is
    a binary cross-entropy; ``own``: metric objects given are copied, not used themselves."""
    if specs is None:
        return []
    if isinstance(specs, (str, tf.keras.metrics.Metric)) or not isinstance(specs, (list, tuple)):
        raise AmpConfigError(f"metrics must be a list, such as metrics=['accuracy']. Received: {specs!r}. Fix: put "
                             f"it in a list: metrics=[{specs!r}].")
    replicas = int(strategy.num_replicas_in_sync)
    with strategy.scope():
        out = [_one(s, binary, replicas, own) for s in specs]
    names = [m.name for m in out]
    clash = sorted({n for n in names if names.count(n) > 1 or n == "loss"})
    if clash:
        raise AmpConfigError(f"Metric names must be unique and not 'loss' (they name the logged values). Received "
                             f"names {names}. Fix: give each metric its own name=...")
    return out


logger = logging.getLogger("amp_backends.train")

MAXIMISED = ("acc", "auc", "precision", "recall", "f1", "iou")


@dataclass(frozen=True)
class Every:
    """A schedule: every ``n`` epochs or steps."""

    n: int
    unit: str  # "epochs" or "steps"


def parse_every(value: Any) -> Every:
    """``validation_every``: ``1``, ``"2 epochs"``, ``"500 steps"``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return Every(value, "epochs")
    match = re.fullmatch(r"\s*(\d+)\s*(epochs?|steps?)\s*", value) if isinstance(value, str) else None
    if match and int(match.group(1)) >= 1:
        unit = match.group(2)
        return Every(int(match.group(1)), unit if unit.endswith("s") else unit + "s")
    raise AmpConfigError(f"validation_every must be a number of epochs (an integer >= 1) or a string such as "
                         f"'2 epochs' or '500 steps'. Received: {value!r}. Fix: pass such as validation_every=1 "
                         "(each epoch) or validation_every='500 steps'.")


class Monitor(Observer):
    """Per-epoch values, validation results, the best monitored value and early stopping (module docstring)."""

    def __init__(self, updates: Sequence[str], metric_names: Sequence[str], *, keep_best: str | bool | None,
                 monitor: str | None, mode: str, patience: int | None, min_delta: float) -> None:
        self.updates = list(updates)
        self.metric_names = list(metric_names)
        if patience is not None and (not isinstance(patience, int) or isinstance(patience, bool) or patience < 1):
            raise AmpConfigError(f"patience must be an integer >= 1 (values without improvement before training stops) "
                                 f"or None. Received: {patience!r}. Fix: pass a whole number, such as patience=3.")
        if not isinstance(min_delta, (int, float)) or min_delta < 0:
            raise AmpConfigError(f"min_delta must be a number >= 0. Received: {min_delta!r}. Fix: pass such as "
                                 "min_delta=0.001 (the least change that counts as better), or leave it out (0).")
        if not (keep_best is None or isinstance(keep_best, (bool, str))) or keep_best == "":
            raise AmpConfigError(f"keep_best must be the name of a logged value to keep the best checkpoint by, such "
                                 f"as 'val_accuracy' or 'val_loss', or True (by monitor=, else 'val_loss'). Received: "
                                 f"{keep_best!r}. Fix: pass such as keep_best='val_loss', or leave it out.")
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise AmpConfigError(f"monitor must be the name of a logged value, such as 'val_loss'. Received: "
                                 f"{monitor!r}. Fix: pass such as monitor='val_accuracy', or leave it out.")
        if isinstance(keep_best, str) and monitor is not None and keep_best != monitor:
            raise AmpConfigError(f"keep_best={keep_best!r} and monitor={monitor!r} name two values; one is monitored. "
                                 "Fix: give one of them (keep_best=True with monitor=..., or keep_best=<name>).")
        watched = keep_best if isinstance(keep_best, str) else monitor
        if watched is None and (keep_best or patience):
            watched = "val_loss"
        self.monitor: str | None = watched
        self.keep_best = bool(keep_best)
        if mode not in ("auto", "min", "max"):
            raise AmpConfigError(f"mode must be 'auto', 'min' or 'max'. Received: {mode!r}. Fix: pass one of them "
                                 "('auto': 'max' for accuracies and the like, else 'min').")
        if mode == "auto":
            mode = "max" if any(k in (watched or "").lower() for k in MAXIMISED) else "min"
        self.mode = mode
        self.patience, self.min_delta = patience, float(min_delta)
        self.epochs: list[dict[str, Any]] = []
        self.validations: list[dict[str, Any]] = []
        self.best: dict[str, Any] | None = None
        self.wait = 0
        self.stopped_early: str | None = None
        self._sums = {u: [0.0, 0] for u in self.updates}  # the current epoch's applied losses

    def _loss_name(self, update: str) -> str:
        """An update's epoch loss: ``loss``, or ``loss/<update>`` among several."""
        return "loss" if len(self.updates) == 1 else f"loss/{update}"

    def names(self, validating: bool) -> list[str]:
        """The names a run logs: training loss(es) and metrics per epoch, ``val_*`` with validation."""
        train = [self._loss_name(u) for u in self.updates] + self.metric_names
        return train + ([f"val_{n}" for n in ["loss", *self.metric_names]] if validating else [])

    def check_name(self, validating: bool | None) -> None:
        """The monitored name is one the run logs (``validating=None``: before ``fit`` says whether it validates)."""
        if self.monitor is None:
            return
        known = self.names(True if validating is None else validating)
        if self.monitor in known:
            return
        why = (" This fit has no validation_data, so no val_* value is logged."
               if self.monitor.startswith("val_") and validating is False else "")
        raise AmpConfigError(f"keep_best/patience monitor {self.monitor!r}, which this run does not log.{why} "
                             f"Expected one of {known}. Fix: pass validation_data=... to fit, add the metric "
                             "(metrics=[...]), or monitor one of those names.")

    # ------------------------------------------------------------------ as an observer
    @override
    def after_call(self, r: CallRecord) -> None:
        for i in range(r.steps):
            for j, name in enumerate(r.names):
                if r.finite[i][j] and math.isfinite(float(r.losses[i][j])):
                    self._sums[name][0] += float(r.losses[i][j])
                    self._sums[name][1] += 1

    # ------------------------------------------------------------------ records
    def epoch_values(self) -> dict[str, float]:
        """The finished epoch's mean training loss(es); the running sums start again."""
        out = {self._loss_name(u): (s / n if n else math.nan) for u, (s, n) in self._sums.items()}
        self._sums = {u: [0.0, 0] for u in self.updates}
        return out

    def add(self, epoch: int, step: int, values: dict[str, float], *, epoch_end: bool) -> bool:
        """A record at an epoch's end or of a validation between epochs; whether the monitored value improved."""
        record = {"epoch": epoch, "step": step, **values}
        if epoch_end:
            self.epochs.append(record)
        validated = {k: v for k, v in values.items() if k.startswith("val_")}
        if validated:
            self.validations.append({"epoch": epoch, "step": step, **validated})
        # improved on the best? After ``patience`` values that did not, `stopped_early`
        if self.monitor is None or self.monitor not in record:
            return False
        value = float(record[self.monitor])
        best = None if self.best is None else float(self.best["value"])
        better = math.isfinite(value) and (best is None or (value > best + self.min_delta if self.mode == "max"
                                                            else value < best - self.min_delta))
        if better:
            self.best = {"monitor": self.monitor, "mode": self.mode, "value": value, "epoch": record["epoch"],
                         "step": record["step"]}
            self.wait = 0
            return True
        self.wait += 1
        if self.patience and self.wait >= self.patience:
            assert self.best is not None or not math.isfinite(value)
            where = (f"its best {self.best['value']:.5g} (epoch {self.best['epoch']}, step {self.best['step']})"
                     if self.best else "a finite value")
            self.stopped_early = (f"{self.monitor} has not improved on {where} by more than {self.min_delta:g} "
                                  f"for {self.wait} value{'s' if self.wait > 1 else ''} in a row "
                                  f"(patience={self.patience})")
        return False

    # ------------------------------------------------------------------ resume
    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the run's history (JSON)."""
        return {"epochs": self.epochs, "validations": self.validations, "best": self.best, "wait": self.wait,
                "stopped_early": self.stopped_early, "epoch_sums": self._sums}

    def load(self, state: dict[str, Any] | None) -> None:
        """A resumed run's history, best value and waiting, from its checkpoint's `state`."""
        if not state:
            return
        self.epochs = list(state.get("epochs", []))
        self.validations = list(state.get("validations", []))
        best = state.get("best")
        self.best = best if best and best.get("monitor") == self.monitor and best.get("mode") == self.mode else None
        if best and self.best is None and self.monitor:
            logger.info(f"The checkpoint's best value was of {best.get('monitor')} ({best.get('mode')}); this run "
                        f"monitors {self.monitor} ({self.mode}): its best starts afresh.")
        self.wait = int(state.get("wait", 0)) if self.best is not None else 0
        # stopped only if this run's patience is spent too (a resumed run with more patience goes on)
        spent = self.best is not None and bool(self.patience) and self.wait >= (self.patience or 0)
        self.stopped_early = state.get("stopped_early") if spent else None
        sums = state.get("epoch_sums") or {}
        self._sums = {u: list(sums.get(u, [0.0, 0])) for u in self.updates}


# ------------------------------------------------------------------------------------ each call of a fit
@dataclass
class Progress:
    """What one ``fit`` records of each call, told to ``observers``; compiling (a key not in ``called``) or warm-up
    calls stay out of the median throughput."""

    names: Sequence[str]
    observers: Sequence[Observer]
    called: set[Any]
    images_per_step: int
    warmup_calls: int = WARMUP_CALLS
    throughputs: list[float] = field(default_factory=list)
    history: list[dict[str, float]] = field(default_factory=list)
    last: dict[str, float] = field(default_factory=dict)
    said_skipped: set[str] = field(default_factory=set)  # the updates whose skipped step was said
    calls: int = 0
    _t0: float = 0.0

    def start(self, step: int, total_steps: int | None) -> None:
        """Tell the observers that a fit starts (`Observer.on_fit_start`).

        Args:
            step: The global step it starts from.
            total_steps: The step it will stop at, or ``None`` when the data's length is unknown.
        """
        for o in self.observers:
            o.on_fit_start(step, total_steps)

    def before_call(self, step: int, steps: int) -> None:
        """Tell the observers that a call starts, and start its clock.

        Args:
            step: The global step before the call.
            steps: The steps the call will run.
        """
        for o in self.observers:
            o.before_call(step, steps)
        self._t0 = time.perf_counter()

    def after_call(self, ran: Ran, at: At, first: int, scalers: Mapping[str, LossScaler]) -> None:
        """Record the call (`Ran`) from ``at`` (step ``first`` of its epoch) and tell the observers."""
        seconds = time.perf_counter() - self._t0
        compiling = ran.key not in self.called
        self.called.add(ran.key)
        if not ran.done:
            return
        step_time = seconds / ran.done
        throughput = self.images_per_step / step_time
        self.calls += 1
        if self.calls > self.warmup_calls and not compiling:
            self.throughputs.append(throughput)
        self.last = {n: float(ran.losses[-1][j]) for j, n in enumerate(self.names)}
        self.history.append({"step": at.step + ran.done, "throughput": throughput, **self.last})
        record = CallRecord(at.epoch, first, at.step + ran.done, ran.done, self.names, ran.losses, ran.finite,
                            step_time, throughput, {n: s.current for n, s in scalers.items()},
                            {n: int(s.skipped.numpy()) for n, s in scalers.items()})
        for o in self.observers:
            o.after_call(record)
        for j, n in enumerate(self.names):  # a skip no loss scale explains: said once a fit
            if n not in self.said_skipped and scalers[n].config.mode != "dynamic" and not ran.finite[:, j].all():
                self.said_skipped.add(n)
                i = int(ran.finite[:, j].argmin())
                said = (f"Step {at.step + i} (epoch {at.epoch}, step {first + i} of the epoch) of {n!r} was skipped: "
                        f"its gradients were not finite (inf or NaN), and with {scalers[n].config.mode} loss scaling "
                        "no scale overflowed: that batch holds inf or NaN, a value went past its dtype's range, or "
                        "training diverged. Training goes on, skipping such steps. Fix: check that batch's inputs "
                        "(np.isfinite), or lower the learning rate.")
                warn(said, log=logger)

    def close(self) -> None:
        """Close every observer (`Observer.close`)."""
        for o in self.observers:
            o.close()

    def results(self, steps: int, scalers: Mapping[str, LossScaler]) -> dict[str, Any]:
        """What a `TrainResult` reports of the calls and of each update's scaler after ``steps`` steps."""
        skipped = {n: int(s.skipped.numpy()) for n, s in scalers.items()}
        return {"median_throughput": statistics.median(self.throughputs) if self.throughputs else None,
                "throughputs": self.throughputs, "last_losses": self.last, "skipped": skipped,
                "applied": {n: steps - k for n, k in skipped.items()},
                "loss_scales": {n: s.current for n, s in scalers.items()}, "history": self.history}


def masked_weights(values: Any, sample_weight: Any, outputs: Any) -> Any:
    """Per-value loss weights: the sample weights times the Keras mask of a single output where it has one (padded
    timesteps of ``mask_zero``: left out of the loss, as Keras's losses leave them).

    Args:
        values: The per-example (or per-position) loss values.
        sample_weight: One weight per sample (over each of its values), one per value (a per-position loss's
            ``(N, T)``), or ``None``.
        outputs: The model's outputs as it returned them (its mask read from ``_keras_mask``).

    Returns:
        The weights, float32, or ``None`` where there are none (a plain mean).
    """
    mask = None if isinstance(outputs, (dict, list, tuple)) else getattr(outputs, "_keras_mask", None)
    w = None
    if sample_weight is not None:  # a sample's weight over each of its values (a loss per position: (N, T))
        sample_weight, rank = tf.cast(sample_weight, tf.float32), values.shape.rank
        if rank is not None and sample_weight.shape.rank == rank + 1 and sample_weight.shape[-1] == 1:
            sample_weight = tf.squeeze(sample_weight, -1)  # (N, T, 1), as the labels of (N, T) values may be
        w = tf.reshape(sample_weight, [-1])
        if rank is not None and rank > 1 and sample_weight.shape.rank == rank:  # a weight per value (a token's)
            w = sample_weight * tf.ones_like(values)
        elif rank is None:
            w = tf.reshape(w, tf.shape(values))
        else:
            w = tf.reshape(w, [-1] + [1] * (rank - 1)) * tf.ones_like(values)
    if mask is not None and mask.shape.rank == values.shape.rank:
        w = tf.cast(mask, tf.float32) * (1.0 if w is None else w)
    return w
