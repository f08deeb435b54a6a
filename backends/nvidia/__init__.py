"""The NVIDIA backend: CUDA GPUs, probed through NVML (nvidia-ml-py) without initialising CUDA."""

from .backend import NvidiaBackend, NvidiaFacts, derive_capabilities, gpu_device, gpu_probe
from .nvml import NvmlGpu, cuda_enumeration, explain_library_failure, parse_visible_devices, visible_gpus

__all__ = ["NvidiaBackend", "NvidiaFacts", "NvmlGpu", "cuda_enumeration", "derive_capabilities",
           "explain_library_failure", "gpu_device", "gpu_probe", "parse_visible_devices", "visible_gpus"]
