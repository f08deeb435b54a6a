"""The ``amp-backends`` command line (typer): ``info``, ``check``, ``bench`` and ``train mnist|gan``.

Importing this module defines ``info`` only; ``bench`` and ``train`` are registered by :func:`get_app`
when the command line runs, so importing the CLI (or running ``info``) never loads the benchmark, the
examples or numpy. Help is click's plain layout (``rich_markup_mode=None``): it wraps to the terminal
instead of cutting option names, and shows no type markers (:mod:`.typer_app`).
"""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import AmpConfigError
from .typer_app import make_app, override_option, run_single

app = make_app("Hardware-aware mixed precision for TensorFlow/Keras: what this machine can do, and the plan.",
               no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Hardware-aware mixed precision for TensorFlow/Keras."""


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"amp-backends: error: {message}", err=True)
    raise typer.Exit(code)


def info(
    json_output: bool = typer.Option(False, "--json", help="Print the report as JSON (schema: amp_backends.commands.report)."),
    tensorflow: Optional[bool] = typer.Option(
        None, "--tensorflow/--no-tensorflow", show_default=False,
        help="Import TensorFlow to list its devices, or never. Default: only when the plan depends on it (an NVIDIA "
             "GPU that TensorFlow must confirm, or Intel XPUs listed through ITEX); the rest of the report needs no "
             "TensorFlow import."),
    backend: Optional[str] = override_option("backend"),
    policy: Optional[str] = override_option("policy"),
    xla: Optional[str] = override_option("xla"),
    tf32: Optional[str] = override_option("tf32"),
    loss_scale: Optional[str] = override_option("loss_scale"),
    itex_amp: Optional[str] = override_option("itex_amp"),
    fp8: Optional[str] = override_option("fp8"),
    strict: bool = override_option("strict"),
    force: bool = override_option("force"),
) -> None:
    """Report the plan with its reasons, the software and the hardware (exit 2 on an invalid override)."""
    from .quiet import quiet_tensorflow_logs

    quiet = quiet_tensorflow_logs()
    from .report import collect, render_text, to_json

    try:
        report = collect(use_tensorflow=tensorflow, quiet=quiet, backend=backend, policy=policy, xla=xla, tf32=tf32,
                         loss_scale=loss_scale, itex_amp=itex_amp, fp8=fp8, strict=strict or None,
                         force=force or None)
    except AmpConfigError as exc:
        fail(str(exc))
        return
    if json_output:
        typer.echo(to_json(report))
    else:
        render_text(report)


app.command("info", short_help="The plan with its reasons, the software and the hardware.")(info)
_registered = False


def get_app() -> typer.Typer:
    """The full command line: ``info``, plus ``bench`` and ``train`` registered on first use."""
    global _registered
    if not _registered:
        from ..examples.gan import gan_command
        from ..examples.mnist import mnist_command
        from ..model_check.command import check_command
        from .bench import main as bench_main

        train_app = make_app("Train the tutorials' models under the auto plan.", no_args_is_help=True)

        @train_app.callback()
        def _train_group() -> None:
            """Train the tutorials' models under the auto plan."""

        train_app.command("mnist")(mnist_command)
        train_app.command("gan")(gan_command)
        app.add_typer(train_app, name="train", short_help="Train the tutorials' MNIST CNN or GAN under the auto plan.")
        app.command("check", short_help="Check a Keras model for what makes mixed precision slow or wrong.")(
            check_command)
        app.command("bench", help=bench_main.__doc__, short_help="Time the tutorials' configurations against the auto plan.")(
            bench_main)
        _registered = True
    return app


def main() -> None:
    """Entry point of the ``amp-backends`` script and ``python -m amp_backends``."""
    get_app()()


def info_main() -> None:
    """Entry point of ``python -m amp_backends.info``."""
    run_single(info)
