"""Checkpoint saves on storage that can fail: a full disk, no permission, a read-only file system, a kill.

TensorFlow writes a checkpoint into ``ckpt-N_temp/`` first, moves it into place, then swaps the ``checkpoint``
index, so a save that fails never replaces the latest checkpoint; what it leaves is a traceback and litter.
Around a `CheckpointStore`:

* `save_checkpoint` saves; a save that cannot be written removes its partial files and raises
  `CheckpointError` naming the folder, its free space, the size a checkpoint needs
  and the fix. The previous checkpoint stays the latest.
* `ready_to_save`, before training, removes the unfinished saves a killed process left (``ckpt-N_temp*``
  folders, TensorFlow's ``*.tempstate*`` and ``checkpoint.tmp*`` files), saying so, and refuses to start when
  the folder is not writable or has no room for one checkpoint (its next save would fail).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from typing import Any

import numpy as np
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
