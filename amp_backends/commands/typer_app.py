"""What every command shares: the typer settings, the plan overrides' options, and how a command fails.

Help is click's plain layout (``rich_markup_mode=None``), up to 120 columns, with ``-h``: typer's rich
panels cut long option names at 80 columns and add type markers (``<bool>``); click's layout wraps to the
terminal instead.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NoReturn, Optional

import typer

from ..request import OPTIONS, option_help, overrides_given

CONTEXT = {"max_content_width": 120, "help_option_names": ["-h", "--help"]}
OVERRIDES = "overrides"  # the parameter of a command that receives the plan overrides given, as one dict


def make_app(help: str | None = None, **kwargs: Any) -> typer.Typer:
    """A typer application with the plain help layout."""
    return typer.Typer(help=help, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                       context_settings=CONTEXT, **kwargs)


def run_single(command: Callable[..., Any]) -> None:
    """Run one command function as a whole program (``python -m amp_backends.info``)."""
    app = make_app()
    app.command()(command)
    app()


def fail(prog: str, message: object, code: int = 2, kind: str = "error") -> NoReturn:
    """End the command: ``<prog>: <kind>: <message>`` on stderr, exit status ``code`` (2: a usage error)."""
    typer.echo(f"{prog}: {kind}: {message}", err=True)
    raise typer.Exit(code)


def with_overrides(*, exclude: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the plan overrides' options of :data:`amp_backends.request.OPTIONS` (all but ``exclude``).

    The command declares one parameter ``overrides`` where the options go in its help; it receives the
    overrides given, as ``auto_configure`` keywords (:func:`~amp_backends.request.overrides_given`)::

        @with_overrides()
        def info(json_output: bool = ..., overrides: dict = {}) -> None:
            plan = auto_configure(**overrides)
    """
    options = [o for o in OPTIONS if o.name not in exclude]

    def parameter(option: Any) -> inspect.Parameter:
        help = option_help(option.name)
        if option.flag:
            return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                                     default=typer.Option(False, option.flag_name, help=help))
        return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                                 default=typer.Option(None, option.flag_name, metavar=option.metavar, help=help))

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command)
        if OVERRIDES not in signature.parameters:
            raise TypeError(f"{command.__name__} takes no {OVERRIDES!r} parameter for the plan overrides")
        params: list[inspect.Parameter] = []
        for p in signature.parameters.values():
            if p.name == OVERRIDES:
                params += [parameter(o) for o in options]
            else:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(command)
        def wrapper(**parsed: Any) -> Any:
            given = overrides_given({o.name: parsed.pop(o.name) for o in options})
            return command(**parsed, **{OVERRIDES: given})

        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate
