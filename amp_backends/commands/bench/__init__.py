"""The benchmark command: ``python -m amp_backends.bench`` / ``amp-backends bench``, results in one folder (``--out``).

By default `loops`: the tutorials' hand-written loops under their manual configurations, Keras ``fit`` and the trainer
under the auto plan (``bench.json``, ``bench.png``); with ``--zoo``, `zoo_suite` (workers: `zoo_worker`): reference
models under the float32 baseline, the manual configurations and the auto plan (``zoo.json``, ``zoo.md``).
`supervisor` runs the workers with time limits; `output` writes tables, JSON and charts. The GPU suite runs from a
checkout: ``python benchmarks/gpu_suite.py`` (``benchmarks/README.md``).
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Optional

import typer

from ..typer_app import fail, number_option, refuse_up_front
from .loops import MANUAL

MANUAL_NAMES = ", ".join(c[0] for c in MANUAL)
MOVED_GPU_SUITE = ("the GPU suite is not part of the installed command: from a checkout of amp_backends, run "
                   "python benchmarks/gpu_suite.py --out DIR (benchmarks/README.md).")
ZOO_OPTIONS = "Model zoo"
PROG = "bench"


def _stopped(stop: KeyboardInterrupt, results: Path) -> typer.Exit:
    """Ctrl-C (exit 130) or SIGTERM (143): a normal way to stop; what finished is kept."""
    from .output import stop_reason

    kept = f"what finished before it is in {results}" if results.exists() else "nothing had finished"
    typer.echo(f"{PROG}: {stop_reason(stop)}; {kept}", err=True)
    return typer.Exit(getattr(stop, "exit_code", 130))


# the options one mode reads and the other would leave unused (refused there)
LOOPS_ONLY = ("epochs", "samples", "mnist_batch", "gan_batch", "steps_per_call", "no_fit")
ZOO_ONLY = ("reps", "steps", "batch")


def _names(text: Optional[str]) -> list[str] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def main(
    ctx: typer.Context,
    models: Optional[str] = typer.Option(None, "--models", metavar="MODELS",
                                         help="Comma-separated: mnist, gan (default both); with --zoo, zoo models "
                                              "(default all: see amp_backends.zoo)."),
    configs: Optional[str] = typer.Option(None, "--configs", metavar="CONFIGS",
                                          help="Comma-separated manual configurations "
                                               f"(default all: {MANUAL_NAMES}); with --zoo, the zoo's "
                                               "configurations (baseline, auto and peers are shorthands)."),
    epochs: int = number_option(3, "--epochs", prog=PROG, metavar="N",
                                help="Timed epochs per configuration (after 1 warm-up epoch)."),
    samples: int = number_option(60000, "--samples", prog=PROG, metavar="N",
                                 help="Synthetic MNIST-shaped images per epoch."),
    mnist_batch: int = number_option(1024, "--mnist-batch", prog=PROG, metavar="N", help="MNIST CNN batch size."),
    gan_batch: int = number_option(4096, "--gan-batch", prog=PROG, metavar="N", help="GAN batch size."),
    steps_per_call: Optional[int] = number_option(None, "--steps-per-call", prog=PROG, example=32, metavar="N",
                                                  help="Trainer steps per compiled call (default: one epoch)."),
    no_fit: bool = typer.Option(False, "--no-fit", help="Skip the Keras fit configuration."),
    out: Path = typer.Option(Path("bench-results"), "--out", metavar="DIR",
                             help="Folder for the results (made if missing; never overwritten: DIR-2 next)."),
    zoo: bool = typer.Option(False, "--zoo", help="Run the model zoo instead of the tutorials' loops.",
                             rich_help_panel=ZOO_OPTIONS),
    reps: int = number_option(5, "--reps", prog=PROG, metavar="N", rich_help_panel=ZOO_OPTIONS,
                              help="Zoo: interleaved timed repetitions per configuration."),
    steps: int = number_option(4, "--steps", prog=PROG, metavar="N", help="Zoo: training steps per repetition.",
                               rich_help_panel=ZOO_OPTIONS),
    batch: Optional[int] = number_option(None, "--batch", prog=PROG, example=256, metavar="N",
                                         help="Zoo: one batch size for every model (default: each model's own; "
                                             "larger on a GPU).", rich_help_panel=ZOO_OPTIONS),
    gpu_suite: bool = typer.Option(False, "--gpu-suite", hidden=True, help="Moved: python benchmarks/gpu_suite.py."),
) -> None:
    """Time the tutorials' configurations against the auto plan (default), or the model zoo (--zoo)."""
    if gpu_suite:
        fail(PROG, MOVED_GPU_SUITE)
    given = [name for name in LOOPS_ONLY + ZOO_ONLY
             if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"]  # (typer's own click)
    if wrong := [n for n in given if (n in ZOO_ONLY) != zoo]:  # (else silently unused)
        flags = ", ".join("--" + n.replace("_", "-") for n in wrong)
        whose, fix = ("the tutorials' loops", "drop --zoo") if zoo else ("the model zoo (--zoo)", "add --zoo")
        fail(PROG, f"{flags} {'are' if len(wrong) > 1 else 'is'} for {whose}. Received: {flags} "
                   f"{'with' if zoo else 'without'} --zoo. Fix: {fix}, or drop {flags}.")
    from ...errors import AmpConfigError
    from ...tf_import import import_tensorflow, quiet_tensorflow_logs
    from .output import results_folder

    try:  # the AMP_* variables the auto plan's rows read: a bad one, or one AMP_STRICT refuses here, before timing
        refuse_up_front()
    except AmpConfigError as exc:
        fail(PROG, exc)

    if zoo:
        from ...zoo import ZOO
        from .zoo_suite import run_zoo

        zoo_models = _names(models) or list(ZOO)
        if any(m not in ZOO for m in zoo_models):
            fail(PROG, f"--zoo --models takes {', '.join(ZOO)}. Received: {models!r}. Fix: pass some of those, "
                       "comma-separated, or leave --models out (every model).")
        result = "zoo.json"
        job = functools.partial(run_zoo, zoo_models, _names(configs), reps, steps, batch)
    else:
        from .loops import check_batches, run

        wanted: list[str] | None = _names(models) if models is not None else ["mnist", "gan"]
        if not wanted or any(m not in ("mnist", "gan") for m in wanted):
            fail(PROG, f"--models takes mnist and/or gan (or zoo models with --zoo). Received: {models!r}. Fix: "
                       "--models mnist,gan, or add --zoo for the zoo's models.")
        chosen = _names(configs)
        unknown = [c for c in chosen or [] if c not in [m[0] for m in MANUAL]]
        if unknown:
            fail(PROG, f"unknown configuration(s) {unknown}; valid: {MANUAL_NAMES}. Fix: pass some of those, "
                       "comma-separated, or leave --configs out (every one).")
        try:
            check_batches(wanted, samples, mnist_batch, gan_batch)
        except ValueError as exc:
            fail(PROG, str(exc))
        result = "bench.json"
        job = functools.partial(run, wanted, chosen, epochs, samples, mnist_batch, gan_batch, steps_per_call,
                                with_fit=not no_fit)
    try:  # before any work: a file in the way of --out fails now, and an earlier run is never overwritten
        folder = results_folder(out, result)
    except ValueError as exc:
        fail(PROG, str(exc))
    if not zoo:
        import_tensorflow(quiet_tensorflow_logs())
    try:
        job(folder)
    except ValueError as exc:  # refused before it ran (a configuration this machine has not): no folder left behind
        with contextlib.suppress(OSError):
            folder.rmdir()  # (only an empty one)
        fail(PROG, str(exc))
    except KeyboardInterrupt as exc:
        raise _stopped(exc, folder / result) from None

