"""Which layers produce a model's outputs: read from its graph, or, for a subclassed model, from one traced call.

A functional or Sequential model keeps the layer behind each output (``_keras_history``). A subclassed model's
``call`` is traced once at its built input shape (nothing runs, its losses put back): an output is the layer
whose result the call returned as it is.
"""

from __future__ import annotations

from typing import Any

__all__ = ["output_layers"]


def output_layers(model: Any) -> list[tuple[str, Any]]:
    """The layers that produce ``model``'s outputs, through nested models.

    Args:
        model: A Keras model: functional, Sequential or subclassed (built, or its call cannot be traced).

    Returns:
        ``(path, layer)`` for each output's layer (paths as `amp_backends.keras_compat.walk` names them); empty
        where the model does not tell (a subclassed model not yet built).
    """
    from .keras_compat import walk

    paths = {id(layer): path for path, layer in walk(model, getattr(model, "name", "model")) if layer is not model}
    found: list[tuple[str, Any]] = []
    stack = _producers(model) or _returned_by_call(model)
    seen: set[int] = set()
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        inner = _producers(layer) if hasattr(layer, "layers") and layer is not model else []
        if inner:
            stack.extend(inner)
        elif id(layer) in paths:
            found.append((paths[id(layer)], layer))
    return found


def _producers(model: Any) -> list[Any]:
    """The layers behind a functional or Sequential model's outputs."""
    try:
        outputs = list(getattr(model, "outputs", None) or [])
    except (AttributeError, ValueError):
        outputs = []
    out = [history[0] for t in outputs if (history := getattr(t, "_keras_history", None))]
    if not out and type(model).__name__ == "Sequential" and getattr(model, "layers", None):
        out.append(model.layers[-1])
    return out


def _returned_by_call(model: Any) -> list[Any]:
    """The layers whose results a subclassed model's call returns, from one trace of it (none where it fails)."""
    from .keras_compat import input_structure, user_code, walk
    from .model_check.scopes import LayerScopes

    try:
        struct = input_structure(model)
    except Exception:  # a model whose inputs cannot be read has no trace here
        return []
    if struct is None or not getattr(model, "built", False):
        return []
    import tensorflow as tf

    layers = [layer for _, layer in walk(model, "m") if layer is not model]
    returned: list[Any] = []

    forward = user_code(model)  # (traced without AutoGraph: the model called as AutoGraph would)

    def traced(inputs: Any) -> Any:
        out = forward(inputs, training=False)
        returned.extend(tf.nest.flatten(out))
        return out

    specs = tf.nest.map_structure(lambda leaf: tf.TensorSpec((1, *leaf.shape[1:]), leaf.dtype), struct)
    scopes = LayerScopes(layers, keep_losses=[model, *layers])  # (what each layer's call returned, recorded)
    try:
        with scopes:
            tf.function(traced, autograph=False).get_concrete_function(specs)
    except Exception:  # a call that cannot be traced at its build shape: no output layer named
        return []
    return [layers[scopes.made[id(t)]] for t in returned if id(t) in scopes.made]
