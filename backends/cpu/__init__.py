"""The CPU backend: x86 (Intel, AMD) and Arm host processors."""

from .backend import NO_ITEX, CpuBackend, CpuFacts, cpu_probe, parse_cpuinfo, probe_cpu
from .onednn import OneDnnState, onednn_state
from .verbose import CpuKernelAudit

__all__ = ["NO_ITEX", "CpuBackend", "CpuFacts", "CpuKernelAudit", "OneDnnState", "cpu_probe", "onednn_state",
           "parse_cpuinfo", "probe_cpu"]
