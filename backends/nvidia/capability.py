"""NVIDIA's compute capability (CC), kept as one of the backend's device facts (`capability_facts`, read back
with `compute_capability`): the report's JSON writes ``"compute_capability": "9.0"``, people read ``CC 9.0``.
"""

from __future__ import annotations

from amp_backends.backend_api import Accelerator, DeviceFact, KnownDevice

COMPUTE_CAPABILITY = "compute_capability"


def cc_label(cc: str) -> str:
    """A compute capability (``"9.0"``) as the reasons and reports name it.

    Args:
        cc: The compute capability as text.

    Returns:
        ``"CC 9.0"``.
    """
    return f"CC {cc}"


def capability_facts(cc: tuple[int, int] | None) -> tuple[DeviceFact, ...]:
    """The device facts that state an NVIDIA GPU's compute capability.

    Args:
        cc: The compute capability (``(9, 0)``), or ``None`` where unknown.

    Returns:
        ``compute_capability`` (``"9.0"``, read ``"CC 9.0"``), or no fact where unknown.
    """
    if cc is None:
        return ()
    value = f"{cc[0]}.{cc[1]}"
    return (DeviceFact(COMPUTE_CAPABILITY, value, cc_label(value)),)


def compute_capability(device: Accelerator | KnownDevice) -> tuple[int, int] | None:
    """The compute capability the NVIDIA backend stated for a device or catalogue entry.

    Args:
        device: A device of the NVIDIA probe, or an entry of its catalogue.

    Returns:
        ``(major, minor)``, such as ``(9, 0)``, or ``None`` where unknown.
    """
    value = device.fact(COMPUTE_CAPABILITY)
    if value is None:
        return None
    major, minor = value.split(".")
    return int(major), int(minor)


def cc_text(device: Accelerator | KnownDevice) -> str:
    """The compute capability as the reasons and reports write it after ``CC``.

    Args:
        device: A device of the NVIDIA probe, or an entry of its catalogue.

    Returns:
        ``"9.0"``, or ``"-"`` where unknown.
    """
    return device.fact(COMPUTE_CAPABILITY) or "-"
