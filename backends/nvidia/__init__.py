"""The NVIDIA backend: CUDA GPUs, probed through NVML (nvidia-ml-py) without initialising CUDA."""

from .backend import NvidiaBackend, NvidiaFacts, derive_capabilities, gpu_device, gpu_probe
from .kernels import NvidiaKernelAudit, classify, read_trace
from .nvml import NvmlGpu, cuda_enumeration, explain_library_failure, parse_visible_devices, visible_gpus

__all__ = ["NvidiaBackend", "NvidiaFacts", "NvidiaKernelAudit", "NvmlGpu", "classify", "cuda_enumeration",
           "derive_capabilities", "explain_library_failure", "gpu_device", "gpu_probe", "parse_visible_devices",
           "read_trace", "visible_gpus"]
