"""The CPU backend: x86 (Intel, AMD) and Arm host processors."""

from .backend import CpuBackend, CpuFacts, parse_cpuinfo, probe_cpu
from .onednn import OneDnnState, onednn_state

__all__ = ["CpuBackend", "CpuFacts", "OneDnnState", "onednn_state", "parse_cpuinfo", "probe_cpu"]
