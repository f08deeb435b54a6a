"""Training under a plan: one trainer for every vendor, and the pieces it is made of.

=====================  ==========================================================================
module                 its part
=====================  ==========================================================================
``trainer``            `Trainer`: the loop — runs calls, saves, stops on interrupts
``step``               `Update` and the compiled step (replica gradients, skip, apply)
``loss_scaling``       `LossScaler`: none / fixed / dynamic, sparse gradients kept sparse; the same in a
                       ``tf.GradientTape`` loop of your own (``LossScaler.apply``)
``inputs``             resident arrays; each input kind sizes and runs its compiled call
``streams``            ``tf.data`` pipelines of batches, behind the same interface
``batches``            what both input kinds share: a compiled call's result, nests of arrays
``runs``               where training stands (epoch, sample offset, step); one run at a time in a
                       checkpoint folder; what a resumed run keeps or says (seed, loss scaling, steps left)
``checkpoints``        run directories, checkpoints that never lose a run
``saving``             checkpoint saves on a disk that fails (full, read-only, a killed save's leftovers);
                       the random layers' generators, kept in checkpoints
``observers``          log line, TensorBoard scalars, progress bar, profiler window, the defaults
``precision``          the precision check of the models being trained
``signals``            Ctrl-C and SIGTERM: stop after the current call
``distribute``         ``tf.distribute`` strategies, cluster checks, plan agreement, agreeing to stop
``launchers``          the cluster from ``mpiexec`` (Open MPI, MPICH) or ``srun`` (Slurm) when no TF_CONFIG
``tasks``              ready-made updates: classifier, the tutorials' GAN, MNIST batches
``arguments``          the trainer's arguments checked; optimizers built once
``results``            what a ``fit`` call collects and returns (`TrainResult`)
``metrics``            Keras metrics by name or object, updated in the step, one number across workers;
                       per-epoch history, validation schedule, best value, early stopping
``validation``         the trainer's validation, evaluate and predict under the plan; the best checkpoint
``callbacks``          Keras ``fit`` callbacks (`ThroughputLogger`)
``seeding``            `seed_everything`, `step_seed`: reproducible runs and random draws inside a step
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
    "step_seed": ".seeding",
    "record_predictions": ".metrics",
    "LossScaler": ".loss_scaling",
    "run_directory": ".checkpoints",
    "Observer": ".observers",
    "CallRecord": ".observers",
    "classifier_updates": ".tasks",
    "gan_updates": ".tasks",
    "mnist_batch_fn": ".tasks",
    "ThroughputLogger": ".callbacks",
    "seed_everything": ".seeding",
}

__all__ = [
    "CallRecord", "Evaluation", "LossScaler", "Observer", "ThroughputLogger", "TrainResult", "Trainer", "Update",
    "classifier_updates", "gan_updates", "mnist_batch_fn", "parse_profile_steps", "record_predictions",
    "run_directory", "seed_everything", "step_seed",
]

if TYPE_CHECKING:  # pragma: no cover
    from .callbacks import ThroughputLogger
    from .checkpoints import run_directory
    from .loss_scaling import LossScaler
    from .metrics import record_predictions
    from .observers import CallRecord, Observer, parse_profile_steps
    from .seeding import seed_everything, step_seed
    from .step import Evaluation, Update
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
