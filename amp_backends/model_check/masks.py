"""Large negative constants in the traced graph: the attention masks that overflow float16 (or bfloat16).

Attention code masks positions by adding (or ``where``-ing in) a large negative number before the softmax:
``-1e9``, ``-1e10``, ``tf.float32.min``. float16 ends at -65504, so in float16 such a constant is ``-inf``;
bfloat16 ends at about -3.39e38, so ``float32.min`` rounds to ``-inf`` there. ``-inf`` is worse than
large: ``0 * -inf`` is NaN (the ``(1 - mask) * -1e9`` pattern then turns every *kept* position into NaN),
and a row with every position masked is ``softmax(-inf, ..., -inf)`` = NaN. Keras itself is safe: its
Softmax layer masks with -3e4 in float16 and -1e9 otherwise (``_large_negative_number``), its TensorFlow
``dot_product_attention`` with -0.7 times the dtype's largest value (``_get_large_negative``), so both
stay finite.

:func:`large_negative_constants` finds, among the ops on a model's graph, the constants that are (or are
cast into) a reduced-precision float beyond its range, each with the layer whose scope created it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FLOAT16_MAX = 65504.0
BFLOAT16_MAX = 3.3895313892515355e38
LIMITS = {"float16": FLOAT16_MAX, "bfloat16": BFLOAT16_MAX}
_FOLLOW = ("Identity", "Mul", "AddV2", "Add", "Sub", "Neg", "Maximum", "Minimum", "SelectV2", "Select")


@dataclass(frozen=True)
class MaskConstant:
    """A constant ``value`` (its most negative element) that becomes ``-inf`` in ``dtype`` in layer ``layer``.

    ``stored`` is the dtype the constant is written in (float32 when a Cast carries it to ``dtype``);
    ``direct`` says that the constant itself becomes ``-inf`` (written in ``dtype``, or cast right away), so
    the math after it (``(1 - mask) * c``) meets ``-inf``; else it is cast after that math, which ran in
    the wider dtype.
    """

    name: str
    layer: int
    value: float
    stored: str
    dtype: str
    direct: bool = True


def _constant_min(op: Any) -> float | None:
    import numpy as np
    import tensorflow as tf

    try:
        proto = op.get_attr("value")
        value = tf.make_ndarray(proto)
    except (ValueError, TypeError):
        return None
    if value.size == 0 or value.size > 4096 or not np.issubdtype(value.dtype, np.floating):
        return None
    return float(np.min(value.astype(np.float64)))


def _reduced_dtypes_reached(op: Any, depth: int = 3) -> dict[str, bool]:
    """The reduced-precision dtypes the constant is cast into, through a few elementwise ops: dtype -> direct."""
    found: dict[str, bool] = {}
    frontier = [op]
    for level in range(depth):
        nxt = []
        for node in frontier:
            for out in node.outputs:
                for consumer in out.consumers():
                    if consumer.type == "Cast":
                        name = consumer.outputs[0].dtype.name
                        if name in LIMITS:
                            found[name] = found.get(name, False) or level == 0
                    elif consumer.type in _FOLLOW:
                        nxt.append(consumer)
        frontier = nxt
    return found


def large_negative_constants(ops: list[Any], layer_of: Callable[[str], int]) -> list[MaskConstant]:
    """Constants beyond -65504 in float16 (or beyond bfloat16's range in bfloat16), stored or cast so."""
    out: list[MaskConstant] = []
    for op in ops:
        if op.type != "Const" or not op.outputs or not op.outputs[0].dtype.is_floating:
            continue
        low = _constant_min(op)
        if low is None or low >= -FLOAT16_MAX:
            continue
        stored = op.outputs[0].dtype.name
        targets = {stored: True} if stored in LIMITS else _reduced_dtypes_reached(op)
        for dtype, direct in sorted(targets.items()):
            if low < -LIMITS[dtype]:
                out.append(MaskConstant(op.name, layer_of(op.name), low, stored, dtype, direct))
    return out
