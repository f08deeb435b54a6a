"""Installed software, read from package metadata and files: TensorFlow is never imported here."""

from __future__ import annotations

import ast
import importlib.util
import os
from importlib import metadata
from typing import Any

TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos")


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def tensorflow_version() -> str | None:
    return next((v for dist in TF_DISTRIBUTIONS if (v := installed_version(dist))), None)


def minor_version(version: str | None) -> tuple[int, int]:
    """``"2.15.1"`` -> ``(2, 15)``; ``(-1, -1)`` when unreadable."""
    parts = str(version).split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (-1, -1)


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
