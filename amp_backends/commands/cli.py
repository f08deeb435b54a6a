"""The ``amp-backends`` command line (typer): ``info``, ``check``, ``audit``, ``bench`` and ``train mnist|gan``.

Importing this module defines ``info`` only; the others are registered by `get_app` when the command line runs, so
importing the CLI (or running ``info``) never loads the benchmark, the examples or numpy.
"""

from __future__ import annotations

import functools

import typer

from ..tf_import import exit_quickly
from .info_command import info
from .typer_app import make_app, run_app, show_warnings_plainly

app = make_app("Hardware-aware mixed precision for TensorFlow/Keras: what this machine can do, and the plan.",
               no_args_is_help=True)


def _show_version(asked: bool) -> None:
    if asked:
        from ..version import __version__

        typer.echo(f"amp-backends {__version__}")
        raise typer.Exit()


@app.callback()
def _group(version: bool = typer.Option(False, "--version", is_eager=True, callback=_show_version,
                                        help="Print the version of amp_backends and exit.")) -> None:
    """Hardware-aware mixed precision for TensorFlow/Keras."""


app.command("info", short_help="The plan with its reasons, the software and the hardware.")(info)


@functools.cache
def get_app() -> typer.Typer:
    """The full command line: ``info``, plus ``check``, ``audit``, ``bench`` and ``train`` registered on first use."""
    from .audit_command import audit_command
    from .bench import main as bench_main
    from .check_command import check_command
    from .train_command import train_app

    app.add_typer(train_app(), name="train", short_help="Train the tutorials' MNIST CNN or GAN under the auto plan.")
    app.command("check", short_help="Check a Keras model for what makes mixed precision slow or wrong.")(check_command)
    app.command("audit", short_help="Train a few steps and report the kernels that ran: dtypes, float32 islands.")(
        audit_command)
    app.command("bench", help=bench_main.__doc__,
                short_help="Time the tutorials' configurations against the auto plan.")(bench_main)
    return app


def main() -> None:
    """Entry point of the ``amp-backends`` script and ``python -m amp_backends``."""
    exit_quickly()
    show_warnings_plainly()
    run_app(get_app())
