"""``amp-backends info`` (``python -m amp_backends.info``): the plan with its reasons, the software, the hardware.

Short by default (a few words a setting); ``--why`` gives each whole reason with its measurements, ``--json``
everything. On a terminal the report is tables; piped, one plain line a row.
"""

from __future__ import annotations

from typing import Any

import typer

from ..errors import AmpConfigError
from .typer_app import fail, with_overrides

PROG = "amp-backends"


@with_overrides()
def info(
    json_output: bool = typer.Option(
        False, "--json", help="Print the report as JSON (schema: amp_backends/schemas/report.schema.json)."),
    why: bool = typer.Option(
        False, "--why", help="Each setting's whole reason, with the measurements it quotes (results file, machine, "
                             "figures), and the rejected alternatives; without it, a few words each."),
    tensorflow: bool | None = typer.Option(
        None, "--tensorflow/--no-tensorflow", show_default=False,
        help="Import TensorFlow to list its devices, or never. Default: only when the plan depends on it (an NVIDIA "
             "GPU that TensorFlow must confirm, or Intel XPUs listed through ITEX); the rest of the report needs no "
             "TensorFlow import."),
    device: str | None = typer.Option(
        None, "--device", metavar="NAME",
        help="Plan for a device of the catalogue instead of this machine (h100, a100, t4, sapphire-rapids; the list: "
             "amp_backends.known_devices())."),
    overrides: Any = None,
) -> None:
    """Report the plan with its reasons, the software and the hardware (exit 2 on an invalid override, or one
    --strict refuses here)."""
    from ..tf_import import quiet_tensorflow_logs

    quiet = quiet_tensorflow_logs()
    from .capability_report import collect, render_text, to_json

    try:
        report = collect(use_tensorflow=tensorflow, quiet=quiet, device=device, **overrides)
    except AmpConfigError as exc:
        fail(PROG, exc)
    if json_output:
        typer.echo(to_json(report))
    else:
        render_text(report, why=why)

