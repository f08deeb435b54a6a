"""Fake hardware for decision tests: invented machines, built by the backends' own probe builders.

The builders are the ones the device catalogue describes its devices with (`Backend.describe`) and the real probes
report through: `gpu_probe`, `xpu_probe`, `cpu_probe`, and `machine_of` for the machine. Here only the fakes'
own figures are chosen: every GPU has 16 GiB, every CPU 8 logical cores, driver 580.00, ITEX 2.15 with TensorFlow
2.15.1 where loaded (TensorFlow 2.21 otherwise). `plan_of` is the planner's pure plan for such a machine.
"""

from __future__ import annotations

from amp_backends.backends.cpu import NO_ITEX, cpu_probe
from amp_backends.backends.intel import IntelFacts, itex_status, xpu_probe
from amp_backends.backends.nvidia import gpu_probe
from amp_backends.devices import machine_of
from amp_backends.hardware import BackendProbe, CpuInfo, Hardware
from amp_backends.software import KerasInfo
from amp_backends.plan import Plan
from amp_backends.planner import make_plan
from amp_backends.registry import Backend, BackendRegistry, default_registry
from amp_backends.request import build_request

ITEX_LOADED = itex_status("2.15.0.0", "2.15.1", look=False)

GiB = 2**30


def nvidia(*gpus: tuple[str, tuple[int, int]]) -> BackendProbe:
    """An NVIDIA probe of GPUs given as ``(name, compute capability)``, 16 GiB each."""
    return gpu_probe([(name, cc, 16 * GiB) for name, cc in gpus], reason=f"{len(gpus)} GPU(s)",
                     details=(("driver", "580.00"),))


def intel(*names: str) -> BackendProbe:
    """An Intel probe of XPUs given by name, under a loaded ITEX 2.15."""
    return xpu_probe(names, IntelFacts(ITEX_LOADED, ("gpu",)), reason=f"{len(names)} XPU(s)",
                     details=(("itex_version", "2.15.0.0"),))


def cpu_of(spec: tuple[str, str, str], arch: str = "x86_64", itex: bool = False,
           environ: dict[str, str] | None = None, system: str = "linux") -> BackendProbe:
    """A CPU probe of ``spec`` (vendor, model name, /proc/cpuinfo flags); ``environ`` (``TF_ENABLE_ONEDNN_OPTS``)
    and ``system`` decide oneDNN's state as TensorFlow would."""
    vendor, model, flags = spec
    status = ITEX_LOADED if itex else NO_ITEX
    return cpu_probe(CpuInfo(vendor, model, arch, 8, frozenset(flags.split())), status, environ=environ,
                     system=system, reason=model, details=(("itex", status.reason),))


def machine(*probes: BackendProbe, tf_device_types: frozenset[str] | None = None) -> Hardware:
    """A Hardware with the given probes; the installed backends not given are 'not present'."""
    return machine_of(probes, default_registry().names(), lambda name: f"no {name} device (fake)", tf_device_types)


def plan_of(hw: Hardware, registry: BackendRegistry, keras: KerasInfo | None = None, *,
            environ: dict[str, str] | None = None, **overrides) -> Plan:
    """The plan the planner decides for ``hw``: pure (``make_plan``), no TensorFlow, no probe of this machine.

    Args:
        hw: The hardware, fake (`machine`) or from the device catalogue.
        registry: The backends that may plan (the ``registry`` fixture: the installed ones).
        keras: The Keras the plan is for; ``None``: unknown, so no float8 training.
        environ: The environment the request reads its ``AMP_*`` variables from; ``None``: an empty one, never
            this process's.
        **overrides: The request's keywords (``policy``, ``loss_scale``, ``xla``, ``force``...).

    Returns:
        The plan, not applied.
    """
    return make_plan(hw, build_request(registry.names(), environ=environ or {}, **overrides), registry, keras)


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


class NoKernelAudit(Backend):
    """A backend never available here that leaves ``kernel_audit`` as the interface has it."""

    name, priority = "npu", 1

    def probe(self, *, use_tensorflow=False):
        return BackendProbe(self.name, False, "none here")

    def assess(self, probe, hardware):
        raise AssertionError("not available: never assessed")


class KernelAuditRaises(NoKernelAudit):
    """The same, broken: its ``kernel_audit`` raises."""

    name = "broken-npu"

    def kernel_audit(self):
        raise RuntimeError("kernel audit broke")
