"""What the trainer trains on: arrays resident on the device, or a ``tf.data`` pipeline of batches.

Arrays are copied to the device once; each step gathers its batch there from the epoch's permutation of ``(seed,
epoch)``: no host round trip between steps, and a position exact on resume whatever the batch size. A dataset yields
batches, as Keras ``fit`` expects; on resume the batches already consumed are skipped. Each kind answers the loop's
questions (steps left, the next call's size) and runs its call, returning a `Ran`.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

import numpy as np
import tensorflow as tf

from ..errors import InputError
from ..model_inputs import as_array_nest, describe_array, leaf_paths, rows
from .runs import At
from .step import StepProgram, Update, device_type

logger = logging.getLogger("amp_backends.train")

BatchFn = Callable[[Any, Any, Any], Any]


def is_count(value: Any, least: int = 1) -> bool:
    """Whether ``value`` is an int (NumPy's too; ``bool`` is not one) of at least ``least``: a count we take."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= least


@dataclass(frozen=True)
class Ran:
    """What one compiled call did: ``done`` steps, their losses and flags (``[done, updates]``: 1 applied, 0
    non-finite), the key it was compiled under (a new key: it compiled), whether the data's pass ended in it, and
    ``refused``: ``(row, update)`` where an update's ``check`` refused a batch, which ended the call (`of_call`)."""

    done: int
    losses: np.ndarray
    flags: np.ndarray
    key: Any
    pass_ended: bool = False
    refused: tuple[int, int] | None = None

    @classmethod
    def of_call(cls, done: int, losses: np.ndarray, flags: np.ndarray, key: Any, pass_ended: bool = False) -> Ran:
        """A call's outputs (a row per batch taken) kept up to its ``done`` steps (`step.steps_done`), the first
        refused batch noted."""
        bad = np.argwhere(flags < 0)
        refused = (int(bad[0][0]), int(bad[0][1])) if len(bad) else None
        return cls(done, losses[:done], flags[:done], key, pass_ended and refused is None, refused)

    @property
    def finite(self) -> np.ndarray:
        """Per step and update: its gradients were finite (a refused batch is not a non-finite one)."""
        return self.flags != 0

    def check_refused(self, at: At, first_in_epoch: int, updates: Sequence[Update]) -> None:
        """`InputError` naming the batch an update's ``check`` refused in this call (run from ``at``), if any."""
        if self.refused is None:
            return
        i, u = self.refused[0], updates[self.refused[1]]
        again = (" A fit with corrected data runs that step again." if i == self.done else
                 " (Updates before it in that step were applied: the step counts as done.)")
        raise InputError(f"The batch of step {at.step + i} (epoch {at.epoch}, step {first_in_epoch + i} of the epoch) "
                         f"{u.check_message or 'was refused by the check of update ' + repr(u.name) + '.'} That step "
                         f"was skipped (no weight changed) and training stopped; nothing was saved after it.{again}")


def refuse_labels_beside(dataset: Any, y: Any) -> None:
    """Labels given beside a ``tf.data.Dataset``, whose elements carry them: `InputError` with the fix."""
    if isinstance(dataset, tf.data.Dataset) and y is not None:
        raise InputError("With a tf.data.Dataset, the labels come from the dataset's elements ((x, y) batches). "
                         f"Received y={describe_array(y)} as well. Fix: zip them into the dataset and pass y=None.")


def on_device(x: Any, y: Any, device: str) -> tuple[Any, Any, bool]:
    """Arrays ``x`` and ``y`` (``None``: none) as tensors on ``device``, and whether any is a string tensor."""
    with tf.device(device):
        xs, ys = (None if a is None else tf.nest.map_structure(tf.convert_to_tensor, a) for a in (x, y))
    return xs, ys, any(t.dtype == tf.string for t in tf.nest.flatten((xs, ys)) if t is not None)


@tf.autograph.experimental.do_not_convert
def gather_batch(x: Any, y: Any, idx: tf.Tensor) -> Any:
    """The default batch: every array's rows at ``idx``, as ``(x, y)`` (``y`` is ``None`` without labels)."""
    return tuple(None if a is None else tf.nest.map_structure(lambda t: tf.gather(t, idx), a) for a in (x, y))


# ------------------------------------------------------------------------------------ arrays
class ResidentArrays:
    """Arrays copied to the device once; batches gathered on the device from a per-epoch permutation."""

    reusable = True  # a later fit() on the same arrays takes this input again (no copy, no check)
    fixed_shape = True  # every batch of one shape: a step compiles once

    def __init__(self, x: Any, y: Any, *, batch_size: int, device: str, seed: int,
                 batch_fn: BatchFn | None = None) -> None:
        if x is None:
            raise InputError("fit() needs training data: x as arrays (or a tuple/dict of arrays), "
                             "or a tf.data.Dataset. Received: x=None.")
        x, y = as_array_nest(x, "x"), (None if y is None else as_array_nest(y, "y"))
        self.samples = rows(x, y)
        if self.samples < batch_size:
            fix = f"lower batch_size to at most {self.samples}, or train on more data" if self.samples else "pass data"
            raise InputError(f"The data has {self.samples} samples, fewer than one batch of {batch_size}. Fix: {fix}.")
        self.batch_size, self.seed, self.device, self.batch_fn = batch_size, seed, device, batch_fn or gather_batch
        self.host = (x, y)  # for validation (labels within the model's classes) before anything runs
        self.x, self.y, self.has_strings = on_device(x, y, device)
        self._perm: tuple[int, tf.Tensor] | None = None

    @property
    def steps_per_epoch(self) -> int:
        """Full batches per epoch (the rows left over wait for another epoch's order)."""
        return self.samples // self.batch_size

    def permutation(self, epoch: int) -> tf.Tensor:
        """The epoch's sample order on the device, from ``(seed, epoch)`` alone (so a resumed run sees the same)."""
        if self._perm is None or self._perm[0] != epoch:
            perm = np.random.RandomState((self.seed * 100003 + epoch) % 2**32).permutation(self.samples)
            with tf.device(self.device):
                self._perm = (epoch, tf.constant(perm, dtype=tf.int64))
        return self._perm[1]

    def sample_batch(self) -> Any:
        """The data as the step's batch function sees it, for validating the updates before training."""
        return self.host

    def describe(self) -> str:
        """The data in words, for the line before training (what the loop asks every input, from here on)."""
        left = self.samples % self.batch_size  # (a full batch each step: the rest waits for another epoch's order)
        return f"{self.samples} samples resident on {self.device}" + (
            f" ({left} left out of each epoch, other ones each epoch: the data is shuffled)" if left else "")

    def first_batch(self, rows: int) -> Any:
        """The first ``rows`` samples as the step's batch function gives them to the model (for the precision check)."""
        return self.batch_fn(self.x, self.y, tf.range(rows, dtype=tf.int64))

    def left_in_epoch(self, offset: int) -> int:
        """Full batches left in the epoch from sample ``offset``."""
        return max(0, (self.samples - offset) // self.batch_size)

    def start(self) -> None:
        """Before a ``fit`` call's loop (nothing to do: every call gathers its batches from the position)."""

    def epoch_over(self) -> None:
        """The position moved to the next epoch (the permutation follows it)."""

    def call_size(self, steps_per_call: int, left: int | None, budget: int | None, program: StepProgram) -> int:
        """Full calls of ``steps_per_call``. Looped calls take their length as an argument; unrolled calls compile per
        size: the epoch's last call gets its own; other short stretches (resume, ``max_steps``) run as single steps."""
        room = min(v for v in (steps_per_call, left, budget) if v is not None)
        whole = room == steps_per_call or not program.unrolled(steps_per_call)
        return room if whole or room == self.steps_per_epoch % steps_per_call else 1

    def run(self, program: StepProgram, at: At, k: int, capacity: int) -> Ran:
        """``k`` steps from ``at`` in one compiled call."""
        fn = program.resident_call(k, self.batch_fn, capacity=capacity)
        losses, flags, done = fn(self.x, self.y, self.permutation(at.epoch), tf.constant(at.offset, tf.int64),
                                 tf.constant(k, tf.int32))
        return Ran.of_call(int(done), losses.numpy()[:k], flags.numpy()[:k], k if program.unrolled(k) else "loop")


# ------------------------------------------------------------------------------------ tf.data
@dataclass
class _Spec:
    leading: set[Any]
    scalars: list[str]
    variable: list[str]  # tensors with a dimension of unknown size besides the batch (variable-length features)
    strings: bool


def batch_dims(spec: Any, batch_size: int, keep: str = ", drop_remainder=True") -> tuple[_Spec, str]:
    """A dataset's dimensions, and the fix (``keep``: the last batch) that refuses it where an element is a sample."""
    out = _Spec(set(), [], [], False)
    for path, s in leaf_paths(spec, "element"):
        if not isinstance(s, tf.TensorSpec):
            raise InputError(f"The dataset's {path} is a {type(s).__name__}; the trainer takes datasets of dense "
                             "tensors. Fix: convert it in the pipeline (tf.sparse.to_dense or .to_tensor()).")
        out.strings = out.strings or s.dtype == tf.string
        if s.shape.rank == 0:
            out.scalars.append(path)
        elif s.shape.rank is not None:
            out.leading.add(s.shape[0])
        if s.shape.rank is not None and None in s.shape[1:]:  # (an unknown rank, from py_function: not known)
            out.variable.append(f"{path} (shape {s.shape})")
    fix = f"batch it: dataset.batch({batch_size}{keep}) (the trainer takes a dataset of batches, as Keras fit does)"
    if out.scalars:
        raise InputError(f"The dataset is not batched: its {out.scalars[0]} is a scalar, one sample per element. "
                         f"Expected batches of {batch_size}. Fix: {fix}.")
    return out, fix


class Stream:
    """A ``tf.data`` pipeline of batches, consumed by an iterator inside the compiled call."""

    reusable = False  # a dataset may change between fit() calls (a new pass is made each time)

    def __init__(self, dataset: tf.data.Dataset, *, batch_size: int, device: str, strategy: tf.distribute.Strategy,
                 steps_per_epoch: int | None = None) -> None:
        dims, fix_unbatched = batch_dims(dataset.element_spec, batch_size)
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
        if (unsized := None in dims.leading or not dims.leading) and dims.variable:
            raise InputError(
                f"The dataset's batches have no fixed size and its {dims.variable[0]} has a variable length (padded "
                f"per batch, as padded_batch does): such batches cannot be regrouped into batches of {batch_size}. "
                f"Fix: pad every batch to one fixed length and size: dataset.padded_batch({batch_size}, padded_shapes="
                f"<fixed shapes, such as [64] for token ids>, drop_remainder=True) (one compiled shape for every "
                f"step), or at least dataset.padded_batch({batch_size}, drop_remainder=True).")
        if unsized:  # batched without drop_remainder: keep batch_size per step (a partial batch: new shapes, scale)
            dataset = dataset.rebatch(batch_size, drop_remainder=True)
            logger.info(f"The dataset's batches have no fixed size (batched without drop_remainder): rebatched to "
                        f"{batch_size} with drop_remainder=True, dropping a last partial batch per pass.")
        cardinality = int(dataset.cardinality().numpy())
        if cardinality == 0:
            raise InputError(f"The dataset yields no batch of {batch_size}: it is empty, or has fewer samples than one "
                             "batch (batched with drop_remainder=True). Fix: check the pipeline, or lower batch_size.")
        if steps_per_epoch is not None and not is_count(steps_per_epoch):
            raise InputError(f"steps_per_epoch must be a positive integer or None. Received: {steps_per_epoch!r}. "
                             "Fix: pass the number of batches an epoch takes from the dataset (an int), or leave it "
                             "out where the dataset's length is known.")
        self.dataset, self.batch_size, self.device, self.strategy = dataset, batch_size, device, strategy
        self.cardinality = cardinality if cardinality >= 0 else None
        self.fixed_steps, self.has_strings = steps_per_epoch, dims.strings
        self.fixed_shape = not dims.variable  # else each new length compiles the step anew, at any step of a call
        self._sample: Any = None
        self._iterator: Any = None
        self._opened_at = self._yielded = 0  # the open pass: the batches it skipped, and those it reached since
        self._next_skip: int | None = None  # where the next pass opens (None: at the position, `batches_before`)

    @property
    def steps_per_epoch(self) -> int | None:
        """Batches per epoch when known (``steps_per_epoch``, or the dataset's cardinality), else ``None``."""
        return self.fixed_steps if self.fixed_steps is not None else self.cardinality

    @property
    def continuous(self) -> bool:
        """With ``steps_per_epoch`` the data is one stream across epochs, as Keras ``fit`` reads it."""
        return self.fixed_steps is not None

    def iterator(self, skip_batches: int = 0) -> Any:
        """A fresh pass over the pipeline, ``skip_batches`` already consumed; prefetched to the device."""
        ds = self.dataset.skip(skip_batches) if skip_batches else self.dataset
        if self.strategy.num_replicas_in_sync > 1 or getattr(self.strategy, "cluster_resolver", None) is not None:
            return iter(self.strategy.experimental_distribute_dataset(ds))
        if device_type(self.device) in ("GPU", "XPU"):
            return iter(ds.apply(tf.data.experimental.prefetch_to_device(self.device)))
        return iter(ds.prefetch(tf.data.AUTOTUNE))

    def batches_before(self, at: At) -> int:
        """Batches of the current pass trained on at ``at`` (a resumed run skips them); a stream across epochs wraps
        at the length of a pass: the dataset's cardinality, or, when unknown, learnt where a pass ended (or counted)."""
        done = at.offset // self.batch_size + at.epoch * (self.fixed_steps or 0)  # (one stream across epochs)
        return done % self.cardinality if self.continuous and self.cardinality else done

    def sample_batch(self) -> Any:
        """The first batch (from a separate pass), for validating the updates before training."""
        if self._sample is None:
            if (batch := next(iter(self.dataset.take(1)), None)) is None:
                raise InputError(f"The dataset yields no batch of {self.batch_size}: it is empty, or has fewer samples "
                                 "than one batch. Fix: check the pipeline, or lower batch_size.")
            self._sample = tf.nest.map_structure(lambda t: t.numpy(), batch)
        return self._sample

    # -- what the loop asks every input (see ResidentArrays) ----------------------------------------
    def describe(self) -> str:
        """The data in words, for the line before training."""
        return "a tf.data pipeline"

    def first_batch(self, rows: int) -> Any:
        """The first ``rows`` samples of the pipeline's first batch (for the precision check)."""
        return tf.nest.map_structure(lambda a: a[:rows] if np.ndim(a) else a, self.sample_batch())

    def left_in_epoch(self, offset: int) -> int | None:
        """``None``: a stream of unknown length."""
        return None if (total := self.steps_per_epoch) is None else max(0, total - offset // self.batch_size)

    def start(self) -> None:
        """The next call opens a pass at the position."""
        self._iterator, self._next_skip = None, None

    def epoch_over(self) -> None:
        """A new pass, unless the stream runs across epochs."""
        self._iterator = self._iterator if self.continuous else None

    def call_size(self, steps_per_call: int, left: int | None, budget: int | None, program: StepProgram) -> int:
        """Up to ``steps_per_call``: the call takes its length as an argument (no new compilation)."""
        return min(v for v in (steps_per_call, left, budget) if v is not None)

    def run(self, program: StepProgram, at: At, k: int, capacity: int) -> Ran:
        """Up to ``k`` steps from ``at`` in one compiled call, fewer where the data's pass ends: the next call opens
        the next pass (across epochs with ``steps_per_epoch``, its length learnt: `batches_before`)."""
        while True:
            if self._iterator is None:
                skip = self.batches_before(at) if self._next_skip is None else self._next_skip
                self._iterator, self._opened_at, self._yielded, self._next_skip = self.iterator(skip), skip, skip, None
            taken, steps, losses, flags = program.stream_call()(self._iterator, tf.constant(k, tf.int32))
            self._yielded += (done := int(taken.numpy()))
            ran = Ran.of_call(int(steps), losses.numpy(), flags.numpy(), "stream", done < k and not self.continuous)
            if done == k or ran.refused is not None:
                return ran
            self._iterator, self._next_skip, skip = None, 0, self._opened_at  # the pass ended in the call or before
            if self._yielded == skip and (not skip or self.continuous):  # it gave nothing: from its start (empty),
                if not skip or skip < (self.cardinality or skip):  # or after a skip within a pass (passes differ),
                    raise InputError(f"The dataset yielded no batch of {self.batch_size}" + (
                        f" after skipping {skip} of the {self.cardinality} batches of a pass: its passes differ. "
                        "Expected the same batches each pass. Fix: make the pipeline give them, or train without "
                        "resume." if skip else ": it is empty (or smaller than one batch). Fix: check the pipeline."))
                self.cardinality = int(self.dataset.take(skip).reduce(np.int64(0), lambda n, _: n + 1))
                self._next_skip = skip % self.cardinality if self.cardinality else 0  # or past its end: count, wrap
                logger.info(f"The stream resumed {skip} batches in, past the end of a pass of {self.cardinality} "
                            f"batches (counted): it goes on from batch {self._next_skip} of a pass.")
                continue
            self.cardinality = self.cardinality or (self._yielded if self.continuous else None)  # its length
            if done or not self.continuous:
                return ran  # (an epoch without steps_per_epoch ends with its pass, or where its skip reached)


Source = Union[ResidentArrays, Stream]  # what the loop trains on


# ------------------------------------------------------------------------------------ the trainer's input
def contents(*data: Any) -> tuple[Any, list[Any]]:
    """What tells data apart between calls: each leaf's identity, and a NumPy array's checksum (changed in place,
    it is other data, copied and checked again); then the leaves, held so that no other object takes their ids."""
    leaves = tf.nest.flatten(data)
    return tuple((id(a), zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8)) if isinstance(a, np.ndarray)
                  and a.dtype != object else 0) for a in leaves), leaves


def input_for(last: tuple[Any, Source] | None, x: Any, y: Any, updates: Sequence[Update], *, batch_size: int,
              device: str, seed: int, strategy: tf.distribute.Strategy, batch_fn: BatchFn | None,
              steps_per_epoch: int | None) -> tuple[Any, Source]:
    """``(contents, input)`` for ``fit(x, y)``: a `Stream` for a dataset, else `ResidentArrays`, validated by the
    updates. The arrays of the last call (``last``), unchanged, are not copied or checked again."""
    key = contents(x, y)
    if last is not None and last[0][0] == key[0] and last[1].reusable:
        return last
    refuse_labels_beside(x, y)
    source: Source
    if isinstance(x, tf.data.Dataset):
        if batch_fn is not None:
            raise InputError("batch_fn transforms resident arrays on the device; a tf.data.Dataset transforms its "
                             "batches itself. Fix: do that work in the pipeline (dataset.map(...)) and build the "
                             "Trainer without batch_fn.")
        source = Stream(x, batch_size=batch_size, device=device, strategy=strategy, steps_per_epoch=steps_per_epoch)
    elif isinstance(x, tf.data.Iterator):
        raise InputError("fit() takes a tf.data.Dataset, not an iterator over one (the trainer makes a fresh pass per "
                         "epoch). Fix: pass the dataset itself.")
    elif steps_per_epoch is not None:
        raise InputError("steps_per_epoch applies to a tf.data.Dataset; with arrays an epoch is every sample once. "
                         f"Received steps_per_epoch={steps_per_epoch!r}. Fix: leave it out, or use max_steps.")
    else:
        source = ResidentArrays(x, y, batch_size=batch_size, device=device, seed=seed, batch_fn=batch_fn)
    for validate in filter(None, (u.validate for u in updates)):
        validate(source.sample_batch())
    return key, source
