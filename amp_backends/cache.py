"""The package's answers kept between runs (autotune's choices, the per-layer precision choices): one JSON file
per kind, written atomically, read tolerantly.

The folder is ``$AMP_CACHE_DIR``, else ``$XDG_CACHE_HOME/amp_backends``, else ``~/.cache/amp_backends``. A file
that is no cache's JSON object reads as empty and is never replaced (it may be anything of the user's); a file that
cannot be written is skipped with a warning: a cache never stops training.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger("amp_backends")


def cache_dir() -> Path:
    """The cache folder, absolute (``~`` expanded)."""
    path = os.environ.get("AMP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "amp_backends")
    return Path(os.path.abspath(os.path.expanduser(path)))


def digest(text: str) -> str:
    """A short stable hash of ``text`` (cache keys)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


_DAMAGED: set[str] = set()  # cache files said to be damaged, once each


def load(path: Path) -> dict[str, Any]:
    """The cache file's entries; ``{}`` when it is missing or unreadable (said once; `store` leaves it as it is)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        data = exc
    if not isinstance(data, dict):
        if str(path) not in _DAMAGED:
            _DAMAGED.add(str(path))
            logger.warning(f"The cache {path} cannot be read as its JSON object ({str(data)[:120]}): it is ignored "
                           "and left as it is, so no answer is kept there. Fix: point the cache at another file, or "
                           "move that one away.")
        return {}
    return data


def store(path: Path, key: str, value: Any) -> bool:
    """Add ``key: value`` to the file, atomically (a temporary file renamed over it); whether it was written (not
    over a file that is no cache's JSON object: `load` said why)."""
    entries = load(path)
    if not entries and str(path) in _DAMAGED and os.path.lexists(path):
        return False
    entries[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning(f"Could not write the cache {path} ({exc}); the answer is not kept for the next run.")
        return False
    return True


def unwritable(path: Path) -> str | None:
    """Why the cache file ``path`` could not be written, for a warning before the work whose answer it would keep;
    ``None`` where nothing in the way is seen.

    Args:
        path: The cache file (absolute).

    Returns:
        The reason, or ``None``.
    """
    if path.is_dir():
        return f"{path} is a folder"
    for folder in path.parents:  # the nearest that exists: the file is written there (a temporary file renamed)
        if folder.exists():
            if not folder.is_dir():
                return f"{folder} is a file, not a folder"
            return None if os.access(folder, os.W_OK | os.X_OK) else f"no permission to write in {folder}"
    return None


@functools.cache
def host_machine() -> str:
    """This machine's CPU as the OS names it (``/proc/cpuinfo``'s model name, family and model; else the
    platform's processor string): part of every cache key, so that a cache copied to another machine is not
    taken for its own."""
    import platform

    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = (part.strip() for part in line.partition(":"))
                if key in ("model name", "cpu family", "model", "CPU part"):
                    fields.setdefault(key, value)
                if not line.strip() and fields:
                    break
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown"
    extra = "/".join(fields[k] for k in ("cpu family", "model", "CPU part") if k in fields)
    return f"{name}{' (' + extra + ')' if extra else ''}"
