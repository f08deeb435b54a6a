"""CPU probe (``/proc/cpuinfo``, ``sysctl`` on macOS, ``TF_ENABLE_ONEDNN_OPTS``) and the CPU backend: mixed_bfloat16
where the CPU has bf16 instructions *and* oneDNN runs the model (`rules`, `onednn`), float32 elsewhere; XLA off."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from typing_extensions import override

from amp_backends.backends.intel.itex import (MATH_MODE_VARIABLE, ItexStatus, amp_variable_beside, apply_math_mode,
                                             itex_status, math_mode_support, user_math_mode)

from amp_backends.backend_api import warn
from amp_backends.assessment import EMULATED, NATIVE, UNSUPPORTED, Assessment, MatrixUnit, Support, VendorSetting
from amp_backends.hardware import KnownDevice, BF16, FP16, Accelerator, BackendProbe, CpuInfo, Hardware
from amp_backends.plan import Plan
from amp_backends.registry import Backend, Peer
from amp_backends.software import installed_version, tensorflow_version

from . import rules
from .catalogue import CATALOGUE
from .measured import FIT_STEPS, evidence, quote
from .onednn import OneDnnState, onednn_state, read_onednn_state
from .verbose import CpuKernelAudit

RELEVANT_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_fp16", "avx512_fp16",
                  "amx_tile")
ARM_RELEVANT_FLAGS = ("bf16", "asimdhp", "fphp", "sve", "i8mm")
FLAGS_THAT_MATTER = frozenset(RELEVANT_FLAGS + ARM_RELEVANT_FLAGS)  # the report's and the results files'
# Arm's part numbers (/proc/cpuinfo "CPU part", implementer 0x41) for the cores a plan tells apart.
ARM_PARTS = {"0xd40": "Neoverse-V1", "0xd4f": "Neoverse-V2", "0xd84": "Neoverse-V3", "0xd0c": "Neoverse-N1",
             "0xd49": "Neoverse-N2", "0xd08": "Cortex-A72", "0xd0b": "Cortex-A76"}
ARM_IMPLEMENTERS = {"0x41": "ARM", "0x61": "Apple", "0xc0": "Ampere", "0x48": "HiSilicon", "0x46": "Fujitsu"}
UNKNOWN_CPU = CpuInfo("unknown", "unknown", "unknown", 1)


# TensorFlow 2.21 without ITEX: the software of a described CPU (the device catalogue's assumption).
NO_ITEX = itex_status(None, "2.21.0", look=False)

FIT_STEPS_CONFIGS = tuple(f"mixed_bfloat16 steps_per_execution={n}" for n in (1, 4, 16, 64))


def parse_cpuinfo(text: str, arch: str | None = None) -> CpuInfo:
    """Parse Linux ``/proc/cpuinfo`` text (x86 ``flags`` or Arm ``Features``) into a `CpuInfo`."""
    vendor = model = part = implementer = ""
    flags: set[str] = set()
    numbers: dict[str, int] = {}  # "cpu family", "model", "stepping" of the first processor
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
        elif key == "cpu part" and not part:
            part = value.lower()
        elif key == "cpu implementer" and not vendor:
            implementer = value.lower()
            vendor = ARM_IMPLEMENTERS.get(implementer, f"Arm implementer {value}")
        elif key in ("flags", "features") and not flags:
            flags = set(value.lower().split())
        elif key in ("cpu family", "model", "stepping") and key not in numbers and value.isdigit():
            numbers[key] = int(value)
    vendor = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}.get(vendor, vendor) or "unknown"
    if not model and implementer == "0x41":
        model = ARM_PARTS.get(part, "")
    arch = arch or ("aarch64" if flags & {"asimd", "fp"} and "sse" not in flags else "x86_64")
    return CpuInfo(vendor=vendor, model=model or "unknown", arch=arch, logical_cores=cores or (os.cpu_count() or 1),
                   flags=frozenset(flags), family=numbers.get("cpu family"), model_number=numbers.get("model"),
                   stepping=numbers.get("stepping"))


def _sysctl(name: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


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
        flags = {flag for flag, feature in (("bf16", "FEAT_BF16"), ("fphp", "FEAT_FP16"))
                 if _sysctl(f"hw.optional.arm.{feature}") == "1"}
        brand = _sysctl("machdep.cpu.brand_string") or platform.processor() or "unknown"
        return CpuInfo("Apple" if arch == "arm64" else "Intel", brand, arch, os.cpu_count() or 1, frozenset(flags))
    return CpuInfo("unknown", platform.processor() or "unknown", arch, os.cpu_count() or 1, frozenset())


@dataclass(frozen=True)
class CpuFacts:
    """What the CPU probe saw beyond the CPU itself: ITEX (``itex.compatible``: TensorFlow loads it, which changes
    what is safe and what exists), whether TensorFlow runs oneDNN (``None``: not read; Linux's default assumed), and
    AMD's ZenDNN plug-in."""

    itex: ItexStatus
    onednn: OneDnnState | None = None
    zentf: str | None = None  # AMD's ZenDNN plug-in for TensorFlow, where installed: its version
    zendnn_on: bool = False  # TF_ENABLE_ZENDNN_OPTS=1 where TensorFlow starts: zentf's kernels run
    math_mode: str | None = None  # ITEX_FP32_MATH_MODE as the user set it (kept), where ITEX is loaded

    @property
    def itex_loaded(self) -> bool:
        """Whether TensorFlow loads ITEX as a plugin when imported (``itex.compatible``)."""
        return self.itex.compatible


def _facts(probe: BackendProbe) -> CpuFacts | None:
    return probe.facts if isinstance(probe.facts, CpuFacts) else None


def onednn_of(probe: BackendProbe, cpu: CpuInfo) -> OneDnnState:
    """Whether TensorFlow runs oneDNN on the probed machine, as the probe read it.

    Args:
        probe: A CPU probe (`cpu_probe`).
        cpu: The probe's CPU.

    Returns:
        The probe's `OneDnnState`, or where it holds none, `onednn_state`'s for ``cpu`` on Linux with
        ``TF_ENABLE_ONEDNN_OPTS`` unset.
    """
    facts = _facts(probe)
    return facts.onednn if facts is not None and facts.onednn is not None else onednn_state(cpu, {}, system="linux")


def _state(probe: BackendProbe) -> tuple[CpuInfo, OneDnnState, bool]:
    """The probe's CPU, oneDNN's state there and whether ITEX is loaded: what every rule reads."""
    cpu = probe.cpu or UNKNOWN_CPU
    facts = _facts(probe)
    return cpu, onednn_of(probe, cpu), facts is not None and facts.itex_loaded


def cpu_probe(cpu: CpuInfo, itex: ItexStatus, *, onednn: OneDnnState | None = None,
              environ: Mapping[str, str] | None = None, system: str = "linux", reason: str | None = None,
              details: Iterable[tuple[str, str]] | None = None, zentf: str | None = None,
              zendnn_on: bool | None = None) -> BackendProbe:
    """The CPU probe of a machine with this CPU (the real probe's, a catalogue CPU's, the tests' fakes').

    Args:
        cpu: The CPU.
        itex: ITEX's status there; its ``tf_version`` is the TensorFlow there.
        onednn: Whether TensorFlow runs oneDNN there (default: as TensorFlow would decide, `onednn_state`).
        environ: The environment TensorFlow starts in, where ``onednn`` or ``zendnn_on`` is not given.
        system: The platform (``sys.platform``'s names), where ``onednn`` is not given.
        reason: The probe's summary (default: the CPU, its cores and its bf16 instructions).
        details: The probe's ``(key, value)`` details (default: ITEX's status and oneDNN's state).
        zentf: The installed version of AMD's ZenDNN plug-in (``zentf``), or ``None``.
        zendnn_on: Whether ``TF_ENABLE_ZENDNN_OPTS=1`` is set where TensorFlow starts (default: as ``environ`` says).

    Returns:
        The probe, with the CPU as its one device (``/CPU:0``).
    """
    if onednn is None:
        onednn = onednn_state(cpu, environ or {}, system=system, tf_version=itex.tf_version)
    if zendnn_on is None:
        zendnn_on = (environ or {}).get(rules.ZENDNN_VARIABLE) == "1"
    if reason is None:
        bf16 = f"native bf16 ({rules.bf16_flags(cpu)})" if cpu.native_bf16 else "no bf16 instructions"
        reason = f"{cpu.name}, {cpu.logical_cores} logical cores, {bf16}"
    if details is None:
        details = (("itex", itex.reason), ("oneDNN", ("on: " if onednn.enabled else "off: ") + onednn.why))
    caps = {cap for cap, has in ((BF16, cpu.native_bf16), (FP16, cpu.native_fp16)) if has}
    device = Accelerator("cpu", 0, cpu.name, "CPU", capabilities=frozenset(caps))
    return BackendProbe("cpu", True, reason, devices=(device,), cpu=cpu, details=tuple(details),
                        facts=CpuFacts(itex, onednn, zentf, zendnn_on, user_math_mode(environ or {})))


class CpuBackend(Backend):
    """The host CPU. Always available; used when no accelerator backend is."""

    name = "cpu"
    priority = 100
    tf_device_type = None

    @override
    def probe(self, *, use_tensorflow: bool = False) -> BackendProbe:
        cpu = probe_cpu()
        return cpu_probe(cpu, itex_status(), onednn=read_onednn_state(cpu, os.environ, tensorflow_version()),
                         zentf=installed_version(rules.ZENDNN_PACKAGE), environ=os.environ)

    @override
    def report_rows(self, probe: BackendProbe) -> list[tuple[str, str]]:
        cpu, facts = probe.cpu, _facts(probe)
        rows = [("device", ", ".join(d.tf_name for d in probe.devices) or "-"),
                ("model", cpu.name if cpu else "unknown")]
        if cpu:
            onednn = onednn_of(probe, cpu)
            rows += [
                ("architecture", f"{cpu.arch}, {cpu.logical_cores} logical cores"),
                ("flags that matter", ", ".join(sorted(cpu.flags & FLAGS_THAT_MATTER)) or "none"),
                ("native bf16", "yes" if cpu.native_bf16 else "no (no avx512_bf16 / amx_bf16 / Arm bf16)"),
                ("native fp16", "yes" if cpu.native_fp16 else "no"), ("AMX", "yes" if cpu.amx else "no"),
                ("oneDNN", ("on" if onednn.enabled else "off") + f" ({onednn.why})"),
            ]
        rows.append(("ITEX", (facts.itex.reason + ("; loaded with TensorFlow" if facts.itex_loaded else ""))
                     if facts else "-"))
        if cpu and facts:
            rows.append(("math library", rules.math_library(onednn, facts.itex_loaded, facts.zentf, facts.zendnn_on)))
        return rows

    @override
    def assess(self, probe: BackendProbe, hardware: Hardware) -> Assessment:
        cpu, onednn, itex_active = _state(probe)
        bf16 = rules.bf16_support(cpu, onednn, itex_active)
        if itex_active and cpu.amx:
            tf32 = math_mode_support(getattr(_facts(probe), "math_mode", None), "BF32", Support(
                NATIVE, "ITEX's BF32 math mode lets float32 matmuls use AMX bf16 units (ITEX_FP32_MATH_MODE=BF32)"))
        else:
            tf32 = Support(UNSUPPORTED, "TF32 is an NVIDIA Tensor Core format; CPUs have none"
                           + ("" if not itex_active else " (ITEX's BF32 mode needs AMX)"),
                           "an NVIDIA Tensor Core format; CPUs have none")
        fp8 = Support(EMULATED, "CPUs have no fp8 arithmetic: Keras's float8 layers run emulated (quantize-dequantize "
                                "around bfloat16 or float32 matmuls), slower than without them",
                      "CPUs have no fp8 arithmetic: emulated, slower")
        units = {}
        if cpu.amx:
            units["bfloat16"] = MatrixUnit("AMX tiles", 8)
            if itex_active:
                units["float32"] = MatrixUnit("AMX tiles (BF32)", 8)
        kept, kept_why = rules.float32_layers(cpu, onednn, itex_active)
        return Assessment(
            backend=self.name,
            devices=tuple(d.tf_name for d in probe.devices) or ("/CPU:0",),
            policies={"float32": rules.fp32_support(cpu, onednn, itex_active, bf16),
                      "mixed_float16": rules.fp16_support(cpu, onednn, itex_active), "mixed_bfloat16": bf16},
            preference=rules.preference(cpu, onednn, itex_active), tf32=tf32, xla=rules.xla_support(cpu),
            xla_default=False, fp8=fp8, matrix_units=units,
            steps_per_execution_why=("one training step per compiled call (Keras's default): more gained nothing for "
                                     "Keras fit on a CPU, where a step dwarfs fit's per-call overhead ("
                                     + quote(FIT_STEPS, *FIT_STEPS_CONFIGS) + ")"),
            steps_per_execution_evidence=evidence(FIT_STEPS, *FIT_STEPS_CONFIGS),
            float32_layers=kept,
            float32_layers_why=kept_why or "no layer was measured slower in bfloat16 than in float32 here",
            peers=rules.judge_peers(cpu, self.peers(probe)),
            graph_amp=rules.graph_amp_support(cpu, onednn, itex_active), graph_amp_dtypes=("bfloat16",))

    @override
    def vendor_settings(self, plan: Plan) -> tuple[VendorSetting, ...]:
        settings = []
        if plan.tf32:  # only ever native here: ITEX loaded on an AMX CPU
            settings.append(VendorSetting(MATH_MODE_VARIABLE, "BF32", "ITEX's BF32 math mode is how this CPU runs "
                                          "float32 matmuls on its AMX bf16 units (the plan's tf32=on)"))
        if plan.graph_amp:  # only ever bfloat16 here, where oneDNN runs it on bf16 instructions
            settings.append(VendorSetting(rules.GRAPPLER_BF16, "on", "TensorFlow's grappler rewrites the float32 "
                                          f"graph to {plan.graph_amp} for oneDNN (graph_amp=on)"))
        return tuple(settings)

    @override
    def apply(self, plan: Plan, tf: Any) -> list[str]:
        mode = plan.vendor_setting(MATH_MODE_VARIABLE)
        notes = [apply_math_mode(mode),
                 grappler_rewrite(tf, rules.GRAPPLER_BF16, plan.vendor_setting(rules.GRAPPLER_BF16) == "on"),
                 hide_accelerators(tf)]
        if (said := amp_variable_beside(plan.policy)) and itex_status().compatible:  # (ITEX loaded: it reads it)
            warn(said)
        return [note for note in notes if note]

    def peers(self, probe: BackendProbe) -> tuple[Peer, ...]:
        """oneDNN the other way round, TensorFlow's bfloat16 rewrite, ZenDNN where installed (`rules.peers`)."""
        facts = _facts(probe)
        return rules.peers(*_state(probe), facts.zentf if facts else None)

    def catalogue(self) -> tuple[KnownDevice, ...]:
        """The cpu devices of the device catalogue (``backends/cpu/catalogue.py``)."""
        return CATALOGUE

    def describe(self, device: KnownDevice) -> BackendProbe:
        """The probe this backend would give on a machine with the catalogue's ``device`` alone.

        Args:
            device: One of this backend's `catalogue` entries.

        Returns:
            `cpu_probe`'s probe of the device.
        """
        cpu = CpuInfo(device.cpu_vendor, device.device_name, device.arch, device.logical_cores,
                      frozenset(device.flags.split()), device.family, device.model_number)
        return cpu_probe(cpu, NO_ITEX, reason=device.title, details=())

    def kernel_audit(self) -> CpuKernelAudit:
        """oneDNN's verbose records (`verbose`), ``ONEDNN_VERBOSE=1`` in the child.

        Returns:
            The CPU's `CpuKernelAudit`.
        """
        return CpuKernelAudit(lambda: probe_cpu())  # looked up at each call: the tests' fake machines replace it


_REWRITES_SET: dict[str, bool | None] = {}  # the grappler rewrites this backend turned on: the value it found


def grappler_rewrite(tf: Any, name: str, on: bool) -> str | None:
    """Turn TensorFlow's grappler rewrite ``name`` (an option of ``tf.config.optimizer``) on for a plan that has
    it, or back to what it was for one that does not (only where this backend turned it on); it acts on graphs
    traced afterwards, not on eager ops. Returns a note for the log, or ``None`` where nothing changed."""
    if not on and name not in _REWRITES_SET:
        return None  # not ours to put back (TensorFlow is not even asked)
    found = tf.config.optimizer.get_experimental_options().get(name)
    if on:
        if found:
            return None  # on already (the user's, or ours from an earlier plan)
        _REWRITES_SET.setdefault(name, found)
        tf.config.optimizer.set_experimental_options({name: True})
        return f"grappler {name} on"
    before = _REWRITES_SET.pop(name)
    if not found:
        return None  # turned off since
    tf.config.optimizer.set_experimental_options({name: bool(before)})
    return f"grappler {name} back to {'on' if before else 'off'} (the plan has no graph rewrite)"


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
