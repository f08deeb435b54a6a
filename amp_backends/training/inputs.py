"""What the trainer trains on: arrays resident on the device, or a ``tf.data`` pipeline.

**Arrays** (NumPy arrays or tensors; one array, a tuple/list of arrays for several inputs, or a dict of
named features, with optional labels of the same kinds) are copied to the device once. Each epoch's
order is a permutation derived from ``(seed, epoch)``, and every step gathers its batch from that
permutation on the device: no host round trip between steps, several steps per compiled call, and a
position that is simply "sample ``s`` of epoch ``e``", exact on resume whatever the batch size.
Arrays of strings are taken (for a model that starts with its own ``StringLookup``); the steps then run
without XLA.

**A** ``tf.data.Dataset`` of batches: see `streams`.

Each input kind answers the loop's questions itself (steps left in the epoch, the size of the next call)
and runs its compiled call (`ResidentArrays.run`, `streams.Stream.run`), returning a
`Ran`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import tensorflow as tf

from ..errors import InputError
from .batches import Ran, _describe, _leaf_paths
from .runs import At

if TYPE_CHECKING:  # pragma: no cover
    from .streams import Stream

logger = logging.getLogger("amp_backends.train")

BatchFn = Callable[[Any, Any, Any], Any]


def _as_array_nest(structure: Any, name: str) -> Any:
    """Validate a nest of array-likes and convert Python lists of numbers to arrays; keep tensors as they are."""
    if isinstance(structure, dict):
        bad = [k for k in structure if not isinstance(k, str)]
        if bad:
            raise InputError(f"{name} as a dict must have string keys (feature names). Received keys {bad!r}.")
        return {k: _as_array_nest(v, f"{name}[{k!r}]") for k, v in structure.items()}
    if isinstance(structure, tuple) or (isinstance(structure, list) and structure and all(
            np.ndim(v) >= 1 or isinstance(v, (dict, tuple)) for v in structure)):
        return type(structure)(_as_array_nest(v, f"{name}[{i}]") for i, v in enumerate(structure))
    if isinstance(structure, tf.Tensor) or isinstance(structure, tf.Variable):
        return structure
    if hasattr(structure, "shape") and hasattr(structure, "dtype"):  # numpy, or an array library's array
        arr = np.asarray(structure)
    else:
        try:
            arr = np.asarray(structure)
        except Exception:
            arr = np.asarray(None, dtype=object)
    if arr.dtype == object and arr.ndim >= 1 and arr.size and all(isinstance(v, (str, bytes)) for v in arr.flat):
        arr = arr.astype(bytes if isinstance(next(iter(arr.flat)), bytes) else str)  # strings held as objects
    if arr.dtype == object or arr.dtype.kind == "V" or arr.ndim == 0:
        raise InputError(
            f"{name} must be an array of numbers or strings with one row per sample (a NumPy array or tensor, or a "
            f"tuple, list or dict of them). Received: {_describe(structure)}. Fix: convert it with np.asarray(...).")
    return arr  # (strings are for a model that starts with its own StringLookup or TextVectorization)


class ResidentArrays:
    """Arrays copied to the device once; batches gathered on the device from a per-epoch permutation."""

    reusable = True  # a later fit() on the same arrays takes this input again (no copy, no check)

    def __init__(self, x: Any, y: Any, *, batch_size: int, device: str, seed: int,
                 batch_fn: BatchFn | None = None) -> None:
        if x is None:
            raise InputError("fit() needs training data: x as arrays (or a tuple/dict of arrays), "
                             "or a tf.data.Dataset. Received: x=None.")
        x = _as_array_nest(x, "x")
        y = None if y is None else _as_array_nest(y, "y")
        self.samples = rows(x, y)
        if self.samples < batch_size:
            raise InputError(f"The data has {self.samples} samples, fewer than one batch of {batch_size}. Fix: lower "
                             f"batch_size to at most {self.samples}, or train on more data.")
        self.batch_size = batch_size
        self.seed = seed
        self.device = device
        self.host = (x, y)  # for validation (labels within the model's classes) before anything runs
        with tf.device(device):
            self.x = tf.nest.map_structure(tf.convert_to_tensor, x)
            self.y = None if y is None else tf.nest.map_structure(tf.convert_to_tensor, y)
        self.batch_fn = batch_fn or gather_batch
        self.has_strings = any(t.dtype == tf.string for t in tf.nest.flatten((self.x, self.y)) if t is not None)
        self._perm: tuple[int, Any] | None = None

    def steps_in_epoch(self, samples_done: int = 0) -> int:
        """Full batches left in an epoch after ``samples_done`` samples."""
        return max(0, (self.samples - samples_done) // self.batch_size)

    @property
    def steps_per_epoch(self) -> int:
        return self.samples // self.batch_size

    def permutation(self, epoch: int) -> Any:
        """The epoch's sample order on the device, from ``(seed, epoch)`` alone (so a resumed run sees the same)."""
        if self._perm is None or self._perm[0] != epoch:
            perm = np.random.RandomState((self.seed * 100003 + epoch) % 2**32).permutation(self.samples)
            with tf.device(self.device):
                self._perm = (epoch, tf.constant(perm, dtype=tf.int64))
        return self._perm[1]

    def sample_batch(self) -> Any:
        """The data as the step's batch function sees it, for validating the updates before training."""
        return self.host

    # -- what the loop asks every input ------------------------------------------------------------
    def describe(self) -> str:
        return f"{self.samples} samples resident on {self.device}"

    def first_batch(self, rows: int) -> Any:
        """The first ``rows`` samples as the step's batch function gives them to the model (for the precision check)."""
        return self.batch_fn(self.x, self.y, tf.range(rows, dtype=tf.int64))

    def left_in_epoch(self, offset: int) -> int:
        """Steps left in the epoch from sample ``offset``."""
        return self.steps_in_epoch(offset)

    def start(self) -> None:
        """Before a ``fit`` call's loop (nothing to do: every call gathers its batches from the position)."""

    def epoch_over(self) -> None:
        """The position moved to the next epoch (the permutation follows it)."""

    def call_size(self, steps_per_call: int, left: int | None, budget: int | None, program: Any) -> int:
        """Full calls of ``steps_per_call``. Looped calls take their length as an argument; unrolled calls
        compile per size: the epoch's regular last call gets its own, other short stretches (a resumed
        mid-epoch start, ``max_steps``) run as single steps."""
        room = min(v for v in (steps_per_call, left, budget) if v is not None)
        if room == steps_per_call or not program.unrolled(steps_per_call):
            return room
        return room if room == self.steps_per_epoch % steps_per_call else 1

    def run(self, program: Any, at: At, k: int, capacity: int) -> Ran:
        """``k`` steps from ``at`` in one compiled call."""
        fn = program.resident_call(k, self.batch_fn, capacity=capacity)
        losses, flags = fn(self.x, self.y, self.permutation(at.epoch), tf.constant(at.offset, tf.int64),
                           tf.constant(k, tf.int32))
        return Ran(k, losses.numpy()[:k], flags.numpy()[:k], k if program.unrolled(k) else "loop")


def rows(x: Any, y: Any) -> int:
    """The number of samples in arrays ``x`` and labels ``y`` (nests of arrays from `_as_array_nest`): one row
    per sample in every array, or `InputError` naming each array's rows."""
    leaves = _leaf_paths(x, "x") + ([] if y is None else _leaf_paths(y, "y"))
    counts = {path: int(leaf.shape[0]) for path, leaf in leaves}
    if len(set(counts.values())) > 1:
        raise InputError("Every input and label array must have one row per sample, the same number of rows. "
                         f"Received: {', '.join(f'{p}: {n}' for p, n in counts.items())}. Fix: make the arrays the "
                         "same length (x and y describe the same samples).")
    return next(iter(counts.values()))


def refuse_labels_beside(dataset: Any, y: Any) -> None:
    """Labels given beside a ``tf.data.Dataset``, whose elements carry them: `InputError` with the fix."""
    if isinstance(dataset, tf.data.Dataset) and y is not None:
        raise InputError("With a tf.data.Dataset, the labels come from the dataset's elements ((x, y) batches). "
                         f"Received y={_describe(y)} as well. Fix: zip them into the dataset and pass y=None.")


def gather_batch(x: Any, y: Any, idx: Any) -> Any:
    """The default batch: every array's rows at ``idx``, as ``(x, y)`` (``y`` is ``None`` without labels)."""
    take = lambda a: tf.gather(a, idx)  # noqa: E731
    return tf.nest.map_structure(take, x), (None if y is None else tf.nest.map_structure(take, y))


def make_input(x: Any, y: Any, *, batch_size: int, device: str, seed: int, strategy: Any,
               batch_fn: BatchFn | None, steps_per_epoch: int | None) -> ResidentArrays | Stream:
    """The trainer's input for ``fit(x, y)``: a `Stream` for a dataset, else
    `ResidentArrays`."""
    from .streams import Stream

    refuse_labels_beside(x, y)
    if isinstance(x, tf.data.Dataset):
        if batch_fn is not None:
            raise InputError("batch_fn transforms resident arrays on the device; a tf.data.Dataset transforms its "
                             "batches itself. Fix: do that work in the pipeline (dataset.map(...)) and build the "
                             "Trainer without batch_fn.")
        return Stream(x, batch_size=batch_size, device=device, strategy=strategy, steps_per_epoch=steps_per_epoch)
    if isinstance(x, tf.data.Iterator):
        raise InputError("fit() takes a tf.data.Dataset, not an iterator over one (the trainer makes a fresh pass per "
                         "epoch). Fix: pass the dataset itself.")
    if steps_per_epoch is not None:
        raise InputError("steps_per_epoch applies to a tf.data.Dataset; with arrays an epoch is every sample once. "
                         f"Received steps_per_epoch={steps_per_epoch!r}. Fix: leave it out, or use max_steps.")
    return ResidentArrays(x, y, batch_size=batch_size, device=device, seed=seed, batch_fn=batch_fn)


def input_for(last: tuple[Any, Any, Any] | None, x: Any, y: Any, updates: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
    """``(x, y, input)`` for ``fit(x, y)``, validated by the updates (``kwargs``: `make_input`'s). The same
    arrays as in the last call (``last``, the same objects) are not copied to the device or checked again:
    calling ``fit`` once per epoch costs nothing."""
    if last is not None and last[0] is x and last[1] is y and last[2].reusable:
        return last
    source = make_input(x, y, **kwargs)
    for u in updates:
        if u.validate is not None:
            u.validate(source.sample_batch())
    return x, y, source
