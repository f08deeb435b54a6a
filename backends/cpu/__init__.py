"""The CPU backend: x86 (Intel, AMD) and Arm host processors."""

from .backend import CpuBackend, CpuFacts, parse_cpuinfo, probe_cpu

__all__ = ["CpuBackend", "CpuFacts", "parse_cpuinfo", "probe_cpu"]
