"""Probes: parsing with recorded inputs, NVML through a fake module, and the real probes on this machine."""

from __future__ import annotations

import sys
import types

import pytest

from conftest import NEUTRAL_CWD

from amp_backends.backends.cpu import parse_cpuinfo
from amp_backends.backends.cpu.backend import CpuBackend
from amp_backends.backends.intel import classify_xpu, itex_status
from amp_backends.backends.nvidia import (NvidiaBackend, NvmlGpu, compute_capability, cuda_enumeration,
                                          derive_capabilities, parse_visible_devices)
from amp_backends.backends.nvidia.nvml import NVML_LIBRARY, explain_library_failure, library_load_error

pytestmark = pytest.mark.intel

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
    assert cpu.model == "Neoverse-V1"  # from the CPU part (0xd40): TensorFlow's oneDNN default names this core


ZEN1 = "avx avx2 fma"
ZEN4 = "avx2 avx512f avx512_vnni avx512_bf16 avx_vnni"
SPR = "avx2 avx512f avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8"
CASCADE_LAKE = "avx2 avx512f avx512_vnni"
ALDER_LAKE = "avx2 fma avx_vnni"


@pytest.mark.parametrize("flags,model,arch,system,env,tf,enabled,why", [
    (ZEN4, "AMD EPYC", "x86_64", "linux", None, "2.21.0", True, "on by default on Linux for CPUs with avx512_bf16"),
    (SPR, "Xeon", "x86_64", "linux", None, "2.21.0", True, "amx_bf16"),
    (CASCADE_LAKE, "Xeon", "x86_64", "linux", None, "2.21.0", True, "avx512_vnni"),
    (ALDER_LAKE, "Core", "x86_64", "linux", None, "2.21.0", True, "avx_vnni"),
    (ZEN1, "AMD EPYC", "x86_64", "linux", None, "2.21.0", False,
     "off by default on Linux for CPUs without AVX512-VNNI"),
    (ZEN1, "AMD EPYC", "x86_64", "linux", "1", "2.21.0", True, "TF_ENABLE_ONEDNN_OPTS=1"),
    (ZEN1, "AMD EPYC", "x86_64", "linux", "TRUE", "2.21.0", True, "TF_ENABLE_ONEDNN_OPTS=TRUE"),
    (ZEN4, "AMD EPYC", "x86_64", "linux", "0", "2.21.0", False, "TF_ENABLE_ONEDNN_OPTS=0"),
    (ZEN4, "AMD EPYC", "x86_64", "linux", "false", "2.21.0", False, "TF_ENABLE_ONEDNN_OPTS=false"),
    (ZEN4, "AMD EPYC", "x86_64", "linux", "off", "2.21.0", True,
     "'off' is not 0, 1, true or false: TensorFlow ignores it"),
    (ZEN4, "AMD EPYC", "x86_64", "linux", "", "2.21.0", True, "ignores it"),
    (ZEN4, "AMD EPYC", "x86_64", "linux", None, "2.8.0", False, "before 2.9"),
    ("fp asimd sve bf16", "Neoverse-V1", "aarch64", "linux", None, "2.21.0", True, "Neoverse V1"),
    ("fp asimd sve bf16", "Neoverse-V2", "aarch64", "linux", None, "2.21.0", False, "other than Neoverse V1"),
    ("fp asimd bf16", "Apple M3", "arm64", "darwin", "1", "2.21.0", False, "have no oneDNN"),
    (ZEN1, "Core", "x86_64", "win32", None, "2.21.0", True, "on by default on Windows x86"),
])
def test_tensorflow_onednn_rule(flags, model, arch, system, env, tf, enabled, why):
    from amp_backends.backends.cpu.onednn import onednn_state
    from amp_backends.hardware import CpuInfo

    cpu = CpuInfo("x", model, arch, 2, frozenset(flags.split()))
    state = onednn_state(cpu, {} if env is None else {"TF_ENABLE_ONEDNN_OPTS": env}, system=system, tf_version=tf)
    assert state.enabled is enabled and why in state.why
    assert state.switched_off is (env in ("0", "false"))
    assert not state.tensorflow_imported


def test_once_tensorflow_is_imported_its_own_answer_counts():
    from amp_backends.backends.cpu.onednn import onednn_state
    from amp_backends.hardware import CpuInfo

    cpu = CpuInfo("AMD", "AMD EPYC", "x86_64", 2, frozenset(ZEN4.split()))
    state = onednn_state(cpu, {"TF_ENABLE_ONEDNN_OPTS": "1"}, system="linux", imported_answer=False)
    assert not state.enabled and state.tensorflow_imported
    assert "TensorFlow is imported and reports oneDNN off" in state.why


def test_real_cpu_probe_reads_onednn_from_the_environment(monkeypatch):
    import importlib.util

    if importlib.util.find_spec("intel_extension_for_tensorflow") is not None:
        # the probe imports ITEX, and ITEX TensorFlow: started here under the suite's own setting, not under the 0
        # below, which TensorFlow would keep for every later test of this process
        import tensorflow  # noqa: F401
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    probe = CpuBackend().probe()
    onednn = probe.facts.onednn
    rows = dict(CpuBackend().report_rows(probe))
    assert rows["oneDNN"].startswith("on" if onednn.enabled else "off")
    if "tensorflow" in sys.modules:  # imported by an earlier test: TensorFlow's own answer, fixed at its import
        assert onednn.tensorflow_imported
    else:
        assert not onednn.enabled and onednn.why == "TF_ENABLE_ONEDNN_OPTS=0"


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
    def __init__(self, message, value=999):
        super().__init__(message)
        self.value = value


# name, CC, PCI bus id, CUDA cores, max SM clock (MHz): what NVML reports
V100_PCI0 = ("Tesla V100-SXM2-32GB", (7, 0), "00000000:00:1E.0", 5120, 1530)
A100_PCI1 = ("NVIDIA A100-SXM4-40GB", (8, 0), "00000000:01:00.0", 6912, 1410)
T4_PCI2 = ("Tesla T4", (7, 5), "00000000:02:00.0", 2560, 1590)
A100_PCI3 = ("NVIDIA A100-SXM4-40GB", (8, 0), "00000000:03:00.0", 6912, 1410)


def fake_pynvml(gpus, fail_init=None, init_error_value=999, nvml_order=None):
    """A pynvml module over ``gpus``; ``nvml_order`` lists them in NVML's index order (default: as given)."""
    m = types.ModuleType("pynvml")
    m.NVMLError = _FakeNVMLError
    m.NVML_ERROR_LIBRARY_NOT_FOUND = 12
    m.NVML_CLOCK_SM = 1
    m.calls = []
    gpus = [gpus[i] for i in nvml_order] if nvml_order else list(gpus)

    def init():
        m.calls.append("init")
        if fail_init:
            raise _FakeNVMLError(fail_init, init_error_value)

    def spec(h):
        g = gpus[h]
        return g if len(g) == 5 else (*g, f"00000000:{h:02X}:00.0", None, None)

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlSystemGetDriverVersion = lambda: "580.65.06"
    m.nvmlSystemGetCudaDriverVersion_v2 = lambda: 13000
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h:04d}"
    m.nvmlDeviceGetName = lambda h: spec(h)[0]
    m.nvmlDeviceGetCudaComputeCapability = lambda h: spec(h)[1]
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=spec(h)[2].encode())
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * 2**30)

    def cores(h):
        if spec(h)[3] is None:
            raise _FakeNVMLError("Not Supported", 3)
        return spec(h)[3]

    def clock(h, kind):
        assert kind == m.NVML_CLOCK_SM
        if spec(h)[4] is None:
            raise _FakeNVMLError("Not Supported", 3)
        return spec(h)[4]

    m.nvmlDeviceGetNumGpuCores = cores
    m.nvmlDeviceGetMaxClockInfo = clock
    return m


def probe_with(monkeypatch, gpus, **env):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus))
    for var in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    return NvidiaBackend().probe()


def test_nvidia_probe_through_nvml(monkeypatch):
    probe = probe_with(monkeypatch, [("NVIDIA H100 80GB HBM3", (9, 0)), ("NVIDIA A100-SXM4-40GB", (8, 0))],
                       CUDA_VISIBLE_DEVICES="1")
    assert probe.available and [d.name for d in probe.devices] == ["NVIDIA A100-SXM4-40GB"]
    assert probe.devices[0].index == 0 and compute_capability(probe.devices[0]) == (8, 0)
    assert probe.detail("driver") == "580.65.06" and probe.detail("driver_cuda") == "13.0"
    assert probe.detail("hidden_by_CUDA_VISIBLE_DEVICES") == "1"
    assert probe.facts.driver == "580.65.06" and len(probe.facts.nvml_gpus) == 2
    assert sys.modules["pynvml"].calls == ["init", "shutdown"]


# --- CUDA's device order: CUDA_VISIBLE_DEVICES indices and /GPU:n follow it, not NVML's order ----------------

def test_default_order_is_fastest_first_on_a_mixed_host(monkeypatch):
    """A V100 at PCI bus 0 and an A100 at bus 1: CUDA's default order makes the A100 device 0."""
    probe = probe_with(monkeypatch, [V100_PCI0, A100_PCI1], CUDA_VISIBLE_DEVICES="0")
    assert [d.name for d in probe.devices] == ["NVIDIA A100-SXM4-40GB"] and probe.devices[0].index == 0
    assert probe.facts.device_order == "FASTEST_FIRST" and "CUDA's default" in probe.detail("CUDA_device_order")
    from amp_backends.backends.nvidia import NvidiaBackend as B
    from fakes import AMD_HERE, cpu_of, machine

    a = B().assess(probe, machine(probe, cpu_of(AMD_HERE)))
    assert a.tf32.level == "native" and a.policies["mixed_bfloat16"].level == "native"  # planned for the A100


def test_pci_bus_id_order_is_nvidia_smis(monkeypatch):
    probe = probe_with(monkeypatch, [V100_PCI0, A100_PCI1], CUDA_VISIBLE_DEVICES="0", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert [d.name for d in probe.devices] == ["Tesla V100-SXM2-32GB"] and probe.facts.device_order == "PCI_BUS_ID"
    assert probe.devices[0].pci_bus_id == "00000000:00:1E.0"


def test_all_visible_gpus_are_listed_in_cuda_order(monkeypatch):
    probe = probe_with(monkeypatch, [V100_PCI0, A100_PCI3, T4_PCI2, A100_PCI1])
    assert [(d.index, d.name, d.pci_bus_id[-7:]) for d in probe.devices] == [
        (0, "NVIDIA A100-SXM4-40GB", "01:00.0"), (1, "NVIDIA A100-SXM4-40GB", "03:00.0"),  # same model: PCI order
        (2, "Tesla T4", "02:00.0"), (3, "Tesla V100-SXM2-32GB", "00:1E.0")]
    by_pci = probe_with(monkeypatch, [V100_PCI0, A100_PCI3, T4_PCI2, A100_PCI1], CUDA_DEVICE_ORDER="pci_bus_id")
    assert [d.pci_bus_id[-7:] for d in by_pci.devices] == ["00:1E.0", "01:00.0", "02:00.0", "03:00.0"]
    picked = probe_with(monkeypatch, [V100_PCI0, A100_PCI3, T4_PCI2, A100_PCI1], CUDA_VISIBLE_DEVICES="3,2")
    assert [d.name for d in picked.devices] == ["Tesla V100-SXM2-32GB", "Tesla T4"]  # in the variable's order


@pytest.mark.parametrize("gpus,expected", [
    # same compute capability: the throughput estimate (cores x clock) decides
    ([("small", (8, 6), "0:1:0.0", 3584, 1777), ("big", (8, 6), "0:2:0.0", 10496, 1695)], ["big", "small"]),
    # unknown cores or clock count as 0; ties keep PCI order, whatever NVML's index order
    ([("b", (7, 0), "0:2:0.0", None, None), ("a", (7, 0), "0:1:0.0", None, None)], ["a", "b"]),
    # the compute capability comes first
    ([("old-but-big", (7, 0), "0:1:0.0", 99999, 9999), ("new", (9, 0), "0:2:0.0", 1, 1)], ["new", "old-but-big"]),
])
def test_fastest_first_heuristic(gpus, expected):
    listed = [NvmlGpu(i, n, f"GPU-{i}", pci, cc, None, cores, clock)
              for i, (n, cc, pci, cores, clock) in enumerate(gpus)]
    assert [g.name for g in cuda_enumeration(listed)] == expected


# --- NVML start-up failures, told apart ------------------------------------------------------------------

def test_nvidia_probe_errors_keep_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], fail_init="Driver Not Loaded"))
    probe = NvidiaBackend().probe()
    assert not probe.available and "Driver Not Loaded" in probe.reason
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([]))
    assert "NVML reports no GPU" in NvidiaBackend().probe().reason
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert "nvidia-ml-py is not installed" in NvidiaBackend().probe().reason


def test_missing_and_invalid_nvml_libraries_are_told_apart(tmp_path):
    # what the dynamic loader really says for each (dlopen through ctypes, as nvidia-ml-py loads NVML)
    missing = library_load_error(str(tmp_path / "libnvidia-ml.so.1"))
    bad = tmp_path / "libbad.so"
    bad.write_bytes(b"this is not a shared library")
    invalid = library_load_error(str(bad))
    assert missing and invalid and missing != invalid
    assert explain_library_failure(missing).endswith("not found: no NVIDIA driver is installed")
    explained = explain_library_failure(invalid)
    assert "was found but cannot be loaded" in explained and "reinstall the driver" in explained
    assert "Shared Library Not Found" not in explained


def test_nvml_library_not_found_is_reported_as_what_it_is(monkeypatch):
    """nvidia-ml-py says "NVML Shared Library Not Found" for a missing *and* an unloadable library."""
    import amp_backends.backends.nvidia.nvml as nv

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], fail_init="NVML Shared Library Not Found",
                                                           init_error_value=12))
    monkeypatch.setattr(nv, "library_load_error", lambda: f"{NVML_LIBRARY}: invalid ELF header")
    reason = NvidiaBackend().probe().reason
    assert "cannot be loaded (libnvidia-ml.so.1: invalid ELF header)" in reason and "Not Found" not in reason
    monkeypatch.setattr(nv, "library_load_error",
                        lambda: f"{NVML_LIBRARY}: cannot open shared object file: No such file or directory")
    assert "not found: no NVIDIA driver is installed" in NvidiaBackend().probe().reason


# --- the real probes, on this machine --------------------------------------------------------------

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo, which only Linux has")
def test_real_cpu_probe_here():
    text = open("/proc/cpuinfo").read()
    lines = [line.partition(":") for line in text.splitlines()]
    flags = next((set(v.split()) for k, _, v in lines if k.strip() in ("flags", "Features")), set())
    from conftest import REAL_PROBE_CPU  # this machine's CPU, also under --as-cpu

    cpu = REAL_PROBE_CPU()
    assert cpu.flags == flags and cpu.logical_cores == sum(1 for k, _, _ in lines if k.strip() == "processor")
    expected_bf16 = "bf16" in flags if cpu.is_arm else bool(flags & {"avx512_bf16", "amx_bf16"})
    assert cpu.native_bf16 is expected_bf16 and cpu.amx is ("amx_bf16" in flags)
    vendor_id = next((v.strip() for k, _, v in lines if k.strip() == "vendor_id"), None)
    if vendor_id:
        assert cpu.vendor == {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}.get(vendor_id, vendor_id)


def test_real_nvidia_probe_here_explains():
    probe = NvidiaBackend().probe()
    load_error = library_load_error()
    if load_error is not None:  # no loadable NVML here: the reason says which problem it is
        assert not probe.available
        assert probe.reason == f"no NVIDIA GPU: NVML could not start ({explain_library_failure(load_error)})"
    elif probe.available:
        assert probe.devices and all(compute_capability(d) for d in probe.devices)
        assert [d.index for d in probe.devices] == list(range(len(probe.devices)))
    else:
        assert probe.reason.startswith("no NVIDIA GPU: ") and len(probe.reason) > len("no NVIDIA GPU: ")


# Run in a fresh process: records every process the probes start (audit events) and whether TensorFlow got imported.
PROBE_AUDIT = """
import json, sys
started = []
def hook(event, args):
    if event in ("subprocess.Popen", "os.system", "os.posix_spawn", "os.fork", "os.forkpty", "os.exec", "os.spawn"):
        started.append(event + " " + repr(args)[:200])
sys.addaudithook(hook)
from amp_backends.probe import probe_hardware
hw = probe_hardware()
print(json.dumps({"tensorflow": "tensorflow" in sys.modules, "started": started,
                  "backends": [p.backend for p in hw.probes], "errors": [p.error for p in hw.probes if p.error]}))
"""


def test_all_probes_without_tensorflow_import_nothing_heavy_and_start_no_process():
    """What the probes do, not how long they take: no TensorFlow import, no process (NVML is a library call)."""
    import json
    import subprocess

    out = subprocess.run([sys.executable, "-c", PROBE_AUDIT], check=False, capture_output=True, text=True, timeout=120,
                         cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["tensorflow"] is False, "a probe imported TensorFlow"
    assert seen["errors"] == [] and {"nvidia", "intel", "cpu"} <= set(seen["backends"])
    if sys.platform == "darwin":  # the CPU probe asks sysctl there; nothing else may start
        seen["started"] = [s for s in seen["started"] if "sysctl" not in s]
    assert seen["started"] == [], f"the probes started processes: {seen['started']}"


def test_intel_probe_does_not_import_tensorflow(monkeypatch):
    import subprocess

    code = ("import sys; from amp_backends.backends.intel import IntelBackend; p=IntelBackend().probe(); "
            "assert 'tensorflow' not in sys.modules; print(p.available, p.needs_tensorflow, p.reason)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    # XPUs are listed through TensorFlow: without it the probe is unavailable, and asks for it only if ITEX can load
    assert out.stdout.startswith(f"False {itex_status().compatible} ")


def test_cpu_backend_lists_its_device_as_the_plan_uses_it():
    probe = CpuBackend().probe()
    rows = dict(CpuBackend().report_rows(probe))
    assert {"model", "flags that matter", "native bf16", "ITEX"} <= set(rows)
    assert rows["device"] == "/CPU:0" and [d.tf_name for d in probe.devices] == ["/CPU:0"]
    from fakes import machine

    assert CpuBackend().assess(probe, machine(probe)).devices == ("/CPU:0",)
