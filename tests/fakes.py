"""Fake hardware for decision tests: real dataclasses, invented machines."""

from __future__ import annotations

from amp_backends.backends.cpu import CpuFacts
from amp_backends.backends.cpu.backend import cpu_device
from amp_backends.backends.cpu.onednn import onednn_state
from amp_backends.backends.intel import IntelFacts, ItexStatus, classify_xpu
from amp_backends.backends.nvidia import derive_capabilities
from amp_backends.hardware import Accelerator, BackendProbe, CpuInfo, Hardware

ITEX_LOADED = ItexStatus("2.15.0.0", "2.15.1", True, "ITEX 2.15.0.0 matches TensorFlow 2.15.1")
NO_ITEX = ItexStatus(None, "2.21.0", False, "Intel Extension for TensorFlow is not installed")

GiB = 2**30


def nvidia(*gpus: tuple[str, tuple[int, int]]) -> BackendProbe:
    devices = tuple(
        Accelerator("nvidia", i, name, "GPU", cc, 16 * GiB, derive_capabilities(name, cc))
        for i, (name, cc) in enumerate(gpus)
    )
    return BackendProbe("nvidia", True, f"{len(devices)} GPU(s)", devices=devices, details=(("driver", "580.00"),))


def intel(*names: str) -> BackendProbe:
    devices = tuple(classify_xpu(i, n) for i, n in enumerate(names))
    return BackendProbe("intel", True, f"{len(devices)} XPU(s)", devices=devices,
                        details=(("itex_version", "2.15.0.0"),), facts=IntelFacts(ITEX_LOADED, ("gpu",)))


def cpu(vendor: str, model: str, flags: str, arch: str = "x86_64", itex: bool = False,
        environ: dict[str, str] | None = None, system: str = "linux") -> BackendProbe:
    """A CPU probe; ``environ`` (``TF_ENABLE_ONEDNN_OPTS``) and ``system`` decide oneDNN's state as TensorFlow would."""
    info = CpuInfo(vendor, model, arch, 8, frozenset(flags.split()))
    status = ITEX_LOADED if itex else NO_ITEX
    onednn = onednn_state(info, environ or {}, system=system, tf_version="2.15.1" if itex else "2.21.0")
    return BackendProbe("cpu", True, model, devices=(cpu_device(info),), cpu=info, details=(("itex", status.reason),),
                        facts=CpuFacts(status, onednn))


def machine(*probes: BackendProbe, tf_device_types: frozenset[str] | None = None) -> Hardware:
    """A Hardware with the given probes; backends not given are 'not present'."""
    given = {p.backend for p in probes}
    missing = tuple(BackendProbe(name, False, f"no {name} device (fake)")
                    for name in ("nvidia", "intel", "cpu") if name not in given)
    return Hardware(probes=tuple(probes) + missing, tf_device_types=tf_device_types)


# GPUs
P100 = ("Tesla P100-PCIE-16GB", (6, 0))
V100 = ("Tesla V100-SXM2-32GB", (7, 0))
T4 = ("Tesla T4", (7, 5))
GTX1660TI = ("NVIDIA GeForce GTX 1660 Ti", (7, 5))
A100 = ("NVIDIA A100-SXM4-40GB", (8, 0))
RTX4090 = ("NVIDIA GeForce RTX 4090", (8, 9))
H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
# XPUs
MAX1550 = "Intel(R) Data Center GPU Max 1550"
ARC_A770 = "Intel(R) Arc(TM) A770 Graphics"
FLEX170 = "Intel(R) Data Center GPU Flex 170"
IRIS_XE = "Intel(R) Iris(R) Xe Graphics"
# CPUs
# AMD EPYC Zen 1 (the earlier machines): AVX2, no AVX-512, no bf16; TensorFlow leaves oneDNN off by default
AMD_HERE = ("AMD", "AMD EPYC", "fpu sse sse2 avx avx2 fma f16c")
# AMD EPYC Zen 4 (the machine now): AVX-512 with avx512_bf16 and avx512_vnni, no AMX
ZEN4 = ("AMD", "AMD EPYC", "fpu sse sse2 avx avx2 fma f16c avx512f avx512bw avx512vl avx_vnni avx512_bf16 avx512_vnni")
SAPPHIRE_RAPIDS = ("Intel", "Intel(R) Xeon(R) Platinum 8480+",
                   "avx2 avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8")
ICELAKE = ("Intel", "Intel(R) Xeon(R) Platinum 8380", "avx2 avx512f avx512bw avx512vl")
GRAVITON3 = ("ARM", "Neoverse-V1", "fp asimd sve bf16 i8mm asimdhp fphp")
GRAVITON4 = ("ARM", "Neoverse-V2", "fp asimd sve sve2 bf16 i8mm asimdhp fphp")
CORTEX_A72 = ("ARM", "Cortex-A72", "fp asimd evtstrm crc32 cpuid")


def cpu_of(spec, arch="x86_64", itex=False, environ=None, system="linux") -> BackendProbe:
    return cpu(*spec, arch=arch, itex=itex, environ=environ, system=system)
