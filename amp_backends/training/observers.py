"""What watches training: the log line, TensorBoard scalars, the progress bar, the profiler window (each an
`Observer`, called around every compiled call with a `CallRecord`; ``Trainer(observers=[...])`` adds yours), and
Keras ``fit``'s callback (`ThroughputLogger`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import tensorflow as tf
from typing_extensions import override

from ..configure import ensure_visible_logging
from ..errors import AmpConfigError, write_failure

if TYPE_CHECKING:  # pragma: no cover
    from .inputs import Source

logger = logging.getLogger("amp_backends.train")

# calls left out of a throughput median: the first ones trace and compile
WARMUP_CALLS = 2
SHORT_NAMES = {"generator": "G", "discriminator": "D"}  # the GAN's updates, as its log line names them


@dataclass
class CallRecord:
    """One compiled call, as observers see it after it ran.

    Attributes:
        epoch: The epoch of its first step.
        first: Its first step's index within that epoch.
        step: The global step it ended at.
        steps: How many steps it ran.
        names: The updates' names, in the order of the losses' columns.
        losses: ``losses[i, j]``: step ``i``'s loss for update ``names[j]``.
        finite: ``finite[i, j]``: whether that loss and its gradients were finite (else the step was skipped).
        step_time: Seconds per step in this call.
        throughput: Samples (images) per second in this call.
        loss_scales: Each update's loss scale after the call.
        skipped: Each update's count of skipped steps so far.
    """

    epoch: int
    first: int
    step: int
    steps: int
    names: Sequence[str]
    losses: np.ndarray
    finite: np.ndarray
    step_time: float
    throughput: float
    loss_scales: dict[str, float]
    skipped: dict[str, int]


class Observer:
    """Hooks around training; every method is optional."""

    def on_fit_start(self, start_step: int, total_steps: int | None) -> None:
        """Before the first call.

        Args:
            start_step: The global step training starts from (after a resume, where it left off).
            total_steps: The step it will stop at, or ``None`` when the data's length is unknown.
        """

    def before_call(self, step: int, steps: int) -> None:
        """Before a compiled call.

        Args:
            step: The global step the call starts from.
            steps: How many steps the call will run.
        """

    def after_call(self, record: CallRecord) -> None:
        """After each compiled call.

        Args:
            record: What the call did: its steps, time, losses and loss scales.
        """

    def after_evaluation(self, epoch: int, step: int, values: dict[str, float]) -> None:
        """At each epoch's end (its mean loss, metrics, ``val_*`` values) and after a validation between epochs.

        Args:
            epoch: The epoch, counted from 0 as the log prints it.
            step: The global step.
            values: The logged values by name.
        """

    def close(self) -> None:
        """At the end of ``fit``, also when it fails or is interrupted."""


def _value(v: float, digits: int = 5) -> str:
    """A loss as the logs say it: ``digits`` decimals (as the tutorials' logs), in powers of ten from a million up."""
    return f"{v:.{digits}f}" if abs(v) < 1e6 or v != v else f"{v:.{digits}e}"


class LogLine(Observer):
    """The tutorials' line every ``every`` steps, ``(epoch, step), Loss: 0.08706, step_time: 0.00100, throughput:
    1.02e+06 img/s.``, and one per epoch's end (``Epoch 0 (global step 22): ...``) or validation between epochs."""

    def __init__(self, every: int = 1) -> None:
        self.every = every

    @override
    def after_call(self, r: CallRecord) -> None:
        for i in range(r.steps):
            if (r.step - r.steps + i + 1) % self.every:  # (the global step)
                continue
            loss_text = f"Loss: {_value(r.losses[i][0])}" if len(r.names) == 1 else ", ".join(
                f"{SHORT_NAMES.get(n, n)} Loss: {_value(r.losses[i][j], 3)}" for j, n in enumerate(r.names))
            bad = [n for j, n in enumerate(r.names) if not r.finite[i][j]]
            mark = f" [skipped: non-finite gradients in {', '.join(bad)}]" if bad else ""
            logger.info(f"({r.epoch}, {r.first + i}), {loss_text}, step_time: {r.step_time:.5f}, "
                        f"throughput: {r.throughput:.3e} img/s.{mark}")

    @override
    def after_evaluation(self, epoch: int, step: int, values: dict[str, float]) -> None:
        what = (f"Epoch {epoch} (global step {step})" if any(not k.startswith("val_") for k in values)
                else f"Validation at global step {step} (epoch {epoch})")
        def said(k: str, v: float) -> str:  # an epoch's loss is the mean of its applied steps: NaN when none was
            return "n/a (every step of the epoch was skipped)" if v != v and not k.startswith("val_") else _value(v)

        logger.info(f"{what}: " + ", ".join(f"{k}: {said(k, v)}" for k, v in values.items()) + ".")


class TensorBoardScalars(Observer):
    """Scalars ``loss/``, ``loss_scale/``, ``skipped_steps/<update>``, ``throughput_img_per_s``, ``epoch/<name>`` and
    ``val/<name>`` in ``logdir/train``, after each ``fit``'s restart marker (``SessionLog.START``: TensorBoard drops
    the steps a resumed run logs again). A write that fails is a warning; training goes on without scalars."""

    def __init__(self, logdir: str) -> None:
        self.writer: Any = None
        self.path = os.path.join(logdir, "train")
        self.usable = importlib.util.find_spec("tensorboard") is not None
        self.start_step: int | None = None
        if not self.usable:
            logger.warning("TensorBoard is not installed: no scalars are written to %s (pip install tensorboard)",
                           logdir)

    @override
    def on_fit_start(self, start_step: int, total_steps: int | None) -> None:
        self.start_step = start_step  # its marker goes ahead of this fit's first scalars

    @override
    def after_call(self, r: CallRecord) -> None:
        if not self.usable:
            return
        if self.writer is None:
            try:
                self.writer = tf.summary.create_file_writer(self.path)
            except (tf.errors.OpError, OSError) as exc:
                self._failed("cannot be written", exc)
                _remove_empty_event_files(self.path)
                return
        if self.start_step is not None:
            start, self.start_step = self.start_step, None
            self._guarded(lambda: self._mark_start(start))
        values: dict[str, float] = {}
        for j, n in enumerate(r.names):
            values.update({f"loss/{n}": float(r.losses[-1][j]), f"loss_scale/{n}": r.loss_scales[n],
                           f"skipped_steps/{n}": r.skipped[n]})
        self._scalars(r.step, {**values, "throughput_img_per_s": r.throughput})

    @override
    def after_evaluation(self, epoch: int, step: int, values: dict[str, float]) -> None:
        self._scalars(step, {f"val/{k[4:]}" if k.startswith("val_") else f"epoch/{k}": v for k, v in values.items()})

    def _scalars(self, step: int, values: dict[str, float]) -> None:
        def write() -> None:
            with self.writer.as_default():
                for tag, value in values.items():
                    tf.summary.scalar(tag, value, step=step)

        if self.writer is not None:
            self._guarded(write)

    def _mark_start(self, start_step: int) -> None:
        # the marker goes into the writer's own file, ahead of the scalars; tf.summary has no call for a raw event
        resource = getattr(self.writer, "_resource", None)
        if resource is None:
            return
        start = tf.compat.v1.Event(wall_time=time.time(), step=start_step + 1,
                                   session_log=tf.compat.v1.SessionLog(status=tf.compat.v1.SessionLog.START))
        tf.raw_ops.ImportEvent(writer=resource, event=start.SerializeToString())

    @override
    def close(self) -> None:
        if self.writer is not None:
            self._guarded(self.writer.flush)

    def _guarded(self, write: Any) -> None:
        try:
            write()
        except (tf.errors.OpError, OSError) as exc:
            self._failed("can no longer be written", exc)

    def _failed(self, what: str, exc: BaseException) -> None:
        logger.warning(f"TensorBoard scalars {what} to {self.path} ({write_failure(exc)}); training goes on "
                       "without them.")
        self.writer, self.usable = None, False


def _remove_empty_event_files(folder: str) -> None:
    """The empty event file a writer that failed to start left (this process's), and its folder if now empty."""
    try:
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if f".{os.getpid()}." in name and name.startswith("events.out.tfevents") and not os.path.getsize(path):
                os.remove(path)
        os.rmdir(folder)
    except OSError:
        pass


class ProgressBar(Observer):
    """A rich progress bar (steps done of the total), for terminals."""

    def __init__(self) -> None:
        self.progress: Any = None

    @override
    def on_fit_start(self, start_step: int, total_steps: int | None) -> None:
        from rich import progress as rich

        self.progress = rich.Progress("[progress.description]{task.description}", rich.BarColumn(),
                                      rich.MofNCompleteColumn(), rich.TimeRemainingColumn(), transient=True)
        self.task = self.progress.add_task("training", total=total_steps, completed=start_step)
        self.progress.start()

    @override
    def after_call(self, r: CallRecord) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=r.step)

    @override
    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class ProfilerWindow(Observer):
    """Traces the (whole) calls covering steps ``start:stop`` into ``logdir``; a failed trace is a warning.

    Args:
        logdir: The folder TensorFlow's profiler writes into (``plugins/profile/``).
        window: ``(start, stop)``: the steps to trace, counted over the whole run.
        after_fit_start: Count the window from the step the first fit starts at instead (``--profile``: the steps
            after its warm-up, a resumed run's too).
    """

    def __init__(self, logdir: str, window: tuple[int, int], after_fit_start: bool = False) -> None:
        self.logdir = logdir
        self.window, self.after_fit_start = window, after_fit_start
        self.start, self.stop = window
        self.first: int | None = None
        self.began: int | None = None  # the step this fit started from
        self.last = 0  # and the step it has reached
        self.running = self.done = False

    @override
    def on_fit_start(self, start_step: int, total_steps: int | None) -> None:
        if self.after_fit_start and self.began is None:  # (the first fit's warm-up compiles; later fits reuse it)
            self.start, self.stop = (start_step + step for step in self.window)
        self.began = self.last = start_step

    @override
    def before_call(self, step: int, steps: int) -> None:
        if not self.running and not self.done and step < self.stop and step + steps > self.start:
            if self._guarded(lambda: tf.profiler.experimental.start(self.logdir)):
                self.running, self.first = True, step

    @override
    def after_call(self, r: CallRecord) -> None:
        self.last = r.step
        if self.running and r.step >= self.stop:
            self._written()

    def _written(self) -> None:
        """Stop the trace and say which steps it holds (the calls covering the window, or up to the fit's end)."""
        written = self._guarded(tf.profiler.experimental.stop)
        self.running, self.done = False, True
        if written:
            asked = "" if (self.first, self.last) == (self.start, self.stop) else \
                f" (asked: {self.start}:{self.stop}; calls are traced whole" + \
                ("" if self.last >= self.stop else "; training ended first") + ")"
            logger.info(f"Profiler trace of steps {self.first}:{self.last}{asked} written to {self.logdir}")

    @override
    def close(self) -> None:
        if self.running:
            self._written()
        elif not self.done and self.began is not None and sys.exc_info()[0] is None:  # (not a stopped fit's)
            if self.began >= self.stop:
                where = f"this fit started at step {self.began}, past it: a resumed run counts its earlier steps"
            elif self.last <= self.start:
                where = f"this fit ended at step {self.last}; the window starts at step {self.start}"
            else:
                where = f"this fit trained no step from {self.began}"
            logger.warning(f"No profiler trace in this fit: the profile window {self.start}:{self.stop} was not "
                           f"reached ({where}). Fix: choose a window inside the steps the run trains (a later fit of "
                           "the same trainer traces it when it gets there).")

    def _guarded(self, call: Any) -> bool:
        """``call()``; a failure to write the trace ends the window with a warning. Returns whether it worked."""
        try:
            call()
            return True
        except (tf.errors.OpError, OSError) as exc:
            logger.warning(f"The profiler trace cannot be written to {self.logdir} ({write_failure(exc)}); "
                           "training goes on without it.")
            self.running, self.done = False, True
            return False


# ------------------------------------------------------------------------------------ the trainer's defaults
def default_observers(chief: bool, log_every: int, logdir: str | None, progress: bool | None,
                      profile_steps: tuple[int, int] | None) -> list[Observer]:
    """The log line, TensorBoard and the progress bar (on the chief), the profiler window (everywhere)."""
    out: list[Observer] = []
    if chief:
        ensure_visible_logging()  # (auto_configure(verbose=False) quiets the plan's summary, not training)
        out.append(LogLine(log_every))
        if logdir:
            out.append(TensorBoardScalars(logdir))
        if sys.stdout.isatty() if progress is None else progress:
            out.append(ProgressBar())
    if profile_steps and logdir:
        out.append(ProfilerWindow(logdir, profile_steps))
    return out


def training_line(source: Source, batch_size: int, steps_per_call: int, checkpoint_every: int | None) -> str:
    """The line that says, before training, what one epoch and one compiled call are."""
    k, per_epoch = steps_per_call, source.steps_per_epoch
    lines = [f"Training on {source.describe()}: batch {batch_size}, "
             + (f"{per_epoch} steps per epoch" if per_epoch is not None else "epochs end with the data")
             + f", {k} step{'s' if k > 1 else ''} per compiled call"]
    if k > 1 and per_epoch is not None and per_epoch % k:
        lines.append(f"each epoch: {per_epoch // k} full calls and one of {per_epoch % k} steps")
    if checkpoint_every and k > 1 and checkpoint_every % k:
        lines.append(f"checkpoints at the end of the call that reaches each multiple of {checkpoint_every} "
                     f"steps (calls are never cut)")
    return "; ".join(lines)


# ------------------------------------------------------------------------------------ Keras fit
class ThroughputLogger(tf.keras.callbacks.Callback):
    """Logs ``(epoch, step), Loss (epoch mean): …, step_time: …, throughput: … img/s.`` during ``model.fit``.

    The loss is Keras's running mean of the epoch (our `Trainer` logs each step's). With ``steps_per_execution``
    above 1 a line covers an execution (``step_time`` per step). Throughput counts the samples Keras's loss tracker
    counted (full batches without a loss); at the end, the median after two warm-up executions.

    Args:
        batch_size: The batch size ``fit`` trains with.
        log_every: Log a line every this many steps.
        images_per_step: Samples a full step counts (default: ``batch_size``; a shorter batch counts its share).

    Raises:
        ValueError: ``batch_size`` is not a positive integer.
    """

    def __init__(self, batch_size: int, log_every: int = 1, images_per_step: int | None = None) -> None:
        super().__init__()
        if not isinstance(batch_size, int) or batch_size < 1:
            raise AmpConfigError(f"batch_size must be a positive integer. Received: {batch_size!r}. Fix: pass the "
                                 "training's batch size, such as 32.")
        self.batch_size, self.images = batch_size, images_per_step or batch_size
        self.log_every = log_every
        self.throughputs: list[float] = []
        self._epoch, self._t0, self._last, self._counted = 0, 0.0, -1, 0.0
        ensure_visible_logging()  # (auto_configure(verbose=False) quiets the plan's summary, not these lines)

    @override
    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch, self._last = epoch, -1

    @override
    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._counted, self._t0 = _samples_counted(self.model), time.perf_counter()  # (the count read first)

    @override
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        dt = time.perf_counter() - self._t0
        total = (getattr(self, "params", None) or {}).get("steps")  # (Keras names an epoch's short last call by
        batch = min(batch, total - 1) if isinstance(total, int) and total > 0 else batch  # the steps it could run)
        steps = max(batch - self._last, 1)
        self._last = batch
        step_time = dt / steps
        samples = (_samples_counted(self.model) - self._counted) or self.batch_size * steps
        tp = samples * self.images / self.batch_size / dt if dt > 0 else float("inf")
        self.throughputs.append(tp)
        if batch % self.log_every < steps:
            loss = (logs or {}).get("loss", float("nan"))
            logger.info(f"({self._epoch}, {batch}), Loss (epoch mean): {float(loss):.5f}, step_time: {step_time:.5f}, "
                        f"throughput: {tp:.3e} img/s.")

    @override
    def on_train_end(self, logs: Any = None) -> None:
        if len(self.throughputs) > WARMUP_CALLS:
            logger.info(f"Summary: median throughput {statistics.median(self.throughputs[WARMUP_CALLS:]):.4g} img/s")


def _samples_counted(model: Any) -> float:
    """The samples Keras's loss tracker counted this epoch (each step adds its batch's rows); 0 without one."""
    count = next((getattr(m, "count", None) for m in getattr(model, "metrics", None) or () if m.name == "loss"), None)
    return 0.0 if count is None else float(np.asarray(count))
