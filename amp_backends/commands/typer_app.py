"""The typer settings every command uses: click's plain help layout, up to 120 columns, ``-h``.

Plain (``rich_markup_mode=None``) because typer's rich panels cut long option names at 80 columns and add
type markers (``<bool>``); click's layout wraps to the terminal instead.
"""

from __future__ import annotations

from typing import Any, Callable

import typer

CONTEXT = {"max_content_width": 120, "help_option_names": ["-h", "--help"]}


_METAVARS = {"backend": "NAME", "policy": "POLICY", "xla": "auto|on|off", "tf32": "auto|on|off", "loss_scale": "SCALE",
             "itex_amp": "on|off", "fp8": "auto|on|off"}


def override_option(name: str) -> Any:
    """The command-line option of plan override ``name`` (``--loss-scale`` for ``loss_scale``), the same in
    every command: its values and the ``AMP_*`` variable it defaults to in the help."""
    from ..request import option_help

    flag = "--" + name.replace("_", "-")
    if name in ("strict", "force"):
        return typer.Option(False, flag, help=option_help(name))
    return typer.Option(None, flag, metavar=_METAVARS[name], help=option_help(name))


def make_app(help: str | None = None, **kwargs: Any) -> typer.Typer:
    """A typer application with the plain help layout."""
    return typer.Typer(help=help, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                       context_settings=CONTEXT, **kwargs)


def run_single(command: Callable[..., Any]) -> None:
    """Run one command function as a whole program (``python -m amp_backends.info``)."""
    app = make_app()
    app.command()(command)
    app()
