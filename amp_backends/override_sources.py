"""The words an override is given in, and where each given value came from: its ``AMP_*`` variable (`env_name`), its
command-line flag (`flag_name`), its value as text (`format_value`), and the context in which keyword overrides are a
command's options (`keywords_as_options`) or a chooser's choice such as autotune's (`keywords_chosen_by`), so that
errors and the plan's reasons name them as the user gave them and a refusal's fix says how to take them back
(`undo_of`). `amp_backends.request.build_request` reads `GIVEN_BY`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from typing import Any


def env_name(name: str) -> str:
    """The ``AMP_*`` variable of an override.

    Args:
        name: The override's keyword (or an old name of `amp_backends.request.RENAMED`).

    Returns:
        ``AMP_POLICY`` for ``policy``.
    """
    return "AMP_" + name.upper()


def flag_name(name: str) -> str:
    """The command-line flag of an override.

    Args:
        name: The override's keyword (or an old name of `amp_backends.request.RENAMED`).

    Returns:
        ``--loss-scale`` for ``loss_scale``.
    """
    return "--" + name.replace("_", "-")


def format_value(value: Any) -> str:
    """An override's value in the words the plan's lines say it.

    Args:
        value: The value (a field of `amp_backends.request.Request`).

    Returns:
        ``on``/``off`` for a bool, a tuple comma-separated (``none``: empty), else ``str(value)``.
    """
    if value is True:
        return "on"
    if value is False:
        return "off"
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    return str(value)


# Where keyword overrides came from when not from the caller's own code, by name: (value, how its errors are
# worded, its source as the plan says it). `keywords_as_options` (a command's flags) and `keywords_chosen_by`
# (autotune's choice) set it; a keyword of build_request holding that value is said with that source.
GIVEN_BY: contextvars.ContextVar[Mapping[str, tuple[Any, str, str]] | None] = contextvars.ContextVar(
    "amp_given_by", default=None)


@contextlib.contextmanager
def _given_by(given: Mapping[str, tuple[Any, str, str]]) -> Iterator[None]:
    token = GIVEN_BY.set({**(GIVEN_BY.get() or {}), **given})
    try:
        yield
    finally:
        GIVEN_BY.reset(token)


def keywords_as_options(given: Mapping[str, Any]) -> contextlib.AbstractContextManager[None]:
    """While it lasts, the keyword overrides ``given`` are a command's options: their errors and the plan's reasons
    name the flag (``--policy``); any other keyword (a model factory's own ``auto_configure(...)``) keeps the Python
    words.

    Args:
        given: The overrides the command line gave, as ``auto_configure``'s keywords
            (`amp_backends.request.overrides_given`).

    Returns:
        A context manager: the block runs with those overrides in the command line's words.
    """
    return _given_by({name: (value, "option", flag_name(name)) for name, value in given.items()})


# How to take back each chooser's choice (`keywords_chosen_by`), as a refusal's fix says it
_UNDO: dict[str, str] = {}


def keywords_chosen_by(chooser: str, chosen: Mapping[str, Any], undo: str) -> contextlib.AbstractContextManager[None]:
    """While it lasts, the keyword overrides ``chosen`` are ``chooser``'s choice, not the caller's request: the
    plan's reasons say ``requested (autotune)`` where they would say ``requested (argument)``, and a refusal's fix
    says ``undo``.

    Args:
        chooser: What chose them, as the plan names the source (``"autotune"``).
        chosen: The overrides it chose, as ``auto_configure``'s keywords.
        undo: How to take the choice back, as a refusal's fix says it.

    Returns:
        A context manager: the block runs with those overrides said as ``chooser``'s.
    """
    _UNDO[chooser] = undo
    return _given_by({name: (value, "argument", chooser) for name, value in chosen.items()})


def undo_of(source: str) -> str:
    """How to take an override back, in the words it was given in (``Request.sources``).

    Args:
        source: Where it came from: ``"argument"``, a command's flag, a variable, or a chooser.

    Returns:
        The fix: ``remove the override``, ``leave --policy out``, ``unset AMP_POLICY``, or the chooser's own.
    """
    return ("remove the override" if source == "argument" else f"leave {source} out" if source.startswith("--")
            else _UNDO.get(source) or f"unset {source}")
