"""Validate a report against the JSON Schema the package ships for it (``amp_backends/schemas/<name>.schema.json``)."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import jsonschema

NAMES = ("audit", "bench", "check", "report", "zoo")


@functools.cache
def schema(name: str) -> dict[str, Any]:
    """The shipped schema, read as an installed package reads it (a wheel's package data, or the checkout)."""
    return json.loads((resources.files("amp_backends") / "schemas" / f"{name}.schema.json").read_text("utf-8"))


def errors(name: str, data: Any, definition: str | None = None) -> list[str]:
    """Every way ``data`` (as JSON would carry it) breaks the schema ``name`` (or one of its ``$defs``)."""
    target = schema(name)
    if definition is not None:
        target = {"$defs": target["$defs"], "$ref": f"#/$defs/{definition}"}
    validator = jsonschema.Draft202012Validator(target)
    out = []
    for error in validator.iter_errors(json.loads(json.dumps(data, default=str))):
        while error.context:  # "not valid under any of the given schemas": the branch of the value's type
            branches = [e for e in error.context if not (e.validator == "type" and not e.relative_path)]
            error = jsonschema.exceptions.best_match(branches or error.context)
        out.append(f"{'/'.join(map(str, error.absolute_path)) or '<top>'}: {error.message[:300]}")
    return sorted(out)


def assert_valid(name: str, data: Any, definition: str | None = None) -> None:
    problems = errors(name, data, definition)
    assert not problems, f"the output breaks amp_backends/schemas/{name}.schema.json:\n" + "\n".join(problems)
