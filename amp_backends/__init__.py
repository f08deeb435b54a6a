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


class _CheckoutBackends:
    """In a source checkout, finds ``amp_backends.backends`` (installed, the repository's ``backends/``) where an
    installed copy has it; an import-system finder for that one name, so nothing loads before it is imported and
    the repository root stays off the package's path."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        """The spec of ``amp_backends.backends`` from the checkout's ``backends/`` folder; ``None`` for any other
        ``name`` (another finder's)."""
        if name != f"{__name__}.backends":
            return None
        import importlib.util

        return importlib.util.spec_from_file_location(name, _os.path.join(self.folder, "__init__.py"),
                                                      submodule_search_locations=[self.folder])


def _source_checkout_layout() -> None:
    """Let a source checkout import ``amp_backends.backends`` as an installed copy does (`_CheckoutBackends`)."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    backends = _os.path.join(_os.path.dirname(here), "backends")
    if not _os.path.isdir(_os.path.join(here, "backends")) and _os.path.isfile(
            _os.path.join(backends, "cpu", "backend.py")):
        import sys

        if not any(isinstance(f, _CheckoutBackends) for f in sys.meta_path):
            sys.meta_path.append(_CheckoutBackends(backends))


_source_checkout_layout()

# What a training script uses; a backend author's names are in amp_backends.backend_api.
_LAZY = {name: module for module, names in (
    # the plan: chosen and applied for this machine, or planned for another
    (".configure", ("auto_configure", "current_plan", "plan_for", "known_devices", "configure_for_device", "reset")),
    (".plan", ("Plan",)), (".loss_scale", ("LossScale",)),
    # a model under the plan: prepared, checked (what should run), audited (what did run)
    (".prepare", ("prepare_model", "Preparation")), (".layer_plan", ("LayerPlan",)),
    (".model_check", ("check_model", "ModelCheck")), (".auditing", ("audit", "audit_trace", "Audit")),
    (".training", ("Trainer", "TrainResult", "Update", "classifier_updates", "gan_updates", "Observer",
                   "ThroughputLogger", "seed_everything", "step_seed", "LossScaler")),
    # the base of every error the library raises, and its warning (the others: amp_backends.errors)
    (".errors", ("AmpError", "AmpWarning"))) for name in names}

__all__ = sorted(_LAZY) + ["__version__"]

# Modules a training script reaches through the package (``amp_backends.errors.InputError``).
_SUBMODULES = ("errors", "backend_api")

# Names that moved, kept for one release: reaching them here warns and gives the new place.
_MOVED = {name: "amp_backends.errors" for name in (
    "AmpConfigError", "UnsupportedRequestError", "ClusterConfigError", "FactoryError", "BackendError",
    "NonFiniteError", "DistributedFailure", "DataUnavailableError", "InputError", "ModelCallError",
    "CheckpointError", "CheckpointMismatchError", "TrainingInterrupted")}

# Old module paths, kept for one release: old path -> where its names are now. ``audit`` was the audit's package
# before ``audit`` named the function (``amp_backends.auditing`` now): each of its names and its module. The others
# moved into ``amp_backends.autotune``: the modules that hold their names, looked in in order (``module:name``:
# that one name of a module, the rest of which stays unserved).
_OLD_PATHS: dict[str, Any] = {
    "audit": {"audit": "amp_backends", "audit_trace": "amp_backends", "Audit": "amp_backends",
              "AuditObserver": "amp_backends.auditing"},
    "timing": ("autotune.timing",), "measurement": ("autotune.layer_choice",),
    "policy_choice": ("autotune.layers", "autotune.layer_choice", "layer_plan:worth_measuring")}


def _old_module(old: str) -> Any:
    """The module object that serves the old path ``amp_backends.<old>`` for one release (`_OLD_PATHS`): it sits in
    ``sys.modules``, so both import forms work with no file of that name, and each name read through it warns and
    forwards. The attribute ``amp_backends.audit`` is never rebound: it stays the function in every import order.
    """
    import importlib
    import importlib.machinery
    import sys
    import types

    name, where = f"{__name__}.{old}", _OLD_PATHS[old]
    if name in sys.modules:
        return sys.modules[name]
    audit = isinstance(where, dict)
    module = types.ModuleType(name, f"Deprecated: the old path of {__name__}.{'auditing' if audit else 'autotune'}.")

    def moved_to(attr: str) -> str | None:
        if audit:
            return where.get(attr)
        for entry in where:  # "module": the names of its __all__; "module:name": that name alone
            module, _, only = entry.partition(":")
            new = f"{__name__}.{module}"
            if not attr.startswith("__") and (attr == only if only else attr in importlib.import_module(new).__all__):
                return new
        return None

    def forward(attr: str) -> Any:
        from .errors import warn

        real = "Measurement" if (old, attr) == ("policy_choice", "PolicyChoice") else attr  # its earlier name
        new = moved_to(real)
        if new is None:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}" + (
                f": {name} is now the audit function; the audit's package is {__name__}.auditing, its vendor parts "
                "are in the backends" if audit else f" ({name} moved into {__name__}.autotune)"))
        now = f"{name} is now the audit function itself, and " if audit else ""
        warn(f"the module path {name} is deprecated: import {real} from {new} (from {new} import {real}); "
             f"{now}the old path goes in the next release", DeprecationWarning)
        return getattr(importlib.import_module(new), real)

    vars(module).update(__getattr__=forward, __all__=sorted(where) if audit else [],
                        __spec__=importlib.machinery.ModuleSpec(name, None))  # (find_spec() answers for it)
    sys.modules[name] = module
    return module


for _old in _OLD_PATHS:
    _old_module(_old)
del _old

if TYPE_CHECKING:  # pragma: no cover
    from .auditing import Audit, audit, audit_trace
    from .layer_plan import LayerPlan
    from .loss_scale import LossScale
    from .configure import auto_configure, configure_for_device, current_plan, known_devices, plan_for, reset
    from .errors import AmpError, AmpWarning
    from .model_check import ModelCheck, check_model
    from .plan import Plan
    from .prepare import Preparation, prepare_model
    from .training import (LossScaler, Observer, ThroughputLogger, Trainer, TrainResult, Update, classifier_updates,
                           gan_updates, seed_everything, step_seed)


def __getattr__(name: str) -> Any:
    import importlib

    module = _LAZY.get(name)
    if module is None and name in _SUBMODULES:  # ``amp_backends.errors.InputError`` after ``import amp_backends``
        return importlib.import_module(f".{name}", __name__)
    if module is None and name in _OLD_PATHS:  # ``amp_backends.timing`` as an attribute: the old path's module
        return _old_module(name)
    if module is None and name in _MOVED:
        from .errors import warn

        warn(f"amp_backends.{name} moved to {_MOVED[name]}.{name}; the old name goes in the next release",
             DeprecationWarning)
        return getattr(importlib.import_module(_MOVED[name]), name)
    if module is None:
        authors = importlib.import_module(".backend_api", __name__).__all__ if not name.startswith("_") else ()
        where = ": it is a backend author's name, import it from amp_backends.backend_api" if name in authors else ""
        raise AttributeError(f"module 'amp_backends' has no attribute {name!r}{where}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
