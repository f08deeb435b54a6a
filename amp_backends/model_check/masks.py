"""Large negative constants in the traced graph: the attention masks that overflow float16, bfloat16 or float8.

A mask of ``-1e9``, ``-1e10`` or ``float32.min`` is ``-inf`` in float16 (which ends at -65504), and
``float32.min`` is in bfloat16 (float8 types end sooner, some at NaN). ``-inf`` is worse than large: ``0 * -inf``
is NaN (the ``(1 - mask) * c`` pattern turns every kept position NaN), and a fully masked row's softmax is NaN.
Keras's own masks stay finite. A number mixed into a bfloat16 tensor is written into the graph as a bfloat16
constant, already ``-inf``: constants are read in every reduced float dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_FOLLOW = ("Identity", "Mul", "AddV2", "Add", "Sub", "Neg", "Maximum", "Minimum", "SelectV2", "Select")
_MAX_ELEMENTS = 4096  # larger constants are weights or tables, not masks


@dataclass(frozen=True)
class MaskConstant:
    """A constant ``value`` (its most negative element) that becomes ``-inf`` in ``dtype`` in layer ``layer``.

    ``stored``: the dtype it is written in (``value`` is ``-inf`` already where that is ``dtype``); ``direct``:
    the constant itself becomes ``-inf`` (written in ``dtype`` or cast right away), so the math after it meets
    ``-inf``, not only its result.
    """

    name: str
    layer: int
    value: float
    stored: str
    dtype: str
    direct: bool = True


def reduced_float(name: str) -> bool:
    """Whether ``name`` is a floating dtype narrower than float32: float16, bfloat16, the float8 types."""
    import tensorflow as tf

    try:
        dtype = tf.as_dtype(name)
    except (TypeError, ValueError):
        return False
    return bool(dtype.is_floating) and dtype.size < 4


def _written(value: float, dtype: str) -> float:
    """``value`` once written in ``dtype`` (rounded as TensorFlow's Cast rounds), read back."""
    import numpy as np
    import tensorflow as tf

    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.asarray(value, np.float64).astype(tf.as_dtype(dtype).as_numpy_dtype).astype(np.float64))


def limit(dtype: str) -> float:
    """The largest finite value of ``dtype`` (65504 for float16)."""
    import tensorflow as tf

    return float(tf.as_dtype(dtype).max)


def _constant_min(op: Any) -> float | None:
    """The most negative element of a floating constant, whatever its float type (NaN counts as -inf)."""
    import numpy as np
    import tensorflow as tf

    try:  # (np.issubdtype(..., np.floating) is False for ml_dtypes' bfloat16 and float8: converted instead)
        value = tf.make_ndarray(op.get_attr("value"))
        wide = value.astype(np.float64) if 0 < value.size <= _MAX_ELEMENTS else None
    except (ValueError, TypeError):
        return None
    if wide is None:
        return None
    if np.isnan(wide).any():
        return float("-inf")  # a float8 type without infinity stores an overflow as NaN
    return float(np.min(wide))


def _reduced_dtypes_reached(op: Any, depth: int = 3) -> dict[str, bool]:
    """The reduced-precision dtypes the constant is cast into, through a few elementwise ops: dtype -> direct."""
    found: dict[str, bool] = {}
    frontier = [op]
    for level in range(depth):
        consumers = [c for node in frontier for out in node.outputs for c in out.consumers()]
        for cast in (c for c in consumers if c.type == "Cast" and reduced_float(c.outputs[0].dtype.name)):
            name = cast.outputs[0].dtype.name
            found[name] = found.get(name, False) or level == 0
        frontier = [c for c in consumers if c.type in _FOLLOW]
    return found


def large_negative_constants(ops: list[Any], layer_of: Callable[[str], int]) -> list[MaskConstant]:
    """Constants that are -inf (or NaN) in the reduced float dtype they are written in or cast into."""
    out: list[MaskConstant] = []
    for op in ops:
        if op.type != "Const" or not op.outputs or not op.outputs[0].dtype.is_floating:
            continue
        low = _constant_min(op)
        if low is None or low >= 0:
            continue
        stored = op.outputs[0].dtype.name
        targets = {stored: True} if reduced_float(stored) else _reduced_dtypes_reached(op)
        for dtype, direct in sorted(targets.items()):
            if not math.isfinite(_written(low, dtype)):
                out.append(MaskConstant(op.name, layer_of(op.name), low, stored, dtype, direct))
    return out


def overflow_result(dtype: str) -> str:
    """What a number beyond ``dtype``'s range becomes there: ``-inf``, or ``NaN`` in a type with no infinity."""
    return "NaN" if math.isnan(_written(-1e300, dtype)) else "-inf"
