"""The ``amp-backends`` command line (typer): ``info`` today; ``train`` and ``bench`` build on it."""

from __future__ import annotations

import os
import sys
from typing import Optional

import typer

from .errors import AmpConfigError

app = typer.Typer(
    help="Hardware-aware mixed precision for TensorFlow/Keras: what this machine can do, and the plan.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

@app.callback()
def _group() -> None:
    """Hardware-aware mixed precision for TensorFlow/Keras."""


OVERRIDE_HELP = "Overrides (default: the AMP_* environment variable, else auto)."


def _quiet_tensorflow() -> None:
    # Our own process: keep TensorFlow's C++ start-up chatter out of the report unless asked for.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"amp-backends: error: {message}", err=True)
    raise typer.Exit(code)


def info(
    json_output: bool = typer.Option(False, "--json", help="Print the report as JSON (schema in amp_backends.report)."),
    no_tensorflow: bool = typer.Option(
        False, "--no-tensorflow", help="Do not import TensorFlow: faster, but no Intel XPU probe and no TF build info."
    ),
    backend: Optional[str] = typer.Option(None, help=f"Backend: auto, nvidia, intel, cpu. {OVERRIDE_HELP}"),
    policy: Optional[str] = typer.Option(None, help="auto, float32, mixed_float16, mixed_bfloat16."),
    xla: Optional[str] = typer.Option(None, help="auto, on, off."),
    tf32: Optional[str] = typer.Option(None, help="auto, on, off."),
    loss_scale: Optional[str] = typer.Option(None, "--loss-scale", help="auto, dynamic, none, fixed:<scale>."),
    strict: bool = typer.Option(False, "--strict", help="Fail instead of downgrading an unsupported request."),
) -> None:
    """Report the hardware, the software and the mixed-precision plan with its reasons."""
    _quiet_tensorflow()
    from .report import collect, render_text, to_json

    try:
        report = collect(use_tensorflow=not no_tensorflow, backend=backend, policy=policy, xla=xla, tf32=tf32,
                         loss_scale=loss_scale, strict=strict or None)
    except AmpConfigError as exc:
        fail(str(exc))
        return
    if json_output:
        typer.echo(to_json(report))
    else:
        render_text(report)


app.command("info")(info)

train_app = typer.Typer(help="Train the tutorials' models under the auto plan.", no_args_is_help=True)


@train_app.callback()
def _train_group() -> None:
    """Train the tutorials' models under the auto plan."""


def _register_training_commands() -> None:
    from .examples.gan import gan_command
    from .examples.mnist import mnist_command

    train_app.command("mnist")(mnist_command)
    train_app.command("gan")(gan_command)


_register_training_commands()
app.add_typer(train_app, name="train")


def _register_bench() -> None:
    from .bench import main as bench_main

    app.command("bench", help=bench_main.__doc__)(bench_main)


_register_bench()


def main() -> None:
    app()


def info_main() -> None:
    """Entry for ``python -m amp_backends.info``."""
    typer.run(info)


if __name__ == "__main__":  # pragma: no cover
    main()
