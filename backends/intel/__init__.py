"""The Intel GPU backend: XPUs (Data Center GPU Max, Flex, Arc) through Intel Extension for TensorFlow."""

from .backend import IntelBackend, classify_xpu

__all__ = ["IntelBackend", "classify_xpu"]
