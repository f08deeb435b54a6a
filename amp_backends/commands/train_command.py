"""``amp-backends train mnist|gan`` (``python -m amp_backends.examples.mnist|gan``): the examples' command line.

The tutorials' flags (``--epochs --batch_size --lr``), the plan overrides and the trainer's and run's flags, parsed
into `RunOptions`. Exit status: 0 done; 2 a usage, data or checkpoint error; 3 stopped on non-finite gradients;
4 another worker failed; 130/143 interrupted.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import typer

from ..errors import (
    AmpConfigError,
    BackendError,
    CheckpointError,
    DataUnavailableError,
    DistributedFailure,
    InputError,
    NonFiniteError,
)
from .typer_app import fail, make_app, number_option, with_overrides

USAGE_ERRORS = (AmpConfigError, DataUnavailableError, InputError, CheckpointError, BackendError)


def _in_flags(exc: NonFiniteError) -> str:
    """The error's remedy in this command line's flags (its message names the Python API's)."""
    from ..request import OPTIONS

    flag = {o.name: o.flag_name for o in OPTIONS}
    words = [f"{flag.get(k, '--' + k.replace('_', '-'))} {v}" for k, v in exc.overrides.items()]
    words += ["--resume"] if exc.resume else []
    return f" On this command line: run it again with {' '.join(words)}." if words else ""


def _as_flags(message: str, flags: Mapping[str, Sequence[str]]) -> str:
    """The trainer's keywords that ``message`` names (``batch_size``, ``epochs=``) and not their flags, said as the
    command's first flag of each (``flags``: each parameter's declarations, ``--progress/--no-progress`` too)."""
    forms = {name: [f for d in decls for f in d.split("/")] for name, decls in flags.items()}
    named = [f"{name} is {said[0]}" for name, said in forms.items() if not any(f in message for f in said)
             and re.search(rf"\b{name}\b" if "_" in name else rf"\b{name}=", message)]  # data, seed: plain words
    return f" (On this command line: {'; '.join(named)}.)" if named else ""


def run_example(name: str, train: Callable[[Any], Any], parsed: dict[str, Any],
                flags: Mapping[str, Sequence[str]] | None = None) -> None:
    """Train with the parsed options; each failure the user can act on ends with its message and exit status (an
    error naming the trainer's keywords says them as ``flags``: each parameter's flags, the first said)."""
    from ..examples.run import RunOptions, preflight
    from ..tf_import import import_tensorflow, quiet_tensorflow_logs

    if not logging.getLogger().handlers:  # the tutorials' log format, unless the program configured logging itself
        logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(levelname)s - %(message)s")
    logging.getLogger("amp_backends").setLevel(logging.INFO)
    for noisy in ("tensorflow", "absl"):  # checkpoint-saving chatter at INFO
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if parsed.get("audit"):  # the kernels' libraries read them once, when they start: before TensorFlow is imported
        from ..registry import default_registry

        for variable, value in default_registry().audit_environment().items():  # oneDNN's ONEDNN_VERBOSE=1
            os.environ.setdefault(variable, value)
    if parsed.get("deterministic"):  # one op at a time, read when TensorFlow starts: concurrent ops reorder sums
        os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
    try:
        opts = RunOptions.from_parsed(parsed)
        preflight(opts)  # what is refused without TensorFlow is refused before it starts
        import_tensorflow(quiet_tensorflow_logs())  # TensorFlow's start-up noise filtered, unless asked for
        train(opts)
    except USAGE_ERRORS as exc:
        fail(name, f"{exc}{_as_flags(str(exc), flags or {})}", 2)
    except DistributedFailure as exc:
        fail(name, exc, 4)
    except NonFiniteError as exc:
        fail(name, f"{exc}{_in_flags(exc)}", 3, kind="stopped")
    except KeyboardInterrupt as exc:  # TrainingInterrupted has said where it saved; a second Ctrl-C has not
        resume = sys.modules.get("amp_backends.training.resume")
        second = resume is not None and resume.StopSignals.asked
        message = getattr(exc, "message", None) or ("interrupted (a second Ctrl-C: no checkpoint was written now)"
                                                    if second else "interrupted before training began: nothing "
                                                    "was trained or saved")
        fail(name, message, getattr(exc, "exit_code", 130), kind="stopped")
    finally:  # a run refused before its first write leaves no run directory behind
        if "amp_backends.training.runs" in sys.modules:
            sys.modules["amp_backends.training.runs"].release_unused_run_directories()


def command(name: str, train: Callable[[Any], Any], *, batch_size: int, lr: float, lr_help: str) -> Callable[..., None]:
    """A typer command with the tutorials' flags (``--epochs --batch_size --lr``) plus the plan and trainer flags."""
    default_batch, default_lr = batch_size, lr

    @with_overrides(exclude=("graph_amp",))
    def main(
        epochs: int = number_option(1, "--epochs", prog=name, metavar="N", help="Passes over the training set."),
        batch_size: int = number_option(default_batch, "--batch_size", "--batch-size", prog=name, metavar="N",
                                        help="Images per step (the global batch under a distribution strategy)."),
        lr: float = number_option(default_lr, "--lr", prog=name, kind=float, minimum=0, metavar="LR", help=lr_help),
        data: str | None = typer.Option(None, "--data", metavar="PATH",
                                        help="mnist.npz in Keras's format (uint8 or [0, 1] float images). Default: "
                                             "Keras's cache, else its download."),
        synthetic: bool = typer.Option(False, "--synthetic",
                                       help="Random MNIST-shaped data (benchmarks; nothing to learn)."),
        digits: bool = typer.Option(False, "--digits", help="Real handwritten digits as 28x28 images (1,797 "
                                    "images, shipped with the package: offline)."),
        overrides: Any = None,
        steps_per_call: int = number_option(1, "--steps-per-call", prog=name, metavar="N",
                                            help="Training steps per compiled call (fewer host round trips)."),
        log_every: int = number_option(1, "--log-every", prog=name, example=10, metavar="N",
                                       help="Log a line every N steps."),
        logdir: str = typer.Option(f"runs/{name}", "--logdir", metavar="DIR",
                                   help="Each run writes TensorBoard scalars, profiles and checkpoints into a new "
                                        "DIR/version_N; earlier runs are kept."),
        checkpoint_every: int | None = number_option(None, "--checkpoint-every", prog=name, example=100, metavar="N",
                                                     help="Checkpoint every N steps (also at the end and on Ctrl-C)."),
        resume: bool = typer.Option(False, "--resume", help="Continue the newest run under --logdir from its newest "
                                    "intact checkpoint (or the run --logdir points at)."),
        profile: bool = typer.Option(False, "--profile", help="Trace 10 steps after the warm-up with the TF profiler."),
        profile_steps: str | None = typer.Option(None, "--profile-steps", metavar="START:STOP",
                                                 help="Trace the calls covering steps START:STOP, e.g. 20:30."),
        max_steps: int | None = number_option(None, "--max-steps", prog=name, example=100, metavar="N",
                                              help="Stop once the run has made this many steps in all (a resumed run "
                                                   "counts its earlier steps)."),
        seed: int | None = number_option(None, "--seed", prog=name, minimum=0, example=0, metavar="N",
                                         help="Seed of the weights, dropout, shuffling, noise, synthetic data and the "
                                              "--digits split: the same seed gives the same losses on a CPU. "
                                              "Default: 0; --resume keeps the run's own seed."),
        deterministic: bool = typer.Option(False, "--deterministic", help="Deterministic TensorFlow kernels "
                                           "(reproducible on GPUs too; slower)."),
        progress: bool | None = typer.Option(None, "--progress/--no-progress", help="Progress bar (default: on a "
                                             "terminal)."),
        distribute: str = typer.Option("auto", "--distribute", metavar="KIND", help="auto (TF_CONFIG, mpiexec or "
                                       "srun: multiworker; several GPUs: mirrored), none, mirrored, multiworker."),
        cluster_timeout: float = number_option(60.0, "--cluster-timeout", prog=name, kind=float, minimum=1,
                                               metavar="SECONDS",
                                               help="Seconds a collective waits for the other workers before failing."),
        tune: bool = typer.Option(False, "--tune", help="Time the candidate plans on this model first and train with "
                                  "the fastest (cached per device and model; single process only)."),
        audit: bool = typer.Option(False, "--audit", help="Report the kernels that ran in the steps after the warm-up: "
                                   "dtypes, float32 islands (on a CPU from oneDNN's records)."),
    ) -> None:
        run_example(name, train, dict(locals()), flags)  # the options by name (and name, train, flags: ignored)

    main.__doc__ = train.__doc__
    flags = {n: tuple(p.default.param_decls) for n, p in inspect.signature(main).parameters.items()
             if getattr(p.default, "param_decls", None)}
    return main


def mnist_command() -> Callable[..., None]:
    """The ``train mnist`` command: `command` with the MNIST tutorial's defaults (batch size 64, learning rate 0.01).

    Returns:
        The typer command; its help is `amp_backends.examples.mnist.train_mnist`'s docstring.
    """
    from ..examples.mnist import train_mnist

    return command("mnist", train_mnist, batch_size=64, lr=0.01,
                   lr_help="Adam learning rate; 0.01 is the tutorial's (on the 1,797 --digits, 0.001 trains better).")


def gan_command() -> Callable[..., None]:
    """The ``train gan`` command: `command` with the GAN tutorial's defaults (batch size 4096, generator learning rate
    0.001).

    Returns:
        The typer command; its help is `amp_backends.examples.gan.train_gan`'s docstring.
    """
    from ..examples.gan import train_gan

    return command("gan", train_gan, batch_size=4096, lr=1e-3, lr_help="Generator Adam learning rate.")


def train_app() -> typer.Typer:
    """``amp-backends train``: ``mnist`` and ``gan``."""
    app = make_app("Train the tutorials' models under the auto plan.", no_args_is_help=True)

    @app.callback()
    def _train_group() -> None:
        """Train the tutorials' models under the auto plan."""

    app.command("mnist")(mnist_command())
    app.command("gan")(gan_command())
    return app

