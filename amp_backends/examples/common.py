"""What the MNIST and GAN examples share: their command line, the plan, the data, the trainer's set-up."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from ..errors import AmpConfigError


@dataclass
class RunOptions:
    epochs: int
    batch_size: int
    lr: float
    data: Optional[str]
    synthetic: bool
    digits: bool
    backend: Optional[str]
    policy: Optional[str]
    xla: Optional[str]
    tf32: Optional[str]
    loss_scale: Optional[str]
    strict: bool
    force: bool
    steps_per_call: int
    log_every: int
    logdir: str
    checkpoint_every: Optional[int]
    resume: bool
    profile: bool
    profile_steps: Optional[str]
    max_steps: Optional[int]
    seed: int
    progress: Optional[bool]
    distribute: str = "auto"
    cluster_timeout: float = 60.0
    tune: bool = False


def configure_logging() -> None:
    """The tutorials' log format, unless the program configured logging itself."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(levelname)s - %(message)s")
    logging.getLogger("amp_backends").setLevel(logging.INFO)
    for noisy in ("tensorflow", "absl"):  # checkpoint-saving chatter at INFO
        logging.getLogger(noisy).setLevel(logging.WARNING)


def strategy_and_plan(opts: RunOptions) -> tuple[Any, Any]:
    """The tf.distribute strategy (created first: multi-worker collectives must be set up before any op), then
    this worker's plan, printed (by the chief) and compared with the other workers' plans."""
    from ..distribute import check_plan_agreement, is_chief, make_strategy

    strategy = make_strategy(opts.distribute, timeout_s=opts.cluster_timeout)
    if opts.tune and strategy is not None:
        raise AmpConfigError("--tune times plans in a single process; it cannot run under a distribution strategy. "
                             "Fix: tune once without --distribute (the choice is cached), then train distributed.")
    plan = plan_and_print(opts, show=strategy is None or is_chief(strategy))
    check_plan_agreement(strategy, plan, strict=opts.strict)
    return strategy, plan


def plan_and_print(opts: RunOptions, show: bool = True) -> Any:
    import amp_backends

    plan = amp_backends.auto_configure(
        backend=opts.backend, policy=opts.policy, xla=opts.xla, tf32=opts.tf32, loss_scale=opts.loss_scale,
        strict=opts.strict or None, force=opts.force or None, verbose=False,
    )
    if show:
        print(plan.explain(), flush=True)
    return plan


def load_data(opts: RunOptions) -> Any:
    from ..data import load_mnist, synthetic_mnist

    if opts.synthetic:
        return synthetic_mnist(seed=opts.seed)
    if opts.digits:
        from ..data import digits_as_mnist

        return digits_as_mnist(seed=opts.seed)
    return load_mnist(opts.data)


def profile_window(opts: RunOptions) -> tuple[int, int] | None:
    """``--profile-steps A:B``; ``--profile`` alone traces 10 steps after the two warm-up (compiling) calls."""
    from ..trainer import parse_profile_steps

    if opts.profile_steps:
        return parse_profile_steps(opts.profile_steps)
    if opts.profile:
        start = 2 * opts.steps_per_call
        return start, start + max(10, opts.steps_per_call)
    return None


def command(name: str, run: Callable[[RunOptions], Any], *, batch_size: int, lr: float, lr_help: str) -> Callable[..., None]:
    """A typer command with the tutorials' flags (``--epochs --batch_size --lr``) plus the plan and trainer flags."""

    def main(
        epochs: int = typer.Option(1, "--epochs", min=1, help="Passes over the training set."),
        batch_size_: int = typer.Option(batch_size, "--batch_size", "--batch-size", min=1, help="Images per step."),
        lr_: float = typer.Option(lr, "--lr", min=0.0, help=lr_help),
        data: Optional[str] = typer.Option(None, "--data", help="Path to mnist.npz (Keras's format). Default: Keras's cache."),
        synthetic: bool = typer.Option(False, "--synthetic", help="Random MNIST-shaped data (benchmarks; nothing to learn)."),
        digits: bool = typer.Option(False, "--digits", help="scikit-learn's real handwritten digits as 28x28 images "
                                    "(1,797 images, offline; needs scikit-learn)."),
        backend: Optional[str] = typer.Option(None, "--backend", help="auto, nvidia, intel, cpu (default: AMP_BACKEND)."),
        policy: Optional[str] = typer.Option(None, "--policy", help="auto, float32, mixed_float16, mixed_bfloat16."),
        xla: Optional[str] = typer.Option(None, "--xla", help="auto, on, off."),
        tf32: Optional[str] = typer.Option(None, "--tf32", help="auto, on, off."),
        loss_scale: Optional[str] = typer.Option(None, "--loss-scale", help="auto, dynamic, none, fixed:<scale>."),
        strict: bool = typer.Option(False, "--strict", help="Fail instead of downgrading an unsupported request."),
        force: bool = typer.Option(False, "--force", help="Run a slow (emulated) request anyway."),
        steps_per_call: int = typer.Option(1, "--steps-per-call", min=1, help="Training steps per compiled call."),
        log_every: int = typer.Option(1, "--log-every", min=1, help="Log a line every N steps."),
        logdir: str = typer.Option(f"runs/{name}", "--logdir", help="TensorBoard scalars, profiler traces, checkpoints."),
        checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", min=1,
                                                       help="Checkpoint every N steps (always at the end)."),
        resume: bool = typer.Option(False, "--resume", help="Continue from the latest checkpoint in LOGDIR/checkpoints."),
        profile: bool = typer.Option(False, "--profile", help="Trace 10 steps after the warm-up with the TF profiler."),
        profile_steps: Optional[str] = typer.Option(None, "--profile-steps", help="Trace steps START:STOP, e.g. 20:30."),
        max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1, help="Stop after this many steps in all."),
        seed: int = typer.Option(0, "--seed", help="Seed of the shuffling, the weights and the synthetic data."),
        progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bar (default: on a terminal)."),
        distribute: str = typer.Option("auto", "--distribute", help="auto (TF_CONFIG -> multiworker, several GPUs -> "
                                       "mirrored), none, mirrored, multiworker."),
        cluster_timeout: float = typer.Option(60.0, "--cluster-timeout", min=1.0,
                                              help="Seconds a collective waits for the other workers before failing."),
        tune: bool = typer.Option(False, "--tune", help="Time the candidate plans on this model first and train with "
                                  "the fastest (cached per device and model; single process only)."),
    ) -> None:
        opts = RunOptions(epochs, batch_size_, lr_, data, synthetic, digits, backend, policy, xla, tf32, loss_scale, strict, force,
                          steps_per_call, log_every, logdir, checkpoint_every, resume, profile, profile_steps, max_steps,
                          seed, progress, distribute, cluster_timeout, tune)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        configure_logging()
        from ..data import DataUnavailableError
        from ..trainer import DistributedFailure, NonFiniteError

        try:
            run(opts)
        except (AmpConfigError, DataUnavailableError, ValueError) as exc:
            typer.echo(f"{name}: error: {exc}", err=True)
            raise typer.Exit(2)
        except DistributedFailure as exc:
            typer.echo(f"{name}: error: {exc}", err=True)
            raise typer.Exit(4)
        except NonFiniteError as exc:
            typer.echo(f"{name}: stopped: {exc}", err=True)
            raise typer.Exit(3)

    main.__doc__ = run.__doc__
    return main


def checkpoint_dir(opts: RunOptions) -> str:
    return str(Path(opts.logdir) / "checkpoints")


def maybe_tune(opts: RunOptions, plan: Any, build: Any, x: Any, y: Any, images_per_step: int | None = None) -> Any:
    """With --tune: time the candidate plans on this model (or apply the cached choice) and print the result."""
    if not opts.tune:
        return plan
    from ..autotune import tune
    from ..trainer import mnist_batch_fn

    plan = tune(build, x, y, batch_size=opts.batch_size, images_per_step=images_per_step, batch_fn=mnist_batch_fn)
    print(f"autotuned plan: {plan.summary().split(' (')[0]}", flush=True)
    return plan


def scope(strategy: Any) -> Any:
    import contextlib

    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def seed_everything(seed: int) -> None:
    import tensorflow as tf

    tf.random.set_seed(seed)


def print_flush(*args: Any) -> None:
    print(*args, flush=True, file=sys.stdout)
