"""The NVIDIA backend: CUDA GPUs, probed through NVML (nvidia-ml-py) without initialising CUDA."""

from .backend import NvidiaBackend, derive_capabilities, parse_visible_devices

__all__ = ["NvidiaBackend", "derive_capabilities", "parse_visible_devices"]
