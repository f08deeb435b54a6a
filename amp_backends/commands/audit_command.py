"""``amp-backends audit MODULE:FACTORY``: train a few steps of a model in a child process and report what ran.

The same factories and plan overrides as ``amp-backends check`` (the overrides reach the child as ``AMP_*``
variables); see `amp_backends.audit`. Ctrl-C (exit 130) or SIGTERM (143) stops the child and says so in one line.
"""

from __future__ import annotations

import signal
from typing import Any

import typer

from ..factory import EXAMPLE
from .typer_app import fail, number_option, refuse_up_front, with_overrides

PROG = "amp-backends audit"


@with_overrides()
def audit_command(
    target: str = typer.Argument(..., metavar="MODULE:FACTORY",
                                 help=f"A function that builds a Keras model with no arguments, such as {EXAMPLE}."),
    batch_size: int = number_option(32, "--batch-size", "--batch_size", prog=PROG, metavar="N",
                                    help="The synthetic training batch."),
    steps: int = number_option(3, "--steps", prog=PROG, metavar="N",
                               help="Training steps measured, after 2 warm-up steps."),
    json_output: bool = typer.Option(False, "--json",
                                     help="Print JSON (schema: amp_backends/schemas/audit.schema.json)."),
    seq_len: int | None = number_option(
        None, "--seq-len", prog=PROG, example=128, metavar="N",
        help="Set every open input dimension after the batch (a sequence length) to N (default: 8; the notes say "
             "so)."),
    input_shape: str | None = typer.Option(
        None, "--input-shape", metavar="SHAPE",
        help="One example's input shape, without the batch: 64x64x3, or name=128,other=128 for named inputs."),
    overrides: Any = None,
) -> None:
    """Train a few steps of MODULE:FACTORY under the plan and report the kernels that ran: dtypes, float32 islands."""
    from ..auditing import audit
    from ..errors import AmpConfigError, ModelCallError
    from ..model_check.shapes import shape_options

    overrides = dict(overrides or {})
    try:  # invalid overrides, and a request --strict refuses on this machine, are refused here before the child
        refuse_up_front(**overrides)
        shape_options(seq_len, input_shape)  # in the options' words
        result = audit(target, batch_size=batch_size, steps=steps, seq_len=seq_len, input_shape=input_shape,
                       **overrides)
    except (AmpConfigError, ModelCallError, ValueError, TypeError) as exc:  # (as check: the caller's error, exit 2)
        fail(PROG, exc)
    except RuntimeError as exc:
        fail(PROG, exc, code=1)
    except KeyboardInterrupt as exc:  # Ctrl-C (to this process or its group) or SIGTERM: the child was stopped
        name = signal.Signals(getattr(exc, "signum", signal.SIGINT)).name
        fail(PROG, f"interrupted ({name}) before the audit of {target} finished: its child process was stopped, "
                   "nothing was measured.", getattr(exc, "exit_code", 130), kind="stopped")
    if json_output:
        typer.echo(result.to_json())
    else:
        result.render_text()
