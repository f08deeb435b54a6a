"""Saving on a disk that fails, and the random state a checkpoint holds.

Checkpoint saves on storage that can fail: a full disk, no permission, a read-only file system, a kill.

TensorFlow writes a checkpoint into ``ckpt-N_temp/`` first, moves it into place, then swaps the ``checkpoint``
index, so a save that fails never replaces the latest checkpoint; what it leaves is a traceback and litter.
Around a `CheckpointStore`:

* `save_checkpoint` saves; a save that cannot be written removes its partial files and raises
  `CheckpointError` naming the folder, its free space, the size a checkpoint needs
  and the fix. The previous checkpoint stays the latest.
* `ready_to_save`, before training, removes the unfinished saves a killed process left (``ckpt-N_temp*``
  folders, TensorFlow's ``*.tempstate*`` and ``checkpoint.tmp*`` files), saying so, and refuses to start when
  the folder is not writable or has no room for one checkpoint (its next save would fail).

The random layers' state, kept in every checkpoint: a resumed run draws what the uninterrupted run would.

Dropout, SpatialDropout, GaussianDropout and GaussianNoise, the augmentation layers (RandomFlip,
RandomRotation, RandomCrop, RandomZoom, ...), keras_hub's layers with dropout and a layer's own generator
each draw from a generator whose state moves at every step. A model's checkpoint
(``tf.train.Checkpoint(model=...)``) leaves that state out: without it a resumed run draws other masks than
the uninterrupted run, and every loss after the resume differs. `random_state` finds it, for the
trainer's checkpoints to carry:

* Keras 3: each ``keras.random.SeedGenerator`` keeps its state in a variable that ``model.variables``
  lists and ``model.weights`` does not (a SeedGenerator is no trackable object). ``keras.random`` ops given
  no seed draw from Keras's global SeedGenerator, kept in Keras's global state: it is made now if no draw
  made it yet (from Python's ``random``, which `seed_everything`
  seeds), so that its state is saved from the first checkpoint on.
* Keras 2: a random layer draws through its ``RandomGenerator``: from a ``tf.random.Generator`` (the
  augmentation layers always; Dropout, GaussianNoise and GaussianDropout once Keras's
  ``enable_tf_random_generator`` is on, which ``seed_everything`` does), whose state is a variable; or from
  TensorFlow's stateful random ops, whose state lives inside the op where no checkpoint reaches: such
  layers are named in a warning (`saved_random_state`).

The trainer's own draws need nothing saved: shuffling is a function of ``(seed, epoch)`` and
`step_seed` of ``(seed, global step)``, both restored with the position.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from typing import Any
import numpy as np
from typing import Sequence

import tensorflow as tf

from ..errors import CheckpointError, NonFiniteError


logger = logging.getLogger("amp_backends.train")

# what an unfinished save leaves: its data folder, a half-written file of the merge, a half-written index
UNFINISHED = re.compile(r"^(ckpt-\d+_temp.*|ckpt-\d+\..*\.tempstate\d*|checkpoint\.tmp[0-9a-f]*)$")
# Besides the variables' bytes, a checkpoint holds an index entry per variable (name, shape, dtype, offset) and
# the graph of the objects saved, an entry per object (measured on a small MLP with Adam: 60 and 72 bytes)
INDEX_BYTES_PER_VARIABLE = 60
GRAPH_BYTES_PER_OBJECT = 72
# a failed write; collective failures (a worker gone) are the distribution layer's to report
WRITE_ERRORS = (OSError, tf.errors.ResourceExhaustedError, tf.errors.PermissionDeniedError,
                tf.errors.FailedPreconditionError, tf.errors.NotFoundError, tf.errors.UnknownError)


def weights_finite(weights: Any) -> bool:
    return bool(tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in weights]).numpy())


def save_finite(store: Any, weights: Any, together: Any) -> str | None:
    """A checkpoint now, written inside ``together`` (with the other workers). Non-finite weights are never
    written: `NonFiniteError`; a checkpoint that cannot be written (a full disk, no permission) raises
    `CheckpointError`."""
    if not weights_finite(weights):
        raise NonFiniteError(
            f"Not saving step {int(store.step_counter.numpy())}: the weights contain NaN or Inf. The latest good "
            f"checkpoint is {store.latest}. Lower the learning rate or use dynamic loss scaling.")
    with together:
        return save_checkpoint(store)


def save_checkpoint(store: Any) -> str | None:
    """``store.save()``; a save that cannot be written raises `CheckpointError` after removing its files."""
    step = int(store.step_counter.numpy())
    try:
        return store.save()
    except WRITE_ERRORS as exc:
        remove_failed_save(store, step)
        raise CheckpointError(cannot_write(store, step, exc)) from None


def ready_to_save(store: Any) -> None:
    """Before training: unfinished saves of a killed run removed (by the chief); `CheckpointError` when the
    checkpoint folder is not writable or has no room for one checkpoint."""
    if store.is_chief:
        remove_unfinished_saves(store.directory)
    folder = store.manager.directory
    if "://" in folder:
        return
    if os.path.isdir(folder) and not os.access(folder, os.W_OK):
        raise CheckpointError(f"The checkpoint folder {folder!r} is not writable{_read_only(folder)}: no checkpoint "
                              f"could be saved. {_kept(store)} Fix: {_writable_fix(store)}")
    free, need = free_bytes(folder), checkpoint_bytes(store)
    if free is not None and need is not None and free < need:
        raise CheckpointError(
            f"The checkpoint folder {folder!r} has {_size(free)} free; a checkpoint of this run needs about "
            f"{_size(need)}, so the next save would fail. {_kept(store)} Fix: {_space_fix(store, need - free)}")


# ------------------------------------------------------------------------------------ litter
def remove_unfinished_saves(directory: str) -> list[str]:
    """Remove what saves killed mid-way left in ``directory`` (a finished checkpoint is never touched); the log
    names them. Returns their names."""
    names = sorted(n for n in _names(directory) if UNFINISHED.match(n))
    freed = sum(_remove(os.path.join(directory, n)) for n in names)
    if names:
        logger.info(f"Removed what unfinished checkpoint saves of an interrupted run left in {directory} (freeing "
                    f"{_size(freed)}): {', '.join(names)}")
    return names


def remove_failed_save(store: Any, step: int) -> None:
    """Remove the files of the save of ``step`` that failed: its temporary folder, half-written merge and index
    files, and ``ckpt-<step>`` itself unless the index lists it (a checkpoint of that step written before)."""
    folder = store.manager.directory
    listed = {os.path.basename(p) for p in store.paths()} if store.is_chief else set()
    own = re.compile(rf"^(ckpt-{step}(_temp.*|\..*\.tempstate\d*)|checkpoint\.tmp[0-9a-f]*)$")
    whole = re.compile(rf"^ckpt-{step}\.(index|data-\d+-of-\d+)$")
    for name in _names(folder):
        if own.match(name) or (whole.match(name) and f"ckpt-{step}" not in listed):
            _remove(os.path.join(folder, name))


def _names(folder: str) -> list[str]:
    """The entries of a local ``folder``; none for a URL or a folder that cannot be listed."""
    if "://" in folder:
        return []
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _remove(path: str) -> int:
    """Delete a file or folder; returns the bytes freed."""
    files = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs] if os.path.isdir(path) else [path]
    size = 0
    for f in files:
        with contextlib.suppress(OSError):
            size += os.path.getsize(f)
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)
    return size


# ------------------------------------------------------------------------------------ room
def free_bytes(directory: str) -> int | None:
    """Free bytes on the disk holding ``directory`` (its nearest existing parent); ``None`` where unknown."""
    path = os.path.abspath(directory)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def checkpoint_bytes(store: Any) -> int | None:
    """About how many bytes one checkpoint of ``store`` takes: the latest checkpoint's files, else the bytes of
    the variables it saves."""
    latest = store.latest
    if latest:
        try:
            return sum(tf.io.gfile.stat(f).length for f in tf.io.gfile.glob(latest + ".*"))
        except (tf.errors.OpError, OSError):
            pass
    view = getattr(tf.train, "TrackableView", None)
    if view is None:
        return None
    total = 0
    for obj in view(store.checkpoint).descendants():
        total += GRAPH_BYTES_PER_OBJECT
        shape, dtype = getattr(obj, "shape", None), getattr(obj, "dtype", None)
        if shape is None or dtype is None or not hasattr(obj, "assign"):
            continue  # not a variable
        dtype = tf.as_dtype(getattr(dtype, "name", dtype))
        if dtype == tf.string:  # the signature, a label
            total += sum(len(x) for x in np.ravel(obj.numpy()))
        else:
            total += int(tf.TensorShape(shape).num_elements() or 0) * dtype.size
        total += INDEX_BYTES_PER_VARIABLE
    return total or None


# ------------------------------------------------------------------------------------ messages
def cannot_write(store: Any, step: int, exc: BaseException) -> str:
    """Why the save of ``step`` failed, what is kept and the fix, in words (the folder, free space, size needed)."""
    folder = store.manager.directory
    reason = _reason(exc)
    free, need = free_bytes(folder), checkpoint_bytes(store)
    room = ", ".join(([f"{_size(free)} free there"] if free is not None else [])
                     + ([f"a checkpoint of this run needs about {_size(need)}"] if need is not None else []))
    if reason == "no space left on device":
        missing = need - free if free is not None and need is not None and need > free else None
        fix = _space_fix(store, missing)
    else:
        fix = _writable_fix(store)
    room = f" ({room})" if room else ""
    return (f"The checkpoint of step {step} could not be written to {folder!r}: {reason}{room}. {_kept(store)} The "
            f"partial files of this save were removed. Fix: {fix}")


def _reason(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, tf.errors.ResourceExhaustedError) or "No space left" in text:
        return "no space left on device"
    if "Read-only file system" in text:
        return "the file system is read-only"
    if isinstance(exc, (tf.errors.PermissionDeniedError, PermissionError)) or "Permission denied" in text:
        return "permission denied"
    first = " ".join(text.split())
    first = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", first)
    return f"{type(exc).__name__}: {first[:240]}"


def _kept(store: Any) -> str:
    latest = getattr(store, "resumes_from", store).latest  # (a best checkpoint's save: the run's own checkpoints)
    if latest:
        return f"The latest checkpoint is still {os.path.basename(latest)}; training can continue from it."
    return "No checkpoint of this run has been written yet."


def _again(store: Any) -> str:
    return ("then run again with --resume (fit(..., resume=True)) to continue from the latest checkpoint"
            if getattr(store, "resumes_from", store).latest else "then run again")


def _space_fix(store: Any, missing: int | None) -> str:
    amount = f"at least {_size(missing)}" if missing else "space"
    return (f"free {amount} on that disk, {_again(store)}; or start over with a --logdir (checkpoint_dir) on a disk "
            "with room.")


def _writable_fix(store: Any) -> str:
    return (f"make {store.manager.directory!r} writable (a read-only mount, an owner or mode that forbids "
            f"writing), {_again(store)}; or start over with a --logdir (checkpoint_dir) you can write to.")


def _read_only(folder: str) -> str:
    try:
        return " (its file system is mounted read-only)" if os.statvfs(folder).f_flag & os.ST_RDONLY else ""
    except OSError:
        return ""


def _size(n: int | None) -> str:
    if n is None:
        return "an unknown amount"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


logger = logging.getLogger("amp_backends.train")

KEY = "random_state"  # its name in the trainer's checkpoints and their signature


class RandomState(tf.Module):
    """The random generators' state variables as one checkpoint object: the layers' ``states`` and Keras's
    global generator's (``shared``). Its ``variables``, the layers' states, are what the checkpoint's
    signature lists, so a model with other random layers is named as a mismatch."""

    def __init__(self, states: Sequence[Any], shared: Sequence[Any] = ()) -> None:
        super().__init__(name=KEY)
        self.states = list(states)
        self.shared = list(shared)

    @property
    def variables(self) -> tuple[Any, ...]:  # (Keras 3's variables are no tf.Variable for tf.Module's own walk)
        return tuple(self.states)


def random_state(models: Sequence[Any]) -> tuple[RandomState, list[str]]:
    """The state of every random generator ``models`` draw from (see the module docstring), and the names of
    their layers whose draws no checkpoint can hold (Keras 2's stateful random ops)."""
    states: list[Any] = []
    seen: set[int] = set()
    unsaved: list[str] = []

    def add(variable: Any) -> None:
        if id(variable) not in seen:
            seen.add(id(variable))
            states.append(variable)

    for model in models:
        weights = {id(w) for w in model.weights}
        for v in model.variables:  # Keras 3: the SeedGenerators' states (Keras 2: the same list as weights)
            if id(v) not in weights:
                add(v)
        for layer in _layers(model):  # Keras 2
            generator = getattr(layer, "_random_generator", None)
            if generator is None or not hasattr(generator, "_rng_type"):
                continue
            if isinstance(getattr(generator, "_generator", None), tf.random.Generator):
                add(generator._generator.state)
            elif generator._rng_type == "legacy_stateful":
                unsaved.append(layer.name)
    shared = _keras_global_generator()
    return RandomState(states, [shared.state] if shared is not None else []), unsaved


def _layers(model: Any) -> list[Any]:
    return [model, *(m for m in getattr(model, "submodules", ()) if hasattr(m, "_random_generator"))]


def _keras_global_generator() -> Any:
    """Keras 3's global SeedGenerator (made now if no draw made it yet); ``None`` under Keras 2."""
    from ..keras_compat import keras_info

    if keras_info(tf).generation != 3:
        return None
    from keras.src.random.seed_generator import global_seed_generator  # (Keras has no public name for it)

    return global_seed_generator()


def saved_random_state(models: Sequence[Any], say: bool) -> RandomState:
    """The random state for the trainer's checkpoints; with ``say``, a warning names the layers whose draws a
    resumed run cannot repeat, with the fix."""
    state, unsaved = random_state(models)
    if unsaved and say:
        logger.warning(
            f"The random layers {', '.join(unsaved)} draw from TensorFlow's stateful random ops, whose state no "
            "checkpoint can hold: after a resume they draw other values than an uninterrupted run would. Fix: call "
            "amp_backends.seed_everything(seed) (or tf.keras.backend.experimental.enable_tf_random_generator()) "
            "before building the model.")
    return state
