"""The Intel GPU backend: XPUs (Data Center GPU Max, Flex, Arc) through Intel Extension for TensorFlow."""

from .backend import IntelBackend, IntelFacts, classify_xpu, xpu_probe
from .itex import ItexStatus, itex_status

__all__ = ["IntelBackend", "IntelFacts", "ItexStatus", "classify_xpu", "itex_status", "xpu_probe"]
