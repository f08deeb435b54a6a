"""What NVML says about the GPUs, and which of them a CUDA program sees, in which order.

NVML lists GPUs in its own order; CUDA numbers them by ``CUDA_DEVICE_ORDER`` and keeps those
``CUDA_VISIBLE_DEVICES`` names (`visible_gpus`). nvidia-ml-py reports every failure to load NVML as "NVML Shared
Library Not Found"; `nvml_start_failure` asks the dynamic loader what really happened.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

FASTEST_FIRST = "FASTEST_FIRST"
PCI_BUS_ID = "PCI_BUS_ID"
NVML_LIBRARY = "nvml.dll" if sys.platform.startswith("win") else "libnvidia-ml.so.1"


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU as NVML lists it (in NVML's index order), with what CUDA's enumeration order depends on."""

    nvml_index: int
    name: str
    uuid: str
    pci_bus_id: str | None = None
    compute_capability: tuple[int, int] | None = None
    memory_bytes: int | None = None
    cores: int | None = None  # CUDA cores (SM count x cores per SM)
    max_sm_clock_mhz: int | None = None


def device_order(value: str | None) -> str:
    """The order ``CUDA_DEVICE_ORDER`` selects: ``PCI_BUS_ID`` if it says so, else CUDA's default ``FASTEST_FIRST``."""
    return PCI_BUS_ID if (value or "").strip().upper() == PCI_BUS_ID else FASTEST_FIRST


def _pci_key(bus_id: str | None) -> tuple[int, ...]:
    """``"00000000:3B:00.0"`` -> numbers to sort by (domain, bus, device, function); unknown ids sort last."""
    if not bus_id:
        return (1 << 62,)
    parts = bus_id.replace(".", ":").split(":")
    try:
        return tuple(int(p, 16) for p in parts)
    except ValueError:
        return (1 << 62,)


def cuda_enumeration(gpus: Sequence[NvmlGpu], order: str = FASTEST_FIRST) -> list[NvmlGpu]:
    """The GPUs in CUDA's enumeration order: the order ``CUDA_VISIBLE_DEVICES`` indices and TensorFlow's
    ``/GPU:<n>`` follow.

    ``PCI_BUS_ID``: ascending PCI bus id. ``FASTEST_FIRST``, CUDA's default, is documented only as "from fastest
    to slowest using a simple heuristic"; we follow the one NVIDIA's samples use: the higher compute capability
    first, then CUDA cores x maximum SM clock (0 where NVML cannot tell), ties broken by PCI bus id.
    """
    by_pci = sorted(gpus, key=lambda g: (_pci_key(g.pci_bus_id), g.nvml_index))
    if order == PCI_BUS_ID:
        return by_pci

    def speed(g: NvmlGpu) -> tuple[tuple[int, int], int]:
        return (g.compute_capability or (0, 0), (g.cores or 0) * (g.max_sm_clock_mhz or 0))

    return sorted(by_pci, key=speed, reverse=True)  # stable: equal speeds keep PCI order


def parse_visible_devices(value: str | None, count: int, uuids: list[str] | None = None) -> list[int]:
    """Positions (in CUDA's enumeration order) that ``CUDA_VISIBLE_DEVICES`` leaves visible, in its order.

    Unset: all. CUDA stops at the first invalid entry; ``""`` or ``-1`` hides every GPU. Entries may be
    indices into CUDA's enumeration order or (prefixes of) UUIDs such as ``GPU-8d2f...``.
    """
    if value is None:
        return list(range(count))
    visible: list[int] = []
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            break
        if item.lstrip("-").isdigit():
            idx = int(item)
            if idx < 0 or idx >= count:
                break
        else:
            matches = [i for i, u in enumerate(uuids or []) if u.startswith(item) or u.startswith("GPU-" + item)]
            if len(matches) != 1:
                break
            idx = matches[0]
        if idx in visible:
            break
        visible.append(idx)
    return visible


def visible_gpus(gpus: Sequence[NvmlGpu], environ: Mapping[str, str]) -> tuple[list[NvmlGpu], str]:
    """The GPUs a CUDA program sees under ``environ`` (``CUDA_DEVICE_ORDER``, ``CUDA_VISIBLE_DEVICES``), in
    its device order (index 0 is TensorFlow's ``/GPU:0``), and the order used."""
    order = device_order(environ.get("CUDA_DEVICE_ORDER"))
    enumerated = cuda_enumeration(gpus, order)
    positions = parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"), len(enumerated),
                                      [g.uuid for g in enumerated])
    return [enumerated[i] for i in positions], order


# ---------------------------------------------------------------------------------------------- NVML
def as_text(value: Any) -> str:
    """A value NVML returned, as text: bytes decoded, anything else through ``str``.

    Args:
        value: What NVML returned (a string or bytes), or an NVML exception (its message).

    Returns:
        ``value`` decoded where it is bytes, else ``str(value)``.
    """
    return value.decode() if isinstance(value, bytes) else str(value)


def library_load_error(library: str = NVML_LIBRARY, load: Callable[[str], Any] = ctypes.CDLL) -> str | None:
    """Why the dynamic loader cannot load ``library`` (its own message), or ``None`` if it loads."""
    try:
        load(library)
    except OSError as exc:
        return str(exc)
    return None


def explain_library_failure(load_error: str | None, library: str = NVML_LIBRARY) -> str:
    """nvidia-ml-py reports every failure to load the NVML library as "NVML Shared Library Not Found": tell a
    missing library (no NVIDIA driver) from one that exists but cannot be loaded (broken or mismatched)."""
    if load_error is None:
        return f"nvidia-ml-py could not load {library}, although it loads now (retry)"
    if "No such file" in load_error or "not found" in load_error.lower() or "could not find" in load_error.lower():
        return f"{library} not found: no NVIDIA driver is installed"
    return (f"{library} was found but cannot be loaded ({load_error}): the NVIDIA driver's library is broken or "
            f"built for another platform; reinstall the driver")


def nvml_start_failure(pynvml: Any, exc: Exception) -> str:
    """What went wrong when ``pynvml.nvmlInit()`` raised ``exc``, in words."""
    if getattr(exc, "value", None) == getattr(pynvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
        return explain_library_failure(library_load_error())
    return as_text(exc) or type(exc).__name__


def optional(call: Callable[[], Any]) -> Any:
    """Run an NVML query that an older driver may lack.

    Args:
        call: The query, without arguments.

    Returns:
        Its result, or ``None`` where it raised.
    """
    try:
        return call()
    except Exception:  # older drivers lack some queries; the order heuristic counts them as unknown
        return None


def read_nvml_gpus(pynvml: Any) -> list[NvmlGpu]:
    """Every GPU NVML lists, in NVML's order, with name, UUID, PCI bus id, CC, memory, cores and clock."""
    return [_read_nvml_gpu(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]


def _read_nvml_gpu(pynvml: Any, i: int) -> NvmlGpu:
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    pci = optional(lambda: pynvml.nvmlDeviceGetPciInfo(h))
    clock_type = getattr(pynvml, "NVML_CLOCK_SM", 1)
    return NvmlGpu(nvml_index=i, name=as_text(pynvml.nvmlDeviceGetName(h)), uuid=as_text(pynvml.nvmlDeviceGetUUID(h)),
                   pci_bus_id=as_text(pci.busId) if pci is not None else None,
                   compute_capability=tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
                   memory_bytes=optional(lambda: int(pynvml.nvmlDeviceGetMemoryInfo(h).total)),
                   cores=optional(lambda: int(pynvml.nvmlDeviceGetNumGpuCores(h))),
                   max_sm_clock_mhz=optional(lambda: int(pynvml.nvmlDeviceGetMaxClockInfo(h, clock_type))))
