"""Run every registered backend's probe and gather the results into a `Hardware`."""

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
    """Probe every backend. A probe that raises becomes an unavailable backend with the error recorded.

    With ``use_tensorflow`` TensorFlow is imported (for Intel XPUs and TensorFlow's own device list);
    without it TensorFlow is consulted only if the program already imported it.
    """
    registry = registry or default_registry()
    if use_tensorflow:
        import tensorflow  # noqa: F401  (loads device plugins such as ITEX)
    probes = []
    for backend in registry:
        try:
            probe = backend.probe(use_tensorflow=use_tensorflow)
            if not isinstance(probe, BackendProbe):
                raise TypeError(f"probe() returned {type(probe).__name__}, expected a BackendProbe")
            probes.append(probe)
        except Exception as exc:  # a probe must never take the program down
            error = f"{type(exc).__name__}: {exc}"
            probes.append(BackendProbe(backend.name, False, f"probe failed: {error}", error=error))
    return Hardware(probes=tuple(probes), tf_device_types=tensorflow_device_types())


def needs_tensorflow(hardware: Hardware, registry: BackendRegistry) -> bool:
    """Whether probing again with TensorFlow could change the plan for ``hardware``.

    It can when a probe could not finish without TensorFlow (Intel XPUs), or when a backend whose devices
    TensorFlow lists (NVIDIA GPUs) found some: only TensorFlow can confirm it sees them (a CPU-only build
    does not). On a machine with neither, the plan is the same without importing TensorFlow.
    """
    for backend in registry:
        probe = hardware.get(backend.name)
        if probe is None:
            continue
        if probe.needs_tensorflow or (probe.available and backend.tf_device_type is not None):
            return True
    return False
