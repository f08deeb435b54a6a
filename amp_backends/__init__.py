"""amp_backends: hardware-aware mixed precision for TensorFlow/Keras.

``amp_backends.auto_configure()`` at the top of a training script detects the hardware (NVIDIA GPUs,
Intel GPUs through ITEX, CPUs), picks the fastest safe plan — dtype policy, loss scaling, TF32, XLA —,
applies it and says why. ``python -m amp_backends.info`` reports the same for humans or as JSON.

Importing this package does no work: it imports neither TensorFlow nor NVML, reads no environment
variable and writes no file. Everything below is loaded on first use. This module is the package's
face: the modules inside import each other (relative imports), never it (``tests/test_layout.py``).
"""

from __future__ import annotations

import os as _os
from typing import TYPE_CHECKING, Any

from .version import __version__


def _source_checkout_layout() -> None:
    """Let a source checkout import ``amp_backends.backends`` as an installed copy does.

    Installed (``pip install .``), the repository's ``backends/`` folder is ``amp_backends/backends``. Run
    from the checkout's root, Python finds the checkout's ``amp_backends/`` first, which has no such
    folder: this adds the repository root to the package's search path then. Two ``stat`` calls.
    """
    here = _os.path.dirname(_os.path.abspath(__file__))
    root = _os.path.dirname(here)
    if not _os.path.isdir(_os.path.join(here, "backends")) and _os.path.isfile(
        _os.path.join(root, "backends", "cpu", "backend.py")
    ):
        __path__.append(root)  # type: ignore[name-defined]


_source_checkout_layout()

_LAZY = {
    "auto_configure": ".configure",
    "current_plan": ".configure",
    "plan_for": ".configure",
    "known_devices": ".configure",
    "configure_for_device": ".configure",
    "reset": ".configure",
    "Plan": ".plan",
    "make_plan": ".planner",
    "LossScale": ".request",
    "Request": ".request",
    "build_request": ".request",
    "Support": ".assessment",
    "Assessment": ".assessment",
    "VendorSetting": ".assessment",
    "probe_hardware": ".probe",
    "Hardware": ".hardware",
    "Accelerator": ".hardware",
    "CpuInfo": ".hardware",
    "BackendProbe": ".hardware",
    "AmpConfigError": ".errors",
    "UnsupportedRequestError": ".errors",
    "AmpWarning": ".errors",
    "BackendError": ".errors",
    "Backend": ".registry",
    "BackendRegistry": ".registry",
    "default_registry": ".registry",
    "check_model": ".model_check",
    "audit": ".audit",
    "audit_trace": ".audit",
    "Preparation": ".prepare",
    "prepare_model": ".prepare",
    "Float32Layer": ".assessment",
    "MatrixUnit": ".assessment",
    "Trainer": ".training",
    "TrainResult": ".training",
    "Update": ".training",
    "classifier_updates": ".training",
    "gan_updates": ".training",
    "ThroughputLogger": ".training",
    "Observer": ".training",
    "seed_everything": ".training",
    "step_seed": ".training",
    "NonFiniteError": ".errors",
    "InputError": ".errors",
    "CheckpointError": ".errors",
    "TrainingInterrupted": ".errors",
}

__all__ = sorted(_LAZY) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from .assessment import Assessment, Float32Layer, MatrixUnit, Support, VendorSetting
    from .audit import audit, audit_trace
    from .configure import auto_configure, configure_for_device, current_plan, known_devices, plan_for, reset
    from .errors import (
        AmpConfigError,
        AmpWarning,
        BackendError,
        CheckpointError,
        InputError,
        NonFiniteError,
        TrainingInterrupted,
        UnsupportedRequestError,
    )
    from .prepare import Preparation, prepare_model
    from .hardware import Accelerator, BackendProbe, CpuInfo, Hardware
    from .model_check import check_model
    from .plan import Plan
    from .planner import make_plan
    from .probe import probe_hardware
    from .registry import Backend, BackendRegistry, default_registry
    from .request import LossScale, Request, build_request
    from .training import (
        Observer,
        ThroughputLogger,
        Trainer,
        TrainResult,
        Update,
        classifier_updates,
        gan_updates,
        seed_everything,
        step_seed,
    )


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
