"""Probes: parsing with recorded inputs, NVML through a fake module, and the real probes on this machine."""

from __future__ import annotations

import sys
import time
import types

import pytest

from conftest import NEUTRAL_CWD

from amp_backends.backends.cpu import parse_cpuinfo, probe_cpu
from amp_backends.backends.cpu.backend import CpuBackend
from amp_backends.backends.intel import IntelBackend, classify_xpu
from amp_backends.backends.nvidia import NvidiaBackend, derive_capabilities, parse_visible_devices
from amp_backends.software import itex_status

AMD_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx avx2 fma f16c

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx avx2 fma f16c
"""
SPR_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid sve bf16 i8mm
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


def test_parse_cpuinfo_amd_without_bf16():
    cpu = parse_cpuinfo(AMD_CPUINFO, "x86_64")
    assert (cpu.vendor, cpu.model, cpu.logical_cores) == ("AMD", "AMD EPYC", 2)
    assert "avx2" in cpu.flags and not cpu.native_bf16 and not cpu.native_fp16 and not cpu.amx


def test_parse_cpuinfo_sapphire_rapids():
    cpu = parse_cpuinfo(SPR_CPUINFO, "x86_64")
    assert cpu.vendor == "Intel" and cpu.native_bf16 and cpu.amx and cpu.native_fp16


def test_parse_cpuinfo_arm_bf16():
    cpu = parse_cpuinfo(ARM_CPUINFO, "aarch64")
    assert cpu.vendor == "ARM" and cpu.is_arm and cpu.native_bf16 and cpu.native_fp16


@pytest.mark.parametrize("name,cc,expected", [
    ("Tesla P100-PCIE-16GB", (6, 0), {"fp16"}),
    ("GeForce GTX 1080", (6, 1), set()),
    ("Tesla V100-SXM2-32GB", (7, 0), {"tensor_cores", "fp16"}),
    ("Tesla T4", (7, 5), {"tensor_cores", "fp16"}),
    ("NVIDIA GeForce GTX 1660 Ti", (7, 5), {"fp16"}),
    ("NVIDIA A100-SXM4-40GB", (8, 0), {"tensor_cores", "fp16", "bf16", "tf32"}),
    ("NVIDIA GeForce RTX 4090", (8, 9), {"tensor_cores", "fp16", "bf16", "tf32", "fp8"}),
    ("NVIDIA H100 80GB HBM3", (9, 0), {"tensor_cores", "fp16", "bf16", "tf32", "fp8"}),
])
def test_nvidia_capabilities(name, cc, expected):
    assert derive_capabilities(name, cc) == frozenset(expected)


@pytest.mark.parametrize("value,expected", [
    (None, [0, 1, 2, 3]), ("", []), ("-1", []), ("1,0", [1, 0]), ("2,7,1", [2]), ("0,0", [0]),
    ("GPU-bbbb", [1]), ("bbbb", [1]), ("GPU-zzzz", []),
])
def test_cuda_visible_devices(value, expected):
    assert parse_visible_devices(value, 4, ["GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd"]) == expected


@pytest.mark.parametrize("name,xmx,xehpc,caps", [
    ("Intel(R) Data Center GPU Max 1550", None, None, {"xmx", "bf16", "fp16", "tf32"}),
    ("Intel(R) Data Center GPU Flex 170", None, None, {"xmx", "bf16", "fp16"}),
    ("Intel(R) Arc(TM) A770 Graphics", None, None, {"xmx", "bf16", "fp16"}),
    ("Intel(R) Iris(R) Xe Graphics", None, None, {"fp16"}),
    ("Intel XPU", True, True, {"xmx", "bf16", "fp16", "tf32"}),
])
def test_classify_xpu(name, xmx, xehpc, caps):
    acc = classify_xpu(0, name, xmx, xehpc)
    assert acc.capabilities == frozenset(caps) and acc.kind == "XPU" and acc.vendor == "intel"


def test_itex_status_rules():
    assert not itex_status(None, "2.21.0", look=False).installed
    bad = itex_status("2.15.0.0", "2.21.0", look=False)
    assert bad.installed and not bad.compatible and "needs TensorFlow 2.15.x" in bad.reason
    assert itex_status("2.15.0.0", "2.15.1", look=False).compatible


class _FakeNVMLError(Exception):
    pass


def fake_pynvml(gpus, fail_init=None):
    m = types.ModuleType("pynvml")
    m.NVMLError = _FakeNVMLError
    m.calls = []

    def init():
        m.calls.append("init")
        if fail_init:
            raise _FakeNVMLError(fail_init)

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlSystemGetDriverVersion = lambda: "580.65.06"
    m.nvmlSystemGetCudaDriverVersion_v2 = lambda: 13000
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h:04d}"
    m.nvmlDeviceGetName = lambda h: gpus[h][0]
    m.nvmlDeviceGetCudaComputeCapability = lambda h: gpus[h][1]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * 2**30)
    return m


def test_nvidia_probe_through_nvml(monkeypatch):
    fake = fake_pynvml([("NVIDIA H100 80GB HBM3", (9, 0)), ("NVIDIA A100-SXM4-40GB", (8, 0))])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    probe = NvidiaBackend().probe()
    assert probe.available and [d.name for d in probe.devices] == ["NVIDIA A100-SXM4-40GB"]
    assert probe.devices[0].index == 0 and probe.devices[0].compute_capability == (8, 0)
    assert probe.detail("driver") == "580.65.06" and probe.detail("driver_cuda") == "13.0"
    assert probe.detail("hidden_by_CUDA_VISIBLE_DEVICES") == "1"
    assert fake.calls == ["init", "shutdown"]


def test_nvidia_probe_errors_keep_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], fail_init="Driver Not Loaded"))
    probe = NvidiaBackend().probe()
    assert not probe.available and "Driver Not Loaded" in probe.reason
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([]))
    assert "NVML reports no GPU" in NvidiaBackend().probe().reason
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert "nvidia-ml-py is not installed" in NvidiaBackend().probe().reason


# --- the real probes, on this machine --------------------------------------------------------------

def test_real_cpu_probe_here():
    cpu = probe_cpu()
    assert cpu.logical_cores >= 1 and cpu.arch
    if "AuthenticAMD" in open("/proc/cpuinfo").read():
        assert cpu.vendor == "AMD" and "avx2" in cpu.flags and not cpu.native_bf16


def test_real_nvidia_probe_here_is_fast_and_explains():
    t0 = time.perf_counter()
    probe = NvidiaBackend().probe()
    assert time.perf_counter() - t0 < 0.5
    assert probe.reason  # available or not, it says why
    if not probe.available:
        assert probe.reason.startswith("no NVIDIA GPU")


def test_all_probes_without_tensorflow_are_fast():
    code = ("import time, sys; t=time.perf_counter(); from amp_backends.probe import probe_hardware; "
            "hw=probe_hardware(); dt=time.perf_counter()-t; "
            "assert 'tensorflow' not in sys.modules, 'TF imported'; print(dt)")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 0.5


def test_intel_probe_does_not_import_tensorflow(monkeypatch):
    import subprocess

    code = ("import sys; from amp_backends.backends.intel import IntelBackend; p=IntelBackend().probe(); "
            "assert 'tensorflow' not in sys.modules; print(p.available, p.reason)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("False")


def test_cpu_backend_report_rows_here():
    rows = dict(CpuBackend().report_rows(CpuBackend().probe()))
    assert {"model", "flags that matter", "native bf16", "ITEX"} <= set(rows)
