"""What a run learns about itself as it goes: per-epoch values, validations, the best monitored value, early stopping.

* **Per epoch** (``TrainResult.epochs``): the mean training loss of the epoch's applied steps (per update), the
  training metrics over the epoch, and the validation values when the epoch ended with a validation.
* **Validations** run every ``validation_every`` epochs (an ``int``, or ``"3 epochs"``) or steps (``"500 steps"``:
  at the end of the call that reaches each multiple; calls are never cut), and at no other time.
* **The best checkpoint** (``keep_best="val_accuracy"``): after each new value of the monitored name that improves
  on the best so far (``mode``: ``"max"``, ``"min"``, or ``"auto"``: ``max`` for accuracies, AUC, precision,
  recall, F1 and IoU, ``min`` otherwise), a checkpoint goes to ``<checkpoint_dir>/best`` (one kept), beside the
  latest ones.
* **Early stopping** (``patience=N``): training ends after ``N`` values of the monitored name in a row that do not
  improve on the best by more than ``min_delta``; ``TrainResult.stopped_early`` says why.

All of it is part of every checkpoint (the epoch's running loss and training metrics too), so a resumed run knows
its history, its best value and how long it has waited, and goes on as the uninterrupted run would.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import AmpConfigError
from .observers import CallRecord, Observer

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
                         f"'2 epochs' or '500 steps'. Received: {value!r}.")


def mode_of(monitor: str, mode: str) -> str:
    if mode not in ("auto", "min", "max"):
        raise AmpConfigError(f"mode must be 'auto', 'min' or 'max'. Received: {mode!r}.")
    if mode != "auto":
        return mode
    return "max" if any(k in monitor.lower() for k in MAXIMISED) else "min"


class Monitor(Observer):
    """Per-epoch values, validation results, the best monitored value and early stopping (module docstring)."""

    def __init__(self, updates: Sequence[str], metric_names: Sequence[str], *, keep_best: str | bool | None,
                 monitor: str | None, mode: str, patience: int | None, min_delta: float) -> None:
        self.updates = list(updates)
        self.metric_names = list(metric_names)
        if patience is not None and (not isinstance(patience, int) or isinstance(patience, bool) or patience < 1):
            raise AmpConfigError(f"patience must be an integer >= 1 (values without improvement before training stops) "
                                 f"or None. Received: {patience!r}.")
        if not isinstance(min_delta, (int, float)) or min_delta < 0:
            raise AmpConfigError(f"min_delta must be a number >= 0. Received: {min_delta!r}.")
        if not (keep_best is None or isinstance(keep_best, (bool, str))) or keep_best == "":
            raise AmpConfigError(f"keep_best must be the name of a logged value to keep the best checkpoint by, such "
                                 f"as 'val_accuracy' or 'val_loss', or True (by monitor=, else 'val_loss'). Received: "
                                 f"{keep_best!r}.")
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise AmpConfigError(f"monitor must be the name of a logged value, such as 'val_loss'. Received: "
                                 f"{monitor!r}.")
        if isinstance(keep_best, str) and monitor is not None and keep_best != monitor:
            raise AmpConfigError(f"keep_best={keep_best!r} and monitor={monitor!r} name two values; one is monitored. "
                                 "Fix: give one of them (keep_best=True with monitor=..., or keep_best=<name>).")
        watched = keep_best if isinstance(keep_best, str) else monitor
        if watched is None and (keep_best or patience):
            watched = "val_loss"
        self.monitor: str | None = watched
        self.keep_best = bool(keep_best)
        self.mode = mode_of(watched or "", mode)
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
        why = ""
        if self.monitor.startswith("val_") and validating is False:
            why = " This fit has no validation_data, so no val_* value is logged."
        raise AmpConfigError(f"keep_best/patience monitor {self.monitor!r}, which this run does not log.{why} "
                             f"Expected one of {known}. Fix: pass validation_data=... to fit, add the metric "
                             "(metrics=[...]), or monitor one of those names.")

    # ------------------------------------------------------------------ as an observer
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
        """A record at the end of an epoch (training values, and ``val_*`` when it validated) or of a validation
        between epochs; returns whether the monitored value improved on the best (a best checkpoint is due)."""
        record = {"epoch": epoch, "step": step, **values}
        if epoch_end:
            self.epochs.append(record)
        validated = {k: v for k, v in values.items() if k.startswith("val_")}
        if validated:
            self.validations.append({"epoch": epoch, "step": step, **validated})
        return self._judge(record)

    def _judge(self, record: dict[str, Any]) -> bool:
        """Whether the monitored value improved; after ``patience`` values that did not, `stopped_early`."""
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

