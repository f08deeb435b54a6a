"""Model factories named ``MODULE:FACTORY``: the one parser and loader of ``check``, ``audit`` and its child.

A factory builds a Keras model with no arguments (``amp_backends.models:mnist_cnn``; ``mymodels:build`` for
``./mymodels.py``). Every way such a name can be wrong raises `FactoryError` with the expected form and fix.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
from typing import Any, Callable

from .errors import FactoryError

FORM = "MODULE:FACTORY"
EXAMPLE = "amp_backends.models:mnist_cnn"
_SPEC = re.compile(r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<factory>[A-Za-z_]\w*)$")


def parse_factory(spec: Any) -> tuple[str, str]:
    """``"package.module:factory"`` -> ``("package.module", "factory")``; `FactoryError` when malformed."""
    match = _SPEC.match(spec.strip()) if isinstance(spec, str) else None
    if match is not None and match.group("module").endswith(".py"):  # a file's name, read as package "mymodels"
        module = match.group("module")[:-3]
        raise FactoryError(f"expected {FORM} with the module's import name, such as {EXAMPLE}. Received: {spec!r}, a "
                           f"file's name. Fix: {module}:{match.group('factory')} (without .py), run from the folder "
                           "that holds the file")
    if match is None:
        raise FactoryError(
            f"expected {FORM}: a module's dotted import path and the name of a function in it that returns a Keras "
            f"model, such as {EXAMPLE}. Received: {spec!r}. Fix: write the module and the function name separated "
            "by one colon, with no file extension or path (mymodels:build for ./mymodels.py)")
    return match.group("module"), match.group("factory")


def factory_spec(factory: Any) -> str:
    """The ``MODULE:FACTORY`` of a factory given as that string or as a top-level function of an importable module.

    Checks the form only, importing nothing (for a process that builds the model elsewhere: the audit's child).
    """
    if isinstance(factory, str):
        module, name = parse_factory(factory)
        return f"{module}:{name}"
    owner = getattr(factory, "__module__", None)
    name = str(getattr(factory, "__qualname__", ""))
    if callable(factory) and owner and owner != "__main__" and name.isidentifier():
        return f"{owner}:{name}"
    raise FactoryError(
        f"expected a factory another process can import: a top-level function of an importable module, or its "
        f"{FORM} string. Received {factory!r:.80} (module {owner!r}, name {name!r}). Fix: move it into a module "
        "(a lambda, a nested function or one defined in __main__ cannot be imported) and pass it, or its "
        "'module:function' string")


def _origin(module_name: str) -> str | None:
    """The file of a module that was found (its import may have failed), or ``None``."""
    try:
        return getattr(importlib.util.find_spec(module_name), "origin", None)
    except Exception:  # (a parent package that fails to import)
        return None


def load_factory(factory: Any) -> Callable[[], Any]:
    """The function a ``MODULE:FACTORY`` string names (imported, the current directory importable), or ``factory``
    itself when it is already a function; `FactoryError` saying what went wrong."""
    if callable(factory) and not isinstance(factory, str):
        return factory
    module_name, factory_name = parse_factory(factory)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises while it is imported
        if isinstance(exc, ModuleNotFoundError) and f"{module_name}.".startswith(f"{exc.name}."):  # (or its package)
            fix = (f"run from the directory that holds it (or put it on PYTHONPATH), and check that `python -c "
                   f"'import {module_name}'` works")
        else:  # found: its own code raised (a SyntaxError, an import of its own that fails)
            frames, origin = traceback.extract_tb(exc.__traceback__), _origin(module_name)
            own = [f for f in frames if f.filename == origin] or frames  # (its line, not a library's)
            line = ((getattr(exc, "filename", None), getattr(exc, "lineno", None)) if isinstance(exc, SyntaxError)
                    else (own[-1].filename, own[-1].lineno) if own else (None, None))
            fix = (f"the error in the module's own code{f' ({line[0]}, line {line[1]})' if line[0] else ''}: it was "
                   f"found, and importing it raised (`python -c 'import {module_name}'` shows the same)")
        raise FactoryError(f"expected an importable module {module_name!r} ({FORM} {factory!r}), but importing it "
                           f"raised {type(exc).__name__}: {exc}. Fix: {fix}") from exc
    value = getattr(module, factory_name, None)
    if value is None:
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                         and getattr(v, "__module__", None) == module.__name__)
        raise FactoryError(
            f"expected a function {factory_name!r} in module {module_name!r} ({getattr(module, '__file__', '?')}), "
            f"but it has none. Functions defined there: {', '.join(defined) or 'none'}. Fix: name one of them after "
            f"the colon ({module_name}:<function>)")
    if not callable(value):
        raise FactoryError(
            f"expected {module_name}.{factory_name} to be a function that returns a Keras model, but it is "
            f"{value!r:.80} (of type {type(value).__name__}). Fix: name a function taking no arguments after the colon")
    try:
        needs = [p.name for p in inspect.signature(value).parameters.values()
                 if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):  # (a callable without a signature Python can read: called as it is)
        needs = []
    if needs:
        raise FactoryError(
            f"expected {module_name}.{factory_name} to build a model with no arguments, but it takes "
            f"{', '.join(needs)}. Fix: give them defaults, or name a function that passes them "
            f"(def build(): return {factory_name}(...)) after the colon")
    return value


def build_model(factory: Callable[[], Any], spec: str, traceback_at: str = "traceback above") -> Any:
    """Call a factory for its model: what ``check`` and the audit's child build.

    Args:
        factory: The function `load_factory` returned.
        spec: Its ``MODULE:FACTORY``, as the messages name it.
        traceback_at: Where the reader finds the factory's traceback when it raises.

    Returns:
        The Keras model it returned.

    Raises:
        FactoryError: The factory raised (the exception is its ``__cause__``) or returned no Keras model.
    """
    from .keras_compat import is_keras_model

    module, name = parse_factory(spec)
    try:
        model = factory()
    except Exception as exc:
        raise FactoryError(f"{module}.{name}() raised {type(exc).__name__}: {exc} ({traceback_at}). Expected it to "
                           "build and return a Keras model with no arguments. Fix: the error in the factory, or wrap "
                           "it in a function that passes its arguments") from exc
    if not is_keras_model(model):
        raise FactoryError(f"expected {module}.{name}() to return a Keras model (keras.Model), but it returned "
                           f"{type(model).__module__}.{type(model).__name__} ({model!r:.80}). Fix: return the model "
                           "itself (for a layer: keras.Sequential([keras.Input(shape), layer]))")
    return model
