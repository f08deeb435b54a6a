"""A catalogue of known devices, to plan for hardware this machine does not have.

Each entry describes one device as its probe would see it — the same :class:`~amp_backends.hardware.Hardware`,
:class:`~amp_backends.hardware.BackendProbe` and :class:`~amp_backends.hardware.Accelerator` objects the real
probes fill — with where its figures come from (the vendor's datasheet or specification page for the
name, compute capability, memory and instruction sets). ``plan_for(device="h100")`` plans for it::

    >>> import amp_backends
    >>> amp_backends.known_devices()          # the names, such as "h100", "a100", "sapphire-rapids"
    >>> print(amp_backends.plan_for(device="h100"))

Names are case-insensitive; spaces, dashes and underscores are interchangeable, and each device has aliases
("a100-80gb", "nvidia h100", "spr"). A described machine is the device alone, with TensorFlow's usual
software on it (TensorFlow 2.21 for NVIDIA GPUs and CPUs, TensorFlow 2.15 with ITEX 2.15 for Intel GPUs,
``TF_ENABLE_ONEDNN_OPTS`` unset): the plan is what ``auto_configure()`` would choose there.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .errors import AmpConfigError
from .hardware import Accelerator, BackendProbe, CpuInfo, Hardware

# Vendors' "GB" of GPU memory are binary: NVML reported 81559 MiB (79.6 GiB) on an "H100 80GB HBM3".
GB = 2**30

CUDA_GPUS = "NVIDIA, CUDA GPU compute capability list, https://developer.nvidia.com/cuda-gpus"


@dataclass(frozen=True)
class KnownDevice:
    """One catalogue entry: what the probe would see, and where the figures come from."""

    name: str
    aliases: tuple[str, ...]
    backend: str  # "nvidia", "intel" or "cpu"
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

    def hardware(self) -> Hardware:
        """The machine as the probes would describe it: this device alone, TensorFlow's usual software."""
        return device_hardware(self)

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "aliases": list(self.aliases), "backend": self.backend, "title": self.title,
                "source": self.source, "note": self.note}


def _nvidia(name: str, aliases: tuple[str, ...], title: str, device_name: str, cc: tuple[int, int], memory_gb: float,
            source: str, note: str = "") -> KnownDevice:
    return KnownDevice(name, aliases, "nvidia", title, f"{source}; compute capability: {CUDA_GPUS}", device_name, cc,
                       int(memory_gb * GB), note=note)


def _intel(name: str, aliases: tuple[str, ...], title: str, device_name: str, memory_gb: float,
           source: str) -> KnownDevice:
    return KnownDevice(name, aliases, "intel", title, source, device_name, None, int(memory_gb * GB),
                       note="planned through ITEX 2.15 (end-of-life; TensorFlow 2.15, Keras 2)")


def _cpu(name: str, aliases: tuple[str, ...], title: str, vendor: str, model: str, arch: str, cores: int, flags: str,
         source: str, note: str = "", cpuid: tuple[int, int] | None = None) -> KnownDevice:
    return KnownDevice(name, aliases, "cpu", title, source, model, cpu_vendor=vendor, arch=arch, logical_cores=cores,
                       flags=flags, note=note, family=cpuid[0] if cpuid else None,
                       model_number=cpuid[1] if cpuid else None)


CATALOGUE: tuple[KnownDevice, ...] = (
    _nvidia("v100", ("tesla-v100", "v100-32gb", "v100-sxm2"), "NVIDIA Tesla V100 SXM2 32 GB", "Tesla V100-SXM2-32GB",
            (7, 0), 32, "NVIDIA Tesla V100 datasheet, https://www.nvidia.com/en-us/data-center/v100/"),
    _nvidia("t4", ("tesla-t4",), "NVIDIA T4 16 GB", "Tesla T4", (7, 5), 16,
            "NVIDIA T4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/tesla-t4/"),
    _nvidia("a100", ("a100-80gb", "a100-sxm4-80gb", "a100-sxm"), "NVIDIA A100 SXM4 80 GB", "NVIDIA A100-SXM4-80GB",
            (8, 0), 80, "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/a100/"),
    _nvidia("a100-40gb", ("a100-sxm4-40gb",), "NVIDIA A100 SXM4 40 GB", "NVIDIA A100-SXM4-40GB", (8, 0), 40,
            "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/a100/"),
    _nvidia("l4", ("nvidia-l4",), "NVIDIA L4 24 GB", "NVIDIA L4", (8, 9), 24,
            "NVIDIA L4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/l4/"),
    _nvidia("rtx4090", ("rtx-4090", "geforce-rtx-4090", "4090"), "NVIDIA GeForce RTX 4090 24 GB",
            "NVIDIA GeForce RTX 4090", (8, 9), 24,
            "NVIDIA GeForce RTX 4090 specifications, https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4090/"),
    _nvidia("h100", ("h100-80gb", "h100-sxm", "h100-sxm5", "nvidia-h100"), "NVIDIA H100 SXM5 80 GB HBM3",
            "NVIDIA H100 80GB HBM3", (9, 0), 80,
            "NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/ "
            "(name and CC as NVML reported them on an H100 80GB HBM3)"),
    _nvidia("h200", ("h200-141gb", "h200-sxm", "nvidia-h200"), "NVIDIA H200 SXM 141 GB HBM3e", "NVIDIA H200",
            (9, 0), 141,
            "NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/"),
    _nvidia("b200", ("hgx-b200", "nvidia-b200"), "NVIDIA B200 (HGX B200) 180 GB HBM3e", "NVIDIA B200", (10, 0), 180,
            "NVIDIA HGX B200 datasheet (180 GB per GPU), https://www.nvidia.com/en-us/data-center/hgx/",
            note="TensorFlow 2.21's CUDA 12 wheels may need to JIT-compile their kernels for CC 10.0 at first use"),
    _intel("max1550", ("max-1550", "data-center-gpu-max-1550", "ponte-vecchio", "pvc"),
           "Intel Data Center GPU Max 1550 128 GB HBM2e", "Intel(R) Data Center GPU Max 1550", 128,
           "Intel Data Center GPU Max 1550 product specifications, https://ark.intel.com (Xe-HPC, XMX with TF32)"),
    _intel("flex170", ("flex-170", "data-center-gpu-flex-170"), "Intel Data Center GPU Flex 170 16 GB",
           "Intel(R) Data Center GPU Flex 170", 16,
           "Intel Data Center GPU Flex 170 product specifications, https://ark.intel.com (Xe-HPG, XMX)"),
    _intel("arc-a770", ("a770", "arc-a770-16gb"), "Intel Arc A770 Graphics 16 GB", "Intel(R) Arc(TM) A770 Graphics", 16,
           "Intel Arc A770 Graphics (16GB) product specifications, https://ark.intel.com (Xe-HPG, XMX)"),
    _cpu("sapphire-rapids", ("spr", "xeon-8480", "xeon-platinum-8480+", "xeon-8480+"),
         "Intel Xeon Platinum 8480+ (Sapphire Rapids), one socket", "Intel", "Intel(R) Xeon(R) Platinum 8480+",
         "x86_64", 112,
         "avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8",
         "Intel Xeon Platinum 8480+ product specifications, https://ark.intel.com (56 cores, 112 threads; AMX, "
         "AVX-512 with BF16 and FP16: Intel Architecture Instruction Set Extensions Programming Reference); "
         "family 6 model 0x8F: Linux's intel-family.h", cpuid=(6, 0x8F)),
    _cpu("zen1", ("amd-zen1", "epyc-zen1", "naples", "epyc-7001"),
         "AMD EPYC 7001 (Zen 1): AVX2, no AVX-512, no bf16 instructions, 2 logical cores",
         "AMD", "AMD EPYC", "x86_64", 2, "avx2 fma f16c",
         "AMD EPYC 7001 Series (Zen 1) product brief, https://www.amd.com/en/products/processors/server/epyc/"
         "7001-series.html; flags as /proc/cpuinfo lists them on the project's Zen 1 machines; family 0x17 model "
         "0x01: Linux's arch/x86/kernel/cpu/amd.c", cpuid=(0x17, 0x01)),
    _cpu("zen3", ("amd-zen3", "epyc-zen3", "milan", "epyc-7003"),
         "AMD EPYC 7003 (Zen 3): AVX2, no AVX-512, no bf16 instructions, 2 logical cores",
         "AMD", "AMD EPYC", "x86_64", 2, "avx2 fma f16c",
         "AMD EPYC 7003 Series (Zen 3) product brief, https://www.amd.com/en/products/processors/server/epyc/"
         "7003-series.html; flags as /proc/cpuinfo lists them on the project's Zen 3 machine; family 0x19 model "
         "0x01: Linux's arch/x86/kernel/cpu/amd.c", cpuid=(0x19, 0x01)),
    _cpu("zen4", ("amd-zen4", "epyc-zen4", "genoa", "epyc-9004"),
         "AMD EPYC 9004 (Zen 4), 2 logical cores as measured here", "AMD", "AMD EPYC", "x86_64", 2,
         "avx2 fma avx512f avx512bw avx512vl avx_vnni avx512_vnni avx512_bf16",
         "AMD EPYC 9004 Series (Zen 4) product brief, https://www.amd.com/en/products/processors/server/epyc/"
         "4th-generation-9004-and-8004-series.html; "
         "flags as /proc/cpuinfo lists them on the project's AVX512-BF16 machine; family 0x19 model 0x11: AMD's "
         "Processor Programming Reference for Family 19h Model 11h (EPYC 9004)", cpuid=(0x19, 0x11)),
    _cpu("zen5", ("amd-zen5", "epyc-zen5", "turin", "epyc-9005"),
         "AMD EPYC 9005 (Zen 5): AVX-512 with BF16, no AMX, 2 logical cores",
         "AMD", "AMD EPYC", "x86_64", 2,
         "avx2 fma f16c avx512f avx512bw avx512vl avx_vnni avx512_vnni avx512_bf16 avx512_vp2intersect",
         "AMD EPYC 9005 Series (Zen 5) product brief, https://www.amd.com/en/products/processors/server/epyc/"
         "9005-series.html; flags as /proc/cpuinfo lists them on the project's AVX512-BF16 machine; family 0x1A "
         "model 0x02: Linux's arch/x86/kernel/cpu/amd.c", cpuid=(0x1A, 0x02)),
    _cpu("graviton3", ("graviton-3", "aws-graviton3", "neoverse-v1", "c7g"),
         "AWS Graviton3 (Arm Neoverse V1), 64 cores", "ARM", "Neoverse-V1", "aarch64", 64,
         "fp asimd sve bf16 i8mm asimdhp fphp",
         "AWS Graviton3 (Neoverse V1, SVE, BF16, I8MM), https://aws.amazon.com/ec2/graviton/"),
)


def canonical(name: str) -> str:
    """``"NVIDIA H100_80GB"`` -> ``"nvidia-h100-80gb"``: lower case, spaces and underscores as dashes."""
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def _index() -> dict[str, KnownDevice]:
    index: dict[str, KnownDevice] = {}
    for device in CATALOGUE:
        for key in (device.name, *device.aliases):
            index[canonical(key)] = device
            index[canonical(key).replace("-", "")] = device
    return index


def known_devices() -> tuple[str, ...]:
    """The catalogue's device names, for ``plan_for(device=...)`` and ``--device``."""
    return tuple(d.name for d in CATALOGUE)


def find_device(name: str) -> KnownDevice:
    """The catalogue entry for ``name`` (a name or an alias, any case). An unknown name raises
    :class:`~amp_backends.errors.AmpConfigError` listing the known ones."""
    if not isinstance(name, str) or not name.strip():
        raise AmpConfigError(f"device must be a device name such as 'h100'. Received: {name!r}. "
                             f"Known devices: {', '.join(known_devices())}.")
    index = _index()
    key = canonical(name)
    device = index.get(key) or index.get(key.replace("-", ""))
    if device is None:
        raise AmpConfigError(
            f"Unknown device {name!r}. Expected one of the known devices: {', '.join(known_devices())} "
            f"(aliases such as 'a100-80gb' or 'spr' work too; case does not matter). Fix: choose one of those, or "
            f"build a Hardware from amp_backends.hardware for another machine.")
    return device


def device_hardware(device: KnownDevice | str) -> Hardware:
    """The :class:`Hardware` the probes would report for a catalogue device (a name or an entry)."""
    if isinstance(device, str):
        device = find_device(device)
    build, types = _PROBES[device.backend]
    probes = [build(device)]
    given = {p.backend for p in probes}
    probes += [BackendProbe(name, False, f"not part of the catalogue's {device.name} machine")
               for name in ("nvidia", "intel", "cpu") if name not in given]
    return Hardware(tuple(probes), tf_device_types=frozenset(types))


def _nvidia_probe(device: KnownDevice) -> BackendProbe:
    from .backends.nvidia import derive_capabilities
    from .backends.nvidia.backend import NvidiaFacts

    acc = Accelerator("nvidia", 0, device.device_name, "GPU", device.compute_capability, device.memory_bytes,
                      derive_capabilities(device.device_name, device.compute_capability))
    return BackendProbe("nvidia", True, f"1 GPU(s): {acc.name} (CC {acc.cc_str}) [catalogue: {device.source}]",
                        devices=(acc,), details=(("catalogue", device.source),), facts=NvidiaFacts())


def _intel_probe(device: KnownDevice) -> BackendProbe:
    from .backends.intel import IntelFacts, ItexStatus, classify_xpu

    acc = classify_xpu(0, device.device_name)
    acc = Accelerator(acc.vendor, acc.index, acc.name, acc.kind, None, device.memory_bytes, acc.capabilities)
    itex = ItexStatus("2.15.0.0", "2.15.1", True, "ITEX 2.15.0.0 with TensorFlow 2.15.1 (the catalogue's assumption)")
    return BackendProbe("intel", True, f"1 XPU(s): {acc.name} [catalogue: {device.source}]", devices=(acc,),
                        details=(("catalogue", device.source),), facts=IntelFacts(itex, ("gpu",)))


def _cpu_probe(device: KnownDevice) -> BackendProbe:
    from .backends.cpu import CpuFacts
    from .backends.cpu.backend import cpu_device
    from .backends.cpu.onednn import onednn_state
    from .backends.intel import ItexStatus

    cpu = CpuInfo(device.cpu_vendor, device.device_name, device.arch, device.logical_cores,
                  frozenset(device.flags.split()), device.family, device.model_number)
    no_itex = ItexStatus(None, "2.21.0", False, "Intel Extension for TensorFlow is not installed")
    onednn = onednn_state(cpu, {}, system="linux", tf_version="2.21.0")
    return BackendProbe("cpu", True, f"{device.title} [catalogue: {device.source}]",
                        devices=(cpu_device(cpu),), cpu=cpu,
                        details=(("catalogue", device.source),), facts=CpuFacts(no_itex, onednn))


# backend -> (how its probe would describe the device, the device types TensorFlow would list)
_PROBES: dict[str, tuple[Callable[[KnownDevice], BackendProbe], tuple[str, ...]]] = {
    "nvidia": (_nvidia_probe, ("CPU", "GPU")),
    "intel": (_intel_probe, ("CPU", "XPU")),
    "cpu": (_cpu_probe, ("CPU",)),
}
