"""CPU probe (``/proc/cpuinfo``, ``sysctl`` on macOS) and CPU plan rules.

Measured with ``benchmarks/cpu_xla.py`` on an AMD EPYC (Zen 1, 2 cores, AVX2, no AVX-512, no bf16
instructions), TensorFlow 2.21, the MNIST CNN training step at batch 256: float32 1139 img/s, float32 + XLA
242, mixed_float16 216, mixed_bfloat16 123. A CPU without bf16 instructions emulates bf16 and fp16, so mixed
precision there is 5-9x *slower*; with ITEX loaded, a bf16 matmul on such a CPU aborts the process (oneDNN
cannot create the primitive).

On a CPU with bf16 instructions the same benchmark shows the opposite: an AMD EPYC (Zen 4, 2 cores,
avx512_bf16, no AMX), TensorFlow 2.21, batch 256: mixed_bfloat16 3655 img/s, float32 1139, float32 + XLA 368,
mixed_float16 336 (no fp16 instructions there either).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from amp_backends.assessment import (
    EMULATED,
    FUNCTIONAL,
    NATIVE,
    UNSAFE,
    UNSUPPORTED,
    Assessment,
    MatrixUnit,
    Support,
    VendorSetting,
)
from amp_backends.backends.intel.itex import MATH_MODE_VARIABLE, ItexStatus, apply_math_mode, itex_status
from amp_backends.hardware import BF16, FP16, Accelerator, BackendProbe, CpuInfo, Hardware
from amp_backends.plan import Plan
from amp_backends.registry import Backend

RELEVANT_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_fp16", "avx512_fp16", "amx_tile")
ARM_RELEVANT_FLAGS = ("bf16", "asimdhp", "fphp", "sve", "i8mm")

# benchmarks/cpu_xla.py on an AMD EPYC (Zen 1, 2 cores, AVX2), TF 2.21, MNIST CNN training step, batch 256.
MEASURED_XLA = "AMD EPYC AVX2, TF 2.21, MNIST CNN batch 256: 1139 img/s without XLA, 242 with"
FIT_STEPS_WHY = ("one training step per compiled call (Keras's default): more gained nothing for Keras fit on a CPU, "
                 "where a step dwarfs fit's per-call overhead (benchmarks/fit_steps_per_execution.py, AMD EPYC Zen 4, TF "
                 "2.21, MNIST CNN batch 256, mixed_bfloat16: 3146 img/s at 1, 3143 at 4, 3149 at 16 and at 64)")
MEASURED_BF16 = ("AMD EPYC Zen 4 with avx512_bf16, TF 2.21, MNIST CNN batch 256: mixed_bfloat16 3655 img/s, "
                 "float32 1139")
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


@dataclass(frozen=True)
class CpuFacts:
    """What the CPU probe saw beyond the CPU itself: whether ITEX (and so its oneDNN CPU backend) is loaded.

    ``itex.compatible`` means TensorFlow loads ITEX when imported: that changes what is safe (bf16 aborts
    without bf16 instructions) and what exists (BF32 math mode on AMX).
    """

    itex: ItexStatus

    @property
    def itex_loaded(self) -> bool:
        return self.itex.compatible


def cpu_device(cpu: CpuInfo) -> Accelerator:
    """The host CPU as the device a CPU plan runs on (``/CPU:0``)."""
    caps = {BF16} if cpu.native_bf16 else set()
    if cpu.native_fp16:
        caps.add(FP16)
    return Accelerator("cpu", 0, display_name(cpu), "CPU", capabilities=frozenset(caps))


def display_name(cpu: CpuInfo) -> str:
    return cpu.model if cpu.vendor.lower() in cpu.model.lower() else f"{cpu.vendor} {cpu.model}"


class CpuBackend(Backend):
    """The host CPU. Always available; used when no accelerator backend is."""

    name = "cpu"
    priority = 100
    tf_device_type = None

    def probe(self, *, use_tensorflow: bool = False) -> BackendProbe:
        cpu = probe_cpu()
        itex = itex_status()
        bf16 = "native bf16 (" + ", ".join(sorted(cpu.flags & {"avx512_bf16", "amx_bf16", "bf16"})) + ")" if cpu.native_bf16 else "no bf16 instructions"
        return BackendProbe(
            backend=self.name,
            available=True,
            reason=f"{display_name(cpu)}, {cpu.logical_cores} logical cores, {bf16}",
            devices=(cpu_device(cpu),),
            cpu=cpu,
            details=(("itex", itex.reason),),
            facts=CpuFacts(itex),
        )

    def report_rows(self, probe: BackendProbe) -> list[tuple[str, str]]:
        cpu = probe.cpu
        rows = [("device", ", ".join(d.tf_name for d in probe.devices) or "-"),
                ("model", display_name(cpu) if cpu else "unknown")]
        if cpu:
            rows += [
                ("architecture", f"{cpu.arch}, {cpu.logical_cores} logical cores"),
                ("flags that matter", ", ".join(sorted(cpu.flags & set(RELEVANT_FLAGS + ARM_RELEVANT_FLAGS))) or "none"),
                ("native bf16", "yes" if cpu.native_bf16 else "no (no avx512_bf16 / amx_bf16 / Arm bf16)"),
                ("native fp16", "yes" if cpu.native_fp16 else "no"),
                ("AMX", "yes" if cpu.amx else "no"),
            ]
        facts = probe.facts if isinstance(probe.facts, CpuFacts) else None
        rows.append(("ITEX", (facts.itex.reason + ("; loaded with TensorFlow" if facts.itex_loaded else "")) if facts else "-"))
        return rows

    def assess(self, probe: BackendProbe, hardware: Hardware) -> Assessment:
        cpu = probe.cpu or CpuInfo("unknown", "unknown", "unknown", 1)
        itex_active = isinstance(probe.facts, CpuFacts) and probe.facts.itex_loaded
        which = ", ".join(sorted(cpu.flags & {"avx512_bf16", "amx_bf16", "bf16"}))
        if cpu.native_bf16:
            bf16 = Support(NATIVE, f"the CPU has bf16 instructions ({which}): bf16 matmuls and convolutions run natively "
                                   f"through oneDNN, without loss scaling (measured: {MEASURED_BF16})")
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
        else:
            tf32 = Support(UNSUPPORTED, "TF32 is an NVIDIA Tensor Core format; CPUs have none"
                           + ("" if not itex_active else " (ITEX's BF32 mode needs AMX)"))
        xla = Support(FUNCTIONAL, "TensorFlow's CPU kernels use oneDNN; XLA's CPU JIT was 4.7x slower for the MNIST CNN "
                                  f"({MEASURED_XLA}); Keras's own jit_compile='auto' also keeps XLA off on CPUs")
        fp8 = Support(EMULATED, "CPUs have no fp8 arithmetic: Keras's float8 layers run emulated (quantize-dequantize "
                                "around bfloat16 or float32 matmuls), slower than without them")
        units = {}
        if cpu.amx:
            units["bfloat16"] = MatrixUnit("AMX tiles", 8)
            if itex_active:
                units["float32"] = MatrixUnit("AMX tiles (BF32)", 8)
        return Assessment(
            backend=self.name,
            devices=tuple(d.tf_name for d in probe.devices) or ("/CPU:0",),
            policies={"float32": fp32, "mixed_float16": fp16, "mixed_bfloat16": bf16},
            preference=preference,
            tf32=tf32,
            tf32_default=True,
            xla=xla,
            xla_default=False,
            fp8=fp8,
            matrix_units=units,
            steps_per_execution=1,
            steps_per_execution_why=FIT_STEPS_WHY,
        )

    def vendor_settings(self, plan: Plan) -> tuple[VendorSetting, ...]:
        if plan.tf32:  # only ever native here: ITEX loaded on an AMX CPU
            return (VendorSetting(MATH_MODE_VARIABLE, "BF32", "ITEX's BF32 math mode is how this CPU runs float32 "
                                  "matmuls on its AMX bf16 units (the plan's tf32=on)"),)
        return ()

    def apply(self, plan: Plan, tf: Any) -> list[str]:
        notes = []
        mode = plan.vendor_setting(MATH_MODE_VARIABLE)
        if mode:
            notes.append(apply_math_mode(mode))
        hidden = hide_accelerators(tf)
        if hidden:
            notes.append(hidden)
        return notes


def hide_accelerators(tf: Any) -> str | None:
    """On a CPU plan, hide GPUs/XPUs from TensorFlow if it still can (before its runtime starts)."""
    hidden = []
    for kind in ("GPU", "XPU"):
        try:
            if tf.config.list_physical_devices(kind):
                tf.config.set_visible_devices([], kind)
                hidden.append(kind)
        except RuntimeError:
            return (f"TensorFlow already started its {kind} runtime: the CPU plan cannot hide it; place ops with "
                    "tf.device(plan.device)")
        except Exception:
            continue
    return f"hid {', '.join(hidden)} devices from TensorFlow for the CPU plan" if hidden else None
