"""One run at a time in a checkpoint folder, and no folder left behind by a run that wrote nothing.

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
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from ..errors import CheckpointError
from .checkpoints import ensure_directory

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
