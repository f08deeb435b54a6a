"""The shapes the check traces the model on: the model's own, or the ones the caller gives (``inputs=``).

A model may leave dimensions open besides the batch (a keras_hub backbone's sequence length), leaving the
matmuls after them unsized. ``inputs=`` closes them: a sample batch as the model takes it (an ``(x, y[, w])``
tuple is read as its ``x``), a ``tf.data.Dataset`` or its element spec, or shapes such as ``(None, 128)``.
Only shapes and dtypes are read; the batch of the given inputs is the check's unless ``batch_size=`` says
otherwise.
"""

from __future__ import annotations

from typing import Any

from ..keras_compat import InputLeaf, input_structure
from ..errors import AmpConfigError

SHAPE_FORMS = ("a sample batch (NumPy arrays / tensors, or a dict / tuple / list of them as the model takes them), "
               "a tf.data.Dataset or its element_spec (tf.TensorSpec), or shapes such as (None, 128) "
               "(in a dict / list for several inputs)")


def _is_shape(value: Any) -> bool:
    return (isinstance(value, (tuple, list)) and len(value) > 0
            and all(d is None or (isinstance(d, int) and not isinstance(d, bool)) for d in value))


def _leaf(value: Any, default_dtype: Any) -> InputLeaf | None:
    """The `InputLeaf` of one given input, or ``None`` if ``value`` is a structure, not a leaf."""
    import tensorflow as tf

    if _is_shape(value) or isinstance(value, tf.TensorShape):
        return InputLeaf(tuple(tf.TensorShape(value).as_list()), default_dtype or tf.float32)
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None or isinstance(value, (dict, list, tuple)):
        return None
    try:
        dims = tuple(tf.TensorShape(shape).as_list())
        dtype = tf.as_dtype(dtype)
    except (TypeError, ValueError):
        return None
    if default_dtype is not None and (dtype == tf.string) != (tf.as_dtype(default_dtype) == tf.string):
        takes = "strings" if tf.as_dtype(default_dtype) == tf.string else f"numbers ({tf.as_dtype(default_dtype).name})"
        raise AmpConfigError(
            f"inputs= gives {'strings' if dtype == tf.string else 'numbers'} ({dtype.name}) to a model "
            f"input that takes {takes}: the model could not be called on that batch. Fix: pass the batch "
            "the model is called with (text encoded before it, or a model that starts with its own "
            "StringLookup or TextVectorization after keras.Input(shape, dtype='string')).")
    # the model converts its inputs to the dtype it declares; Keras feeds NumPy's float64 as float32
    return InputLeaf(dims, default_dtype or (tf.float32 if dtype == tf.float64 else dtype))


def _to_leaves(given: Any, model_struct: Any) -> Any:
    """``given`` as a structure of `InputLeaf`, following the model's structure where there is one."""
    import tensorflow as tf

    if isinstance(given, tf.data.Dataset):
        given = given.element_spec
    model_leaf = model_struct if isinstance(model_struct, InputLeaf) else None
    leaf = _leaf(given, model_leaf.dtype if model_leaf else None)
    if leaf is not None:
        return leaf
    if isinstance(given, dict):
        sub = model_struct if isinstance(model_struct, dict) else {}
        return {k: _to_leaves(v, sub.get(k)) for k, v in given.items()}
    if isinstance(given, (list, tuple)):
        subs = list(model_struct) if isinstance(model_struct, (list, tuple)) else []
        items = [_to_leaves(v, subs[i] if i < len(subs) else None) for i, v in enumerate(given)]
        return items if isinstance(given, list) or len(subs) == len(items) or not subs else tuple(items)
    raise AmpConfigError(f"inputs= takes {SHAPE_FORMS}. Received: {given!r} (of type {type(given).__name__}). "
                         "Fix: pass one batch of the data the model is trained on, or its shapes.")


def _describe(struct: Any) -> str:
    import tensorflow as tf

    return str(tf.nest.map_structure(lambda leaf: leaf.shape, struct))


def _matches(given: Any, model_struct: Any) -> bool:
    import tensorflow as tf

    try:
        tf.nest.assert_same_structure(given, model_struct, check_types=False)
    except (ValueError, TypeError):
        return False
    return True


def _fit(given: Any, model_struct: Any, model_name: str) -> Any:
    """``given`` in the model's structure; an ``(x, y[, w])`` tuple gives its ``x``; a mismatch is an error."""
    if model_struct is None:
        return given
    if isinstance(model_struct, dict) and isinstance(given, dict) and set(model_struct) - set(given):
        raise AmpConfigError(
            f"inputs= lacks the model {model_name!r}'s input(s) {sorted(set(model_struct) - set(given))}. "
            f"Expected the keys {sorted(model_struct)}; received {sorted(given)}. Fix: give every input.")
    if isinstance(model_struct, dict) and isinstance(given, (list, tuple)) and len(given) == len(model_struct) \
            and not any(isinstance(g, (dict, list, tuple)) for g in given):
        example = ", ".join(f"{k!r}: ..." for k in model_struct)
        raise AmpConfigError(
            f"inputs= gives the model {model_name!r} a {type(given).__name__} of {len(given)} inputs, but "
            f"it takes a dict of named inputs {sorted(model_struct)} (a list's order is not theirs). Fix: "
            f"pass a dict: {{{example}}}.")
    if isinstance(model_struct, dict) and isinstance(given, dict):
        given = {k: given[k] for k in model_struct}  # extra keys (labels in the same dict) are not the model's
    if _matches(given, model_struct):
        return given
    if isinstance(model_struct, (list, tuple)) and len(model_struct) == 1 and _matches(given, model_struct[0]):
        return [given] if isinstance(model_struct, list) else (given,)  # one input, listed by the model
    if isinstance(given, (tuple, list)) and 2 <= len(given) <= 3 and _matches(given[0], model_struct):
        return given[0]  # an (x, y) or (x, y, sample_weight) element
    raise AmpConfigError(f"inputs= does not match the inputs of the model {model_name!r}: "
                         f"expected {_describe(model_struct)}, received {_describe(given)}. "
                         "Fix: pass the model's inputs (x, not (x, y) when the model takes a tuple), "
                         "in the structure it is called with.")


def _check_leaf(given: InputLeaf, declared: InputLeaf | None, model_name: str) -> None:
    if declared is None or not declared.shape:
        return
    if len(given.shape) != len(declared.shape):
        raise AmpConfigError(
            f"inputs= gives an input of shape {given.shape} to the model {model_name!r}, whose input has "
            f"shape {declared.shape} (rank {len(declared.shape)}). Fix: give the batch's full shape, the "
            "batch first, e.g. " + str((None,) + tuple(d or 128 for d in declared.shape[1:])) + ".")
    for i, (g, d) in enumerate(zip(given.shape[1:], declared.shape[1:], strict=True), start=1):
        if g is not None and d is not None and g != d:
            raise AmpConfigError(
                f"inputs= gives an input of shape {given.shape} to the model {model_name!r}, whose "
                f"input has shape {declared.shape}: dimension {i} is {g}, the model's is {d}. Fix: give "
                "the shape the model takes.")


def input_names(model: Any, model_struct: Any) -> list[str] | None:
    """The names of a model's listed inputs, in its order (as ``inputs=`` and ``--input-shape`` name them), or
    ``None`` where it has no such list of distinct names."""
    try:
        names = [str(t.name).split(":")[0] for t in model.inputs]
    except (AttributeError, TypeError, ValueError):
        return None
    fits = isinstance(model_struct, (list, tuple)) and len(names) == len(model_struct) == len(set(names))
    return names if fits else None


def by_name(model: Any, inputs: Any, model_struct: Any) -> Any:
    """A dict of inputs for a model that lists its inputs, in the model's order by their names (as Keras takes it);
    anything else as given."""
    if not isinstance(inputs, dict) or (names := input_names(model, model_struct)) is None:
        return inputs
    if missing := [n for n in names if n not in inputs]:
        raise AmpConfigError(
            f"inputs= lacks the model {model.name!r}'s input(s) {missing}. Expected the keys {names} (its "
            f"inputs' names); received {sorted(inputs)}. Fix: name each input as the model does.")
    ordered = [inputs[n] for n in names]  # (other keys, labels in the same dict, are not the model's)
    return ordered if isinstance(model_struct, list) else tuple(ordered)


def refuse_unknown_names(model: Any, shapes: Any, flag: str) -> None:
    """Refuse names in ``--input-shape name=SHAPE,...`` that are none of the model's inputs (a batch's dict may hold
    labels beside the inputs; a shape the user names for an input is a mistake where the model has no such input).

    Args:
        model: The Keras model.
        shapes: The shapes `parse_input_shape` read (a dict where named).
        flag: The text of ``--input-shape``, as the error quotes it.

    Raises:
        AmpConfigError: A name is not one of the model's inputs.
    """
    if not isinstance(shapes, dict):
        return
    struct = input_structure(model)  # (named by its dict's keys, or by its list's input names)
    names = list(struct) if isinstance(struct, dict) else input_names(model, struct)
    if names is not None and (unknown := [n for n in shapes if n not in names]):
        raise AmpConfigError(f"--input-shape {flag} names {', '.join(map(repr, unknown))}, which the model "
                             f"{model.name!r} has no input of. Expected its inputs' names: {', '.join(names)}. Fix: "
                             f"give a shape for each of those, such as --input-shape {example_shape(model)}.")


def checked_inputs(model: Any, inputs: Any, model_struct: Any) -> Any:
    """``inputs=`` as `check_model` and `amp_backends.prepare_model` take it, checked against the model's inputs.

    Args:
        model: The Keras model the inputs are for.
        inputs: One batch, a ``tf.data`` dataset or element spec, or shapes (see the module docstring).
        model_struct: The model's own inputs (`amp_backends.keras_compat.input_structure`), ``None`` where unknown.

    Returns:
        The structure of `InputLeaf` to trace on: a dict of named inputs in the order the model lists them
        (`by_name`), an ``(x, y)`` element as its ``x``.

    Raises:
        TypeError: ``inputs`` is none of the forms above.
        ValueError: ``inputs`` does not fit the model's inputs (their structure, rank or fixed sizes).
    """
    import tensorflow as tf

    given = _fit(_to_leaves(by_name(model, inputs, model_struct), model_struct), model_struct, model.name)
    if model_struct is not None:
        for g, d in zip(tf.nest.flatten(given), tf.nest.flatten(model_struct), strict=True):
            _check_leaf(g, d, model.name)
            if not g.shape:
                raise AmpConfigError(f"inputs= gives a scalar to the model {model.name!r}: expected a batch, the batch "
                                     "dimension first. Fix: give one batch of inputs.")
    return given


def dynamic_dims(struct: Any) -> list[tuple[int, int]]:
    """``(input index, dimension)`` of every dimension after the batch whose size is not known."""
    import tensorflow as tf

    return [(i, d) for i, leaf in enumerate(tf.nest.flatten(struct))
            for d, size in enumerate(leaf.shape) if d > 0 and size is None]


def shapes_with_sequence_length(model: Any, length: int, batch_size: int | None = None) -> Any:
    """The model's input shapes with every open dimension after the batch set to ``length`` (``--seq-len N``).

    For a keras_hub backbone: ``{"token_ids": (batch_size, length), ...}``, for ``check_model(model, inputs=...)``.

    Args:
        model: A Keras model whose inputs have open dimensions (``keras.Input((None,))``).
        length: The size each open dimension after the batch gets, an int >= 1.
        batch_size: The batch of the shapes (``None``: filled by the check's).

    Returns:
        The model's input shapes in its input structure, batch first.

    Raises:
        AmpConfigError: ``length`` is no positive int, the model's input shapes cannot be told, or they have no open
            dimension (the length would change nothing).
    """
    import tensorflow as tf

    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise AmpConfigError(f"The sequence length must be a positive int, such as 128. Received: {length!r}.")
    struct = input_structure(model)
    if struct is None:
        raise AmpConfigError(
            f"Cannot tell the input shape of the model {getattr(model, 'name', model)!r}, so a sequence "
            "length cannot be applied to it. Fix: give the full shapes instead (inputs=...).")
    if None not in [d for leaf in tf.nest.flatten(struct) for d in leaf.shape[1:]]:
        shapes = ", ".join(str(tuple(leaf.shape)) for leaf in tf.nest.flatten(struct))
        raise AmpConfigError(
            f"A sequence length of {length} sets the open dimensions of the inputs of the model "
            f"{getattr(model, 'name', model)!r}, and it has none (its inputs: {shapes}): it would change nothing. "
            "Fix: leave the sequence length (--seq-len) out, or give other shapes in full (--input-shape).")
    return tf.nest.map_structure(
        lambda leaf: (batch_size,) + tuple(length if d is None else d for d in leaf.shape[1:]), struct)


def example_shape(model: Any) -> str:
    """One example's input shape as ``--input-shape`` takes it (``28x28x1``; ``token_ids=128,padding_mask=128``), an
    open dimension as 128."""
    struct = input_structure(model)
    if isinstance(struct, (list, tuple)) and len(struct) > 1 and (names := input_names(model, struct)):
        struct = dict(zip(names, struct, strict=True))  # a list of inputs: --input-shape names them
    leaves = struct.items() if isinstance(struct, dict) else [(None, struct)] if struct is not None else []
    shapes = {name: "x".join(str(d or 128) for d in leaf.shape[1:]) or "1" for name, leaf in leaves
              if getattr(leaf, "shape", None)}
    if len(shapes) == 1 and None in shapes:
        return shapes[None]
    return ",".join(f"{k}={v}" for k, v in shapes.items()) if shapes else "128"


def in_flag_words(flag_value: str, error: Exception, model: Any) -> str:
    """An ``inputs=`` error of `checked_inputs`, said in the words of the option ``--input-shape flag_value``."""
    what = str(error)
    if not what.startswith("inputs= "):
        return what
    return (f"--input-shape {flag_value} {what[len('inputs= '):].split(' Fix: ')[0]} Fix: give one example's shape "
            f"without the batch, such as --input-shape {example_shape(model)}")


def shape_options(seq_len: int | None, input_shape: str | None) -> Any:
    """``--seq-len`` and ``--input-shape`` as a command takes them, checked before any work is done.

    Args:
        seq_len: The value of ``--seq-len``, if given.
        input_shape: The text of ``--input-shape``, if given.

    Returns:
        The shapes ``--input-shape`` gives (`parse_input_shape`), or ``None`` without it.

    Raises:
        ValueError: Both are given, or ``--input-shape`` is malformed.
    """
    if seq_len is not None and input_shape is not None:
        raise AmpConfigError(
            "expected at most one of --seq-len and --input-shape, received both. Fix: give --seq-len N "
            "for the open dimensions, or the full shapes with --input-shape")
    return None if input_shape is None else parse_input_shape(input_shape)


def parse_input_shape(text: str) -> Any:
    """One example's shape: ``"64x64x3"`` -> ``(None, 64, 64, 3)``; ``"token_ids=128,padding_mask=128"`` -> a dict of
    such shapes; ValueError when malformed."""
    def dims(part: str) -> tuple[int | None, ...]:
        try:
            values = tuple(int(d) for d in part.strip().lower().split("x"))
        except ValueError:
            values = ()
        if not values or any(d < 1 for d in values):
            bad = [d.strip() for d in part.strip().lower().split("x") if not d.strip().isdecimal() or int(d) < 1]
            named = ", ".join(repr(d) if d.strip() else "the empty size" for d in bad)
            fix = f"give {named or 'a size'} as a positive whole number" + (
                " (leave the batch out: it comes from --batch-size)" if "0" in bad or "-1" in bad else "")
            raise AmpConfigError(
                f"expected one example's shape as positive sizes joined by 'x', such as 28x28x1 or 128. Received: "
                f"{part!r} in --input-shape {text!r}. Fix: {fix}, such as 28x28x1")
        return (None, *values)

    if "=" not in text:
        return dims(text)
    shapes: dict[str, tuple[int | None, ...]] = {}
    for item in text.split(","):
        name, sep, shape = item.partition("=")
        if not sep or not name.strip():
            raise AmpConfigError(
                f"expected name=SHAPE pairs separated by commas, such as token_ids=128,padding_mask=128. "
                f"Received: {item!r} in --input-shape {text!r}. Fix: name every input")
        shapes[name.strip()] = dims(shape)
    return shapes
