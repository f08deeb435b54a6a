"""Labels checked once, for the trainer and the MNIST loader alike (NumPy only, no TensorFlow).

Class labels are class ids, one per sample: integers, or floats holding whole numbers, in ``0..classes-1``.
One-hot rows are converted (the MNIST loader) or refused with the fix (a sparse loss cannot use them). Labels for
a loss that compares them with a model's output element by element have the output's shape (`check_label_shape`).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def class_ids(y: Any, classes: int | None, where: str, *, one_hot: str = "refuse", owner: str = "",
              error: type[Exception] = ValueError) -> np.ndarray:
    """``y`` as ``int64`` class ids in ``0..classes-1`` (no upper bound when ``classes`` is ``None``).

    ``one_hot`` is ``"convert"`` (rows of one 1 become its index) or ``"refuse"`` (an error naming the
    fix). ``owner`` says where ``classes`` comes from (``" (the model has 3 outputs)"``). Problems raise
    ``error`` with what was expected, what was received and the fix.
    """
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim == 2 and classes and classes > 1 and y.shape[1] == classes:
        if one_hot == "refuse":
            raise error(f"{where} look one-hot (shape {y.shape}), but the loss is sparse categorical cross-entropy, "
                        f"which takes one class id per sample. Fix: pass np.argmax(y, axis=-1) as the labels, or "
                        "loss=tf.keras.losses.CategoricalCrossentropy(reduction='none') for one-hot labels.")
        if y.dtype.kind in "iufb" and set(np.unique(y).tolist()) <= {0, 1} and (y.sum(axis=1) == 1).all():
            return y.argmax(axis=1).astype(np.int64)
        raise error(f"{where} has shape {y.shape} like one-hot labels, but some rows are not a single 1. Expected "
                    f"class ids (shape (N,)) or one-hot rows. Fix: pass one class id per sample.")
    if y.ndim != 1:
        raise error(f"{where} must be one class id per sample, shape (N,). Received shape {y.shape}. Fix: pass "
                    "one integer class id per sample (np.argmax(y, axis=-1) for one-hot rows).")
    if y.dtype.kind not in "iufb":
        raise error(f"{where} must hold class ids (integers). Received dtype {y.dtype}. Fix: map each class to an "
                    "integer id first (for string classes: keras.layers.StringLookup, or np.unique(y, "
                    "return_inverse=True)[1]).")
    if y.dtype.kind == "f":
        bad = ~np.isfinite(y) | (y != np.round(y))
        if bad.any():
            raise error(f"{where} must be whole class ids; {int(bad.sum())} are not "
                        f"(first: {y[bad][0].item()!r} at index {int(np.flatnonzero(bad)[0])}). "
                        "Fix: pass integer labels.")
    outside = (y < 0) | ((y >= classes) if classes is not None else False)
    if outside.any():
        low, high = int(y.min()), int(y.max())
        span = f"0..{classes - 1}" if classes is not None else "0 and up"
        too_few_units = classes is not None and high >= classes and bool(owner)
        fixes = [f"map them to {span}"] if classes != 1 or not too_few_units else []  # (one unit: 0..0 is no fix)
        fixes += [f"give the model's last layer {high + 1} units"] if too_few_units else []
        raise error(f"{where} must hold class ids in {span}{owner}; {int(outside.sum())} are outside (range found "
                    f"{low}..{high}; for example {y[outside][:3].tolist()} "
                    f"at index {int(np.flatnonzero(outside)[0])}). Fix: {', or '.join(fixes)}.")
    return y.astype(np.int64)


# Keras losses (names lower case, without underscores) that compare labels and outputs element by element: labels
# of another shape broadcast against the output, or fail inside the compiled step
ELEMENTWISE = {"mse", "mae", "mape", "msle", "kld", "huber", "logcosh", "poisson", "hinge", "squaredhinge",
               "categoricalhinge", "cosinesimilarity", "meansquarederror", "meanabsoluteerror", "kldivergence",
               "meanabsolutepercentageerror", "meansquaredlogarithmicerror", "kullbackleiblerdivergence",
               "categoricalcrossentropy", "binarycrossentropy", "binaryfocalcrossentropy",
               "categoricalfocalcrossentropy"}


def check_label_shape(y: Any, output: tuple[int | None, ...] | None, loss: str, model: str,
                      error: type[Exception] = ValueError) -> None:
    """Refuse labels a model with one output cannot take: several arrays, or, where ``loss`` is `ELEMENTWISE`,
    another shape per sample than the output's (a trailing 1 aside, as Keras's losses squeeze it).

    Args:
        y: The labels of a batch (an array, or what the user passed).
        output: The model's output shape per sample (without the batch; ``None`` where open), ``None`` where its
            rank is unknown (not compared).
        loss: The loss's name, lower case, without underscores (``"meansquarederror"``).
        model: The model's name, for the message.
        error: The exception class to raise.

    Raises:
        Exception: ``error``, saying what was expected, what was received and the fix.
    """
    if isinstance(y, (tuple, list)) and len(y) != 1:
        raise error(f"The labels y hold {len(y)} arrays, where the model {model!r} has one output. Expected one "
                    "array of labels. Fix: pass y as one array; for a weight per sample, train on "
                    "tf.data.Dataset.from_tensor_slices((x, y, sample_weight)).batch(batch_size).")
    y = y[0] if isinstance(y, (tuple, list)) else y
    if output is None or loss not in ELEMENTWISE or isinstance(y, dict):
        return
    got = tuple(np.shape(y)[1:])

    def trim(shape: tuple[Any, ...]) -> tuple[Any, ...]:
        return shape[:max((i + 1 for i, d in enumerate(shape) if d != 1), default=0)]

    have, want = trim(got), trim(tuple(output))
    if len(have) != len(want) or any(w is not None and int(w) != h for h, w in zip(have, want, strict=True)):
        raise error(f"The labels y have shape {np.shape(y)}, {got or 'one value'} per sample, where the model "
                    f"{model!r} outputs {tuple(output)} per sample and the loss ({loss}) compares the two element "
                    "by element. Expected labels of the output's shape. Fix: give the labels the output's shape "
                    "(one-hot rows as wide as the last layer, one target per output unit), or give the model's last "
                    "layer as many units as the labels have columns.")
