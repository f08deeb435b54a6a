"""What the MNIST and GAN examples share: their command line, the plan, the data, the run directory, the trainer."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

import typer

from ..commands.typer_app import make_app, override_option
from ..errors import (AmpConfigError, BackendError, CheckpointError, DataUnavailableError, DistributedFailure,
                      InputError, NonFiniteError)


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
    deterministic: bool = False
    fp8: Optional[str] = None


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
    from ..training.distribute import check_plan_agreement, is_chief, make_strategy

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
        fp8=opts.fp8, strict=opts.strict or None, force=opts.force or None, verbose=False,
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
    from ..training.trainer import parse_profile_steps

    if opts.profile_steps:
        return parse_profile_steps(opts.profile_steps)
    if opts.profile:
        start = 2 * opts.steps_per_call
        return start, start + max(10, opts.steps_per_call)
    return None


def prepare_run(opts: RunOptions, strategy: Any) -> Any:
    """Seed everything, then decide the run directory (a new ``version_N``, or the one ``--resume`` continues)."""
    from ..training.checkpoints import run_directory
    from ..training.distribute import is_chief
    from ..training.seeding import seed_everything

    seed_everything(opts.seed, deterministic=opts.deterministic)
    run = run_directory(opts.logdir, opts.resume, strategy)
    if strategy is None or is_chief(strategy):
        print(f"Run directory: {run.path} ({'resumed' if run.resumed else 'new run'}; "
              f"tensorboard --logdir {opts.logdir})", flush=True)
    return run


def prepare_models(plan: Any, *models: Any) -> None:
    """Float8 for the eligible layers when the plan has fp8 on (it says what it changed, or why nothing)."""
    if plan.fp8:
        for model in models:
            print(plan.prepare_model(model), flush=True)


def trainer_options(opts: RunOptions, run: Any, strategy: Any) -> dict[str, Any]:
    """The Trainer's keyword arguments the command line decides."""
    from ..training.tasks import mnist_batch_fn

    return dict(batch_size=opts.batch_size, steps_per_call=opts.steps_per_call, log_every=opts.log_every,
                logdir=str(run.path), checkpoint_dir=str(run.checkpoints), checkpoint_every=opts.checkpoint_every,
                profile_steps=profile_window(opts), progress=opts.progress, seed=opts.seed, batch_fn=mnist_batch_fn,
                strategy=strategy)


def command(name: str, run: Callable[[RunOptions], Any], *, batch_size: int, lr: float, lr_help: str) -> Callable[..., None]:
    """A typer command with the tutorials' flags (``--epochs --batch_size --lr``) plus the plan and trainer flags."""

    def main(
        epochs: int = typer.Option(1, "--epochs", min=1, metavar="N", help="Passes over the training set."),
        batch_size_: int = typer.Option(batch_size, "--batch_size", "--batch-size", min=1, metavar="N",
                                        help="Images per step (the global batch under a distribution strategy)."),
        lr_: float = typer.Option(lr, "--lr", min=0.0, metavar="LR", help=lr_help),
        data: Optional[str] = typer.Option(None, "--data", metavar="PATH",
                                           help="mnist.npz in Keras's format (uint8 or [0, 1] float images). Default: "
                                                "Keras's cache, else its download."),
        synthetic: bool = typer.Option(False, "--synthetic", help="Random MNIST-shaped data (benchmarks; nothing to learn)."),
        digits: bool = typer.Option(False, "--digits", help="scikit-learn's real handwritten digits as 28x28 images "
                                    "(1,797 images, offline; needs scikit-learn)."),
        backend: Optional[str] = override_option("backend"),
        policy: Optional[str] = override_option("policy"),
        xla: Optional[str] = override_option("xla"),
        tf32: Optional[str] = override_option("tf32"),
        loss_scale: Optional[str] = override_option("loss_scale"),
        fp8: Optional[str] = override_option("fp8"),
        strict: bool = override_option("strict"),
        force: bool = override_option("force"),
        steps_per_call: int = typer.Option(1, "--steps-per-call", min=1, metavar="N",
                                           help="Training steps per compiled call (fewer host round trips)."),
        log_every: int = typer.Option(1, "--log-every", min=1, metavar="N", help="Log a line every N steps."),
        logdir: str = typer.Option(f"runs/{name}", "--logdir", metavar="DIR",
                                   help="Each run writes TensorBoard scalars, profiles and checkpoints into a new "
                                        "DIR/version_N; earlier runs are kept."),
        checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", min=1, metavar="N",
                                                       help="Checkpoint every N steps (also at the end and on Ctrl-C)."),
        resume: bool = typer.Option(False, "--resume", help="Continue the newest run under --logdir from its newest "
                                    "intact checkpoint (or the run --logdir points at)."),
        profile: bool = typer.Option(False, "--profile", help="Trace 10 steps after the warm-up with the TF profiler."),
        profile_steps: Optional[str] = typer.Option(None, "--profile-steps", metavar="START:STOP",
                                                    help="Trace the calls covering steps START:STOP, e.g. 20:30."),
        max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1, metavar="N",
                                                help="Stop after this many steps in all."),
        seed: int = typer.Option(0, "--seed", min=0, metavar="N", help="Seed of the weights, dropout, shuffling, noise "
                                 "and synthetic data: the same seed gives the same losses on a CPU."),
        deterministic: bool = typer.Option(False, "--deterministic", help="Deterministic TensorFlow kernels "
                                           "(reproducible on GPUs too; slower)."),
        progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bar (default: on a "
                                                "terminal)."),
        distribute: str = typer.Option("auto", "--distribute", metavar="KIND", help="auto (TF_CONFIG: multiworker; "
                                       "several GPUs: mirrored), none, mirrored, multiworker."),
        cluster_timeout: float = typer.Option(60.0, "--cluster-timeout", min=1.0, metavar="SECONDS",
                                              help="Seconds a collective waits for the other workers before failing."),
        tune: bool = typer.Option(False, "--tune", help="Time the candidate plans on this model first and train with "
                                  "the fastest (cached per device and model; single process only)."),
    ) -> None:
        opts = RunOptions(epochs, batch_size_, lr_, data, synthetic, digits, backend, policy, xla, tf32, loss_scale, strict,
                          force, steps_per_call, log_every, logdir, checkpoint_every, resume, profile, profile_steps,
                          max_steps, seed, progress, distribute, cluster_timeout, tune, deterministic, fp8)
        from ..commands.quiet import import_tensorflow, quiet_tensorflow_logs

        configure_logging()
        try:
            import_tensorflow(quiet_tensorflow_logs())  # TensorFlow's start-up noise filtered, unless asked for
            run(opts)
        except (AmpConfigError, DataUnavailableError, InputError, CheckpointError, BackendError) as exc:
            fail(name, "error", exc, 2)
        except DistributedFailure as exc:
            fail(name, "error", exc, 4)
        except NonFiniteError as exc:
            fail(name, "stopped", exc, 3)
        except KeyboardInterrupt as exc:  # TrainingInterrupted has said where it saved; a second Ctrl-C has not
            message = getattr(exc, "message", None) or "interrupted (a second Ctrl-C: no checkpoint was written now)"
            fail(name, "stopped", message, getattr(exc, "exit_code", 130))

    main.__doc__ = run.__doc__
    return main


def fail(name: str, kind: str, message: Any, code: int) -> None:
    typer.echo(f"{name}: {kind}: {message}", err=True)
    raise typer.Exit(code)


def app_for(command_fn: Callable[..., None]) -> typer.Typer:
    """A one-command typer app with plain help (nothing cut at 80 columns)."""
    app = make_app()
    app.command()(command_fn)
    return app


def maybe_tune(opts: RunOptions, plan: Any, build: Any, x: Any, y: Any, images_per_step: int | None = None) -> Any:
    """With --tune: time the candidate plans on this model (or apply the cached choice) and print the result."""
    if not opts.tune:
        return plan
    from ..autotune import tune
    from ..training.tasks import mnist_batch_fn

    overrides = dict(backend=opts.backend, tf32=opts.tf32, loss_scale=opts.loss_scale, fp8=opts.fp8,
                     strict=opts.strict or None, force=opts.force or None)
    plan = tune(build, x, y, batch_size=opts.batch_size, images_per_step=images_per_step, batch_fn=mnist_batch_fn,
                overrides=overrides)
    print(f"autotuned plan: {plan.summary().split(' (')[0]}", flush=True)
    return plan


def scope(strategy: Any) -> Any:
    import contextlib

    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def print_flush(*args: Any) -> None:
    print(*args, flush=True, file=sys.stdout)
