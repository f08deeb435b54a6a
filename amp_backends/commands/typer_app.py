"""What every command shares: the typer settings, the plan overrides' options, numbers, and how a command fails.

Help is click's plain layout (``rich_markup_mode=None``), up to 120 columns, with ``-h``: typer's rich panels cut
long option names at 80 columns and add type markers.
"""

from __future__ import annotations

import collections
import functools
import inspect
import logging
import math
import shlex
import sys
import warnings
from collections.abc import Callable
from typing import Any, NoReturn, Optional

import typer

from ..tf_import import exit_quickly
from ..override_sources import keywords_as_options
from ..request import OPTIONS, RENAMED, option_help, overrides_given, renamed_message
from ..errors import AmpConfigError, AmpWarning, warn

CONTEXT = {"max_content_width": 120, "help_option_names": ["-h", "--help"]}
OVERRIDES = "overrides"  # the parameter of a command that receives the plan overrides given, as one dict


def make_app(help: str | None = None, **kwargs: Any) -> typer.Typer:
    """A typer application with the plain help layout."""
    return typer.Typer(help=help, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                       context_settings=CONTEXT, **kwargs)


class _Logged(logging.Handler):
    """The library's warning lines a command logged: a warning of the same words is not said twice."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: collections.deque[str] = collections.deque(maxlen=20)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def show_warnings_plainly() -> None:
    """A command's warnings as ``warning: <message>`` on stderr, once (not again after the log line of the same
    words): the library's file and line, Python's way, say nothing to the user of a command."""
    logged = _Logged()
    logging.getLogger("amp_backends").addHandler(logged)
    shown = warnings.showwarning

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        text = str(message)
        if not issubclass(category, (AmpWarning, DeprecationWarning, FutureWarning)):
            shown(message, category, filename, lineno, file, line)
        elif not any(text in said or said in text for said in logged.lines):
            print(f"warning: {text}", file=file or sys.stderr)

    warnings.showwarning = show


def run_single(command: Callable[..., Any]) -> None:
    """Run one command function as a whole program (``python -m amp_backends.info``)."""
    exit_quickly()
    show_warnings_plainly()
    app = make_app()
    app.command()(command)
    run_app(app)


def run_app(app: Callable[[], Any]) -> None:
    """Run ``app`` as the program. Where the reader closed the pipe early (``| head``), it ends as Unix tools end:
    exit 141 (128 + SIGPIPE), not click's 1, which is `check`'s exit for an error finding."""
    try:
        app()
    except SystemExit:
        if "PacifyFlushWrapper" in type(sys.stdout).__name__:  # (click's, once a write met a closed pipe)
            raise SystemExit(141) from None
        raise


def refuse_up_front(**overrides: Any) -> None:
    """Refuse, before a command's work, the plan overrides (and ``AMP_*`` variables) it would be refused later:
    invalid values, with the request's own warnings (a misspelt variable), and a request strict mode refuses on
    this machine. A downgrade's warning is left to the plan the work makes.

    Args:
        **overrides: The command's plan overrides, as ``auto_configure``'s keywords.

    Raises:
        AmpConfigError: An override or variable is invalid, or strict mode refuses the request here.
    """
    from ..configure import plan_for
    from ..registry import default_registry
    from ..request import build_request

    build_request(default_registry().known_names(), **overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan_for(**overrides)


def fail(prog: str, message: object, code: int = 2, kind: str = "error") -> NoReturn:
    """End the command: ``<prog>: <kind>: <message>`` on stderr, exit status ``code`` (2: a usage error)."""
    typer.echo(f"{prog}: {kind}: {message}", err=True)
    raise typer.Exit(code)


def number_option(default: Any, *flags: str, prog: str, kind: type = int, minimum: float = 1,
                  example: Any = None, **kwargs: Any) -> Any:
    """A typer option taking a number (``int`` or a finite ``float``) of at least ``minimum``; anything else ends the
    command before any work with the value and a fix offering ``example`` (default: ``default``), exit status 2
    (typer's own message names neither)."""
    flag, expected = flags[0], f"{'an integer' if kind is int else 'a number'} >= {minimum:g}"
    offer = example if example is not None else default

    def parse(value: Any) -> Any:
        try:
            number = kind(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            number = None
        if number is None or not math.isfinite(number) or number < minimum:
            typer.echo(f"{prog}: error: {flag} must be {expected}. Received: {flag} {shlex.quote(str(value))}. "
                       f"Fix: pass {expected}" + (f", such as {flag} {offer}." if offer is not None else "."), err=True)
            raise typer.Exit(2)
        return number

    return typer.Option(default, *flags, parser=parse, **kwargs)


def with_overrides(*, exclude: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the plan overrides' options of `amp_backends.request.OPTIONS` (all but ``exclude``), and the
    old names of `amp_backends.request.RENAMED` as hidden options that still work, with a ``FutureWarning``. The
    command's parameter ``overrides`` (where the options go in its help) receives those given, as ``auto_configure``
    keywords (`overrides_given`)."""
    options = [o for o in OPTIONS if o.name not in exclude]
    renamed = {old: new for old, new in RENAMED.items() if new not in exclude}  # old flags: hidden, still taken

    def parameter(name: str, flag: bool, *decls: str, **kwargs: Any) -> inspect.Parameter:  # a flag, or a value
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=bool if flag else Optional[str],
                                 default=typer.Option(False if flag else None, *decls, **kwargs))

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command)
        if OVERRIDES not in signature.parameters:
            raise AmpConfigError(f"{command.__name__} takes no {OVERRIDES!r} parameter for the plan overrides")
        params: list[inspect.Parameter] = []
        for p in signature.parameters.values():
            if p.name == OVERRIDES:
                params += [parameter(o.name, o.flag, o.flag_name, metavar=o.metavar, help=option_help(o.name))
                           for o in options]
                params += [parameter(old, False, "--" + old.replace("_", "-"), hidden=True) for old in renamed]
            else:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(command)
        def wrapper(**parsed: Any) -> Any:
            for old, new in renamed.items():
                value = parsed.pop(old)
                if value is not None:
                    warn(renamed_message(old, "option"), FutureWarning)
                    parsed[new] = parsed[new] if parsed[new] is not None else value
            given = overrides_given({o.name: parsed.pop(o.name) for o in options})
            with keywords_as_options(given):  # an invalid value is named as its flag
                return command(**parsed, **{OVERRIDES: given})

        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate
