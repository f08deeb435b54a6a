"""Class labels checked once, for the trainer and the MNIST loader alike (NumPy only, no TensorFlow).

Labels are class ids, one per sample: integers, or floats holding whole numbers, in ``0..classes-1``.
One-hot rows are converted (the MNIST loader) or refused with the fix (a sparse loss cannot use them).
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
        grow = f", or give the model's last layer {high + 1} units" if too_few_units else ""
        raise error(f"{where} must hold class ids in {span}{owner}; {int(outside.sum())} are outside (range found "
                    f"{low}..{high}; for example {y[outside][:3].tolist()} "
                    f"at index {int(np.flatnonzero(outside)[0])}). Fix: map them to {span}{grow}.")
    return y.astype(np.int64)
