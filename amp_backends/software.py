"""Installed software, read from package metadata: no imports of TensorFlow or ITEX here."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos")
ITEX_DISTRIBUTION = "intel-extension-for-tensorflow"
ITEX_EOL = (
    "end-of-life: Intel stopped ITEX development (last release 2.15.0.3, 2025-03; no plan beyond TensorFlow 2.16, "
    "Python <= 3.11)"
)


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def tensorflow_version() -> str | None:
    for dist in TF_DISTRIBUTIONS:
        v = installed_version(dist)
        if v:
            return v
    return None


def _minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (-1, -1)


@dataclass(frozen=True)
class ItexStatus:
    """Whether Intel Extension for TensorFlow is installed and usable with the installed TensorFlow."""

    version: str | None
    tf_version: str | None
    compatible: bool
    reason: str

    @property
    def installed(self) -> bool:
        return self.version is not None


def itex_status(itex_version: str | None = None, tf_version: str | None = None, *, look: bool = True) -> ItexStatus:
    """ITEX X.Y.* needs TensorFlow X.Y.*: a mismatch fails at import (or aborts), so it is never loaded then."""
    if look:
        itex_version = itex_version or installed_version(ITEX_DISTRIBUTION)
        tf_version = tf_version or tensorflow_version()
    if itex_version is None:
        return ItexStatus(None, tf_version, False, "Intel Extension for TensorFlow is not installed")
    if tf_version is None:
        return ItexStatus(itex_version, None, False, f"ITEX {itex_version} is installed but TensorFlow is not")
    if _minor(itex_version) != _minor(tf_version):
        want = ".".join(map(str, _minor(itex_version)))
        return ItexStatus(
            itex_version,
            tf_version,
            False,
            f"ITEX {itex_version} needs TensorFlow {want}.x but TensorFlow {tf_version} is installed: ITEX will not "
            f"load (use an environment with tensorflow=={want}.* for Intel GPUs)",
        )
    return ItexStatus(itex_version, tf_version, True, f"ITEX {itex_version} matches TensorFlow {tf_version}")
