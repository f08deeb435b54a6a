"""Training under a plan: one trainer for every vendor, and the pieces it is made of, one concept a module.

``trainer`` (`Trainer`, the loop; `TrainResult`), ``step`` (`Update`, the compiled step; `step_seed`),
``loss_scaling`` (`LossScaler`, also for a ``tf.GradientTape`` loop of your own), ``inputs`` (resident arrays and
``tf.data`` pipelines), ``runs`` (run folders, one run at a time, the position; `parse_profile_steps`), ``resume``
(saving, stopping on Ctrl-C or SIGTERM, resuming), ``checkpoints`` (checkpoints that survive a failing disk),
``distribute`` and ``launchers`` (strategies, clusters from ``mpiexec`` or ``srun``), ``metrics``, ``validation``,
``observers`` (log line, TensorBoard, progress bar, profiler; `ThroughputLogger`), ``precision`` (the layer plans and
the precision check), ``tasks`` (ready-made updates: classifier, the tutorials' GAN, MNIST batches). The package
also gives `seed_everything` (`amp_backends.seeds`).

Importing this package is cheap; TensorFlow is imported with the first name used from it, except ``runs``' names
(TensorFlow only once `run_directory` with a strategy runs; `parse_profile_steps` never), `seed_everything`
(TensorFlow only once it runs) and ``distribute``'s and ``launchers``' cluster checks, which run before TensorFlow
starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {name: module for module, names in {
    ".trainer": ("Trainer", "TrainResult"),
    ".step": ("Update", "Evaluation", "step_seed"),
    ".observers": ("Observer", "CallRecord", "ThroughputLogger"),
    ".metrics": ("record_predictions",),
    ".loss_scaling": ("LossScaler",),
    ".runs": ("parse_profile_steps", "run_directory"),
    "..seeds": ("seed_everything",),
    ".tasks": ("classifier_updates", "gan_updates", "mnist_batch_fn"),
}.items() for name in names}

__all__ = [
    "CallRecord", "Evaluation", "LossScaler", "Observer", "ThroughputLogger", "TrainResult", "Trainer", "Update",
    "classifier_updates", "gan_updates", "mnist_batch_fn", "parse_profile_steps", "record_predictions",
    "run_directory", "seed_everything", "step_seed",
]

if TYPE_CHECKING:  # pragma: no cover
    from .loss_scaling import LossScaler
    from .metrics import record_predictions
    from .observers import CallRecord, Observer, ThroughputLogger
    from ..seeds import seed_everything
    from .runs import parse_profile_steps, run_directory
    from .step import Evaluation, Update, step_seed
    from .tasks import classifier_updates, gan_updates, mnist_batch_fn
    from .trainer import Trainer, TrainResult


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'amp_backends.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
