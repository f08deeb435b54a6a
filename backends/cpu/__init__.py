"""The CPU backend: x86 (Intel, AMD) and Arm host processors."""

from .backend import CpuBackend, CpuFacts, parse_cpuinfo, probe_cpu
from .onednn import OneDnnState, onednn_state
from .verbose import CpuKernelAudit

__all__ = ["CpuBackend", "CpuFacts", "CpuKernelAudit", "OneDnnState", "onednn_state", "parse_cpuinfo", "probe_cpu"]
