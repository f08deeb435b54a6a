"""Which layers produce a model's outputs: read from its graph, or, for a subclassed model, from one traced call;
and whether its outputs are probabilities where its loss takes them (`check_probabilities`).

A functional or Sequential model keeps the layer behind each output (``_keras_history``). A subclassed model's
``call`` is traced once at its built input shape (nothing runs, its losses put back): an output is the layer
whose result the call returned as it is.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from .errors import warn

__all__ = ["check_probabilities", "output_layers"]

logger = logging.getLogger("amp_backends.train")


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


_SAID_LOGITS: weakref.WeakSet[Any] = weakref.WeakSet()  # the models warned of, once each


def check_probabilities(model: Any, x: Any, loss_name: str) -> None:
    """An `AmpWarning` (once a model) where the model's outputs on a few rows of ``x`` are no probabilities (logits:
    values out of 0..1) for a loss that takes probabilities (``loss_name``'s): it would train on nonsense.

    Args:
        model: A Keras model.
        x: Its inputs (the first 32 rows are run).
        loss_name: The loss's name, as the warning says it.
    """
    import tensorflow as tf
    if model in _SAID_LOGITS:
        return
    try:
        pred = tf.cast(model(tf.nest.map_structure(lambda a: a[:32], x), training=False), tf.float32).numpy()
    except Exception:  # (a model that runs only in its step: nothing said here)
        return
    if pred.size and (pred.min() < -1e-3 or pred.max() > 1 + 1e-3):
        _SAID_LOGITS.add(model)
        said = (f"The loss ({loss_name}) takes probabilities (from_logits=False), but the model {model.name!r} "
                f"outputs values from {pred.min():.3g} to {pred.max():.3g}: logits, with no softmax or sigmoid, so the "
                "loss it trains on means nothing. Fix: give the loss from_logits=True (keras.losses.SparseCategorical"
                "Crossentropy(from_logits=True)), or end the model with activation='softmax' (binary: 'sigmoid').")
        warn(said, log=logger)
