"""The data a model takes: nests of arrays validated as given (`as_array_nest`, `rows`), and its inputs checked
against the model before training and as each step runs.

`check_model_inputs` refuses, with the fix, what a Keras model cannot take (strings for numbers, fractions for
token ids, rows of another shape, a dict without the inputs' names); in a traced step it also checks each batch's
feature shape as the step runs, so a later batch of another width is an error at its step, not a crash in a
kernel (under TensorFlow 2.15 with ITEX, a matmul given such a batch aborted the process).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf

from .errors import InputError

__all__ = ["as_array_nest", "check_model_inputs", "describe_array", "leaf_paths", "rows"]


def describe_array(value: Any) -> str:
    """A value as errors name it: its type, and its shape and dtype where it has them.

    Args:
        value: Any value (an array, a tensor, a list...).

    Returns:
        ``"ndarray of shape (3, 28) and dtype float32"``; ``"list"`` for a value without shape or dtype.
    """
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    return f"{type(value).__name__}" + (f" of shape {tuple(shape)}" if shape is not None else "") + (
        f" and dtype {dtype}" if dtype is not None else "")


def leaf_paths(structure: Any, prefix: str) -> list[tuple[str, Any]]:
    """``(path, leaf)`` pairs of a nest of arrays: ``x['ids']``, ``x[1]``, ``y``.

    Args:
        structure: An array, or a dict, tuple or list of them (nested).
        prefix: The path of ``structure`` itself (``"x"``).

    Returns:
        Each leaf with its path, in order.
    """
    if isinstance(structure, dict):
        return [p for k, v in structure.items() for p in leaf_paths(v, f"{prefix}[{k!r}]")]
    if isinstance(structure, (tuple, list)):
        return [p for i, v in enumerate(structure) for p in leaf_paths(v, f"{prefix}[{i}]")]
    return [(prefix, structure)]


def as_array_nest(structure: Any, name: str) -> Any:
    """Validate a nest of array-likes and convert Python lists of numbers to arrays; keep tensors as they are.

    Args:
        structure: The data given (``x`` or ``y``): arrays, tensors or Python lists, or a dict, tuple or list of them.
        name: Its name, as errors say it (``"x"``).

    Returns:
        The same nest, of NumPy arrays (and tensors as given).

    Raises:
        InputError: A dict has keys that are not strings, or a leaf is no array of numbers or strings with a row
            per sample.
    """
    if isinstance(structure, dict):
        if bad := [k for k in structure if not isinstance(k, str)]:
            raise InputError(f"{name} as a dict must have string keys (feature names). Received keys {bad!r}.")
        return {k: as_array_nest(v, f"{name}[{k!r}]") for k, v in structure.items()}
    # a list of arrays is several inputs; a list of Python lists or numbers is one array's rows
    if isinstance(structure, tuple) or (isinstance(structure, list) and structure and all(
            np.ndim(v) >= 1 and not isinstance(v, list) or isinstance(v, (dict, tuple)) for v in structure)):
        return type(structure)(as_array_nest(v, f"{name}[{i}]") for i, v in enumerate(structure))
    if isinstance(structure, (tf.Tensor, tf.Variable)):
        return structure
    try:  # numpy, an array library's array, Python lists of numbers
        arr = np.asarray(structure)
    except Exception:  # ragged lists
        arr = np.asarray(None, dtype=object)
    if arr.dtype == object and arr.ndim >= 1 and arr.size and all(isinstance(v, (str, bytes)) for v in arr.flat):
        arr = arr.astype(bytes if isinstance(next(iter(arr.flat)), bytes) else str)  # strings held as objects
    if arr.dtype == object or arr.dtype.kind == "V" or arr.ndim == 0:
        text = isinstance(structure, (str, bytes, os.PathLike))
        path = text and (os.path.isfile(structure) or str(os.fspath(structure)).endswith((".npy", ".npz")))
        raise InputError(
            f"{name} must be an array of numbers or strings with one row per sample (a NumPy array or tensor, or a "
            f"tuple, list or dict of them). Received: {describe_array(structure)}. Fix: " + (
                f"load the arrays from the file first (np.load({os.fspath(structure)!r}) for .npy; for .npz, "
                "data = np.load(path), then data['x'], data['y'] by their names)" if path else
                "give one row per sample: a text as a list of one, [text]" if text else
                "convert it with np.asarray(...)") + ".")
    return arr  # (strings are for a model that starts with its own StringLookup or TextVectorization)


def rows(x: Any, y: Any) -> int:
    """The number of samples in arrays ``x`` and labels ``y`` (nests of arrays from `as_array_nest`).

    Args:
        x: The inputs.
        y: The labels, or ``None``.

    Returns:
        The rows every array has.

    Raises:
        InputError: The arrays have different numbers of rows; the message names each array's.
    """
    leaves = leaf_paths(x, "x") + ([] if y is None else leaf_paths(y, "y"))
    counts = {path: int(leaf.shape[0]) for path, leaf in leaves}
    if len(set(counts.values())) > 1:
        raise InputError("Every input and label array must have one row per sample, the same number of rows. "
                         f"Received: {', '.join(f'{p}: {n}' for p, n in counts.items())}. Fix: make the arrays the "
                         "same length (x and y describe the same samples).")
    return next(iter(counts.values()))


@tf.autograph.experimental.do_not_convert  # Python checks on static shapes, run while tracing
def check_model_inputs(model: Any, x: Any) -> Any:
    """Data a model cannot take, refused with the fix: strings for numbers (or back), fractions for whole numbers, a
    feature shape, another number of inputs, a dict without the inputs' names (matched as Keras matches inputs).

    Args:
        model: A built Keras model.
        x: Its inputs: arrays (NumPy, checked now) or the tensors a compiled step traces.

    Returns:
        ``x``, where traced, with each input's feature shape checked as the step runs (``tf.ensure_shape``): a later
        batch of another width is TensorFlow's error at that step (an `InputError` there), not a crash in a kernel.

    Raises:
        InputError: The data does not fit the model's inputs.
    """
    named = _check_named_inputs(model, x)
    inputs = list(named.values()) if named else getattr(model, "inputs", None)
    if not inputs:
        return x
    names = list(named) if named else [getattr(t, "name", "").split(":")[0] for t in inputs]
    if isinstance(x, dict):  # Keras finds a model's inputs in a dict by their names (named inputs: above)
        if (missing := [n for n in names if n not in x]) and len(names) == 1:
            key = next(iter(x), "features")
            raise InputError(
                f"The model {model.name!r} takes one input, {names[0]!r} of shape "
                f"{tuple(['batch', *inputs[0].shape[1:]])}; x is a dict without that name (its keys: {sorted(x)}), "
                "and Keras finds a model's inputs in a dict by their names. Fix: give x the array itself (for a "
                f"dataset: dataset.map(lambda x, y: (x[{key!r}], y))), or name the model's input after the key: "
                f"keras.Input(shape, name={key!r}).")
        if missing:
            raise InputError(f"The model {model.name!r} takes the inputs {names} (a dict gives them by those names); "
                             f"x lacks {missing} (its keys: {sorted(x)}). Fix: give x a dict with the model's input "
                             f"names, or a list of {len(names)} arrays in the model's order.")
        pairs = [(t, x[n], f"x[{n!r}]", n) for t, n in zip(inputs, names, strict=True)]
    elif len(inputs) == 1:
        return x if isinstance(x, (tuple, list)) else _check_input(model, inputs[0], x, "x")
    elif isinstance(x, (tuple, list)):
        if len(x) != len(inputs):
            raise InputError(f"The model {model.name!r} takes {len(inputs)} inputs ({', '.join(names)}); x has "
                             f"{len(x)}. Fix: give x a list of {len(inputs)} arrays in the model's order, or a dict "
                             "by those names.")
        pairs = [(t, v, f"x[{i}]", n) for i, (t, v, n) in enumerate(zip(inputs, x, names, strict=True))]
    else:
        raise InputError(f"The model {model.name!r} takes {len(inputs)} inputs ({', '.join(names)}); x is one "
                         f"{type(x).__name__}. Fix: give x a list of {len(inputs)} arrays in that order, or a dict by "
                         "those names.")
    checked = [_check_input(model, spec, value, where, f"its input {name!r}") for spec, value, where, name in pairs]
    if isinstance(x, dict):
        return {**x, **dict(zip(names, checked, strict=True))}
    return type(x)(checked)



def _check_input(model: Any, spec: Any, x: Any, where: str = "x", takes: str = "inputs") -> Any:
    if isinstance(x, (dict, tuple, list)) or not hasattr(x, "shape"):
        return x
    wants_strings = tf.as_dtype(spec.dtype) == tf.string
    dtype = getattr(x, "dtype", None)
    has_strings = tf.as_dtype(dtype) == tf.string
    if has_strings != wants_strings:
        raise InputError(
            f"The model {model.name!r} takes "
            f"{'strings' if wants_strings else f'numbers ({tf.as_dtype(spec.dtype).name})'}"
            f" but {where} holds {'strings' if has_strings else 'numbers'} ({tf.as_dtype(dtype).name}). Fix: "
            + ("start the model with a layer that encodes them (tf.keras.layers.StringLookup or TextVectorization "
               "after keras.Input(shape, dtype='string')), or encode them before training."
               if has_strings else "give the model the raw strings, or drop its string input."))
    if tf.as_dtype(spec.dtype).is_integer and isinstance(x, np.ndarray) and x.dtype.kind == "f" and (
            fractions := x[x != np.round(x)]).size:
        raise InputError(f"The model {model.name!r} takes whole numbers ({tf.as_dtype(spec.dtype).name}: ids, as an "
                         f"Embedding does) as {takes}; {where} holds {fractions.size} fractions ({x.dtype}, such as "
                         f"{fractions.flat[0]}), which the model would cut to whole numbers. Fix: give it the ids "
                         "themselves (integers), or, for features, a float input: keras.Input(shape) (float32).")
    want, have = list(spec.shape)[1:], list(x.shape)[1:]
    # as Keras adjusts a functional model's input: one more or one fewer trailing axis of size 1, not a 1 elsewhere
    w, h = (want[:-1], have) if want[-1:] == [1] and len(want) == len(have) + 1 else (
        (want, have[:-1]) if have[-1:] == [1] and len(have) == len(want) + 1 else (want, have))
    if len(w) != len(h) or any(a is not None and b is not None and a != b for a, b in zip(w, h, strict=True)):
        fix = (f"(or, for a model meant for such rows, build it with keras.Input(shape={tuple(have)}))"
               if where == "x" else
               "(several inputs go in the model's order, or in a dict by the inputs' names)")
        raise InputError(
            f"The model {model.name!r} takes {takes} of shape {tuple(['batch', *want])}; {where} has rows of shape "
            f"{tuple(have)} ({where}: {tuple(x.shape)}). Fix: reshape the data to the model's input {fix}.")
    if len(want) == len(have) and isinstance(x, tf.Tensor) and not tf.executing_eagerly():  # a traced batch
        return tf.ensure_shape(x, [None, *want])
    return x


def _check_named_inputs(model: Any, x: Any) -> dict[str, Any] | None:
    """A model of named inputs (a dict, as keras_hub's backbones take) given other names, or a list; those inputs
    (``None``: the model lists its inputs, or takes one)."""
    try:
        names = model.input if isinstance(getattr(model, "input", None), dict) else None
    except Exception:  # a subclassed model: Keras knows its inputs only once called
        return None
    if not names:
        return None
    if isinstance(x, dict):
        if missing := sorted(set(names) - set(x)):
            raise InputError(f"The model {model.name!r} takes the inputs {sorted(names)}; x lacks {missing} (its keys: "
                             f"{sorted(x)}). Fix: give x a dict with the model's input names (rename the features in "
                             "the pipeline, e.g. dataset.map(lambda x, y: ({'token_ids': x['input_ids'], ...}, y))).")
    elif isinstance(x, (list, tuple)) or hasattr(x, "shape"):
        raise InputError(f"The model {model.name!r} takes a dict of named inputs {sorted(names)}; x is a "
                         f"{type(x).__name__}. Fix: give x a dict with those keys.")
    return dict(names)
