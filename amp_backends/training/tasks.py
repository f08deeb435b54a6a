"""Ready-made updates: a classifier (any Keras model and loss), the tutorials' GAN, and MNIST batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from .step import Update, step_seed


def _per_example(loss: Any) -> Any:
    """A callable ``(y_true, y_pred) -> per-example losses`` from a Keras loss object, a name or a function."""
    if loss is None:
        return tf.keras.losses.SparseCategoricalCrossentropy(reduction="none"), True
    if isinstance(loss, str):
        fn = tf.keras.losses.get(loss)
        return fn, "sparse_categorical" in loss
    if isinstance(loss, tf.keras.losses.Loss):
        # .call gives one value per example on Keras 2 and 3 alike; the trainer averages (with sample weights)
        return loss.call, isinstance(loss, tf.keras.losses.SparseCategoricalCrossentropy)
    if callable(loss):
        return loss, getattr(loss, "__name__", "") == "sparse_categorical_crossentropy"
    raise TypeError(f"loss must be a Keras loss (object or name) or a function (y_true, y_pred) -> losses. "
                    f"Received: {loss!r} (of type {type(loss).__name__}).")


def _num_classes(model: Any) -> int | None:
    try:
        shape = model.outputs[0].shape if getattr(model, "outputs", None) else model.output_shape
        n = shape[-1]
        return int(n) if n is not None else None
    except Exception:  # a subclassed model that was not built yet
        return None


def check_class_labels(y: Any, classes: int | None, where: str = "y") -> None:
    """Integer class ids in ``[0, classes)``, one per sample; a clear ``ValueError`` otherwise."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim == 2 and classes and y.shape[1] == classes and classes > 1:
        raise ValueError(
            f"The labels {where} look one-hot (shape {y.shape}), but the loss is sparse categorical cross-entropy, which "
            f"takes one class id per sample. Fix: pass np.argmax({where}, axis=-1), or "
            "loss=tf.keras.losses.CategoricalCrossentropy(reduction='none') for one-hot labels.")
    if y.ndim != 1:
        raise ValueError(f"The labels {where} must be one class id per sample, shape (N,). Received shape {y.shape}.")
    if y.dtype.kind not in "iuf" and y.dtype.kind != "b":
        raise ValueError(f"The labels {where} must be integer class ids. Received dtype {y.dtype}.")
    if y.dtype.kind == "f":
        bad = ~np.isfinite(y) | (y != np.round(y))
        if bad.any():
            raise ValueError(f"The labels {where} must be whole class ids; {int(bad.sum())} are not (first: "
                             f"{y[bad][0]!r} at index {int(np.flatnonzero(bad)[0])}). Fix: pass integer labels.")
    low, high = (int(y.min()), int(y.max())) if y.size else (0, 0)
    if low < 0 or (classes is not None and high >= classes):
        outside = (y < 0) | ((y >= classes) if classes is not None else False)
        raise ValueError(
            f"The labels {where} must be class ids in 0..{classes - 1 if classes else 'N-1'}"
            + (f" (the model has {classes} outputs)" if classes else "") + f"; {int(np.sum(outside))} are outside "
            f"(range found: {low}..{high}). Fix: map the labels to 0..{(classes or 1) - 1}"
            + (f", or give the model's last layer {high + 1} units" if high >= (classes or 0) else "") + ".")


def classifier_updates(model: Any, optimizer: Any, loss: Any = None) -> list[Update]:
    """One update: the mean of ``loss(y, model(x, training=True))`` over the batch (weighted, if it has weights).

    Batches are ``(x, y)`` or ``(x, y, sample_weight)``; ``x`` may be a dict or tuple (several inputs).
    ``loss`` is a Keras loss object or name (sparse categorical cross-entropy by default), or a function
    returning one value per example. With the sparse default, the labels are checked before training:
    class ids within the model's outputs.
    """
    per_example, sparse = _per_example(loss)

    def loss_fn(batch):
        if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3) or batch[1] is None:
            raise ValueError("classifier_updates needs labelled batches: (x, y) or (x, y, sample_weight). Received: "
                             f"{type(batch).__name__} of {len(batch) if isinstance(batch, (tuple, list)) else 1} "
                             "item(s). Fix: pass the labels (fit(x, y), or a dataset of (x, y) batches).")
        values = per_example(batch[1], model(batch[0], training=True))
        values = tf.cast(values, tf.float32)
        if len(batch) == 3:
            w = tf.cast(tf.reshape(batch[2], tf.shape(values)), tf.float32)
            return tf.reduce_sum(values * w) / tf.maximum(tf.reduce_sum(w), 1e-12)
        return tf.reduce_mean(values)

    def validate(sample):
        if not isinstance(sample, (tuple, list)) or len(sample) < 2 or sample[1] is None:
            raise ValueError("classifier_updates trains on labelled data: fit(x, y), or a dataset of (x, y) batches. "
                             "Received data without labels. Fix: pass y.")
        if sparse and not isinstance(sample[1], (dict, tuple, list)):  # (several outputs: the loss's own checks)
            check_class_labels(sample[1], _num_classes(model))

    return [Update("model", loss_fn, [(model.trainable_variables, optimizer)], validate=validate)]


def gan_updates(generator: Any, discriminator: Any, g_opt: Any, d_opt: Any) -> list[Update]:
    """The tutorials' GAN: a generator update, then a discriminator update, each with its own forward pass.

    The batches are real images (a tensor, or the first item of a tuple). The noise is uniform in
    [-1, 1], drawn per step from the trainer's seed (:func:`~amp_backends.training.step.step_seed`):
    reproducible, different in every step and replica, and continued exactly by a resumed run.
    """
    from ..models import NOISE_DIM, gan_labels, sigmoid_loss

    def forward(batch, salt):
        real = batch[0] if isinstance(batch, (tuple, list)) else batch
        n = real.shape[0]
        if n is None:
            raise ValueError("gan_updates needs batches of a fixed size (its labels are built per batch). Fix: batch "
                             "the dataset with drop_remainder=True.")
        noise = tf.random.stateless_uniform([n, NOISE_DIM], seed=step_seed(salt), minval=-1.0, maxval=1.0)
        fake = generator(noise, training=True)
        on_real = discriminator(real, training=True)
        on_fake = discriminator(fake, training=True)
        real_labels, fake_labels = gan_labels(n)
        d_loss = 0.5 * (sigmoid_loss(on_fake, fake_labels) + sigmoid_loss(on_real, real_labels))
        g_loss = sigmoid_loss(on_fake, real_labels)
        return g_loss, d_loss

    return [
        Update("generator", lambda b: forward(b, 1)[0], [(generator.trainable_variables, g_opt)]),
        Update("discriminator", lambda b: forward(b, 2)[1], [(discriminator.trainable_variables, d_opt)]),
    ]


def mnist_batch_fn(x: Any, y: Any, idx: Any) -> Any:
    """Gather a batch of uint8 MNIST images on the device and scale to [0, 1] (as the tutorials: /255)."""
    xb = tf.cast(tf.gather(x, idx), tf.float32) / 255.0
    xb = tf.reshape(xb, [-1, 28, 28, 1])
    return xb, (None if y is None else tf.gather(y, idx))
