"""Intel XPUs through Intel Extension for TensorFlow (ITEX, end-of-life, TensorFlow 2.15): probe and plan rules.

XPUs are listed through TensorFlow with ITEX loaded, so this probe runs only once TensorFlow is imported; it
trusts the listed devices, never ``itex.get_backend()`` (which says GPU with only the CPU backend). Rules, from
Intel's ITEX 2.15 documentation (no Intel GPU was measured): XMX (Max, Flex, Arc) -> mixed_bfloat16, plus TF32
math mode on Xe-HPC (Max); no XMX -> mixed_float16 with dynamic loss scaling; XLA off (ITEX fuses graphs itself).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from typing_extensions import override

from amp_backends.backend_api import warn
from amp_backends.assessment import EMULATED, NATIVE, UNSUPPORTED, Assessment, MatrixUnit, Support, VendorSetting
from amp_backends.hardware import KnownDevice, BF16, FP16, TF32, XMX, Accelerator, BackendProbe, Hardware
from amp_backends.kernel_audit import KernelAudit
from amp_backends.plan import Plan
from amp_backends.registry import Backend

from .catalogue import CATALOGUE
from .itex import (AMP_SETTING, ITEX_EOL, MATH_MODE_VARIABLE, ItexStatus, amp_variable_beside, apply_math_mode,
                   configure_itex_amp, itex_libraries, itex_software_row, itex_status, math_mode_support,
                   user_math_mode)


# The ITEX a described Intel GPU runs under (the device catalogue's assumption).
CATALOGUE_ITEX = ItexStatus("2.15.0.0", "2.15.1", True,
                            "ITEX 2.15.0.0 with TensorFlow 2.15.1 (the catalogue's assumption)")


# The matrix unit of each dtype, where every XPU in use has the capability it needs.
MATRIX_UNITS = (("float16", XMX, MatrixUnit("XMX engines", 8)), ("bfloat16", XMX, MatrixUnit("XMX engines", 8)),
                ("float32", TF32, MatrixUnit("XMX engines (TF32)", 4)))


@dataclass(frozen=True)
class IntelFacts:
    """What the Intel probe saw beyond devices: ITEX's status and its native backends (``cpu``, ``gpu``)."""

    itex: ItexStatus
    native_backends: tuple[str, ...] = ()
    math_mode: str | None = None  # ITEX_FP32_MATH_MODE as the user set it (kept)


def classify_xpu(index: int, name: str, has_xmx: bool | None = None, is_xehpc: bool | None = None,
                 memory_bytes: int | None = None) -> Accelerator:
    """An `Accelerator` for an Intel GPU, from its name and ITEX's ``has_xmx``/``is_xehpc`` answers.

    Args:
        index: TensorFlow's index of it (``/XPU:<index>``).
        name: Its name as TensorFlow's device details give it (``"Intel(R) Data Center GPU Max 1550"``).
        has_xmx: ITEX's ``has_xmx()``, where asked (``None``: the name decides).
        is_xehpc: ITEX's ``is_xehpc()``, where asked (``None``: the name decides).
        memory_bytes: Its memory, where known.

    Returns:
        The device: float16 everywhere; XMX and bfloat16 with XMX engines; TF32 on Xe-HPC.
    """
    upper = name.upper()
    xehpc = bool(is_xehpc) or " MAX" in upper or "PONTE VECCHIO" in upper
    xmx = bool(has_xmx) or xehpc or "FLEX" in upper or "ARC" in upper
    caps = {FP16} | ({XMX, BF16} if xmx else set()) | ({TF32} if xehpc else set())
    return Accelerator("intel", index, name, "XPU", memory_bytes=memory_bytes, capabilities=frozenset(caps))


def xpu_probe(names: Iterable[str], facts: IntelFacts, *, has_xmx: bool | None = None, is_xehpc: bool | None = None,
              memory_bytes: int | None = None, details: Iterable[tuple[str, str]] = (),
              reason: str | None = None) -> BackendProbe:
    """The available Intel probe of a machine with these XPUs (the real probe's, a catalogue GPU's, the tests').

    Args:
        names: Each XPU's name, in TensorFlow's order (`classify_xpu`).
        facts: ITEX's status and native backends.
        has_xmx: ITEX's ``has_xmx()`` for them, where asked.
        is_xehpc: ITEX's ``is_xehpc()`` for them, where asked.
        memory_bytes: Each XPU's memory, where known.
        details: The probe's ``(key, value)`` details for people.
        reason: The probe's summary (default: the XPUs).

    Returns:
        The probe, its devices numbered ``/XPU:0``, ``/XPU:1``, ... in the order given.
    """
    devices = tuple(classify_xpu(index, name, has_xmx, is_xehpc, memory_bytes) for index, name in enumerate(names))
    if reason is None:
        reason = f"{len(devices)} XPU(s): " + ", ".join(d.name for d in devices)
    return BackendProbe("intel", True, reason, devices=devices, details=tuple(details), facts=facts)


class IntelBackend(Backend):
    """Intel GPUs (XPU devices) through ITEX."""

    name = "intel"
    priority = 200
    tf_device_type = "XPU"

    @override
    def probe(self, *, use_tensorflow: bool = False) -> BackendProbe:
        itex = itex_status()
        if not itex.installed:
            return BackendProbe(self.name, False,
                                "no Intel GPU: " + itex.reason + " (pip install 'amp-backends[intel]')",
                                facts=IntelFacts(itex))
        native = tuple(itex_libraries())
        facts = IntelFacts(itex, native, user_math_mode())
        details = [("itex_version", itex.version or "-"), ("itex_status", ITEX_EOL),
                   ("itex_native_backends", ", ".join(native) or "none found")]
        if not itex.compatible:
            return BackendProbe(self.name, False, "no Intel GPU usable: " + itex.reason, details=tuple(details),
                                facts=facts)
        if not use_tensorflow and "tensorflow" not in sys.modules:
            return BackendProbe(self.name, False, "not probed: Intel XPUs are listed through TensorFlow, which is not "
                                "imported yet (auto_configure() and `amp-backends info` probe them)",
                                details=tuple(details), facts=facts, needs_tensorflow=True)
        try:
            import tensorflow as tf

            xpus = tf.config.list_physical_devices("XPU")
            has_xmx = is_xehpc = None
            try:
                import intel_extension_for_tensorflow as itex_mod

                details.append(("itex_get_backend", f"{_text(itex_mod.get_backend())} (not used: it says GPU even "
                                                    "with only the CPU backend)"))
                if xpus:
                    has_xmx, is_xehpc = bool(itex_mod.has_xmx()), bool(itex_mod.is_xehpc())
            except Exception as exc:
                details.append(("itex_import", f"failed: {type(exc).__name__}: {exc}"))
            names: list[str] = []
            for dev in xpus:
                try:
                    names.append(tf.config.experimental.get_device_details(dev).get("device_name") or "Intel XPU")
                except Exception:
                    names.append("Intel XPU")
        except Exception as exc:
            return BackendProbe(self.name, False,
                                f"no Intel GPU: probing through TensorFlow failed ({type(exc).__name__}: {exc})",
                                details=tuple(details), facts=facts)
        if not names:
            return BackendProbe(self.name, False, "no Intel GPU: TensorFlow with ITEX lists no XPU device"
                                + (" (ITEX's CPU backend only)" if "gpu" not in native else ""),
                                details=tuple(details), facts=facts)
        return xpu_probe(names, facts, has_xmx=has_xmx, is_xehpc=is_xehpc, details=details)

    @override
    def report_rows(self, probe: BackendProbe) -> list[tuple[str, str]]:
        return [*super().report_rows(probe)[:1],
                *((f"XPU {d.index}", f"{d.name}; " + ", ".join(sorted(d.capabilities))) for d in probe.devices),
                *((k.replace("_", " "), v) for k, v in probe.details)]

    @override
    def software_rows(self) -> list[tuple[str, str]]:
        return [itex_software_row(itex_status())]

    @override
    def assess(self, probe: BackendProbe, hardware: Hardware) -> Assessment:
        devices = probe.devices
        all_have = lambda cap: all(d.has(cap) for d in devices)  # noqa: E731
        names = ", ".join(sorted({d.name for d in devices}))
        if all_have(XMX) and all_have(BF16):
            bf16 = Support(NATIVE, f"{names}: XMX engines run bfloat16 at the float16 rate and bfloat16 needs no loss "
                                   "scaling (Intel's recommended type for ITEX)",
                           "XMX engines run bfloat16 at float16's rate, without loss scaling")
            fp16 = Support(NATIVE, f"{names}: XMX runs float16 too, but it needs loss scaling for the same speed",
                           "XMX runs float16 too, but it needs loss scaling")
            preference = ("mixed_bfloat16", "mixed_float16", "float32")
        else:
            bf16 = Support(EMULATED, f"{names}: no XMX engines, so no bfloat16 arithmetic",
                           "no XMX engines, so no bfloat16 arithmetic")
            fp16 = Support(NATIVE, f"{names}: native float16 arithmetic (no XMX); with dynamic loss scaling",
                           "native float16 arithmetic (no XMX), with dynamic loss scaling")
            preference = ("mixed_float16", "float32", "mixed_bfloat16")
        fp32 = Support(NATIVE, "float32 leaves the XPU's low-precision throughput unused")
        if all_have(TF32):
            facts = probe.facts if isinstance(probe.facts, IntelFacts) else None
            tf32 = math_mode_support(facts.math_mode if facts else None, "TF32", Support(
                NATIVE, "ITEX_FP32_MATH_MODE=TF32 lets float32 matmuls use the Xe-HPC XMX engines",
                "ITEX's TF32 math mode runs float32 matmuls on the XMX engines"))
        else:
            tf32 = Support(UNSUPPORTED, f"{names}: no TF32 on this XPU (only Data Center GPU Max has it)",
                           "no TF32 on this XPU (only Data Center GPU Max has it)")
        xla = Support(UNSUPPORTED, "ITEX's XPU plugin does not run XLA jit_compile clusters; it fuses graphs itself")
        fp8 = Support(EMULATED, f"{names}: ITEX has no fp8 matrix path "
                                "(and needs TensorFlow 2.15, whose Keras 2 has no float8 layers)",
                      "ITEX has no fp8 matrix path")
        units = {dtype: unit for dtype, need, unit in MATRIX_UNITS if all_have(need)}
        return Assessment(
            backend=self.name, devices=tuple(f"/XPU:{d.index}" for d in devices),
            policies={"float32": fp32, "mixed_float16": fp16, "mixed_bfloat16": bf16}, preference=preference,
            tf32=tf32, xla=xla, xla_default=False, fp8=fp8, matrix_units=units,
            graph_amp=Support(NATIVE, "ITEX's Advanced Auto Mixed Precision (itex.set_config) rewrites the graph"))

    @override
    def vendor_settings(self, plan: Plan) -> tuple[VendorSetting, ...]:
        settings = []
        if plan.tf32:
            settings.append(VendorSetting(MATH_MODE_VARIABLE, "TF32",
                                          "ITEX's TF32 math mode is how an XPU runs float32 "
                                          "matmuls on its XMX engines (the plan's tf32=on)"))
        if plan.graph_amp:
            settings.append(VendorSetting(AMP_SETTING, plan.graph_amp.upper(), "ITEX rewrites the float32 graph to "
                                          f"{plan.graph_amp} (graph_amp=on)"))
        return tuple(settings)

    @override
    def apply(self, plan: Plan, tf: Any) -> list[str]:
        mode, amp = plan.vendor_setting(MATH_MODE_VARIABLE), plan.vendor_setting(AMP_SETTING)
        if said := amp_variable_beside(plan.policy):
            warn(said)
        return [note for note in (apply_math_mode(mode), configure_itex_amp(amp) if amp else None) if note]

    def catalogue(self) -> tuple[KnownDevice, ...]:
        """The intel devices of the device catalogue (``backends/intel/catalogue.py``)."""
        return CATALOGUE

    def describe(self, device: KnownDevice) -> BackendProbe:
        """The probe this backend would give on a machine with the catalogue's ``device`` alone.

        Args:
            device: One of this backend's `catalogue` entries.

        Returns:
            `xpu_probe`'s probe of the device.
        """
        facts = IntelFacts(CATALOGUE_ITEX, ("gpu",))
        return xpu_probe([device.device_name], facts, memory_bytes=device.memory_bytes)

    def kernel_audit(self) -> XpuKernelAudit:
        """Nothing is read on an XPU, and the audit says why.

        Returns:
            The Intel backend's `XpuKernelAudit`.
        """
        return XpuKernelAudit()


XPU_REASON = ("not measured on XPU: what ran on an Intel GPU is not read. ITEX routes its matmuls and convolutions "
              "through oneDNN's GPU engine and TensorFlow's profiler, and what either prints there has not been "
              "checked on an Intel GPU; ITEX is end-of-life (TensorFlow <= 2.16). "
              "`amp-backends check` still reads the graph")


class XpuKernelAudit(KernelAudit):
    """What ran on an Intel GPU is not read (`XPU_REASON`): the audit reports it as not measured, without running."""

    device = "xpu"
    unavailable = XPU_REASON


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
