"""Checkpoints that never lose a run, on a disk that may fail.

TensorFlow writes a checkpoint into ``ckpt-N_temp/``, moves it into place, then swaps the ``checkpoint`` index: a
crash mid-save leaves the previous checkpoint the latest. `CheckpointStore` adds: a fresh run refused over another
run's checkpoints; a signature of what each checkpoint holds (the models' variables, the batch size, the plan), so a
mismatch names what differs; the newest intact checkpoint restored when the latest is unreadable; no non-finite
weights saved; ``optional`` objects a checkpoint predates left out of its restore (`Restored` names them); and a
save on failing storage removes its partial files and raises `CheckpointError` naming the folder, its free space,
the size needed and the fix (`CheckpointStore.ready_to_save` checks the room and cleans up a killed save first).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Mapping, Sequence

import numpy as np
import tensorflow as tf

from ..errors import CheckpointError, CheckpointMismatchError, NonFiniteError
from .runs import absolute, check_directory

logger = logging.getLogger("amp_backends.train")

SIGNATURE_KEY = "signature/.ATTRIBUTES/VARIABLE_VALUE"
# what an unfinished save of checkpoint ``step`` leaves: its data folder, a half-written file of the merge, a
# half-written index
UNFINISHED = r"^(ckpt-{step}(_temp.*|\..*\.tempstate\d*)|checkpoint\.tmp[0-9a-f]*)$"
# a checkpoint's bytes besides the variables': index and object-graph entries (measured on a small MLP with Adam)
INDEX_BYTES_PER_VARIABLE = 60
GRAPH_BYTES_PER_OBJECT = 72
# a failed write; collective failures (a worker gone) are the distribution layer's to report
WRITE_ERRORS = (OSError, tf.errors.ResourceExhaustedError, tf.errors.PermissionDeniedError,
                tf.errors.FailedPreconditionError, tf.errors.NotFoundError, tf.errors.UnknownError)


# ------------------------------------------------------------------------------------ signatures
def _variables_of(obj: Any) -> list[Any] | None:
    for attr in ("weights", "variables"):
        value = getattr(obj, attr, None)
        if value is not None and not callable(value):
            return list(value)
    return None


def signature(objects: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint holds: for each model or layer, its variables' names, shapes and dtypes, in order."""
    models, optimizers = {}, {}
    for key, obj in objects.items():
        if hasattr(obj, "apply_gradients"):  # optimizers: their class (their state follows the model's)
            optimizers[key] = type(obj).__name__
        elif (variables := _variables_of(obj)) is not None:
            models[key] = [[str(getattr(v, "path", None) or getattr(v, "name", "?")).rsplit(":", 1)[0], list(v.shape),
                            v.dtype.name if hasattr(v.dtype, "name") else str(v.dtype)] for v in variables]
    return {"format": 1, "objects": models, **({"optimizers": optimizers} if optimizers else {}), **dict(extra)}


def differences(stored: Mapping[str, Any], current: Mapping[str, Any], limit: int = 6) -> list[str]:
    """Human-readable differences between two signatures' objects (shapes, dtypes) and optimizers (classes)."""
    out: list[str] = []
    a, b = stored.get("objects", {}), current.get("objects", {})
    for key in sorted(set(a) | set(b)):
        if key not in b:
            out.append(f"the checkpoint holds {key!r}, which this run does not train")
        elif key not in a:
            out.append(f"this run trains {key!r}, which the checkpoint does not hold")
        elif len(a[key]) != len(b[key]):
            out.append(f"{key!r} has {len(a[key])} variables in the checkpoint, {len(b[key])} here")
        else:
            for (na, sa, da), (nb, sb, db) in zip(a[key], b[key], strict=True):
                if sa != sb or da != db:
                    out.append(f"{key!r} variable {nb}: the checkpoint has shape {tuple(sa)} {da} ({na}), this run "
                               f"{tuple(sb)} {db}")
    ours = current.get("optimizers", {})
    out += [f"{key!r} is {then} in the checkpoint, {ours[key]} here (the state it holds is {then}'s)"
            for key, then in stored.get("optimizers", {}).items() if ours.get(key, then) != then]
    then_named, now_named = sorted({*a, *stored.get("optimizers", {})}), sorted({*b, *ours})
    if out and then_named != now_named:  # (the objects a trainer names itself, unless checkpoint_objects names them)
        out.insert(0, f"the checkpoint's objects are named {', '.join(then_named) or 'nothing'}, this run's "
                      f"{', '.join(now_named)}: checkpoint_objects= differs from the run that wrote it")
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])


def checkpoint_paths(directory: str) -> list[str]:
    """The checkpoints in ``directory``, newest first: those its ``checkpoint`` index lists (by file name: a path in it
    may be stale) and every ``ckpt-N.index`` there (an index deleted or damaged hides none: no resume starts over)."""
    try:
        state = tf.train.get_checkpoint_state(directory)
    except (ValueError, tf.errors.OpError):  # (an empty or garbled index file)
        state = None
    names = {os.path.basename(p) for p in (state.all_model_checkpoint_paths or [state.model_checkpoint_path])} \
        if state else set()
    names |= {n[:-len(".index")] for n in _names(directory) if re.fullmatch(r"ckpt-\d+\.index", n)}
    return sorted((os.path.join(directory, n) for n in names), reverse=True,
                  key=lambda p: int(n) if (n := p.rsplit("-", 1)[-1]).isdigit() else -1)


def read_signature(path: str) -> dict[str, Any] | None:
    """The signature the checkpoint at ``path`` was written with; ``None`` for a foreign one."""
    reader = tf.train.load_checkpoint(path)
    if not reader.has_tensor(SIGNATURE_KEY):
        return None
    raw = reader.get_tensor(SIGNATURE_KEY)
    return json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))


# ------------------------------------------------------------------------------------ the store
@dataclass(frozen=True)
class Restored:
    """The checkpoint restored, and the signature it was written with (``None`` for a foreign one)."""

    path: str
    stored: dict[str, Any] | None
    lacking: tuple[str, ...] = ()  # optional objects with variables the checkpoint does not hold (they keep theirs)


class CheckpointStore:
    """Saves and restores one ``tf.train.Checkpoint`` in a directory; ``weights`` are checked finite before a save."""

    def __init__(self, objects: Mapping[str, Any], directory: str | os.PathLike, *, step_counter: tf.Variable,
                 keep: int = 3, is_chief: bool = True, worker: str = "0", extra: Mapping[str, Any] | None = None,
                 optional: Mapping[str, Any] | None = None, weights: Sequence[tf.Variable] = ()) -> None:
        self.directory = absolute(directory)
        check_directory(self.directory, "checkpoint directory")  # made by the first save (or the run's lock)
        self.is_chief, self.worker, self.keep, self.weights = is_chief, worker, keep, list(weights)
        self._objects = {**dict(objects), **dict(optional or {})}
        self._optional = set(optional or {})
        self.signature = signature(self._objects, extra or {})
        self._signature_var = tf.Variable(json.dumps(self.signature), dtype=tf.string, trainable=False,
                                          name="signature")
        self.checkpoint = tf.train.Checkpoint(**self._objects, signature=self._signature_var)
        self.step_counter = step_counter
        # every worker saves (saving is collective); the others' files go to a scratch folder removed after each save
        write_dir = self.directory if is_chief else os.path.join(self.directory, f".worker-{worker}")
        _set_aside_damaged_index(self.directory) if is_chief else None
        self.manager = tf.train.CheckpointManager(self.checkpoint, write_dir, max_to_keep=keep,
                                                  step_counter=step_counter)
        self.owned = False  # True once this store wrote or restored: its directory is this run's
        self.last_saved_step: int | None = None
        self.resumes_from = self  # the store a resumed run continues from (a sibling's: the store it sits in)

    def sibling(self, name: str, keep: int = 1) -> CheckpointStore:
        """A store of the same objects in the folder ``name`` inside this one (the best checkpoint's)."""
        extra = {k: v for k, v in self.signature.items() if k not in ("format", "objects")}
        store = CheckpointStore({k: v for k, v in self._objects.items() if k not in self._optional},
                                os.path.join(self.directory, name), step_counter=self.step_counter, keep=keep,
                                is_chief=self.is_chief, worker=self.worker, extra=extra, weights=self.weights,
                                optional={k: self._objects[k] for k in self._optional})
        store.resumes_from = self
        store.remove_unfinished_saves() if store.is_chief else None  # (a best save killed mid-way)
        return store

    @property
    def latest(self) -> str | None:
        """The newest checkpoint whose files are there, else ``None``."""
        return next((p for p in self.paths() if tf.io.gfile.exists(p + ".index")), None)

    def paths(self) -> list[str]:
        """Checkpoints in the directory, newest first (`checkpoint_paths`).

        Returns:
            Their paths (prefixes, without ``.index``), newest first.
        """
        return checkpoint_paths(self.directory)

    def ensure_fresh(self) -> None:
        """Refuse to start a new run over another run's checkpoints."""
        latest = None if self.owned else self.latest
        if latest:
            raise CheckpointError(
                f"{self.directory!r} holds the checkpoints of an earlier run (latest: {os.path.basename(latest)}). "
                "Starting over there would overwrite them. Fix: continue that run with resume=True (--resume), or "
                "give this run its own directory (a new --logdir; the examples make a new version_N per run).")

    def annotate(self, key: str, value: Any) -> None:
        """Record ``key: value`` in the signature of the next checkpoints (for a resume to follow)."""
        self.signature[key] = value
        self._signature_var.assign(json.dumps(self.signature))

    def restore(self, before: Callable[[dict[str, Any] | None], None] | None = None) -> Restored | None:
        """Restore the newest intact checkpoint (``None``: none), skipping unreadable ones with a warning; one of other
        models is `CheckpointMismatchError`. ``before(signature)`` runs before the variables are read (float8)."""
        paths = self.paths()
        if not paths:
            return None
        broken: list[tuple[str, str]] = []
        fix = "Fix: resume with the same model code and arguments (checkpoint_objects= too), or start a new run " \
              "(without --resume, or with another --logdir)."
        for path in paths:
            try:
                stored = read_signature(path)
            except Exception as exc:  # missing or truncated files
                broken.append((path, _short(exc)))
                continue
            # the optional objects a checkpoint written before they were added does not hold: left out of it
            absent = {k for k in self._optional if stored is not None and k not in stored.get("objects", {})}
            current = {**self.signature, "objects": {k: v for k, v in self.signature["objects"].items()
                                                     if k not in absent}}
            checkpoint = self.checkpoint if not absent else tf.train.Checkpoint(
                **{k: v for k, v in self._objects.items() if k not in absent}, signature=self._signature_var)
            diff = differences(stored, current) if stored is not None else []
            if diff:
                raise CheckpointMismatchError(f"The checkpoint {path} was written for other models or optimizers "
                                              f"than the ones being trained: {'; '.join(diff)}. {fix}")
            try:
                if before is not None:
                    before(stored)
                checkpoint.restore(path).assert_existing_objects_matched()
            except Exception as exc:  # truncated data: IndexError, DataLossError, ...
                if isinstance(exc, (AssertionError, ValueError)):  # objects or shapes of another program or model
                    raise CheckpointMismatchError(
                        f"The checkpoint {path} does not match the models being trained (it was written by another "
                        f"program or another model): {_short(exc, 240)}. {fix}") from None
                broken.append((path, _short(exc)))
                continue
            for bad, why in broken:
                logger.warning(f"Checkpoint {bad} is unreadable ({why}); resumed from the newest intact one, {path}.")
            self._signature_var.assign(json.dumps(self.signature))  # later saves describe this run
            self.owned = True
            self.last_saved_step = int(self.step_counter.numpy())
            return Restored(path, stored, tuple(sorted(k for k in absent if self.signature["objects"].get(k))))
        reasons = "; ".join(f"{os.path.basename(p)}: {w}" for p, w in broken)
        raise CheckpointError(f"No intact checkpoint in {self.directory!r}: {reasons}. Fix: " + (
            "start a new run (without --resume, or with another --logdir)." if self.resumes_from is self else
            "resume from the run's own checkpoints, beside these; a better validation writes a new best one."))

    # -------------------------------------------------------------------------------- saving
    def weights_finite(self) -> bool:
        """Whether every weight of the checkpointed objects is finite (none is NaN or infinite)."""
        return bool(tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in self.weights]).numpy())

    def save_finite(self, together: ContextManager[Any]) -> str | None:
        """`save` inside ``together`` (with the other workers); non-finite weights are `NonFiniteError`."""
        if not self.weights_finite():
            latest = (f"the latest good checkpoint is {self.latest}. Fix: lower the learning rate and resume from it"
                      if self.latest else "no checkpoint was saved before. Fix: lower the learning rate, start again")
            raise NonFiniteError(  # (non-finite gradients are skipped: finite ones grew the weights past float32)
                f"Not saving step {int(self.step_counter.numpy())}: the weights contain NaN or Inf (training "
                f"diverged); {latest}.")
        with together:
            return self.save()

    def save(self) -> str | None:
        """Write a checkpoint at the current step; its path (``None`` off the chief); `CheckpointError` if it fails."""
        step = int(self.step_counter.numpy())
        try:
            path = self.manager.save(checkpoint_number=step)
        except WRITE_ERRORS as exc:  # the save's files removed (``ckpt-<step>`` itself unless listed: an earlier save)
            folder = self.manager.directory
            listed = {os.path.basename(p) for p in self.paths()} if self.is_chief else set()
            whole = re.compile(rf"^ckpt-{step}\.(index|data-\d+-of-\d+)$")
            for name in _names(folder):
                if re.match(UNFINISHED.format(step=step), name) or (whole.match(name) and f"ckpt-{step}" not in listed):
                    _remove(os.path.join(folder, name))
            raise CheckpointError(self._cannot_write(step, exc)) from None
        self.owned = True
        self.last_saved_step = step
        if not self.is_chief:
            shutil.rmtree(self.manager.directory, ignore_errors=True)
            return None
        return path

    def ready_to_save(self) -> None:
        """Before training: remove a killed run's unfinished saves; `CheckpointError` if no checkpoint would fit."""
        if self.is_chief:
            self.remove_unfinished_saves()
        folder = self.manager.directory
        if "://" in folder:
            return
        if os.path.isdir(folder) and not os.access(folder, os.W_OK):
            raise CheckpointError(f"The checkpoint folder {folder!r} is not writable{_read_only(folder)}: no "
                                  f"checkpoint could be saved. {self._kept()} Fix: {self._fix(False)}")
        free, need = free_bytes(folder), self.checkpoint_bytes()
        if free is not None and need is not None and free < need:
            raise CheckpointError(
                f"The checkpoint folder {folder!r} has {_size(free)} free; a checkpoint of this run needs about "
                f"{_size(need)}, so the next save would fail. {self._kept()} Fix: {self._fix(True, need - free)}")

    def remove_unfinished_saves(self) -> None:
        """Remove (and log) what saves killed mid-way left in the directory."""
        names = sorted(n for n in _names(self.directory) if re.match(UNFINISHED.format(step=r"\d+"), n))
        freed = sum(_remove(os.path.join(self.directory, n)) for n in names)
        if names:
            logger.info(f"Removed what unfinished checkpoint saves of an interrupted run left in {self.directory} "
                        f"(freeing {_size(freed)}): {', '.join(names)}")

    def checkpoint_bytes(self) -> int | None:
        """About how many bytes one checkpoint takes: the latest one's files, else its variables' bytes."""
        latest = self.latest
        if latest:
            with contextlib.suppress(tf.errors.OpError, OSError):
                return sum(tf.io.gfile.stat(f).length for f in tf.io.gfile.glob(latest + ".*"))
        total = 0
        for obj in tf.train.TrackableView(self.checkpoint).descendants():
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

    def _cannot_write(self, step: int, exc: BaseException) -> str:
        """Why the save of ``step`` failed, what is kept and the fix, in words (the folder, free space, size needed)."""
        folder, reason = self.manager.directory, _reason(exc)
        free, need = free_bytes(folder), self.checkpoint_bytes()
        room = ", ".join(([f"{_size(free)} free there"] if free is not None else [])
                         + ([f"a checkpoint of this run needs about {_size(need)}"] if need is not None else []))
        room = f" ({room})" if room else ""
        fix = self._fix(reason == "no space left on device",
                        need - free if free is not None and need is not None and need > free else None)
        return (f"The checkpoint of step {step} could not be written to {folder!r}: {reason}{room}. {self._kept()} The "
                f"partial files of this save were removed. Fix: {fix}")

    def _kept(self) -> str:
        if latest := self.resumes_from.latest:  # (a best checkpoint's save: the run's own checkpoints)
            return f"The latest checkpoint is still {os.path.basename(latest)}; training can continue from it."
        best = f" but the best one, {self.latest}" if self.resumes_from is not self and self.latest else ""
        return f"No checkpoint of this run has been written yet{best}."

    def _fix(self, space: bool, missing: int | None = None) -> str:
        """Free ``missing`` bytes (``space``), else make the folder writable; then run again."""
        again = ("then run again with --resume (fit(..., resume=True)) to continue from the latest checkpoint"
                 if self.resumes_from.latest else "then run again")
        if space:
            return (f"free {f'at least {_size(missing)}' if missing else 'space'} on that disk, {again}; or start over "
                    "with a --logdir (checkpoint_dir) on a disk with room.")
        return (f"make {self.manager.directory!r} writable (a read-only mount, an owner or mode that forbids writing), "
                f"{again}; or start over with a --logdir (checkpoint_dir) you can write to.")


def _short(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def _set_aside_damaged_index(folder: str) -> None:
    """An empty or garbled ``checkpoint`` index (TensorFlow's manager fails on one, ignores the other, hiding what it
    lists) renamed ``checkpoint.damaged``, with a warning: `checkpoint_paths` finds the checkpoints by their files."""
    index = os.path.join(folder, "checkpoint")
    if "://" in folder or not os.path.isfile(index):
        return
    with contextlib.suppress(ValueError, tf.errors.OpError):  # (an empty one: ValueError; a garbled one: None)
        if tf.train.get_checkpoint_state(folder) is not None:  # (TensorFlow's own reading of it)
            return
    with contextlib.suppress(OSError):
        empty = not Path(index).read_text(errors="replace").strip()
        os.replace(index, index + ".damaged")
        logger.warning(f"The checkpoint index {index} is {'empty' if empty else 'damaged'}: it is kept as "
                       "checkpoint.damaged, and the checkpoints are found by their files.")


def _names(folder: str) -> list[str]:
    """The entries of a local ``folder``; none for a URL or a folder that cannot be listed."""
    try:
        return [] if "://" in folder else os.listdir(folder)
    except OSError:
        return []


def _remove(path: str) -> int:
    """Delete a file or folder; returns the bytes freed."""
    files, size = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs] if os.path.isdir(path) else [path], 0
    for f in files:
        with contextlib.suppress(OSError):
            size += os.path.getsize(f)
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)
    return size


def free_bytes(directory: str) -> int | None:
    """Free bytes on the disk holding ``directory`` (its nearest existing parent); ``None`` where unknown."""
    path = os.path.abspath(directory)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _reason(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, tf.errors.ResourceExhaustedError) or "No space left" in text:
        return "no space left on device"
    if "Read-only file system" in text:
        return "the file system is read-only"
    if isinstance(exc, (tf.errors.PermissionDeniedError, PermissionError)) or "Permission denied" in text:
        return "permission denied"
    first = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", " ".join(text.split()))
    return f"{type(exc).__name__}: {first[:240]}"


def _read_only(folder: str) -> str:
    try:
        return " (its file system is mounted read-only)" if os.statvfs(folder).f_flag & os.ST_RDONLY else ""
    except OSError:
        return ""


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
