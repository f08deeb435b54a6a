"""What a ``fit`` call collects as it goes (`Progress`) and what it returns (`TrainResult`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .observers import WARMUP_CALLS, CallRecord


@dataclass
class TrainResult:
    """What `Trainer.fit` did.

    Attributes:
        steps: The step the run reached, counted over the whole run (resumes included).
        epochs_completed: The epochs completed over the whole run.
        median_throughput: The median samples per second of this ``fit``'s calls after the warm-up calls
            (``None`` with too few).
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
        tp = f"{self.median_throughput:.4g} img/s" if self.median_throughput else "n/a (too few steps after warm-up)"
        steps = ", ".join(f"{k}: {self.applied[k]} applied, {self.skipped[k]} skipped" for k in self.applied)
        best = (f", best {self.best['monitor']} {self.best['value']:.5g} (epoch {self.best['epoch']}, step "
                f"{self.best['step']})" if self.best else "")
        return (f"Summary: {self.steps} steps ({steps}), median throughput {tp}, loss scales "
                + ", ".join(f"{k}={v:g}" for k, v in self.loss_scales.items()) + ", last losses "
                + ", ".join(f"{k}: {v:.5g}" for k, v in self.last_losses.items()) + best
                + (f"; stopped early: {self.stopped_early}" if self.stopped_early else ""))


@dataclass
class Progress:
    """What one ``fit`` call collects as it goes."""

    names: Sequence[str]
    warmup_calls: int = WARMUP_CALLS
    throughputs: list[float] = field(default_factory=list)
    history: list[dict[str, float]] = field(default_factory=list)
    last: dict[str, float] = field(default_factory=dict)
    calls: int = 0

    def add(self, ran: Any, epoch: int, first: int, step: int, images_per_step: int, seconds: float, compiling: bool,
            scalers: Mapping[str, Any]) -> CallRecord:
        """A call (`Ran`) of epoch ``epoch`` from its step ``first`` to global ``step``, which took
        ``seconds``; calls that compiled or warmed up stay out of the median. Returns what observers are told."""
        step_time = seconds / ran.done
        throughput = images_per_step / step_time
        self.calls += 1
        if self.calls > self.warmup_calls and not compiling:
            self.throughputs.append(throughput)
        self.last = {n: float(ran.losses[-1][j]) for j, n in enumerate(self.names)}
        self.history.append({"step": step, "throughput": throughput, **self.last})
        return CallRecord(epoch, first, step, ran.done, self.names, ran.losses, ran.finite, step_time, throughput,
                          {n: s.current for n, s in scalers.items()},
                          {n: int(s.skipped.numpy()) for n, s in scalers.items()})

    def result(self, steps: int, epochs_completed: int, scalers: Mapping[str, Any]) -> TrainResult:
        """The result after ``steps`` steps, with each update's skipped steps and loss scale from its scaler."""
        skipped = {n: int(s.skipped.numpy()) for n, s in scalers.items()}
        return TrainResult(
            steps=steps,
            epochs_completed=epochs_completed,
            median_throughput=statistics.median(self.throughputs) if self.throughputs else None,
            throughputs=self.throughputs,
            last_losses=self.last,
            skipped=skipped,
            applied={n: steps - s for n, s in skipped.items()},
            loss_scales={n: s.current for n, s in scalers.items()},
            history=self.history,
        )
