"""Training under a plan: one trainer for every vendor, and the pieces it is made of, one concept a module.

=====================  ==========================================================================
module                 its part
=====================  ==========================================================================
``trainer``            `Trainer`: the loop (runs calls; validation and checkpoints at their turns), its arguments,
                       `TrainResult`
``step``               `Update` and the compiled step (replica gradients, skip, apply); `step_seed`
``loss_scaling``       `LossScaler`: none / fixed / dynamic, sparse gradients kept sparse; the same in a
                       ``tf.GradientTape`` loop of your own (``LossScaler.apply``)
``inputs``             resident arrays and ``tf.data`` pipelines, each sizing and running its compiled call (`Ran`)
``runs``               run directories, one run at a time in a checkpoint folder, the position in the data
                       (epoch, sample offset, step), `seed_everything`
``resume``             `Checkpointing`: when a trainer saves, and its stop on Ctrl-C or SIGTERM (after the current
                       call); what its checkpoints hold (the random layers' generators too), what a resumed run
                       keeps or says
``checkpoints``        `CheckpointStore`: checkpoints that never lose a run, saved on a disk that fails (full,
                       read-only, a killed save's leftovers)
``distribute``         ``tf.distribute`` strategies, cluster checks, plan agreement, agreeing to stop
``launchers``          the cluster from ``mpiexec`` (Open MPI, MPICH) or ``srun`` (Slurm) when no TF_CONFIG
``metrics``            Keras metrics by name or object, updated in the step, one number across workers;
                       per-epoch history, validation schedule, best value, early stopping; each call's record
``validation``         the trainer's validation, evaluate and predict under the plan; the best checkpoint
``observers``          log line, TensorBoard scalars, progress bar, profiler window, the defaults; Keras ``fit``'s
                       `ThroughputLogger`
``precision``          the layer plans and the precision check of the models being trained
``tasks``              ready-made updates: classifier, the tutorials' GAN, MNIST batches
=====================  ==========================================================================

Importing this package is cheap; TensorFlow is imported with the first name used from it (except
``distribute``'s and ``launchers``' cluster checks, which run before TensorFlow starts).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "Trainer": ".trainer",
    "TrainResult": ".trainer",
    "parse_profile_steps": ".observers",
    "Update": ".step",
    "Evaluation": ".step",
    "step_seed": ".step",
    "record_predictions": ".metrics",
    "LossScaler": ".loss_scaling",
    "run_directory": ".runs",
    "Observer": ".observers",
    "CallRecord": ".observers",
    "classifier_updates": ".tasks",
    "gan_updates": ".tasks",
    "mnist_batch_fn": ".tasks",
    "ThroughputLogger": ".observers",
    "seed_everything": ".runs",
}

__all__ = [
    "CallRecord", "Evaluation", "LossScaler", "Observer", "ThroughputLogger", "TrainResult", "Trainer", "Update",
    "classifier_updates", "gan_updates", "mnist_batch_fn", "parse_profile_steps", "record_predictions",
    "run_directory", "seed_everything", "step_seed",
]

if TYPE_CHECKING:  # pragma: no cover
    from .loss_scaling import LossScaler
    from .metrics import record_predictions
    from .observers import CallRecord, Observer, ThroughputLogger, parse_profile_steps
    from .runs import run_directory, seed_everything
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
