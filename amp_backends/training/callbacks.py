"""Keras ``fit`` callbacks: the tutorials' log line and a throughput summary for ``model.fit``."""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import Any

import tensorflow as tf

from .observers import WARMUP_CALLS

logger = logging.getLogger("amp_backends.train")



class ThroughputLogger(tf.keras.callbacks.Callback):
    """Logs ``(epoch, step), Loss (epoch mean): …, step_time: …, throughput: … img/s.`` during ``model.fit``.

    The loss is what Keras reports to callbacks: the running mean of the epoch so far, not the step's own
    loss (our `Trainer` logs each step's). With
    ``steps_per_execution`` > 1 Keras calls back once per execution: the line then covers that many steps
    and ``step_time`` is per step. At the end, the median throughput after two warm-up executions.

    Args:
        batch_size: The batch size ``fit`` trains with.
        log_every: Log a line every this many steps.
        images_per_step: Samples a step counts (default: ``batch_size``).

    Raises:
        ValueError: ``batch_size`` is not a positive integer.
    """

    def __init__(self, batch_size: int, log_every: int = 1, images_per_step: int | None = None) -> None:
        super().__init__()
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer. Received: {batch_size!r}.")
        self.images = images_per_step or batch_size
        self.log_every = log_every
        self.throughputs: list[float] = []
        self._epoch = 0
        self._t0 = 0.0
        self._last = -1

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch
        self._last = -1

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        dt = time.perf_counter() - self._t0
        steps = max(batch - self._last, 1)
        self._last = batch
        step_time = dt / steps
        tp = self.images / step_time if step_time > 0 else math.inf
        self.throughputs.append(tp)
        if batch % self.log_every < steps:
            loss = (logs or {}).get("loss", float("nan"))
            logger.info(f"({self._epoch}, {batch}), Loss (epoch mean): {float(loss):.5f}, step_time: {step_time:.5f}, "
                        f"throughput: {tp:.3e} img/s.")

    def on_train_end(self, logs: Any = None) -> None:
        if len(self.throughputs) > WARMUP_CALLS:
            logger.info(f"Summary: median throughput {statistics.median(self.throughputs[WARMUP_CALLS:]):.4g} img/s")
