"""The audit as a trainer observer: ``Trainer(audit=True)`` or ``Trainer(observers=[AuditObserver(models, plan)])``.

The plan's backend reads the records its kernels print on standard output (`KernelAudit.record_prefix`; the CPU's:
oneDNN's), printed only if its variables (`KernelAudit.environment`) were set before TensorFlow's first kernel
(``amp-backends train ... --audit`` sets them). A pipe in front of standard output drops those records, except in the
window of calls covering steps ``start:stop``; the audit is built when the window closes (``self.result``; logged).
It has the hooks of `amp_backends.training.observers.Observer` without importing the trainer, which imports it.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

from ..kernel_audit import Capture, KernelAudit
from .build import from_reading, plan_data, read_kernels
from .audit_result import Audit
from ..errors import AmpConfigError

if TYPE_CHECKING:
    from ..plan import Plan

logger = logging.getLogger("amp_backends.train.audit")  # shown where the trainer's log lines are

_OPEN, _CLOSE = b"\x00amp-audit-open\n", b"\x00amp-audit-close\n"


class _RecordTap:
    """Standard output (descriptor 1) through a pipe: lines starting with one of ``prefixes`` are dropped, or kept
    between `open_window` and `close_window` (marker lines in the same stream, whatever the reader's lag); every
    other line goes on to the real standard output."""

    def __init__(self, prefix: bytes) -> None:
        self.prefixes: tuple[bytes, ...] = (prefix,)
        sys.stdout.flush()
        self._out = os.dup(1)
        read, write = os.pipe()
        os.dup2(write, 1)
        os.close(write)
        self.records: list[str] = []
        self._keeping = False
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._pump, args=(read,), name="amp-audit-tap", daemon=True)
        self._thread.start()

    def _pump(self, read: int) -> None:
        with os.fdopen(read, "rb") as stream:
            for line in stream:
                if line == _OPEN:
                    self._keeping = True
                elif line == _CLOSE:
                    self._keeping = False
                    self._closed.set()
                elif line.startswith(self.prefixes):
                    if self._keeping:
                        self.records.append(line.decode("utf-8", "replace").rstrip("\n"))
                else:
                    os.write(self._out, line)

    def open_window(self) -> None:
        sys.stdout.flush()
        os.write(1, _OPEN)

    def close_window(self) -> list[str]:
        sys.stdout.flush()
        self._closed.clear()
        os.write(1, _CLOSE)
        self._closed.wait(timeout=30)
        return list(self.records)

    def close(self) -> None:
        global _TAP
        if _TAP is not self:
            return
        _TAP = None
        sys.stdout.flush()
        os.dup2(self._out, 1)  # the pipe's last writer closes: the reader ends
        self._thread.join(timeout=30)
        os.close(self._out)


_TAP: _RecordTap | None = None


def record_tap(prefix: str) -> _RecordTap:
    """The process's one tap, made on first use and closed at exit (it passes on what is left to print); ``prefix``
    (the start of the records' lines it must take off standard output) is added to its prefixes."""
    global _TAP
    raw = prefix.encode()
    if _TAP is None:
        _TAP = _RecordTap(raw)
        atexit.register(_TAP.close)
    elif raw not in _TAP.prefixes:
        _TAP.prefixes += (raw,)
    return _TAP


def _prints_records(audit: KernelAudit | None) -> TypeGuard[KernelAudit]:
    """Whether ``audit`` reads lines its kernels print in the training process."""
    return bool(audit is not None and audit.record_prefix and not audit.unavailable)


def observed_backend(plan: Plan | None) -> tuple[str, KernelAudit | None]:
    """The name and kernel audit (``None``: it offers none) of the backend that reads the trainer's window: the
    plan's, else the first registered backend whose kernels print records on standard output."""
    from ..registry import default_registry

    registry = default_registry()
    if plan is not None:
        return plan.backend, registry.kernel_audit(plan.backend)
    for backend in registry:
        try:
            audit = registry.kernel_audit(backend.name)
        except Exception:  # noqa: BLE001  # a broken third-party backend must not break the others' audits
            continue
        if _prints_records(audit):
            return backend.name, audit
    return "?", None


class AuditObserver:
    """Audit the training calls that cover global steps ``start:stop`` (after the warm-up by default); ``models``
    (the Keras models trained) name the float32 islands, ``batch_size`` is reported.

    Args:
        models: The Keras model trained, or a sequence of them (``None``: none): the audit names them and their
            layers' kernels, and, with a ``plan``, the layers their layer plans keep in float32.
        plan: The `Plan` trained under: its backend reads the window's kernel records. ``None``: the first
            registered backend whose kernels print records on standard output, and no plan in the audit.
        window: ``(start, stop)``, global steps: the training calls covering steps ``start:stop`` are audited
            (``0 <= start < stop``).
        batch_size: The batch size, reported in the audit (``None``: not given).

    Raises:
        AmpConfigError: ``window``'s steps are not ``0 <= start < stop``.
    """

    def __init__(self, models: Any = None, plan: Plan | None = None, window: tuple[int, int] = (3, 6),
                 batch_size: int | None = None) -> None:
        self.models = [] if models is None else list(models) if isinstance(models, Sequence) else [models]
        self.plan, self.batch_size = plan, batch_size
        self.layer_plans: dict[str, Any] | None = None  # by model name: the trainer sets the ones it applied
        self.start, self.stop = window
        if not (0 <= self.start < self.stop):
            raise AmpConfigError(
                f"The audit window must be (start, stop) steps with 0 <= start < stop, such as (3, 6). "
                f"Received: {window!r}.")
        self.result: Audit | None = None
        self.backend, self.kernel_audit = observed_backend(plan)
        audit = self.kernel_audit
        self.enabled = _prints_records(audit) and audit.capturing()
        # From now on the records leave standard output: before fit, TensorFlow already runs kernels.
        self._tap = record_tap(str(audit.record_prefix)) if self.enabled and audit is not None else None
        self._open = False
        self._steps = 0
        self._step_times: list[float] = []
        self.done = False

    @property
    def model(self) -> Any:
        """The first model trained, or ``None`` where none was given."""
        return self.models[0] if self.models else None

    def on_fit_start(self, start_step: int, total_steps: int | None) -> None:
        """Warn, where no audit can be taken in this process, why not and what to run instead.

        Args:
            start_step: The global step training starts from.
            total_steps: The step it will stop at, or ``None`` when the data's length is unknown.
        """
        audit = self.kernel_audit
        if self.enabled:
            return
        if not _prints_records(audit):
            traces = (", or the trainer's profiler window and amp_backends.audit_trace on its logdir"
                      if audit is not None and audit.reads_traces else "")
            logger.warning(f"audit: the {self.backend} backend's kernels print no records in the training process, "
                           f"so no audit is taken. Fix: run `amp-backends audit MODULE:FACTORY`{traces}")
            return
        names = ", ".join(name for name, _ in audit.environment)
        assignments = " ".join(f"{name}={value}" for name, value in audit.environment)
        logger.warning(f"audit: {audit.records_name} are off in this process ({names} was not set when it started), "
                       "so no audit is taken. Fix: run `amp-backends audit MODULE:FACTORY`, start the training "
                       f"program with {assignments}, or use `amp-backends train ... --audit`")

    def before_call(self, step: int, steps: int) -> None:
        """Open the window (records are kept from here) before the first call covering a step of ``start:stop``.

        Args:
            step: The global step the call starts from.
            steps: How many steps the call will run.
        """
        if self._tap is not None and not (self.done or self._open) and step < self.stop and step + steps > self.start:
            self._tap.open_window()
            self._open = True

    def after_call(self, record: Any) -> None:
        """Count a call in the window (its steps, its step time); after the call reaching ``stop``, build the audit.

        Args:
            record: The call's `amp_backends.training.observers.CallRecord`.
        """
        if not self._open:
            return
        self._steps += int(getattr(record, "steps", 1))
        self._step_times.append(float(getattr(record, "step_time", 0.0)))
        if record.step >= self.stop:
            self._finish()

    def after_evaluation(self, epoch: int, step: int, values: dict[str, float]) -> None:
        """Nothing to audit at an epoch's end or a validation (the window is of training calls).

        Args:
            epoch: The epoch, counted from 0.
            step: The global step.
            values: The logged values by name.
        """

    def _finish(self) -> None:
        assert self._tap is not None
        lines = self._tap.close_window()  # the tap stays: later records are dropped too, until the process ends
        self._open = False
        self.done = True
        assert self.kernel_audit is not None
        doc = self._doc()
        self.result = from_reading(read_kernels(self.kernel_audit, Capture(tuple(lines), (), doc, None), self.backend),
                                   doc)
        for line in self.result.render().splitlines():
            logger.info(line)

    def _doc(self) -> dict[str, Any]:
        from .child import layer_kernels

        plan = self.plan
        names = ", ".join(str(getattr(m, "name", "?")) for m in self.models) or "?"
        facts = self.kernel_audit.facts() if self.kernel_audit is not None else {}
        doc: dict[str, Any] = {"model": names, "steps": self._steps, "facts": facts, "batch_size": self.batch_size}
        if self._step_times and all(self._step_times):
            doc["step_time_ms"] = 1000 * sum(self._step_times) / len(self._step_times)
        if plan is not None:
            from ..layer_plan import decide

            # the trained models' layer plans: those the trainer applied (``layer_plans``), else as decided now
            given = self.layer_plans or {}
            plans = [given.get(str(getattr(m, "name", ""))) or decide(m, plan) for m in self.models]
            doc["plan"] = {**plan_data(plan), "graph_amp": plan.graph_amp,
                           "float32_layers": [p for lp in plans for p in lp.float32]}
        if self.models:
            doc["layers"] = [kernel for m in self.models for kernel in layer_kernels(m)]
        return doc

    def close(self) -> None:
        """At the end of ``fit``: a window still open is closed and the audit built from the steps it saw."""
        if self._open:
            self._finish()  # the window was still open: audit the steps it saw
