"""The few places where Keras 2 (TF <= 2.15, the Intel path) and Keras 3 (TF >= 2.16) differ for the check.

Everything else the check does goes through TensorFlow's graph, which is the same under both. Each helper
reads attributes that exist on both generations first and falls back to the generation-specific one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Attributes holding the Python-side losses a layer collects when ``add_loss`` runs during a call.
_LOSS_LISTS = ("_losses", "_eager_losses")


def tf_keras() -> tuple[Any, Any]:
    """TensorFlow and the Keras it exposes as ``tf.keras`` (Keras 3 on TF 2.21, Keras 2 on TF 2.15)."""
    import tensorflow as tf

    return tf, tf.keras


def keras_version(tf: Any) -> str:
    """``tf.keras``'s version, as `amp_backends.keras_compat.keras_info` reads it (``"unknown"`` if it cannot)."""
    from ..keras_compat import keras_info

    return keras_info(tf).version or "unknown"


def is_keras_model(obj: Any) -> bool:
    """True for a ``keras.Model`` (functional, Sequential or subclassed) of the Keras that ``tf.keras`` is."""
    _, keras = tf_keras()
    return isinstance(obj, keras.Model)


def children(layer: Any) -> list[Any]:
    """The direct sublayers of ``layer`` (nested models and layers a custom layer owns), in creation order.

    ``_flatten_layers(include_self=False, recursive=False)`` exists under that name on Keras 2 and 3.
    """
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=False, recursive=False))
    return list(getattr(layer, "layers", []) or [])


def walk(layer: Any, path: str) -> Iterator[tuple[str, Any]]:
    """``(path, layer)`` for ``layer`` and every sublayer below it, depth first, each layer once."""
    seen: set[int] = set()
    stack = [(path, layer)]
    while stack:
        p, layer_ = stack.pop()
        if id(layer_) in seen:
            continue
        seen.add(id(layer_))
        yield p, layer_
        stack.extend(reversed([(f"{p}/{c.name}", c) for c in children(layer_)]))


def policy_name(layer: Any) -> str:
    """The layer's dtype policy name (``mixed_float16``, ``float32``, ``float8_from_mixed_float16``...)."""
    policy = getattr(layer, "dtype_policy", None) or getattr(layer, "_dtype_policy", None)
    name = getattr(policy, "name", None)
    return str(name) if name else str(getattr(layer, "dtype", "float32"))


def compute_dtype(layer: Any) -> str:
    dtype = getattr(layer, "compute_dtype", None) or "float32"
    return getattr(dtype, "name", str(dtype))


@dataclass(frozen=True)
class InputLeaf:
    """One model input: its shape (batch first, ``None`` where unknown) and its ``tf.DType``."""

    shape: tuple[int | None, ...]
    dtype: Any


def input_structure(model: Any) -> Any:
    """The nested structure of `InputLeaf` the model is called with, or ``None`` if it cannot be told.

    Functional and Sequential models know their inputs (Keras 3: ``_inputs_struct``, its Sequential through
    ``_functional``; Keras 2: ``_nested_inputs``). A subclassed model knows its input shape once built:
    Keras 3 keeps the ``build()`` arguments in ``_build_shapes_dict``, Keras 2 keeps ``_build_input_shape``
    (and the first call's ``save_spec()``).
    """
    import tensorflow as tf

    def leaf(t: Any) -> InputLeaf:
        return InputLeaf(tuple(tf.TensorShape(t.shape).as_list()), tf.as_dtype(getattr(t, "dtype", None) or "float32"))

    struct = getattr(model, "_inputs_struct", None)
    functional = getattr(model, "_functional", None)
    if struct is None and functional is not None:
        struct = getattr(functional, "_inputs_struct", None)
    if struct is None:
        struct = getattr(model, "_nested_inputs", None)
    if struct is None:
        try:
            inputs = model.inputs
        except (AttributeError, ValueError):
            inputs = None
        if inputs:
            struct = inputs[0] if len(inputs) == 1 else list(inputs)
    if struct is not None:
        return tf.nest.map_structure(leaf, struct)

    save_spec = getattr(model, "save_spec", None)
    if callable(save_spec):
        try:
            spec = save_spec(dynamic_batch=True)
        except Exception:
            spec = None
        if spec and spec[0] and not spec[1]:
            args = spec[0]
            return tf.nest.map_structure(leaf, args[0] if len(args) == 1 else list(args))
    # A subclassed model's build shape holds the batch of the call that built it, not a fixed batch.
    shapes = getattr(model, "_build_shapes_dict", None)
    if isinstance(shapes, dict) and len(shapes) == 1:
        shape = next(iter(shapes.values()))
        if _is_shape(shape) and shape:
            return InputLeaf((None,) + tuple(shape[1:]), tf.float32)
    shape = getattr(model, "_build_input_shape", None)
    if shape is not None:
        try:
            dims = tf.TensorShape(shape).as_list()
        except (TypeError, ValueError):
            return None
        return InputLeaf((None,) + tuple(dims[1:]), tf.float32) if dims else None
    return None


def _is_shape(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(d is None or isinstance(d, int) for d in value)


def snapshot_losses(layers: list[Any]) -> list[tuple[Any, str, list[Any]]]:
    """Copies of each layer's collected-loss lists: tracing a call may append graph tensors to them."""
    saved = []
    for layer in layers:
        for attr in _LOSS_LISTS:
            value = layer.__dict__.get(attr)
            if isinstance(value, list):
                saved.append((layer, attr, list(value)))
    return saved


def restore_losses(saved: list[tuple[Any, str, list[Any]]]) -> None:
    for layer, attr, items in saved:
        layer.__dict__[attr][:] = items
