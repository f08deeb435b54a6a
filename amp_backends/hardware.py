"""Plain data describing what a machine can do: the probes fill these frozen dataclasses and the planner decides
from them alone, so every rule can be exercised with fake hardware."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, is_dataclass, replace
from typing import Any

from .errors import AmpConfigError, warn
from .microarch import microarchitecture

# Capability names used in ``Accelerator.capabilities`` and ``CpuInfo`` derivations.
TENSOR_CORES = "tensor_cores"
FP16 = "fp16"
BF16 = "bf16"
TF32 = "tf32"
FP8 = "fp8"
XMX = "xmx"


@dataclass(frozen=True)
class DeviceFact:
    """One fact a vendor's backend states about a device, in the vendor's terms (NVIDIA's compute capability): only
    that backend reads it (``device.fact(key)``); the core only shows it and tells devices apart by it.

    Attributes:
        key: What the fact is, as the backend names it (``"compute_capability"``).
        value: Its value as text (``"9.0"``).
        text: How people read it beside the device's name (``"CC 9.0"``).
    """

    key: str
    value: str
    text: str


# The report's JSON (schema version 2, the "accelerator" definition) writes these facts as keys of each device's
# own, null where the device has no such fact; a backend's other facts stay out of the JSON.
SCHEMA_FACT_KEYS = ("compute_capability",)


class _Facts:
    """What the generic device types say of their backend's facts (`DeviceFact`), and how they take them."""

    facts: tuple[DeviceFact, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "facts", _given_facts(self.facts, type(self).__name__))

    def fact(self, key: str) -> str | None:
        """The value of the backend's fact ``key`` (``"9.0"``), or ``None`` where it states no such fact.

        Args:
            key: The fact's key (``"compute_capability"``).
        """
        return next((f.value for f in self.facts if f.key == key), None)

    @property
    def description(self) -> str:
        """The facts as people read them (``"CC 9.0"``; ``""`` without facts)."""
        return "; ".join(f.text for f in self.facts)

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """Deprecated: the NVIDIA backend's ``compute_capability(device)`` reads it from the facts."""
        warn(f"{type(self).__name__}.compute_capability is deprecated: the compute capability is one of the "
             "NVIDIA backend's device facts; read it with amp_backends.backends.nvidia.compute_capability("
             "device)", DeprecationWarning)
        value = self.fact(SCHEMA_FACT_KEYS[0])
        return (int(value.split(".")[0]), int(value.split(".")[1])) if value else None


def _given_facts(value: Any, owner: str) -> tuple[DeviceFact, ...]:
    """The facts a device was built with; a compute capability (or ``None``) given where the facts now go, as
    before they were facts, is turned into the NVIDIA fact with a `DeprecationWarning`."""
    if isinstance(value, (tuple, list)) and all(isinstance(f, DeviceFact) for f in value):
        return tuple(value)
    if value is not None and not (isinstance(value, tuple) and len(value) == 2
                                  and all(isinstance(n, int) for n in value)):
        raise AmpConfigError(f"{owner}'s facts must be a tuple of DeviceFact. Received: {value!r}. Fix: state the "
                             "vendor's facts as DeviceFact(key, value, text) values (an NVIDIA GPU's compute "
                             "capability: capability_facts(cc) of amp_backends.backends.nvidia).")
    warn(f"{owner}(): the argument after the {'kind' if owner == 'Accelerator' else 'device name'} is the "
         f"device's facts (a tuple of DeviceFact), not its compute capability ({value!r}); build NVIDIA "
         "devices with the NVIDIA backend's capability_facts(cc)", DeprecationWarning)
    if value is None:
        return ()
    major, minor = value
    return (DeviceFact(SCHEMA_FACT_KEYS[0], f"{major}.{minor}", f"CC {major}.{minor}"),)


@dataclass(frozen=True)
class Accelerator(_Facts):
    """One device a backend plans for — a GPU, an XPU or the host CPU —, as its probe saw it.

    Attributes:
        vendor: The name of the backend that probed it (``"nvidia"``, ``"intel"``, ``"cpu"``, or a third party's).
        index: TensorFlow's index of the device (``/GPU:<index>``: CUDA's order, not NVML's).
        name: The device's name (``"NVIDIA H200"``).
        kind: TensorFlow's device type (``"GPU"``, ``"XPU"``, ``"CPU"``).
        facts: The backend's own facts about it (`DeviceFact`), such as NVIDIA's compute capability.
        memory_bytes: Its memory, where the probe read it.
        capabilities: What the planner reads (``"tensor_cores"``, ``"bf16"``, ...): native, fast support, not mere
            correctness.
        pci_bus_id: Its PCI bus id, where the probe read it.
    """

    vendor: str
    index: int
    name: str
    kind: str = "GPU"
    facts: tuple[DeviceFact, ...] = ()
    memory_bytes: int | None = None
    capabilities: frozenset[str] = frozenset()
    pci_bus_id: str | None = None

    @property
    def tf_name(self) -> str:
        """The TensorFlow device name, such as ``/GPU:0``."""
        return f"/{self.kind}:{self.index}"

    def has(self, capability: str) -> bool:
        """Whether the device has a capability.

        Args:
            capability: A capability tag (`BF16`, `TENSOR_CORES`, ...).

        Returns:
            True where the probe found it.
        """
        return capability in self.capabilities

    @property
    def label(self) -> str:
        """The device for people: its name, and its facts where it has any (``"NVIDIA H200 (CC 9.0)"``)."""
        return f"{self.name} ({self.description})" if self.facts else self.name

    @property
    def signature(self) -> str:
        """The device in a cache key: its name and its facts' values (``"NVIDIA H200/9.0"``; ``"<name>/-"``
        without facts)."""
        return f"{self.name}/{'/'.join(f.value for f in self.facts) or '-'}"

    @property
    def cc_str(self) -> str:
        """Deprecated: the compute capability as text (``"9.0"``, ``"-"`` where unknown); ``device.fact(key)``."""
        warn("Accelerator.cc_str is deprecated: the compute capability is one of the NVIDIA backend's "
             "device facts; read it with device.fact('compute_capability')", DeprecationWarning)
        return self.fact(SCHEMA_FACT_KEYS[0]) or "-"

    def to_dict(self) -> dict[str, Any]:
        """The Accelerator as JSON-ready data."""
        return {"vendor": self.vendor, "index": self.index, "name": self.name, "kind": self.kind,
                **{key: self.fact(key) for key in SCHEMA_FACT_KEYS}, "memory_bytes": self.memory_bytes,
                "capabilities": sorted(self.capabilities), "pci_bus_id": self.pci_bus_id}


@dataclass(frozen=True)
class CpuInfo:
    """The host CPU, from which `microarchitecture` and `name` are read.

    Attributes:
        vendor: The vendor as the OS names it (``"AMD"``, ``"Intel"``, an Arm implementer's name; ``"unknown"``).
        model: The model name as the OS reports it (``"AMD EPYC 9B45"``).
        arch: The machine architecture (``"x86_64"``, ``"aarch64"``).
        logical_cores: The machine's logical cores (``/proc/cpuinfo``'s processors, else ``os.cpu_count()``).
        flags: The CPU's instruction-set flags (``/proc/cpuinfo``'s; those that matter here: ``"avx512_bf16"``,
            ``"amx_bf16"``...).
        family: CPUID's family (``None`` where unread).
        model_number: CPUID's model (``None`` where unread).
        stepping: CPUID's stepping (``None`` where unread).
    """

    vendor: str
    model: str
    arch: str
    logical_cores: int
    flags: frozenset[str] = frozenset()
    family: int | None = None
    model_number: int | None = None
    stepping: int | None = None

    @property
    def is_arm(self) -> bool:
        """Whether the CPU is an Arm one (aarch64)."""
        return self.arch.lower() in ("aarch64", "arm64")

    @property
    def native_bf16(self) -> bool:
        """bf16 arithmetic in hardware: AVX512_BF16 or AMX on x86, the BF16 extension on Arm."""
        if self.is_arm:
            return "bf16" in self.flags
        return bool(self.flags & {"avx512_bf16", "amx_bf16"})

    @property
    def native_fp16(self) -> bool:
        """float16 arithmetic in hardware: AVX512_FP16 or AMX-FP16 on x86, half-precision SIMD on Arm."""
        if self.is_arm:
            return bool(self.flags & {"fphp", "asimdhp"})
        return bool(self.flags & {"avx512_fp16", "amx_fp16"})

    @property
    def amx(self) -> bool:
        """Whether the CPU has AMX tiles for bfloat16."""
        return "amx_bf16" in self.flags

    @property
    def microarchitecture(self) -> str | None:
        """``"Zen 5"``, ``"Sapphire Rapids"``: named from the vendor, family and model (``None`` if unknown)."""
        return microarchitecture(self.vendor, self.family, self.model_number, self.stepping, self.flags)

    @property
    def name(self) -> str:
        """The CPU as reasons and results files name it: ``"AMD EPYC (Zen 5)"``, ``"Intel Xeon Platinum 8480+
        (Sapphire Rapids)"`` (trademark signs left out); where the microarchitecture is unknown, the family and
        model numbers stand in (``"AMD EPYC (family 26, model 200)"``)."""
        model = re.sub(r"\s*\((R|TM)\)", "", self.model, flags=re.IGNORECASE)  # "Intel(R) Xeon(R)" -> "Intel Xeon"
        base = model if self.vendor.lower() in model.lower() else f"{self.vendor} {model}"
        uarch = self.microarchitecture
        if uarch:
            return base if uarch.lower() in base.lower() else f"{base} ({uarch})"
        if self.family is not None and self.model_number is not None:
            return f"{base} (family {self.family}, model {self.model_number})"
        return base

    def to_dict(self) -> dict[str, Any]:
        """The CpuInfo as JSON-ready data."""
        return {"vendor": self.vendor, "model": self.model, "arch": self.arch, "logical_cores": self.logical_cores,
                "native_bf16": self.native_bf16, "native_fp16": self.native_fp16, "amx": self.amx,
                "family": self.family, "model_number": self.model_number, "stepping": self.stepping,
                "microarchitecture": self.microarchitecture, "flags": sorted(self.flags)}


@dataclass(frozen=True)
class BackendProbe:
    """What one backend found.

    Attributes:
        backend: The backend's name.
        available: Whether it can be used here.
        reason: Why (not), in words.
        devices: The devices it would plan for (`Accelerator`).
        cpu: The host CPU, where this backend read it (`CpuInfo`).
        details: ``(label, text)`` pairs for people, which no decision reads.
        facts: The backend's own record of what it found, which only its `assess` reads.
        needs_tensorflow: Whether the probe could not finish without TensorFlow (Intel XPUs).
        error: What the probe raised, where it did (the backend is broken, not merely without hardware).
    """

    backend: str
    available: bool
    reason: str
    devices: tuple[Accelerator, ...] = ()
    cpu: CpuInfo | None = None
    details: tuple[tuple[str, str], ...] = ()
    facts: Any = None
    needs_tensorflow: bool = False
    error: str | None = None

    def detail(self, key: str, default: str | None = None) -> str | None:
        """A detail of the probe.

        Args:
            key: The detail's label.
            default: What to return where the probe has no such detail.

        Returns:
            The detail's text, else ``default``.
        """
        return next((v for k, v in self.details if k == key), default)

    def to_dict(self) -> dict[str, Any]:
        """The BackendProbe as JSON-ready data."""
        return {"backend": self.backend, "available": self.available, "reason": self.reason,
                "devices": [d.to_dict() for d in self.devices], "details": dict(self.details),
                "facts": _plain(self.facts), "needs_tensorflow": self.needs_tensorflow, "error": self.error,
                "cpu": self.cpu.to_dict() if self.cpu else None}


def _plain(value: Any) -> Any:
    """A JSON-friendly copy of a backend's facts (dataclasses, tuples and sets included)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    return value


@dataclass(frozen=True)
class Hardware:
    """Everything the probes saw on one machine (or a fake one, in tests).

    Attributes:
        probes: Each backend's probe (`BackendProbe`).
        tf_device_types: The device types TensorFlow itself lists (``None``: not consulted), by which the plan
            notices a CPU-only TensorFlow on a machine with GPUs.
    """

    probes: tuple[BackendProbe, ...]
    tf_device_types: frozenset[str] | None = None

    def get(self, backend: str) -> BackendProbe | None:
        """One backend's probe of the machine.

        Args:
            backend: The backend's name.

        Returns:
            Its probe, or ``None`` if the machine has none of it.
        """
        return next((p for p in self.probes if p.backend == backend), None)

    @property
    def cpu(self) -> CpuInfo | None:
        """The host CPU, as the probe that read it saw it (``None`` if none did)."""
        return next((p.cpu for p in self.probes if p.cpu is not None), None)

    def to_dict(self) -> dict[str, Any]:
        """The Hardware as JSON-ready data."""
        return {"backends": [p.to_dict() for p in self.probes],
                "tensorflow_device_types": sorted(self.tf_device_types) if self.tf_device_types is not None else None}


# Vendors' "GB" of GPU memory are binary: NVML reported 81559 MiB (79.6 GiB) on an "H100 80GB HBM3".
GB = 2**30


@dataclass(frozen=True)
class KnownDevice(_Facts):
    """One entry of the device catalogue (`amp_backends.devices`): what its backend's probe would see
    (``Backend.describe``), and where the figures come from.

    Attributes:
        name: The name ``device=`` takes (``"h100"``).
        aliases: Other names it takes (``("h100-80gb", "h100-sxm")``).
        backend: The backend whose catalogue holds it, and which describes it.
        title: The device for people (``"NVIDIA H100 SXM5 80 GB HBM3"``).
        source: Where its figures come from (a datasheet, with its address).
        device_name: A GPU's or XPU's name as the driver reports it.
        facts: A GPU's or XPU's vendor facts (`DeviceFact`).
        memory_bytes: A GPU's or XPU's memory.
        cpu_vendor: A CPU's vendor.
        arch: A CPU's architecture.
        logical_cores: A CPU's logical cores (one socket).
        flags: A CPU's ``/proc/cpuinfo`` flags that matter, separated by spaces.
        note: What the entry leaves out or assumes, in words.
        family: A CPU's CPUID family, from which the probe names the microarchitecture.
        model_number: A CPU's CPUID model.
    """

    name: str
    aliases: tuple[str, ...]
    backend: str
    title: str
    source: str
    device_name: str = ""
    facts: tuple[DeviceFact, ...] = ()
    memory_bytes: int | None = None
    cpu_vendor: str = ""
    arch: str = "x86_64"
    logical_cores: int = 0
    flags: str = ""
    note: str = ""
    family: int | None = None
    model_number: int | None = None

    def to_dict(self) -> dict[str, object]:
        """The KnownDevice as JSON-ready data."""
        return {"name": self.name, "aliases": list(self.aliases), "backend": self.backend, "title": self.title,
                "source": self.source, "note": self.note}

    def cite(self, probe: BackendProbe) -> BackendProbe:
        """``probe`` as the catalogue's description of this device, naming where the figures come from.

        Args:
            probe: The probe its backend builds for the device (`Backend.describe`).

        Returns:
            The probe, its reason ending with ``[catalogue: <source>]`` and a ``catalogue`` detail holding the source.
        """
        return replace(probe, reason=f"{probe.reason} [catalogue: {self.source}]",
                       details=(*probe.details, ("catalogue", self.source)))
