"""What the trainer trains on, part two: a ``tf.data`` pipeline of batches (arrays: `inputs`).

**A** ``tf.data.Dataset`` yields *batches* (as Keras ``fit`` expects): ``ds.batch(batch_size,
drop_remainder=True)``. Batches of unknown size (``ds.batch(n)`` without ``drop_remainder``) are
rebatched to exactly ``batch_size`` with the remainder dropped (a partial batch would change the
compiled shapes and the loss's scale); an unbatched dataset, or batches of another size, is refused with
the fix, and so are batches of unknown size with a variable-length feature (``padded_batch(8)`` for a
batch of 16: rows padded to different lengths cannot be regrouped), with the fix: pad to a fixed length,
``padded_batch(16, padded_shapes=..., drop_remainder=True)``. An epoch is one pass over the dataset, or
``steps_per_epoch`` batches (required for a dataset that repeats forever). The compiled call pulls several
batches from an iterator inside itself (prefetched to the accelerator). The position of a stream is
"batches consumed in epoch ``e``": on resume the epoch's pipeline is rebuilt and that many batches are
skipped, which continues the interrupted order exactly when the pipeline's order depends on its seed alone
(no shuffle, or ``shuffle(..., seed=s, reshuffle_each_iteration=False)``); with reshuffling, the rest of
the resumed epoch follows a fresh order.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from ..errors import InputError
from .batches import Ran, _leaf_paths
from .runs import At

logger = logging.getLogger("amp_backends.train")


@dataclass
class _Spec:
    leading: set[Any]
    scalars: list[str]
    variable: list[str]  # tensors with a dimension of unknown size besides the batch (variable-length features)
    strings: bool


def _batch_dims(spec: Any) -> _Spec:
    leading: set[Any] = set()
    scalars: list[str] = []
    variable: list[str] = []
    strings = False
    for path, s in _leaf_paths(_spec_nest(spec), "element"):
        if not isinstance(s, tf.TensorSpec):
            raise InputError(f"The dataset's {path} is a {type(s).__name__}; the trainer takes datasets of dense "
                             "tensors. Fix: convert it in the pipeline "
                             "(for example tf.sparse.to_dense or .to_tensor()).")
        strings = strings or s.dtype == tf.string
        if s.shape.rank == 0:
            scalars.append(path)
        elif s.shape.rank is not None:
            leading.add(s.shape[0])
        if s.shape.rank is not None and None in s.shape[1:]:  # (an unknown rank, from py_function: not known)
            variable.append(f"{path} (shape {s.shape})")
    return _Spec(leading, scalars, variable, strings)


def _spec_nest(spec: Any) -> Any:
    if isinstance(spec, dict):
        return {k: _spec_nest(v) for k, v in spec.items()}
    if isinstance(spec, (tuple, list)):
        return tuple(_spec_nest(v) for v in spec)
    return spec


class Stream:
    """A ``tf.data`` pipeline of batches, consumed by an iterator inside the compiled call."""

    reusable = False  # a dataset may change between fit() calls (a new pass is made each time)

    def __init__(self, dataset: Any, *, batch_size: int, device: str, strategy: Any,
                 steps_per_epoch: int | None = None) -> None:
        dims = _batch_dims(dataset.element_spec)
        fix_unbatched = (f"batch it: dataset.batch({batch_size}, drop_remainder=True) (the trainer takes a dataset of "
                         "batches, as Keras fit does)")
        if dims.scalars:
            raise InputError(f"The dataset is not batched: its {dims.scalars[0]} is a scalar, one sample per element. "
                             f"Expected batches of {batch_size}. Fix: {fix_unbatched}.")
        known = {d for d in dims.leading if d is not None}
        if len(known) > 1:
            raise InputError(f"The dataset's tensors have different leading (batch) sizes {sorted(known)}. Expected "
                             f"batches of {batch_size} in every tensor. Fix: batch the samples together: "
                             f"dataset.batch({batch_size}, drop_remainder=True).")
        if known and known != {batch_size}:
            size = known.pop()
            raise InputError(f"The dataset yields elements of leading size {size}; the trainer's batch_size is "
                             f"{batch_size}. Fix: if the dataset is batched, pass batch_size={size} to the Trainer or "
                             f"rebatch it with dataset.rebatch({batch_size}, drop_remainder=True); if it is not "
                             f"batched, {fix_unbatched}.")
        if int(dataset.cardinality().numpy()) == tf.data.INFINITE_CARDINALITY and steps_per_epoch is None:
            raise InputError("The dataset repeats forever, so an epoch has no end. Fix: pass steps_per_epoch=N to "
                             "fit() (batches per epoch), or drop .repeat() from the pipeline.")
        if (None in dims.leading or not dims.leading) and dims.variable:
            raise InputError(
                f"The dataset's batches have no fixed size and its {dims.variable[0]} has a variable length (padded "
                f"per batch, as padded_batch does): such batches cannot be regrouped into batches of {batch_size}. "
                f"Fix: pad every batch to one fixed length and size: dataset.padded_batch({batch_size}, padded_shapes="
                f"<fixed shapes, such as [64] for token ids>, drop_remainder=True) "
                f"(one compiled shape for every step), or at least dataset.padded_batch({batch_size}, "
                "drop_remainder=True).")
        if None in dims.leading or not dims.leading:
            # batched without drop_remainder: the last batch would be partial (a new compiled shape, another
            # scale of the loss); keep exactly batch_size per step instead
            dataset = dataset.rebatch(batch_size, drop_remainder=True)
            logger.info(f"The dataset's batches have no fixed size (batched without drop_remainder): rebatched to "
                        f"{batch_size} with drop_remainder=True, dropping a last partial batch per pass.")
        cardinality = int(dataset.cardinality().numpy())
        if cardinality == 0:
            raise InputError(f"The dataset yields no batch of {batch_size}: it is empty, or has fewer samples than one "
                             "batch (batched with drop_remainder=True). Fix: check the pipeline, or lower batch_size.")
        if steps_per_epoch is not None and (not isinstance(steps_per_epoch, int) or steps_per_epoch < 1):
            raise InputError(f"steps_per_epoch must be a positive integer or None. Received: {steps_per_epoch!r}.")
        self.dataset = dataset
        self.batch_size = batch_size
        self.device = device
        self.strategy = strategy
        self.cardinality = cardinality if cardinality >= 0 else None
        self.fixed_steps = steps_per_epoch
        self.has_strings = dims.strings
        self._sample: Any = None
        self._iterator: Any = None
        self._fresh = False  # the iterator has given no batch yet

    @property
    def steps_per_epoch(self) -> int | None:
        """Batches per epoch when known (``steps_per_epoch``, or the dataset's cardinality), else ``None``."""
        return self.fixed_steps if self.fixed_steps is not None else self.cardinality

    def steps_in_epoch(self, batches_done: int = 0) -> int | None:
        total = self.steps_per_epoch
        return None if total is None else max(0, total - batches_done)

    @property
    def continuous(self) -> bool:
        """With ``steps_per_epoch`` the data is one stream across epochs (as Keras ``fit`` reads it): an epoch
        ends after that many batches, and a pass that ends starts the next one."""
        return self.fixed_steps is not None

    def iterator(self, skip_batches: int = 0) -> Any:
        """A fresh pass over the pipeline, ``skip_batches`` already consumed; prefetched to the device."""
        ds = self.dataset.skip(skip_batches) if skip_batches else self.dataset
        if self.strategy.num_replicas_in_sync > 1 or getattr(self.strategy, "cluster_resolver", None) is not None:
            return iter(self.strategy.experimental_distribute_dataset(ds))
        if tf.DeviceSpec.from_string(self.device).device_type in ("GPU", "XPU"):
            ds = ds.apply(tf.data.experimental.prefetch_to_device(self.device))
        else:
            ds = ds.prefetch(tf.data.AUTOTUNE)
        return iter(ds)

    def batches_before(self, at: At) -> int:
        """Batches of the current pass already trained on at ``at``: a resumed run skips them."""
        done = at.offset // self.batch_size
        if not self.continuous:
            return done
        done += at.epoch * (self.fixed_steps or 0)  # one stream across epochs, passes restarting at its end
        return done % self.cardinality if self.cardinality else done

    # -- what the loop asks every input ------------------------------------------------------------
    def describe(self) -> str:
        return "a tf.data pipeline"

    def first_batch(self, rows: int) -> Any:
        """The first ``rows`` samples of the first batch (for the precision check)."""
        return tf.nest.map_structure(lambda a: a[:rows] if np.ndim(a) else a, self.sample_batch())

    def left_in_epoch(self, offset: int) -> int | None:
        """Steps left in the epoch from sample ``offset`` (``None``: a stream of unknown length)."""
        return self.steps_in_epoch(offset // self.batch_size)

    def start(self) -> None:
        """Before a ``fit`` call's loop: the next call opens a pass at the position."""
        self._iterator, self._fresh = None, False

    def epoch_over(self) -> None:
        """The position moved to the next epoch: a new pass, unless the stream runs across epochs."""
        if not self.continuous:
            self._iterator = None

    def call_size(self, steps_per_call: int, left: int | None, budget: int | None, program: Any) -> int:
        """Up to ``steps_per_call``: the call takes its length as an argument (no new compilation)."""
        return min(v for v in (steps_per_call, left, budget) if v is not None)

    def run(self, program: Any, at: At, k: int, capacity: int) -> Ran:
        """Up to ``k`` steps from ``at`` in one compiled call, fewer where the data ends."""
        if self._iterator is None:
            self._iterator, self._fresh = self.iterator(self.batches_before(at)), True
        done_t, losses, flags = program.stream_call()(self._iterator, tf.constant(k, tf.int32))
        done = int(done_t.numpy())
        ended = False
        if done < k:  # the data ended inside this call (or at its start)
            if done == 0 and (self._fresh or at.offset == 0):
                raise InputError(f"The dataset yielded no batch of {self.batch_size}: it is empty (or smaller than "
                                 "one batch). Fix: check the pipeline.")
            self._iterator = None  # a new pass: the next epoch's, or the rest of this one when steps_per_epoch is set
            ended = not self.continuous
        self._fresh = self._fresh and done == 0
        return Ran(done, losses.numpy(), flags.numpy(), "stream", ended)

    def sample_batch(self) -> Any:
        """The first batch (from a separate pass), for validating the updates before training."""
        if self._sample is None:
            for batch in self.dataset.take(1):
                self._sample = tf.nest.map_structure(lambda t: t.numpy(), batch)
            if self._sample is None:
                raise InputError(f"The dataset yields no batch of {self.batch_size}: it is empty, or has fewer samples "
                                 "than one batch. Fix: check the pipeline, or lower batch_size.")
        return self._sample
