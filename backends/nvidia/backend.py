"""NVIDIA GPUs: NVML probe and plan rules.

Capabilities follow the compute capability (CC): Tensor Cores from 7.0 (Volta; not the GTX 16xx), bf16 and TF32
from 8.0 (Ampere), fp8 from 8.9. Devices are numbered as CUDA numbers them (`cuda_enumeration`), so the plan's
``/GPU:0`` is TensorFlow's. The figures the reasons quote come from the committed results files (`measured`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from typing_extensions import override

from amp_backends.backend_api import (EMULATED, FUNCTIONAL, NATIVE, UNSUPPORTED, Assessment, Evidence, MatrixUnit,
                                      Support, quote_results, results_evidence)
from amp_backends.hardware import KnownDevice, BF16, FP8, FP16, TENSOR_CORES, TF32, Accelerator, BackendProbe, Hardware
from amp_backends.registry import Backend
from amp_backends.software import installed_version

from . import measured
from .capability import capability_facts, cc_text, compute_capability
from .catalogue import CATALOGUE
from .kernels import NvidiaKernelAudit
from .nvml import FASTEST_FIRST, NvmlGpu, optional, as_text, nvml_start_failure, read_nvml_gpus, visible_gpus

# TensorFlow's grappler has a float16 rewrite for CUDA GPUs, which the plan does not offer (graph_amp=on).
GRAPH_AMP = Support(
    UNSUPPORTED, "TensorFlow's grappler has a float16 graph rewrite for NVIDIA GPUs (auto_mixed_precision), but the "
                 "plan does not offer it: the Keras mixed_float16 policy, with the plan's loss scaling, is the "
                 "supported path (the rewrite leaves loss scaling to the training code, and TensorFlow deprecated its "
                 "API, enable_mixed_precision_graph_rewrite, for the Keras policy)",
    "not offered: the Keras mixed_float16 policy is the supported path")

# The matrix unit of each dtype, where every GPU in use has the capabilities it needs.
MATRIX_UNITS = (("float16", (TENSOR_CORES,), MatrixUnit("Tensor Cores", 8)),
                ("bfloat16", (BF16, TENSOR_CORES), MatrixUnit("Tensor Cores", 8)),
                ("float32", (TF32,), MatrixUnit("TF32 Tensor Cores", 4)),
                ("float8", (FP8,), MatrixUnit("fp8 Tensor Cores", 16)))

FIT_ONE, FIT_MANY = "fit at 1 step per call", re.compile(r"fit at (\d+) steps per call")
FP16_XLA, BF16_XLA, TF32_XLA = "mnist: fp16 dynamic+XLA", "mnist: bf16+XLA", "mnist: TF32+XLA"
FP16_NO_XLA, BF16_NO_XLA, TF32_NO_XLA = "mnist: fp16 dynamic", "mnist: bf16", "mnist: TF32"


def _fastest() -> tuple[str, tuple[Evidence, ...]]:
    """The tutorials' MNIST loop under float16, bfloat16 and TF32 (each with XLA), as the reasons quote it."""
    results = measured.suite()
    said = quote_results(results, measured.GPU_SUITE, FP16_XLA, BF16_XLA, TF32_XLA)
    ratio = results.ratio(FP16_XLA, BF16_XLA) if results else None
    if results is not None and ratio is not None:
        said += (f"; bfloat16 within {abs(ratio - 1) * 100:.0f}% of float16: one median each, no clear winner"
                 if abs(ratio - 1) < 0.05 else f"; float16 {results.times(FP16_XLA, BF16_XLA)} bfloat16")
    return said, results_evidence(results, FP16_XLA, BF16_XLA, TF32_XLA)


def _fit_steps() -> tuple[str, tuple[Evidence, ...]]:
    """Keras ``fit`` under the plan at one step per compiled call and at many: the reason, its evidence."""
    results = measured.fit_calls()
    found = next(filter(None, map(FIT_MANY.fullmatch, results.medians)), None) if results else None
    if results is None or found is None or not results.has(FIT_ONE):
        return ("Keras's default of one step per compiled call: no GPU measurement of fit with more steps per call "
                f"is committed ({quote_results(results, measured.EXPERIMENTS, FIT_ONE)})"), ()
    many, steps = found.group(0), found.group(1)
    return (f"Keras's default of one step per compiled call, which keeps per-batch callbacks after every batch: fit "
            f"under the plan ran {results.times(many, FIT_ONE)} as fast at {steps} steps per call, one epoch there "
            f"({results.quote(FIT_ONE, many)}); pass steps_per_execution=N to compile() where no callback needs "
            "every batch. The plan keeps one step until more models than the MNIST CNN are measured",
            results_evidence(results, FIT_ONE, many))


def _xla() -> tuple[str, str, tuple[Evidence, ...]]:
    """What XLA did to each configuration of the tutorials' MNIST loop: the reason, its brief, the evidence."""
    results = measured.suite()
    if results is None:
        return (quote_results(results, measured.GPU_SUITE), "fuses mixed precision's element-wise ops",  ())
    gains = ", ".join(f"{name} {results.times(on, off)}" for name, on, off in
                      (("float16", FP16_XLA, FP16_NO_XLA), ("bfloat16", BF16_XLA, BF16_NO_XLA),
                       ("TF32", TF32_XLA, TF32_NO_XLA)))
    figures = (FP16_NO_XLA, FP16_XLA, BF16_NO_XLA, BF16_XLA, TF32_NO_XLA, TF32_XLA)
    return (f"XLA fuses the many small element-wise ops of mixed precision: {gains} "
            f"({results.quote(*figures)}); on an unfamiliar chip, check with autotune",
            f"fuses mixed precision's element-wise ops: {results.times(FP16_XLA, FP16_NO_XLA)} float16 throughput "
            "measured", results_evidence(results, *figures))


def _tf32() -> tuple[str, str, tuple[Evidence, ...]]:
    """TF32's matmul rate against float32's: the reason, its brief, the evidence."""
    results = measured.peaks()
    ratio = results.times("tf32 matmul", "float32 matmul") if results else "much"
    return (quote_results(results, measured.MATMUL_PEAK, "tf32 matmul", "float32 matmul", unit="TFLOP/s"),
            f"TF32 Tensor Cores run the float32 parts ({ratio} float32's matmul rate measured)",
            results_evidence(results, "tf32 matmul", "float32 matmul", unit="TFLOP/s"))


def derive_capabilities(name: str, cc: tuple[int, int] | None) -> frozenset[str]:
    """Capabilities of an NVIDIA GPU from its name and compute capability."""
    if cc is None:
        return frozenset()
    caps: set[str] = set()
    # Turing GTX 16xx (TU116/TU117, CC 7.5) have no Tensor Cores.
    gtx16 = "GTX 16" in name.upper()
    if cc >= (7, 0) and not gtx16:
        caps.add(TENSOR_CORES)
    # Fast fp16 arithmetic: Tensor Cores, or the double-rate fp16 units of P100 (6.0), Jetson TX2 (6.2), GTX 16xx.
    if TENSOR_CORES in caps or cc in ((6, 0), (6, 2)) or gtx16:
        caps.add(FP16)
    if cc >= (8, 0):
        caps.update({BF16, TF32})
    if cc >= (8, 9):
        caps.add(FP8)
    return frozenset(caps)


@dataclass(frozen=True)
class NvidiaFacts:
    """What the NVIDIA probe saw beyond the visible devices: the driver, NVML's GPUs and CUDA's device order."""

    driver: str | None = None
    driver_cuda: str | None = None
    device_order: str = FASTEST_FIRST
    nvml_gpus: tuple[NvmlGpu, ...] = ()


def gpu_device(index: int, name: str, cc: tuple[int, int] | None, memory_bytes: int | None = None,
               pci_bus_id: str | None = None) -> Accelerator:
    """One NVIDIA GPU as the probe reports it, its compute capability among its facts (`capability_facts`).

    Args:
        index: TensorFlow's index of it (``/GPU:<index>``): its place in CUDA's enumeration order.
        name: Its name as NVML reports it (``"NVIDIA H100 80GB HBM3"``).
        cc: Its compute capability (``(9, 0)``), or ``None`` where unknown.
        memory_bytes: Its memory, where known.
        pci_bus_id: Its PCI bus id, where known.

    Returns:
        The device, with `derive_capabilities`'s capabilities.
    """
    return Accelerator("nvidia", index, name, "GPU", capability_facts(cc), memory_bytes, derive_capabilities(name, cc),
                       pci_bus_id)


def gpu_probe(gpus: Iterable[tuple[Any, ...]], *, details: Iterable[tuple[str, str]] = (),
              facts: NvidiaFacts | None = None, reason: str | None = None) -> BackendProbe:
    """The available NVIDIA probe of a machine with these GPUs (the real probe's, a catalogue GPU's, the tests').

    Args:
        gpus: Each GPU's `gpu_device` figures after its index, in CUDA's order: name, compute capability, and
            optionally memory in bytes and PCI bus id (``("NVIDIA H100 80GB HBM3", (9, 0), 80 * GB)``).
        details: The probe's ``(key, value)`` details for people.
        facts: What the probe saw beyond the devices (driver, NVML's GPUs, CUDA's device order), where it looked.
        reason: The probe's summary (default: the GPUs and their compute capabilities).

    Returns:
        The probe, its devices numbered ``/GPU:0``, ``/GPU:1``, ... in the order given.
    """
    devices = tuple(gpu_device(index, *gpu) for index, gpu in enumerate(gpus))
    if reason is None:
        reason = f"{len(devices)} GPU(s): " + ", ".join(f"{d.name} (CC {cc_text(d)})" for d in devices)
    return BackendProbe("nvidia", True, reason, devices=devices, details=tuple(details), facts=facts)


class NvidiaBackend(Backend):
    """CUDA GPUs through TensorFlow's GPU devices."""

    name = "nvidia"
    priority = 300
    tf_device_type = "GPU"

    @override
    def probe(self, *, use_tensorflow: bool = False) -> BackendProbe:
        try:
            import pynvml  # from nvidia-ml-py
        except ImportError:
            return BackendProbe(self.name, False,
                                "no NVIDIA GPU: nvidia-ml-py is not installed (pip install nvidia-ml-py)")
        details: list[tuple[str, str]] = []
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            return BackendProbe(self.name, False,
                                f"no NVIDIA GPU: NVML could not start ({nvml_start_failure(pynvml, exc)})")
        try:
            driver = as_text(pynvml.nvmlSystemGetDriverVersion())
            details.append(("driver", driver))
            cuda = optional(pynvml.nvmlSystemGetCudaDriverVersion_v2)
            driver_cuda = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
            if driver_cuda:
                details.append(("driver_cuda", driver_cuda))
            gpus = read_nvml_gpus(pynvml)
        except Exception as exc:
            return BackendProbe(self.name, False, f"no NVIDIA GPU: NVML error ({as_text(exc) or type(exc).__name__})",
                                details=tuple(details))
        finally:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
        visible, order = visible_gpus(gpus, os.environ)
        facts = NvidiaFacts(driver, driver_cuda, order, tuple(gpus))
        details.append(("CUDA_device_order", order + (" (CUDA's default)" if order == FASTEST_FIRST else "")))
        if gpus and len(visible) < len(gpus):
            details.append(("hidden_by_CUDA_VISIBLE_DEVICES", str(len(gpus) - len(visible))))
        if not visible:
            why = "NVML reports no GPU" if not gpus else "CUDA_VISIBLE_DEVICES hides every GPU"
            return BackendProbe(self.name, False, f"no NVIDIA GPU: {why}", details=tuple(details), facts=facts)
        return gpu_probe([(g.name, g.compute_capability, g.memory_bytes, g.pci_bus_id) for g in visible],
                         details=details, facts=facts)

    @override
    def software_rows(self) -> list[tuple[str, str]]:
        return [("nvidia-ml-py", installed_version("nvidia-ml-py") or "not installed (no NVML probes)")]

    @override
    def report_rows(self, probe: BackendProbe) -> list[tuple[str, str]]:
        rows = super().report_rows(probe)[:1]
        for d in probe.devices:
            mem = f", {d.memory_bytes / 2**30:.0f} GiB" if d.memory_bytes else ""
            pci = f", PCI {d.pci_bus_id}" if d.pci_bus_id else ""
            rows.append((f"GPU {d.index}", f"{d.name}, CC {cc_text(d)}{mem}{pci}; "
                         + (", ".join(sorted(d.capabilities)) or "no Tensor Cores")))
        rows += [(k.replace("_", " "), v) for k, v in probe.details]
        return rows

    @override
    def assess(self, probe: BackendProbe, hardware: Hardware) -> Assessment:
        devices = probe.devices
        weakest = min(devices, key=lambda d: compute_capability(d) or (0, 0))
        all_have = lambda cap: all(d.has(cap) for d in devices)  # noqa: E731
        ccs = ", ".join(sorted({cc_text(d) for d in devices}))
        mixed = len({compute_capability(d) for d in devices}) > 1
        who = f"{weakest.name} (CC {cc_text(weakest)})" + (" is the weakest of the GPUs in use" if mixed else "")

        fastest, fastest_evidence = _fastest()
        if all_have(TENSOR_CORES):
            fp16 = Support(NATIVE, f"{who} has float16 Tensor Cores; float16 with dynamic loss scaling"
                           + (f" was the fastest configuration measured ({fastest})" if all_have(BF16) else ""),
                           "float16 Tensor Cores, with dynamic loss scaling"
                           + ("; the fastest measured" if all_have(BF16) else ""),
                           fastest_evidence if all_have(BF16) else ())
        elif all_have(FP16):
            fp16 = Support(FUNCTIONAL, f"{who} has fast float16 arithmetic but no Tensor Cores: "
                                       "little speed-up over float32",
                           "fast float16 but no Tensor Cores: little speed-up")
        else:
            fp16 = Support(EMULATED, f"{who} has no Tensor Cores and slow float16 arithmetic: "
                                     "float16 is slower than float32",
                           "no Tensor Cores, slow float16: slower than float32")
        if all_have(BF16):
            bf16 = Support(NATIVE, f"{who} has bfloat16 Tensor Cores, "
                                   f"but bfloat16 was not faster than float16 ({fastest})",
                           "bfloat16 Tensor Cores, but not faster than float16 measured", fastest_evidence)
        else:
            bf16 = Support(EMULATED, f"{who} has no bfloat16 arithmetic (needs CC >= 8.0): TensorFlow emulates it, "
                                     "slower than float32", "no bfloat16 arithmetic (CC < 8.0): emulated, slower")
        if all_have(TENSOR_CORES):
            fp32 = Support(NATIVE, "float32 leaves the Tensor Cores' float16 throughput unused"
                           + (" (TF32 only)" if all_have(TF32) else ""),
                           "leaves the Tensor Cores' float16 throughput unused")
            preference = ("mixed_float16", "mixed_bfloat16", "float32")
        else:
            fp32 = Support(NATIVE, f"{who} has no Tensor Cores (needs CC >= 7.0, and not a GTX 16xx): float32 is "
                                   "the fastest safe choice", "no Tensor Cores: the fastest safe choice")
            preference = ("float32", "mixed_float16", "mixed_bfloat16")

        if all_have(TF32):
            tf32_said, tf32_brief, tf32_evidence = _tf32()
            tf32 = Support(NATIVE, f"TF32 Tensor Cores (CC {ccs}) run the float32 parts of the model (chained "
                                   f"8192x8192 matmuls, {tf32_said})", tf32_brief, tf32_evidence)
        else:
            tf32 = Support(UNSUPPORTED, f"TF32 needs CC >= 8.0 (Ampere); {who} has none",
                           "TF32 needs CC >= 8.0 (Ampere)")
        xla_why, xla_brief, xla_evidence = _xla()
        fit_steps_why, fit_steps_evidence = _fit_steps()
        xla = Support(NATIVE, xla_why, xla_brief, xla_evidence)
        if all_have(FP8):
            fp8 = Support(NATIVE, f"{who} has fp8 Tensor Cores (CC >= 8.9): "
                                  "with XLA, Keras's float8 Dense and EinsumDense layers run as fp8 GEMMs "
                                  "(e4m3 forward, e5m2 gradients, delayed scaling)",
                          "fp8 Tensor Cores: with XLA, float8 Dense layers run as fp8 GEMMs")
        else:
            fp8 = Support(EMULATED, f"{who} has no fp8 Tensor Cores (they need CC >= 8.9: Ada and Hopper GPUs "
                                    "such as the L4 and H100): Keras's "
                                    "float8 layers would only be emulated, slower than without them",
                          "no fp8 Tensor Cores (CC < 8.9): float8 layers would be emulated, slower")
        units = {dtype: unit for dtype, needs, unit in MATRIX_UNITS if all(map(all_have, needs))}
        notes = (f"GPUs of different compute capabilities ({ccs}): the plan follows the weakest",) if mixed else ()
        return Assessment(
            backend=self.name, devices=tuple(d.tf_name for d in devices),
            policies={"float32": fp32, "mixed_float16": fp16, "mixed_bfloat16": bf16}, preference=preference,
            tf32=tf32, xla=xla, xla_default=True, graph_amp=GRAPH_AMP, notes=notes, fp8=fp8, matrix_units=units,
            steps_per_execution_why=fit_steps_why, steps_per_execution_evidence=fit_steps_evidence)

    def catalogue(self) -> tuple[KnownDevice, ...]:
        """The nvidia devices of the device catalogue (``backends/nvidia/catalogue.py``)."""
        return CATALOGUE

    def describe(self, device: KnownDevice) -> BackendProbe:
        """The probe this backend would give on a machine with the catalogue's ``device`` alone.

        Args:
            device: One of this backend's `catalogue` entries.

        Returns:
            `gpu_probe`'s probe of the device.
        """
        gpu = (device.device_name, compute_capability(device), device.memory_bytes)
        return gpu_probe([gpu], facts=NvidiaFacts())

    def kernel_audit(self) -> NvidiaKernelAudit:
        """The profiler's trace, every GPU kernel classified by name.

        Returns:
            The NVIDIA backend's `NvidiaKernelAudit`.
        """
        return NvidiaKernelAudit()
