"""The CPU backend: x86 (Intel, AMD) and Arm host processors."""

from .backend import NO_ITEX, CpuBackend, CpuFacts, cpu_probe, parse_cpuinfo, probe_cpu
from .onednn import OneDnnState, onednn_state

__all__ = ["NO_ITEX", "CpuBackend", "CpuFacts", "OneDnnState", "cpu_probe", "onednn_state", "parse_cpuinfo",
           "probe_cpu"]
