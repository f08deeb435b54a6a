"""Installed software, read from package metadata and files: TensorFlow is never imported here. `KerasInfo`: the
Keras that ``tf.keras`` resolves to, read the same way (`expected_keras`).
"""

from __future__ import annotations

import ast
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos")


def installed_version(distribution: str) -> str | None:
    """An installed distribution's version, from its package metadata.

    Args:
        distribution: The distribution's name (``"tensorflow-cpu"``).

    Returns:
        The version, or ``None`` where it is not installed.
    """
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def tensorflow_version() -> str | None:
    """The installed TensorFlow's version, from the metadata of the first of `TF_DISTRIBUTIONS` installed.

    Returns:
        The version, or ``None`` where none is installed.
    """
    return next((v for dist in TF_DISTRIBUTIONS if (v := installed_version(dist))), None)


def minor_version(version: str | None) -> tuple[int, int]:
    """A version's major and minor numbers.

    Args:
        version: A version string (``"2.15.1"``), or ``None``.

    Returns:
        ``(2, 15)`` for ``"2.15.1"``; ``(-1, -1)`` when unreadable.
    """
    parts = str(version).split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (-1, -1)


# Exactly the values TensorFlow's lazy loader accepts for TF_USE_LEGACY_KERAS.
LEGACY_KERAS_VALUES = ("1", "true", "True")


@dataclass(frozen=True)
class KerasInfo:
    """The Keras that ``tf.keras`` is.

    Attributes:
        version: Its version (``"3.15.1"``); ``None`` where none is installed.
        generation: Its API generation, 2 or 3; ``None`` where the version is unknown or unreadable.
        distribution: The package it comes from, ``"keras"`` or ``"tf-keras"`` (``"tf_keras"`` where read from the
            module's name); ``None`` where none is installed.
    """

    version: str | None
    generation: int | None
    distribution: str | None

    def to_dict(self) -> dict[str, Any]:
        """The KerasInfo as JSON-ready data."""
        return asdict(self)


def generation_of(version: str | None) -> int | None:
    """The major version of a Keras version string (``"3.15.1"`` -> 3), or ``None`` if unreadable."""
    try:
        return int(str(version).split(".")[0])
    except (TypeError, ValueError):
        return None


def uses_legacy_keras(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TF_USE_LEGACY_KERAS`` selects tf-keras (as TensorFlow >= 2.16 reads it)."""
    env = os.environ if environ is None else environ
    return env.get("TF_USE_LEGACY_KERAS") in LEGACY_KERAS_VALUES


def expected_keras(tf_version: str | None, environ: Mapping[str, str] | None = None,
                   version_of: Callable[[str], str | None] = installed_version) -> KerasInfo:
    """The Keras ``tf.keras`` resolves to for TensorFlow ``tf_version``, from metadata alone (no import)."""
    if minor_version(tf_version) >= (2, 16) and uses_legacy_keras(environ):
        version = version_of("tf-keras") or version_of("tf_keras")
        return KerasInfo(version, generation_of(version) if version else None, "tf-keras" if version else None)
    version = version_of("keras")
    return KerasInfo(version, generation_of(version), "keras" if version else None)


def tensorflow_build_info() -> dict[str, Any] | None:
    """What ``tf.sysconfig.get_build_info()`` returns (CUDA build, CUDA and cuDNN versions), without importing
    TensorFlow: read from the ``build_info.py`` file TensorFlow's build generates. ``None`` if unreadable."""
    try:
        spec = importlib.util.find_spec("tensorflow")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, "python", "platform", "build_info.py")
        try:
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(), path)
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if (isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "build_info" for t in node.targets)
                    and isinstance(node.value, ast.Call) and node.value.args):
                try:
                    return dict(ast.literal_eval(node.value.args[0]))
                except (ValueError, TypeError, SyntaxError):
                    return None
    return None
