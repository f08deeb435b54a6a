"""CPU probe (``/proc/cpuinfo``, ``sysctl`` on macOS) and CPU plan rules.

Measured with ``benchmarks/cpu_xla.py`` on an AMD EPYC (Zen 1, 2 cores, AVX2, no AVX-512, no bf16
instructions), TensorFlow 2.21, the MNIST CNN training step at batch 256: float32 1139 img/s, float32 + XLA
242, mixed_float16 216, mixed_bfloat16 123. A CPU without bf16 instructions emulates bf16 and fp16, so mixed
precision there is 5-9x *slower*; with ITEX loaded, a bf16 matmul on such a CPU aborts the process (oneDNN
cannot create the primitive).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

from amp_backends.hardware import BackendProbe, CpuInfo, Hardware
from amp_backends.registry import (
    EMULATED,
    FUNCTIONAL,
    NATIVE,
    UNSAFE,
    UNSUPPORTED,
    Assessment,
    Backend,
    Support,
)
from amp_backends.software import itex_status

RELEVANT_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_fp16", "avx512_fp16", "amx_tile")
ARM_RELEVANT_FLAGS = ("bf16", "asimdhp", "fphp", "sve", "i8mm")

# benchmarks/cpu_xla.py on an AMD EPYC (Zen 1, 2 cores, AVX2), TF 2.21, MNIST CNN training step, batch 256.
MEASURED_XLA = "AMD EPYC AVX2, TF 2.21, MNIST CNN batch 256: 1139 img/s without XLA, 242 with"
MEASURED_HERE = "AMD EPYC AVX2 without bf16, TF 2.21, MNIST CNN batch 256: float32 1139 img/s, mixed_float16 216, mixed_bfloat16 123"


def parse_cpuinfo(text: str, arch: str | None = None) -> CpuInfo:
    """Parse Linux ``/proc/cpuinfo`` text (x86 ``flags`` or Arm ``Features``) into a :class:`CpuInfo`."""
    vendor = model = ""
    flags: set[str] = set()
    cores = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "processor":
            cores += 1
        elif key == "vendor_id" and not vendor:
            vendor = value
        elif key in ("model name", "cpu model", "hardware") and not model:
            model = value
        elif key == "cpu implementer" and not vendor:
            vendor = {"0x41": "ARM", "0x61": "Apple", "0xc0": "Ampere", "0x48": "HiSilicon", "0x46": "Fujitsu"}.get(
                value.lower(), f"Arm implementer {value}"
            )
        elif key in ("flags", "features") and not flags:
            flags = set(value.lower().split())
    vendor = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}.get(vendor, vendor) or "unknown"
    arch = arch or ("aarch64" if flags & {"asimd", "fp"} and "sse" not in flags else "x86_64")
    return CpuInfo(vendor=vendor, model=model or "unknown", arch=arch, logical_cores=cores or (os.cpu_count() or 1),
                   flags=frozenset(flags))


def _macos_cpu() -> CpuInfo:
    def sysctl(name: str) -> str:
        try:
            return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    arch = platform.machine()
    flags = set()
    if sysctl("hw.optional.arm.FEAT_BF16") == "1":
        flags.add("bf16")
    if sysctl("hw.optional.arm.FEAT_FP16") == "1":
        flags.add("fphp")
    brand = sysctl("machdep.cpu.brand_string") or platform.processor() or "unknown"
    return CpuInfo("Apple" if arch == "arm64" else "Intel", brand, arch, os.cpu_count() or 1, frozenset(flags))


def probe_cpu() -> CpuInfo:
    """Read the host CPU. Unknown platforms give an empty flag set (so: no native bf16 -> float32, safe)."""
    arch = platform.machine() or "unknown"
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                return parse_cpuinfo(fh.read(), arch)
        except OSError:
            pass
    if sys.platform == "darwin":
        return _macos_cpu()
    return CpuInfo("unknown", platform.processor() or "unknown", arch, os.cpu_count() or 1, frozenset())


class CpuBackend(Backend):
    """The host CPU. Always available; used when no accelerator backend is."""

    name = "cpu"
    priority = 100
    title = "CPU"
    tf_device_type = None

    def probe(self, *, use_tensorflow: bool = False) -> BackendProbe:
        cpu = probe_cpu()
        itex = itex_status()
        details = [("itex", itex.reason)]
        if itex.compatible:
            details.append(("itex_active", "yes"))
        bf16 = "native bf16 (" + ", ".join(sorted(cpu.flags & {"avx512_bf16", "amx_bf16", "bf16"})) + ")" if cpu.native_bf16 else "no bf16 instructions"
        return BackendProbe(
            backend=self.name,
            available=True,
            reason=f"{cpu.model if cpu.vendor.lower() in cpu.model.lower() else cpu.vendor + ' ' + cpu.model}, {cpu.logical_cores} logical cores, {bf16}",
            cpu=cpu,
            details=tuple(details),
        )

    def report_rows(self, probe: BackendProbe) -> list[tuple[str, str]]:
        cpu = probe.cpu
        rows = [("model", (cpu.model if cpu.vendor.lower() in cpu.model.lower() else f"{cpu.vendor} {cpu.model}") if cpu else "unknown")]
        if cpu:
            rows += [
                ("architecture", f"{cpu.arch}, {cpu.logical_cores} logical cores"),
                ("flags that matter", ", ".join(sorted(cpu.flags & set(RELEVANT_FLAGS + ARM_RELEVANT_FLAGS))) or "none"),
                ("native bf16", "yes" if cpu.native_bf16 else "no (no avx512_bf16 / amx_bf16 / Arm bf16)"),
                ("native fp16", "yes" if cpu.native_fp16 else "no"),
                ("AMX", "yes" if cpu.amx else "no"),
            ]
        rows.append(("ITEX", probe.detail("itex", "-")))
        return rows

    def assess(self, probe: BackendProbe, hardware: Hardware) -> Assessment:
        cpu = probe.cpu or CpuInfo("unknown", "unknown", "unknown", 1)
        itex_active = probe.detail("itex_active") == "yes"
        which = ", ".join(sorted(cpu.flags & {"avx512_bf16", "amx_bf16", "bf16"}))
        if cpu.native_bf16:
            bf16 = Support(NATIVE, f"the CPU has bf16 instructions ({which}): bf16 matmuls and convolutions run natively "
                                   "through oneDNN, about twice the float32 rate, without loss scaling")
        elif itex_active:
            bf16 = Support(UNSAFE, "this CPU has no bf16 instructions (no avx512_bf16, amx_bf16) and ITEX is loaded: "
                                   "ITEX's oneDNN aborts the whole process on a bf16 matmul here")
        else:
            bf16 = Support(EMULATED, "this CPU has no bf16 instructions (no avx512_bf16, amx_bf16 or Arm bf16): "
                                     f"TensorFlow emulates bf16, far slower than float32 (measured: {MEASURED_HERE})")
        if cpu.native_fp16:
            fp16 = Support(FUNCTIONAL, "the CPU has fp16 instructions, but TensorFlow's CPU kernels favour bf16; "
                                       "float16 also needs loss scaling")
        else:
            fp16 = Support(EMULATED, "this CPU has no fp16 arithmetic: TensorFlow emulates float16 on the CPU, "
                                     f"far slower than float32 (measured: {MEASURED_HERE})")
        fp32 = Support(NATIVE, "float32 is the CPU's native fast path" + (
            "" if cpu.native_bf16 else "; without bf16 instructions mixed precision only adds casts here"))
        preference = ("mixed_bfloat16", "float32", "mixed_float16") if cpu.native_bf16 else ("float32", "mixed_bfloat16", "mixed_float16")

        if itex_active and cpu.amx:
            tf32 = Support(NATIVE, "ITEX's BF32 math mode lets float32 matmuls use AMX bf16 units (ITEX_FP32_MATH_MODE=BF32)")
            math_mode = "BF32"
        else:
            tf32 = Support(UNSUPPORTED, "TF32 is an NVIDIA Tensor Core format; CPUs have none"
                           + ("" if not itex_active else " (ITEX's BF32 mode needs AMX)"))
            math_mode = None
        xla = Support(FUNCTIONAL, "TensorFlow's CPU kernels use oneDNN; XLA's CPU JIT was 4.7x slower for the MNIST CNN "
                                  f"({MEASURED_XLA}); Keras's own jit_compile='auto' also keeps XLA off on CPUs")
        return Assessment(
            backend=self.name,
            devices=("/CPU:0",),
            policies={"float32": fp32, "mixed_float16": fp16, "mixed_bfloat16": bf16},
            preference=preference,
            tf32=tf32,
            tf32_default=True,
            xla=xla,
            xla_default=False,
            math_mode=math_mode,
        )
