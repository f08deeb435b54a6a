"""Measure and choose: what the package decides by timing configurations on this machine.

``timing`` is the interleaved timing harness (plain Python); ``layer_choice`` the float32-layers choice as data and
its cache; ``layers`` measures it (`measure`); ``plans`` is the plan tuner (`tune`). Names load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "MARGIN": ".timing", "ROUNDS": ".timing", "Sample": ".timing", "Timings": ".timing", "interleaved": ".timing",
    "Measurement": ".layer_choice", "measure": ".layers", "not_measurable": ".layers",
    "Trial": ".plans", "cache_path": ".plans", "cached_for_device": ".plans", "candidates": ".plans",
    "device_signature": ".plans", "load_cache": ".plans", "model_signature": ".plans", "store": ".plans",
    "tune": ".plans", "valid_entry": ".plans",
}

__all__ = ["MARGIN", "Measurement", "ROUNDS", "Sample", "Timings", "Trial", "cache_path", "cached_for_device",
           "candidates", "device_signature", "interleaved", "load_cache", "measure", "model_signature",
           "not_measurable", "store", "tune", "valid_entry"]

if TYPE_CHECKING:  # pragma: no cover
    from .layer_choice import Measurement
    from .layers import measure, not_measurable
    from .plans import (Trial, cache_path, cached_for_device, candidates, device_signature, load_cache,
                        model_signature, store, tune, valid_entry)
    from .timing import MARGIN, ROUNDS, Sample, Timings, interleaved


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
