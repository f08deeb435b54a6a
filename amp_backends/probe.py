"""Run every registered backend's probe and gather the results into a `Hardware`."""

from __future__ import annotations

import sys
from typing import Any

from .hardware import Accelerator, BackendProbe, Hardware
from .registry import PLAN_ANOTHER, Backend, BackendRegistry, method_of, registry_or_default
from .errors import BackendError


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
    """Probe every backend; one that raises becomes an unavailable backend with the error recorded.

    Args:
        registry: The backends to probe; ``None``: the installed ones.
        use_tensorflow: Import TensorFlow first (Intel XPUs, TensorFlow's device list); otherwise TensorFlow is
            consulted only if already imported.

    Returns:
        What every backend's probe saw.
    """
    registry = registry_or_default(registry)
    if use_tensorflow:
        import tensorflow  # noqa: F401  (loads device plugins such as ITEX)
    probes = []
    for backend in registry:
        try:
            probes.append(checked_probe(backend.probe(use_tensorflow=use_tensorflow), backend, "probe"))
        except Exception as exc:  # a probe must never take the program down
            error = f"{type(exc).__name__}: {exc}"
            probes.append(BackendProbe(backend.name, False, f"probe failed: {error}", error=error))
    return Hardware(probes=tuple(probes), tf_device_types=tensorflow_device_types())


def checked_probe(probe: Any, backend: Backend, method: str, fix: str = PLAN_ANOTHER) -> BackendProbe:
    """A backend's ``probe`` (of its hardware, or `Backend.describe`'s of a device), checked as the library reads it.

    Args:
        probe: What the backend's ``method`` returned.
        backend: The backend.
        method: The method (``"probe"``, ``"describe"``).
        fix: The error's fix.

    Returns:
        The probe.

    Raises:
        BackendError: It is no `BackendProbe`, or one of another backend's name, or its fields are not what the
            library reads (what it has, and what was expected).
    """
    where = method_of(backend, method)
    if not isinstance(probe, BackendProbe):
        raise BackendError(f"{where} returned {type(probe).__name__}, expected a BackendProbe")
    devices, details, name = probe.devices, probe.details, backend.name
    faults = [
        (probe.backend != name, f"of backend {probe.backend!r}; expected its own, {name!r}, as its backend"),
        (not isinstance(probe.available, bool), f"with available={probe.available!r}; expected True or False"),
        (not isinstance(probe.reason, str), f"with reason={probe.reason!r}; expected a str"),
        (not isinstance(devices, tuple) or not all(isinstance(d, Accelerator) and isinstance(d.name, str)
                                                   and isinstance(d.kind, str) and d.kind and type(d.index) is int
                                                   for d in devices),
         f"with devices={devices!r}; expected a tuple of Accelerator (a str name and kind, an int index)"),
        (not isinstance(details, tuple) or not all(isinstance(d, tuple) and len(d) == 2
                                                   and all(isinstance(v, str) for v in d) for d in details),
         f"with details={details!r}; expected a tuple of (label, text) pairs of str"),
    ]
    if problem := next((fault for wrong, fault in faults if wrong), None):
        raise BackendError(f"{where} returned a BackendProbe {problem}. Fix: {fix}.")
    return probe


def needs_tensorflow(hardware: Hardware, registry: BackendRegistry) -> bool:
    """Whether probing again with TensorFlow could change the plan for ``hardware``: where a probe could not
    finish without it (Intel XPUs), or a backend whose devices TensorFlow lists found some (a CPU-only TensorFlow
    would not see them)."""
    probes = ((backend, hardware.get(backend.name)) for backend in registry)
    return any(p is not None and (p.needs_tensorflow or (p.available and b.tf_device_type is not None))
               for b, p in probes)
