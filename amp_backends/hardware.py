"""Plain data describing what a machine can do.

Probes (one per backend, in ``amp_backends.backends.<vendor>``) fill these frozen dataclasses; the
planner (`amp_backends.planner`) decides from them alone, so every rule can be exercised with fake
hardware built from these classes.
"""

from __future__ import annotations

import re

from dataclasses import asdict, dataclass, is_dataclass, replace
from typing import Any

from .microarch import microarchitecture

# Capability names used in ``Accelerator.capabilities`` and ``CpuInfo`` derivations.
TENSOR_CORES = "tensor_cores"
FP16 = "fp16"
BF16 = "bf16"
TF32 = "tf32"
FP8 = "fp8"
XMX = "xmx"


@dataclass(frozen=True)
class Accelerator:
    """One device a backend plans for — a GPU, an XPU or the host CPU —, as its probe saw it.

    ``index`` is TensorFlow's index (``/GPU:<index>``), which for NVIDIA GPUs follows CUDA's enumeration
    order, not NVML's. ``capabilities`` holds the derived facts the planner uses (``"tensor_cores"``,
    ``"fp16"``, ``"bf16"``, ``"tf32"``, ``"fp8"``, ``"xmx"``): native, fast support, not mere correctness.
    """

    vendor: str
    index: int
    name: str
    kind: str = "GPU"
    compute_capability: tuple[int, int] | None = None
    memory_bytes: int | None = None
    capabilities: frozenset[str] = frozenset()
    pci_bus_id: str | None = None

    @property
    def tf_name(self) -> str:
        """The TensorFlow device name, such as ``/GPU:0``."""
        return f"/{self.kind}:{self.index}"

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    @property
    def cc_str(self) -> str:
        cc = self.compute_capability
        return f"{cc[0]}.{cc[1]}" if cc else "-"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["compute_capability"] = self.cc_str if self.compute_capability else None
        d["capabilities"] = sorted(self.capabilities)
        return d


@dataclass(frozen=True)
class CpuInfo:
    """The host CPU: vendor, model and the instruction-set flags that matter for mixed precision.

    ``model`` is the model name (``"AMD EPYC"``); ``family``, ``model_number`` and ``stepping`` are CPUID's
    display family, model and stepping as ``/proc/cpuinfo`` gives them (``None`` where the probe cannot read
    them), from which `microarchitecture` is named.
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
        return self.arch.lower() in ("aarch64", "arm64")

    @property
    def native_bf16(self) -> bool:
        """bf16 arithmetic in hardware: AVX512_BF16 or AMX on x86, the BF16 extension on Arm."""
        if self.is_arm:
            return "bf16" in self.flags
        return bool(self.flags & {"avx512_bf16", "amx_bf16"})

    @property
    def native_fp16(self) -> bool:
        if self.is_arm:
            return bool(self.flags & {"fphp", "asimdhp"})
        return bool(self.flags & {"avx512_fp16", "amx_fp16"})

    @property
    def amx(self) -> bool:
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
        return {
            "vendor": self.vendor,
            "model": self.model,
            "arch": self.arch,
            "logical_cores": self.logical_cores,
            "native_bf16": self.native_bf16,
            "native_fp16": self.native_fp16,
            "amx": self.amx,
            "family": self.family,
            "model_number": self.model_number,
            "stepping": self.stepping,
            "microarchitecture": self.microarchitecture,
            "flags": sorted(self.flags),
        }


@dataclass(frozen=True)
class BackendProbe:
    """What one backend found: whether it can be used, why (not), its devices, its facts and details.

    ``facts`` is the backend's own typed record of what it saw beyond devices (a frozen dataclass the
    backend defines, such as whether ITEX is loaded): its `assess`
    decides from it, the core never looks inside. ``details`` are ``(key, value)`` strings for people (the
    report); no decision reads them. ``needs_tensorflow`` says the probe could not finish without
    TensorFlow (Intel XPUs are listed through it), so a caller that skipped TensorFlow should probe again
    with it. ``error`` is set (by `probe_hardware`) when the probe itself raised:
    the backend is broken, not merely without hardware.
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
        for k, v in self.details:
            if k == key:
                return v
        return default

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "available": self.available,
            "reason": self.reason,
            "devices": [d.to_dict() for d in self.devices],
            "details": dict(self.details),
            "facts": _plain(self.facts),
            "needs_tensorflow": self.needs_tensorflow,
            "error": self.error,
            "cpu": self.cpu.to_dict() if self.cpu else None,
        }


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

    ``tf_device_types`` is the set of device types TensorFlow itself lists (``{"CPU", "GPU"}``), or
    ``None`` when TensorFlow was not consulted. It lets the plan notice, for example, a CPU-only
    TensorFlow build on a machine whose driver reports GPUs.
    """

    probes: tuple[BackendProbe, ...]
    tf_device_types: frozenset[str] | None = None

    def get(self, backend: str) -> BackendProbe | None:
        for p in self.probes:
            if p.backend == backend:
                return p
        return None

    @property
    def cpu(self) -> CpuInfo | None:
        for p in self.probes:
            if p.cpu is not None:
                return p.cpu
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "backends": [p.to_dict() for p in self.probes],
            "tensorflow_device_types": sorted(self.tf_device_types) if self.tf_device_types is not None else None,
        }


# Vendors' "GB" of GPU memory are binary: NVML reported 81559 MiB (79.6 GiB) on an "H100 80GB HBM3".
GB = 2**30


@dataclass(frozen=True)
class KnownDevice:
    """One entry of the device catalogue (`amp_backends.devices`): what its backend's probe would see, and
    where the figures come from. Its backend lists it (``Backend.catalogue``) and describes it
    (``Backend.describe``)."""

    name: str
    aliases: tuple[str, ...]
    backend: str  # the backend whose catalogue holds it, and which describes it
    title: str
    source: str
    # GPUs and XPUs: the name as the driver reports it, compute capability (NVIDIA), memory in bytes
    device_name: str = ""
    compute_capability: tuple[int, int] | None = None
    memory_bytes: int | None = None
    # CPUs: vendor, architecture, logical cores of one socket, /proc/cpuinfo flags that matter
    cpu_vendor: str = ""
    arch: str = "x86_64"
    logical_cores: int = 0
    flags: str = ""
    note: str = ""
    family: int | None = None  # CPUID's family and model, from which the probe names the microarchitecture
    model_number: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "aliases": list(self.aliases), "backend": self.backend, "title": self.title,
                "source": self.source, "note": self.note}

    def cite(self, probe: BackendProbe) -> BackendProbe:
        """``probe`` as the catalogue's description of this device: it names where the figures come from.

        Args:
            probe: The probe its backend builds for the device (`Backend.describe`).

        Returns:
            The probe, its reason ending with ``[catalogue: <source>]`` and a ``catalogue`` detail holding the source.
        """
        return replace(probe, reason=f"{probe.reason} [catalogue: {self.source}]",
                       details=(*probe.details, ("catalogue", self.source)))
