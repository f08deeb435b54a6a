"""The NVIDIA backend: CUDA GPUs, probed through NVML (nvidia-ml-py) without initialising CUDA."""

from .capability import COMPUTE_CAPABILITY, capability_facts, compute_capability
from .backend import NvidiaBackend, NvidiaFacts, derive_capabilities, gpu_device, gpu_probe
from .kernels import NvidiaKernelAudit, classify, read_trace
from .nvml import NvmlGpu, cuda_enumeration, explain_library_failure, parse_visible_devices, visible_gpus

__all__ = ["COMPUTE_CAPABILITY", "NvidiaBackend", "NvidiaFacts", "NvidiaKernelAudit", "NvmlGpu", "capability_facts",
           "classify", "compute_capability", "cuda_enumeration", "derive_capabilities", "explain_library_failure",
           "gpu_device", "gpu_probe", "parse_visible_devices", "read_trace", "visible_gpus"]
