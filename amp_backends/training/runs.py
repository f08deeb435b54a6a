"""A run: where it writes (run directories, one run at a time in a checkpoint folder) and where it stands.

Each run writes into a new ``<logdir>/version_N``; ``--resume`` continues the newest holding checkpoints
(`run_directory`). ``fit`` holds an ``fcntl.flock`` on ``<folder>/.lock`` (`holding`): another process's run is
refused (`CheckpointError`); the lock dies with its process (no ``flock``: unlocked, with a warning). The position
is in samples (`Position`): a resume with another batch size goes on at the same sample. `parse_profile_steps`:
the profiler's window, read before TensorFlow starts.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import operator
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import AmpConfigError, CheckpointError, warn

if TYPE_CHECKING:
    import tensorflow as tf

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("amp_backends.train")

VERSION = re.compile(r"^version_(\d+)$")
LOCK_FILE = ".lock"


def absolute(path: str | os.PathLike) -> str:
    """``path`` made absolute now (``~`` expanded; URLs such as ``gs://`` kept): a run writes where it started."""
    text = os.fspath(path)
    return text if "://" in text else os.path.abspath(os.path.expanduser(text))


def check_no_file_in_the_way(path: str | os.PathLike, what: str) -> Path:
    """``path`` absolute; `AmpConfigError` if empty, or if it or its nearest existing parent is a file."""
    if not str(path).strip():  # ("": the current folder, where a run's version_N folders would go unasked)
        raise AmpConfigError(f"{what} must name a folder. Received {str(path)!r}. Fix: give one, such as {what} runs.")
    p = Path(absolute(path))
    existing = next((q for q in [p, *p.parents] if q.exists()), None)
    if existing is not None and not existing.is_dir():
        raise AmpConfigError(f"{what} {str(p)!r} cannot be used: {str(existing)!r} is a file, not a directory. Fix: "
                             f"choose another {what} (or move that file).")
    return p


def ensure_directory(path: str | os.PathLike, what: str) -> Path:
    """Create ``path`` (and parents) or raise `AmpConfigError` (a file in the way, no permission)."""
    p = check_no_file_in_the_way(path, what)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AmpConfigError(f"{what} {str(p)!r} cannot be created: {exc.strerror or exc}. Fix: choose a {what} you "
                             "can write to.") from None
    if not os.access(p, os.W_OK):
        raise AmpConfigError(f"{what} {str(p)!r} is not writable. Fix: choose a {what} you can write to.")
    return p


def check_directory(path: str | os.PathLike, what: str) -> Path:
    """``path`` as an absolute ``Path``, checked as `ensure_directory` would but not made (the first write makes it)."""
    p = check_no_file_in_the_way(path, what)
    existing = next((q for q in [p, *p.parents] if q.exists()), None)
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise AmpConfigError(f"{what} {str(p)!r} cannot be written: {str(existing)!r} is not writable. Fix: choose a "
                             f"{what} you can write to.")
    return p


def _missing(folder: Path) -> list[Path]:
    """The folders of ``folder``'s path that do not exist yet, deepest first."""
    return list(itertools.takewhile(lambda p: not p.exists(), [folder, *folder.parents]))


def _versions(logdir: Path) -> dict[int, Path]:
    """The ``version_N`` folders under ``logdir``, by N."""
    children = logdir.iterdir() if logdir.is_dir() else ()
    return {int(m.group(1)): c for c in children if (m := VERSION.match(c.name)) and c.is_dir()}


@dataclass(frozen=True)
class RunDirectory:
    """Where one run writes: ``path`` (TensorBoard, profiles) and ``path/checkpoints``."""

    path: Path
    resumed: bool

    @property
    def checkpoints(self) -> Path:
        """The run's checkpoint folder, ``path/checkpoints``."""
        return self.path / "checkpoints"


def propose_run_directory(logdir: str | os.PathLike, resume: bool) -> RunDirectory:
    """Where a run writes under ``logdir`` (the module docstring), decided without creating anything."""
    root = check_no_file_in_the_way(logdir, "--logdir")
    found = _versions(root)
    if resume:
        candidates = [root, *(found[n] for n in sorted(found, reverse=True))]
        for path in candidates:
            if _saved(path):
                return RunDirectory(path, True)
        for path in candidates:  # a run training now that has saved nothing yet: its lock names it
            refuse_if_held(path / "checkpoints")
        raise CheckpointError(
            f"--resume: there is no run to resume under {str(root)!r} (no checkpoints in {str(root / 'checkpoints')!r} "
            f"or in any {str(root / 'version_N' / 'checkpoints')!r}). Fix: drop --resume to start a new run, or point "
            "--logdir at the run to continue.")
    return RunDirectory(root / f"version_{max(found, default=-1) + 1}", False)


def _saved(run: Path) -> bool:  # it holds checkpoints: TensorFlow's state file, or a save's index (a run saving)
    return (run / "checkpoints" / "checkpoint").is_file() or any((run / "checkpoints").glob("ckpt-*.index"))


# The run directories this process reserved, each with the folders above it that the reservation created.
_RESERVED: list[tuple[Path, list[Path]]] = []


def release_unused_run_directories() -> None:
    """Remove the run directories (and folders above) this process reserved and left empty; it also runs at exit."""
    while _RESERVED:
        path, made = _RESERVED.pop()
        _remove_empty([path, *made])


atexit.register(release_unused_run_directories)


def reserve_run_directory(logdir: str | os.PathLike) -> RunDirectory:
    """A new ``version_N`` under ``logdir``, reserved by creating it (``mkdir`` succeeds in one process only; an unused
    one is removed at the end: `release_unused_run_directories`).

    Args:
        logdir: the folder that holds the runs' ``version_N`` folders (made if missing).

    Returns:
        The new run's `RunDirectory` (not resumed).

    Raises:
        AmpConfigError: ``logdir`` cannot be created or written.
    """
    made = _missing(check_no_file_in_the_way(logdir, "--logdir"))
    root = ensure_directory(logdir, "--logdir")
    n = max(_versions(root), default=-1) + 1
    while True:
        path = root / f"version_{n}"
        try:
            path.mkdir()
        except FileExistsError:
            n += 1
            continue
        except OSError as exc:
            raise AmpConfigError(f"--logdir {str(root)!r}: the run directory {str(path)!r} cannot be created: "
                                 f"{exc.strerror or exc}. Fix: choose a --logdir you can write to.") from None
        _RESERVED.append((path, made))
        return RunDirectory(path, False)


def run_directory(logdir: str | os.PathLike, resume: bool, strategy: tf.distribute.Strategy | None = None
                  ) -> RunDirectory:
    """The run's directory: a new ``version_N`` (`reserve_run_directory`), or under ``resume`` the newest run holding
    checkpoints; several workers agree on it first.

    Args:
        logdir: the folder of the runs (``--logdir``), relative or absolute.
        resume: continue the newest run that holds checkpoints instead of starting a new one.
        strategy: the ``tf.distribute`` strategy of a run over several workers, or ``None``.

    Returns:
        The `RunDirectory`.

    Raises:
        CheckpointError: ``resume`` and no run to resume, or workers that chose different directories.
        AmpConfigError: ``logdir`` cannot be created or written.
    """
    several = strategy is not None and getattr(strategy, "cluster_resolver", None) is not None
    if not resume and VERSION.match((root := Path(absolute(logdir))).name) and _saved(root):  # runs/version_0
        warn(f"--logdir {str(logdir)!r} is a run's own folder: this run starts in a version_N inside it. Fix: pass "
             f"--resume to continue that run, or --logdir {str(root.parent)!r} to start one beside it")
    if not resume and not several:
        return reserve_run_directory(logdir)
    run = propose_run_directory(logdir, resume)
    if several:
        from .distribute import gather_numbers

        version = VERSION.match(run.path.name)
        seen = gather_numbers(strategy, int(version.group(1)) if version else -1)
        if len(set(seen)) > 1:
            raise CheckpointError(
                f"The workers chose different run directories under {str(logdir)!r} (versions {seen}): their --logdir "
                "views differ. Fix: give every worker the same --logdir on storage they all share.")
    check_directory(run.path, "--logdir")  # made by the run's first write
    return run


@contextlib.contextmanager
def holding(directory: str | os.PathLike | None) -> Iterator[None]:
    """Hold checkpoint folder ``directory``'s lock for the block (`_release` cleans up); ``None``: nothing to hold."""
    if directory is None or "://" in os.fspath(directory):
        yield
        return
    folder = Path(directory)
    made, fd = _missing(folder), None
    try:
        fd = _acquire(folder)
        yield
    finally:
        _release(fd, folder, made)


def refuse_if_held(directory: str | os.PathLike) -> None:
    """`CheckpointError` now if another process holds ``directory``'s lock; nothing is made or held."""
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
    if fd is not None:
        with contextlib.suppress(OSError):
            if [p.name for p in folder.iterdir()] == [LOCK_FILE]:
                (folder / LOCK_FILE).unlink()  # still held: no other run can have taken it
        os.close(fd)
    _remove_empty(made)


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) up to the first that is not empty."""
    for p in folders:
        try:
            p.rmdir()
        except OSError:
            break


def parse_profile_steps(value: Any, name: str = "--profile-steps") -> tuple[int, int] | None:
    """The profiler's window, from ``--profile-steps 20:30`` or ``Trainer(profile_steps=(20, 30))``.

    Args:
        value: ``"START:STOP"`` or ``(START, STOP)``; ``None`` or ``""``: no profiling.
        name: The argument the error names (``"profile_steps"``, the trainer's, is said as a tuple).

    Returns:
        ``(start, stop)``: steps ``start`` to ``stop - 1`` are traced; ``None``: no profiling.

    Raises:
        AmpConfigError: ``value`` is not two step numbers with ``0 <= START < STOP``.
    """
    if value is None or (isinstance(value, str) and not value):
        return None
    form, example = ("START:STOP", "20:30") if name.startswith("-") else ("(START, STOP)", "(20, 30)")
    try:  # (in a tuple, a step is an int: a float or a string is refused)
        a, b = (int(p) for p in value.split(":")) if isinstance(value, str) else (operator.index(p) for p in value)
    except (TypeError, ValueError):
        a = b = -1
    if not 0 <= a < b:
        raise AmpConfigError(f"{name} must be {form}: two step numbers with 0 <= START < STOP, such as {example}. "
                             f"Received: {value!r}. Fix: give the first step to trace, then the step to stop at.")
    return a, b


@dataclass(frozen=True)
class At:
    """One reading of the position: ``step`` steps done, sample ``offset`` of epoch ``epoch``."""

    epoch: int
    offset: int
    step: int


class Position:
    """The trainer's position variables and how they move (see the module docstring)."""

    def __init__(self, batch_size: int) -> None:
        import tensorflow as tf

        self.batch_size = int(batch_size)
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.samples_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="samples_in_epoch")
        # the batch size the position was written with (a checkpoint holds it; restore compares)
        self.saved_batch_size = tf.Variable(self.batch_size, dtype=tf.int64, trainable=False, name="batch_size")

    def now(self) -> At:
        """The position as it stands, read from its variables."""
        return At(*(int(v.numpy()) for v in (self.epoch, self.samples_in_epoch, self.global_step)))

    @property
    def step(self) -> int:
        """The global step: the steps done so far in the run."""
        return int(self.global_step.numpy())

    def batch_in_epoch(self, at: At) -> int:
        """The step within its epoch of the batch starting at ``at``."""
        return at.offset // self.batch_size

    def next_epoch(self) -> None:
        """Move to the start of the next epoch."""
        self.epoch.assign_add(1)
        self.samples_in_epoch.assign(0)

    def total_steps(self, steps_per_epoch: int | None, epochs: int, max_steps: int | None, say: bool = False
                    ) -> int | None:
        """The global step at which ``fit(epochs=..., max_steps=...)`` ends, when the data's length is known; with
        ``say``, a log line where ``epochs`` ends it before ``max_steps``."""
        if steps_per_epoch is None:
            return max_steps
        at = self.now()
        total = at.step + max((epochs - at.epoch) * steps_per_epoch - at.offset // self.batch_size, 0)
        if say and max_steps is not None and at.step < total < max_steps:
            needed = -(-max_steps // steps_per_epoch)
            logger.info(f"epochs={epochs} (--epochs) ends this fit at global step {total}, before max_steps="
                        f"{max_steps} (--max-steps; the first reached ends it); to train to step {max_steps}, pass "
                        f"epochs={needed} (--epochs {needed}).")
        return total if max_steps is None else min(total, max_steps)

    def checkpoint(self) -> tf.train.Checkpoint:
        """The position's variables (and the batch size they count in) as one checkpoint object."""
        import tensorflow as tf

        return tf.train.Checkpoint(global_step=self.global_step, epoch=self.epoch,
                                   samples_in_epoch=self.samples_in_epoch, batch_size=self.saved_batch_size)

    def restored(self) -> tuple[At, int]:
        """After a restore: where the checkpoint stood and its batch size (from now on, this run's is saved)."""
        at, then = self.now(), int(self.saved_batch_size.numpy())
        self.saved_batch_size.assign(self.batch_size)
        return at, then
