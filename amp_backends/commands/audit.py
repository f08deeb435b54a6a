"""``amp-backends audit MODULE:FACTORY``: train a few steps of a model in a child process and report what ran.

The same factories and plan overrides as ``amp-backends check``; the overrides reach the child as ``AMP_*``
variables, so it plans as ``auto_configure()`` would with them. See :mod:`amp_backends.audit`.
"""

from __future__ import annotations

from typing import Any

import typer

from .typer_app import override_option

EXAMPLE = "amp_backends.models:mnist_cnn"


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"amp-backends audit: error: {message}", err=True)
    raise typer.Exit(code)


def audit_command(
    target: str = typer.Argument(..., metavar="MODULE:FACTORY",
                                 help=f"A function that builds a Keras model with no arguments, such as {EXAMPLE}."),
    batch_size: int = typer.Option(32, "--batch-size", "--batch_size", min=1, help="The synthetic training batch."),
    steps: int = typer.Option(3, "--steps", min=1, help="Training steps measured, after 2 warm-up steps."),
    json_output: bool = typer.Option(False, "--json", help="Print JSON (schema in amp_backends.audit.report)."),
    backend: str | None = override_option("backend"),
    policy: str | None = override_option("policy"),
    xla: str | None = override_option("xla"),
    tf32: str | None = override_option("tf32"),
    loss_scale: str | None = override_option("loss_scale"),
    itex_amp: str | None = override_option("itex_amp"),
    fp8: str | None = override_option("fp8"),
    strict: bool = override_option("strict"),
    force: bool = override_option("force"),
) -> None:
    """Train a few steps of MODULE:FACTORY under the plan and report the kernels that ran: dtypes, float32 islands."""
    from ..audit import audit
    from ..errors import AmpConfigError
    from ..registry import default_registry
    from ..request import build_request

    overrides: dict[str, Any] = {"backend": backend, "policy": policy, "xla": xla, "tf32": tf32,
                                 "loss_scale": loss_scale, "itex_amp": itex_amp, "fp8": fp8,
                                 "strict": strict or None, "force": force or None}
    try:  # invalid overrides are refused here, before the child starts
        build_request(default_registry().known_names(), **overrides)
        result = audit(target, batch_size=batch_size, steps=steps, **overrides)
    except (AmpConfigError, ValueError, TypeError) as exc:
        _fail(str(exc))
        return
    except RuntimeError as exc:
        _fail(str(exc), code=1)
        return
    if json_output:
        typer.echo(result.to_json())
    else:
        result.render_text()
