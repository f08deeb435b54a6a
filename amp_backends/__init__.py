"""amp_backends: hardware-aware mixed precision for TensorFlow/Keras.

``amp_backends.auto_configure()`` at the top of a training script detects the hardware (NVIDIA GPUs,
Intel GPUs through ITEX, CPUs), picks the fastest safe plan — dtype policy, loss scaling, TF32, XLA —,
applies it and says why. ``python -m amp_backends.info`` reports the same for humans or as JSON.

Importing this package does no work: it imports neither TensorFlow nor NVML, reads no environment
variable and writes no file. Everything below is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "auto_configure": ".configure",
    "current_plan": ".configure",
    "plan_for": ".configure",
    "Plan": ".plan",
    "make_plan": ".plan",
    "LossScale": ".options",
    "Request": ".options",
    "build_request": ".options",
    "probe_hardware": ".probe",
    "Hardware": ".hardware",
    "Accelerator": ".hardware",
    "CpuInfo": ".hardware",
    "BackendProbe": ".hardware",
    "AmpConfigError": ".errors",
    "UnsupportedRequestError": ".errors",
    "AmpWarning": ".errors",
    "BackendRegistry": ".registry",
    "default_registry": ".registry",
}

__all__ = sorted(_LAZY) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from .configure import auto_configure, current_plan, plan_for
    from .errors import AmpConfigError, AmpWarning, UnsupportedRequestError
    from .hardware import Accelerator, BackendProbe, CpuInfo, Hardware
    from .options import LossScale, Request, build_request
    from .plan import Plan, make_plan
    from .probe import probe_hardware
    from .registry import BackendRegistry, default_registry


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'amp_backends' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
