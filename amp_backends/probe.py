"""Run every registered backend's probe and gather the results into a :class:`Hardware`."""

from __future__ import annotations

import sys

from .hardware import BackendProbe, Hardware
from .registry import BackendRegistry, default_registry


def tensorflow_device_types() -> frozenset[str] | None:
    """Device types TensorFlow lists, or ``None`` if TensorFlow is not imported (it is never imported here)."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    try:
        return frozenset(d.device_type for d in tf.config.list_physical_devices())
    except Exception:
        return None


def probe_hardware(registry: BackendRegistry | None = None, *, use_tensorflow: bool = False) -> Hardware:
    """Probe every backend. A failing probe becomes an unavailable backend with the error as its reason.

    With ``use_tensorflow`` TensorFlow is imported (for Intel XPUs and TensorFlow's own device list);
    without it TensorFlow is consulted only if the program already imported it.
    """
    registry = registry or default_registry()
    if use_tensorflow:
        import tensorflow  # noqa: F401  (loads device plugins such as ITEX)
    probes = []
    for backend in registry:
        try:
            probes.append(backend.probe(use_tensorflow=use_tensorflow))
        except Exception as exc:  # a probe must never take the program down
            probes.append(BackendProbe(backend.name, False, f"probe failed: {type(exc).__name__}: {exc}"))
    return Hardware(probes=tuple(probes), tf_device_types=tensorflow_device_types())
