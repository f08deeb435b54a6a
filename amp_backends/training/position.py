"""Where training stands in the data: global step, epoch and sample offset within the epoch.

The position is kept in *samples* (sample ``offset`` of epoch ``epoch``), so a run resumed with another
batch size continues at the same sample: nothing is read twice or skipped. Its variables are part of every
checkpoint, together with the batch size they were written with. The compiled calls advance the step and
the offset on the device (`step`); the loop reads them once per call through `Position.now`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tensorflow as tf


@dataclass(frozen=True)
class At:
    """One reading of the position: ``step`` steps done, sample ``offset`` of epoch ``epoch``."""

    epoch: int
    offset: int
    step: int


class Position:
    """The trainer's position variables and how they move (see the module docstring)."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = int(batch_size)
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.samples_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="samples_in_epoch")
        # the batch size the position was written with (a checkpoint holds it; restore compares)
        self.saved_batch_size = tf.Variable(self.batch_size, dtype=tf.int64, trainable=False, name="batch_size")

    # -- reading ---------------------------------------------------------------------------------
    def now(self) -> At:
        return At(*(int(v.numpy()) for v in (self.epoch, self.samples_in_epoch, self.global_step)))

    @property
    def step(self) -> int:
        return int(self.global_step.numpy())

    def batch_in_epoch(self, at: At) -> int:
        """The step within its epoch of the batch starting at ``at``."""
        return at.offset // self.batch_size

    # -- moving ----------------------------------------------------------------------------------
    def next_epoch(self) -> None:
        self.epoch.assign_add(1)
        self.samples_in_epoch.assign(0)

    def total_steps(self, steps_per_epoch: int | None, epochs: int, max_steps: int | None) -> int | None:
        """The global step at which ``fit(epochs=..., max_steps=...)`` ends, when the data's length is known."""
        if steps_per_epoch is None:
            return max_steps
        at = self.now()
        rest = (epochs - at.epoch) * steps_per_epoch - at.offset // self.batch_size
        total = at.step + max(rest, 0)
        return total if max_steps is None else min(total, max_steps)

    # -- checkpoints -----------------------------------------------------------------------------
    def checkpoint(self) -> Any:
        return tf.train.Checkpoint(global_step=self.global_step, epoch=self.epoch,
                                   samples_in_epoch=self.samples_in_epoch, batch_size=self.saved_batch_size)

    def restored(self) -> tuple[At, int]:
        """After a restore: where the checkpoint stood and the batch size it was written with; from now on
        the position is this run's (its batch size is the one saved next)."""
        at, then = self.now(), int(self.saved_batch_size.numpy())
        self.saved_batch_size.assign(self.batch_size)
        return at, then
