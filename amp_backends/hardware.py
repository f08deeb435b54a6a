"""Plain data describing what a machine can do.

Probes (one per backend, in ``amp_backends.backends.<vendor>``) fill these frozen dataclasses; the
planner (:mod:`amp_backends.plan`) decides from them alone, so every rule can be exercised with fake
hardware built from these classes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

# Capability names used in ``Accelerator.capabilities`` and ``CpuInfo`` derivations.
TENSOR_CORES = "tensor_cores"
FP16 = "fp16"
BF16 = "bf16"
TF32 = "tf32"
FP8 = "fp8"
XMX = "xmx"


@dataclass(frozen=True)
class Accelerator:
    """One GPU or XPU, as a probe saw it.

    ``capabilities`` holds the derived facts the planner uses (``"tensor_cores"``, ``"fp16"``,
    ``"bf16"``, ``"tf32"``, ``"fp8"``, ``"xmx"``): native, fast support, not mere correctness.
    """

    vendor: str
    index: int
    name: str
    kind: str = "GPU"
    compute_capability: tuple[int, int] | None = None
    memory_bytes: int | None = None
    capabilities: frozenset[str] = frozenset()

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
    """The host CPU: vendor, model and the instruction-set flags that matter for mixed precision."""

    vendor: str
    model: str
    arch: str
    logical_cores: int
    flags: frozenset[str] = frozenset()

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "vendor": self.vendor,
            "model": self.model,
            "arch": self.arch,
            "logical_cores": self.logical_cores,
            "flags": sorted(self.flags),
            "native_bf16": self.native_bf16,
            "native_fp16": self.native_fp16,
            "amx": self.amx,
        }


@dataclass(frozen=True)
class BackendProbe:
    """What one backend found: whether it can be used, why (not), its devices and free-form details.

    ``details`` is a tuple of ``(key, value)`` pairs so the probe stays hashable and immutable; use
    :meth:`detail` to read one.
    """

    backend: str
    available: bool
    reason: str
    devices: tuple[Accelerator, ...] = ()
    cpu: CpuInfo | None = None
    details: tuple[tuple[str, str], ...] = ()

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
            "cpu": self.cpu.to_dict() if self.cpu else None,
            "details": dict(self.details),
        }


@dataclass(frozen=True)
class Hardware:
    """Everything the probes saw on one machine (or a fake one, in tests).

    ``tf_device_types`` is the set of device types TensorFlow itself lists (``{"CPU", "GPU"}``), or
    ``None`` when TensorFlow was not consulted. It lets the plan notice, for example, a CPU-only
    TensorFlow build on a machine whose driver reports GPUs.
    """

    probes: tuple[BackendProbe, ...]
    tf_device_types: frozenset[str] | None = None
    extra: Mapping[str, str] = field(default_factory=dict)

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
