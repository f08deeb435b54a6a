"""A catalogue of known devices, to plan for hardware this machine does not have (``plan_for(device="h100")``).

The entries belong to the vendor backends: each lists its own (`catalogue`), with the sources of its figures,
and describes one as its probe would see it (`describe`); this module gathers them from the registered
backends, finds one by name (any case; spaces, dashes and underscores alike; aliases) and builds the machine it
describes (`machine_of`, which the tests' fake machines use too). A described machine is the device alone with
its usual software (TensorFlow 2.21; 2.15 with ITEX for Intel GPUs; ``TF_ENABLE_ONEDNN_OPTS`` unset).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from .errors import AmpConfigError, BackendError, warn
from .hardware import GB, BackendProbe, DeviceFact, Hardware, KnownDevice
from .probe import checked_probe
from .registry import AT_FAULT, BackendRegistry, call_backend, registry_or_default


def catalogue(registry: BackendRegistry | None = None) -> tuple[KnownDevice, ...]:
    """Every registered backend's catalogue entries, the highest-priority backend's first.

    Args:
        registry: The backends to ask (default: the installed ones).

    Returns:
        The entries, each backend's in its own order (a backend whose catalogue fails is left out). A name that a
        higher-priority backend's entry already has, as its name or an alias, is that entry's: a lower-priority
        entry of that name is left out, and its aliases name it only where no earlier entry has them.
    """
    entries: list[KnownDevice] = []
    for backend in registry_or_default(registry):
        try:  # a broken third-party backend must not hide the others' devices
            listed = list(call_backend(backend, "catalogue", (tuple, list), "a tuple of KnownDevice",
                                       then=": its devices are left out of the device catalogue", fix=AT_FAULT))
        except BackendError as exc:
            warn(str(exc))
            continue
        if wrong := [d for d in listed if not isinstance(d, KnownDevice) or d.backend != backend.name]:
            said = ", ".join(f"{d.name!r} (backend {d.backend!r})" if isinstance(d, KnownDevice) else
                             f"a {type(d).__name__}" for d in wrong)
            warn(f"the {backend.name} backend's catalogue() lists {said}: expected KnownDevice entries whose backend "
                 f"is {backend.name!r} (the backend that describes them); left out of the device catalogue. Fix: "
                 f"{AT_FAULT}")
            listed = [d for d in listed if d not in wrong]
        taken = {form for device in entries for alias in (device.name, *device.aliases) for form in _forms(alias)}
        entries += [device for device in listed if not taken & set(_forms(device.name))]
    return tuple(entries)


def _forms(name: str) -> tuple[str, str]:
    """The forms a name is found by: `canonical`, and that without its dashes."""
    return canonical(name), canonical(name).replace("-", "")


def canonical(name: str) -> str:
    """``"NVIDIA H100_80GB"`` -> ``"nvidia-h100-80gb"``: lower case, spaces and underscores as dashes.

    Args:
        name: A device name or alias, in any case.

    Returns:
        The name stripped and in lower case, each run of spaces and underscores one dash.
    """
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def known_devices(registry: BackendRegistry | None = None) -> tuple[str, ...]:
    """The catalogue's device names, for ``plan_for(device=...)``.

    Args:
        registry: The backends whose catalogues count (default: the installed ones).

    Returns:
        The names, the highest-priority backend's first.
    """
    return tuple(d.name for d in catalogue(registry))


def find_device(name: str, registry: BackendRegistry | None = None) -> KnownDevice:
    """The catalogue entry for ``name`` (a name or an alias, any case).

    Args:
        name: A device name or alias (``"h100"``, ``"a100-80gb"``, ``"spr"``).
        registry: The backends whose catalogues count (default: the installed ones).

    Returns:
        The entry.

    Raises:
        AmpConfigError: ``name`` is not a catalogue name; the message lists the known ones.
    """
    entries = catalogue(registry)
    names = ", ".join(d.name for d in entries)
    if not isinstance(name, str) or not name.strip():
        raise AmpConfigError(f"device must be a device name such as 'h100'. Received: {name!r}. "
                             f"Known devices: {names}.")
    index: dict[str, KnownDevice] = {}  # every name and alias, with and without its dashes: the first entry's
    for device in entries:
        for alias in (device.name, *device.aliases):
            for form in _forms(alias):
                index.setdefault(form, device)
    found = next((index[form] for form in _forms(name) if form in index), None)
    if found is None:
        raise AmpConfigError(
            f"Unknown device {name!r}. Expected one of the known devices: {names} "
            f"(aliases such as 'a100-80gb' or 'spr' work too; case does not matter). Fix: choose one of those, or "
            f"build a Hardware from amp_backends.hardware for another machine.")
    return found


def device_hardware(device: KnownDevice | str, registry: BackendRegistry | None = None) -> Hardware:
    """The `Hardware` the probes would report for a catalogue device.

    Args:
        device: A catalogue entry, or its name or alias.
        registry: The backends to describe it with (default: the installed ones).

    Returns:
        A machine with the device alone (the other backends not available).

    Raises:
        AmpConfigError: ``device`` is a name the catalogue does not know.
        BackendError: Its backend's ``describe`` raised or gave no valid probe.
    """
    registry = registry_or_default(registry)
    if not isinstance(device, KnownDevice):  # a name, or anything else: find_device says what it expects
        device = find_device(device, registry)
    owner = registry.get(device.backend)
    types = {"CPU"} | ({owner.tf_device_type} if owner.tf_device_type else set())
    probe = checked_probe(call_backend(owner, "describe", BackendProbe, "a BackendProbe of the device", device,
                                       fix=AT_FAULT), owner, "describe", fix=AT_FAULT)
    return machine_of([device.cite(probe)], registry.names(),
                      lambda backend: f"not part of the catalogue's {device.name} machine", frozenset(types))


def machine_of(probes: Iterable[BackendProbe], backends: Iterable[str], absent: Callable[[str], str],
               tf_device_types: frozenset[str] | None = None) -> Hardware:
    """A described machine (a catalogue device's, the tests' fakes).

    Args:
        probes: The probes of the backends present, in their order.
        backends: Every backend's name, highest priority first (``registry.names()``).
        absent: The reason an absent backend gives, from its name.
        tf_device_types: The device types TensorFlow would list there (``None``: TensorFlow not consulted).

    Returns:
        The machine: the given probes, then every other backend, not available there.
    """
    present = tuple(probes)
    given = {p.backend for p in present}
    missing = tuple(BackendProbe(name, False, absent(name)) for name in backends if name not in given)
    return Hardware(present + missing, tf_device_types=tf_device_types)


__all__ = ["GB", "DeviceFact", "KnownDevice", "catalogue", "canonical", "device_hardware", "find_device",
           "known_devices", "machine_of"]


def __getattr__(name: str) -> Any:
    if name == "CATALOGUE":  # the installed backends' entries, as a constant read them
        return catalogue()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
