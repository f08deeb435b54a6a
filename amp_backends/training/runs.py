"""A run's place and its folder: the position in the data, one run at a time in a checkpoint folder, and
what a resumed run keeps.

Where training stands in the data: global step, epoch and sample offset within the epoch.

The position is kept in *samples* (sample ``offset`` of epoch ``epoch``), so a run resumed with another
batch size continues at the same sample: nothing is read twice or skipped. Its variables are part of every
checkpoint, together with the batch size they were written with. The compiled calls advance the step and
the offset on the device (`step`); the loop reads them once per call through `Position.now`.

One run at a time in a checkpoint folder, and no folder left behind by a run that wrote nothing.

Two runs writing one checkpoint folder overwrite each other's checkpoints and index: two ``--resume`` of one
run, or two new runs that chose the same folder. While a trainer trains (``fit``, from before it restores or
checks the folder is fresh until it returns) it holds an exclusive ``fcntl.flock`` on ``<folder>/.lock``; a
run in another process that wants the folder meanwhile is refused with `CheckpointError`, naming the
process that holds it. The operating system releases the lock when that process ends, killed included: there
is never a stale lock to remove. Where ``flock`` does not exist (Windows) or the filesystem refuses it,
training goes on unlocked, with a warning.

The folder is made when the lock is taken (the first moment anything is written there). When ``fit`` ends
with nothing saved — it failed before its first checkpoint — the lock file goes again, and so do the folders
it made, where they are empty: a bad batch size or a model that fails at its first step leaves no
``version_N`` behind.

What a resumed run keeps from the checkpoint it continues, and what it says where a setting changed.

A trainer's checkpoints record the run's seed and each update's loss scaling in their signature (besides the
models, the batch size and the plan: `checkpoints`). Resuming:

* **the seed** orders each epoch's samples and draws the steps' randomness: continuing with another would
  read samples of the epoch in progress twice and skip others. A trainer with another seed is refused
  (`check_seed`); the examples, which load their data before they train, read the run's seed first
  (`run_seed`) and follow it, or refuse a ``--seed`` that differs.
* **loss scaling** restored from a checkpoint written under another one does not fit the plan: a run begun
  without loss scaling (bfloat16 on a CPU) and continued under float16 (on an NVIDIA GPU) would start at
  scale 1 — float16 without scaling until the scale grows, ``growth_interval`` steps later. Where the
  checkpoint's loss scaling differs from the plan's, the plan's starts afresh (at its initial scale, as a new
  run does; ``none`` drops the scale) and the log says so (`follow_loss_scaling`); the same dynamic
  scaling continues from the restored scale.
* **max_steps and epochs** count the whole run: a run already past them has nothing to train, and a warning
  says so and what to pass (`nothing_left`); ``fit`` returns without a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
import json
from collections.abc import Mapping

import tensorflow as tf

from ..errors import CheckpointError, CheckpointMismatchError
from .checkpoints import SIGNATURE_KEY, ensure_directory


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


try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("amp_backends.train")

LOCK_FILE = ".lock"


@contextlib.contextmanager
def holding(directory: str | os.PathLike | None) -> Iterator[None]:
    """Hold checkpoint folder ``directory``'s lock for the block (the folder is made now, if missing); on the
    way out, remove the lock file and the folders made here where nothing else was written. ``None`` (no
    checkpoints, or a worker that is not the chief): nothing to hold."""
    if directory is None or "://" in os.fspath(directory):
        yield
        return
    folder = Path(directory)
    made = _missing(folder)
    try:
        fd = _acquire(folder)
    except BaseException:
        _release(None, folder, made)
        raise
    try:
        yield
    finally:
        _release(fd, folder, made)


def refuse_if_held(directory: str | os.PathLike) -> None:
    """`CheckpointError` now if another process holds ``directory``'s lock (a run about to be refused
    learns it before loading its data); nothing is made or held."""
    path = Path(directory) / LOCK_FILE
    if fcntl is None or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _held(Path(directory), fd) from None
    except OSError:
        pass
    finally:
        os.close(fd)  # releases a lock taken here


def _missing(folder: Path) -> list[Path]:
    """The folders of ``folder``'s path that do not exist yet, deepest first."""
    missing = []
    for p in [folder, *folder.parents]:
        if p.exists():
            break
        missing.append(p)
    return missing


def _acquire(folder: Path) -> int | None:
    if fcntl is None:
        return None
    for _ in range(5):
        ensure_directory(folder, "checkpoint directory")
        path = folder / LOCK_FILE
        # held open for reading only: a file open for writing would keep its disk from being remounted read-only
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            error = _held(folder, fd)
            os.close(fd)
            raise error from None
        except OSError as exc:
            os.close(fd)
            logger.warning(f"Cannot lock {path} ({exc.strerror}): this run is not protected against another run "
                           "writing the same checkpoint folder at the same time.")
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:  # (else the file was removed by a run that ended meanwhile: lock the one there now)
            with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as holder:  # who holds it
                holder.write(f"{os.getpid()} {socket.gethostname()}\n")
            return fd
        os.close(fd)
    return None


def _held(folder: Path, fd: int) -> CheckpointError:
    try:
        holder = os.pread(fd, 200, 0).decode(errors="replace").split()
    except OSError:
        holder = []
    who = f"process {holder[0]} on {holder[1]}" if len(holder) >= 2 else "another process"
    return CheckpointError(
        f"Another run is training in {str(folder)!r} now ({who} holds {str(folder / LOCK_FILE)!r}): two runs writing "
        "one checkpoint folder would overwrite each other's checkpoints. Fix: wait for that run to end (or stop it), "
        "then continue it with resume=True (--resume); or give this run its own folder (another --logdir).")


def _release(fd: int | None, folder: Path, made: list[Path]) -> None:
    lock = folder / LOCK_FILE
    with contextlib.suppress(OSError):
        if fd is not None and [p.name for p in folder.iterdir()] == [LOCK_FILE]:
            lock.unlink()  # still held: no other run can have taken it
    if fd is not None:
        os.close(fd)
    for p in made:  # deepest first; a folder something was written into stays
        try:
            p.rmdir()
        except OSError:
            break




def settings(seed: int, scalers: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint's signature records for a resume to compare: the seed, each update's loss scaling."""
    return {"seed": int(seed), "loss_scaling": {name: s.config.to_dict() for name, s in scalers.items()}}


def check_seed(stored: Mapping[str, Any] | None, seed: int, path: str) -> None:
    """`CheckpointMismatchError` when the checkpoint at ``path`` was written by a run with another seed."""
    then = (stored or {}).get("seed")
    if then is None or int(then) == seed:
        return
    raise CheckpointMismatchError(
        f"The checkpoint {path} was written by a run with seed {then}; this trainer's seed is {seed}. The seed orders "
        "each epoch's samples and draws the steps' randomness: continuing with another would read samples of the "
        f"epoch in progress twice and skip others. Fix: resume with seed={then} (on the command line: leave --seed "
        f"out, a resumed run keeps its own), or start a new run with seed {seed} (without resume=True / --resume, "
        "or in another directory).")


def follow_loss_scaling(stored: Mapping[str, Any] | None, scalers: Mapping[str, Any], say: bool = True) -> list[str]:
    """Restart each scaler whose loss scaling differs from the checkpoint's at the plan's initial scale; what
    changed, as lines (logged with ``say``). A checkpoint that does not record its loss scaling (an older
    one) is followed as is."""
    then = (stored or {}).get("loss_scaling") or {}
    lines = []
    for name, scaler in scalers.items():
        old, new = then.get(name), scaler.config.to_dict()
        if old is None or old == new or (old.get("mode") == new["mode"] == "dynamic"):
            continue
        restored = scaler.current
        scaler.restart()
        was = "without loss scaling" if old.get("mode") == "none" else f"with {_describe(old)} loss scaling"
        if scaler.config.mode == "none":
            now = f"this plan scales no losses: the restored scale {restored:g} of {name!r} is dropped"
        else:
            now = (f"this plan's loss scaling is {scaler.config}: {name!r} starts at scale {scaler.current:g}, as a "
                   f"new run does, not at the restored {restored:g}")
        lines.append(f"The checkpoint was written {was}; {now}.")
        if say:
            logger.info(lines[-1])
    return lines


def _describe(config: Mapping[str, Any]) -> str:
    return f"fixed ({config.get('scale', 0):g})" if config.get("mode") == "fixed" else str(config.get("mode"))


def nothing_left(at: At, epoch_done: bool, epochs: int, max_steps: int | None) -> str | None:
    """The warning for a run that ``fit(epochs=..., max_steps=...)`` would not move (``None``: steps to train);
    ``epoch_done``: the epoch ``at`` stands in has no batch left."""
    if max_steps is not None and at.step >= max_steps:
        return (f"Nothing to train: the run is already at global step {at.step}, "
                + ("which is" if at.step == max_steps else "past") + f" max_steps={max_steps} (--max-steps: "
                "the steps of the whole run, resumed ones included). Fix: to train further, pass a max_steps above "
                f"{at.step}, such as {at.step + max(at.step, 1)}.")
    done = at.epoch + int(epoch_done)
    if done >= epochs:
        return (f"Nothing to train: the run has already completed {done} epoch{'s' if done != 1 else ''}, and "
                f"epochs={epochs} (--epochs) counts the epochs of the whole run. Fix: to train further, pass epochs "
                f"above {done}, such as {done + 1}.")
    return None


def run_seed(checkpoints: str | os.PathLike) -> int | None:
    """The seed recorded by the newest readable checkpoint in folder ``checkpoints`` (``None``: none records
    one), read without building anything."""
    folder = os.fspath(checkpoints)
    state = tf.train.get_checkpoint_state(folder)
    names = {os.path.basename(p) for p in (state.all_model_checkpoint_paths or [state.model_checkpoint_path])} \
        if state else set()
    for name in sorted(names, key=lambda n: int(n.rsplit("-", 1)[-1]) if n.rsplit("-", 1)[-1].isdigit() else -1,
                       reverse=True):
        try:
            reader = tf.train.load_checkpoint(os.path.join(folder, name))
            raw = reader.get_tensor(SIGNATURE_KEY) if reader.has_tensor(SIGNATURE_KEY) else None
        except Exception:  # missing or truncated files: the restore says which
            continue
        seed = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw)).get("seed") if raw else None
        return None if seed is None else int(seed)
    return None


def restore_run(store: Any, position: Any, *, seed: int, scalers: Mapping[str, Any], updates: Any, batch_size: int,
                plan_headline: str, is_chief: bool) -> tuple[int, dict[str, Any]] | None:
    """Restore ``store``'s newest intact checkpoint, if any: its seed checked, the resume said (by the chief),
    loss scaling followed; ``(its global step, its signature)``: the signature holds what the run decided and
    learnt (``layer_plans``, ``monitor``: its history and best value)."""
    from .checkpoints import log_resume

    restored = store.restore()
    if restored is None:
        return None
    check_seed(restored.stored, seed, restored.path)
    at, then_batch = position.restored()
    stored = restored.stored or {}
    if is_chief:
        log_resume(restored, at, then_batch, batch_size, updates=updates, scalers=scalers,
                   plan_headline=plan_headline)
    follow_loss_scaling(restored.stored, scalers, say=is_chief)
    return at.step, stored
