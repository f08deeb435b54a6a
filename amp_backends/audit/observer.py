"""The audit as a trainer observer: ``Trainer(observers=[AuditObserver(model, plan)])``.

In the training process itself oneDNN has started long before the first step, so it prints its records
only if ``ONEDNN_VERBOSE=1`` was in the environment when the program started. Then this observer
captures them for the calls covering steps ``start:stop`` (the process's standard output is redirected to
a file for those calls only: oneDNN writes there, not through Python) and builds the audit when the window
closes (``self.result``; also logged). Without ``ONEDNN_VERBOSE`` it logs how to get an audit and does
nothing: run ``amp-backends audit MODULE:FACTORY``, which starts its own child process, or start the
training program with ``ONEDNN_VERBOSE=1``. On a GPU, use the trainer's profiler window and
:func:`amp_backends.audit.audit_trace` on its logdir.

It has the methods of :class:`amp_backends.training.observers.Observer` (``on_fit_start``,
``before_call``, ``after_call``, ``close``) without importing the trainer.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from typing import Any

from .build import from_onednn
from .report import Audit

logger = logging.getLogger("amp_backends.train.audit")  # shown where the trainer's log lines are


class AuditObserver:
    """Audit the training calls that cover global steps ``start:stop`` (after the warm-up by default)."""

    def __init__(self, model: Any = None, plan: Any = None, window: tuple[int, int] = (3, 6)) -> None:
        self.model, self.plan = model, plan
        self.start, self.stop = window
        self.result: Audit | None = None
        self.enabled = os.environ.get("ONEDNN_VERBOSE", "0") not in ("", "0", "none")
        self._saved_fd: int | None = None
        self._file: Any = None
        self._steps = 0
        self._step_times: list[float] = []
        self.done = False

    def on_fit_start(self, start_step: int, total_steps: int | None) -> None:
        if not self.enabled:
            logger.warning("audit: oneDNN's verbose records are off in this process (ONEDNN_VERBOSE was not set when "
                           "it started), so no audit is taken. Fix: run `amp-backends audit MODULE:FACTORY`, or start "
                           "the training program with ONEDNN_VERBOSE=1")

    def before_call(self, step: int, steps: int) -> None:
        if self.enabled and not self.done and self._saved_fd is None and step < self.stop and step + steps > self.start:
            sys.stdout.flush()
            self._file = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115  # open across calls
            self._saved_fd = os.dup(1)
            os.dup2(self._file.fileno(), 1)

    def after_call(self, record: Any) -> None:
        if self._saved_fd is None:
            return
        self._steps += int(getattr(record, "steps", 1))
        self._step_times.append(float(getattr(record, "step_time", 0.0)))
        if record.step >= self.stop:
            self._finish()

    def _finish(self) -> None:
        assert self._saved_fd is not None and self._file is not None
        sys.stdout.flush()
        os.dup2(self._saved_fd, 1)
        os.close(self._saved_fd)
        self._saved_fd = None
        self._file.seek(0)
        lines = self._file.read().decode("utf-8", "replace").splitlines()
        self._file.close()
        self.done = True
        self.result = from_onednn(lines, self._doc())
        for line in self.result.render().splitlines():
            logger.info(line)

    def _doc(self) -> dict[str, Any]:
        from .child import layer_kernels

        plan = self.plan
        doc: dict[str, Any] = {"model": getattr(self.model, "name", "?"), "steps": self._steps,
                               "onednn_opts": os.environ.get("TF_ENABLE_ONEDNN_OPTS")}
        if self._step_times and all(self._step_times):
            doc["step_time_ms"] = 1000 * sum(self._step_times) / len(self._step_times)
        if plan is not None:
            doc["plan"] = {"backend": plan.backend, "policy": plan.policy, "compute_dtype": plan.compute_dtype,
                           "xla": bool(plan.xla), "graph_amp": plan.graph_amp}
        if self.model is not None:
            doc["layers"] = layer_kernels(self.model)
        return doc

    def close(self) -> None:
        if self._saved_fd is not None:
            self._finish()
