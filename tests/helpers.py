"""Small builders the training tests share: this machine's plan applied quietly, a small classifier, random data.

Each builds exactly what the tests built before they shared it (layers in the same order, the same random
generator and seed): tests compare losses bit-exactly, so a variant is an argument here, never a new default.
TensorFlow is imported on first use: importing this module starts nothing. Fake hardware and the pure plans made
for it are ``fakes``' (`fakes.plan_of`); fixtures and the suite's global state, ``conftest``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import amp_backends

if TYPE_CHECKING:
    from amp_backends.plan import Plan


def applied_plan(policy: str | None = "float32", **overrides) -> Plan:
    """This machine's plan, applied by ``auto_configure`` without printing it.

    Args:
        policy: The Keras policy asked for; ``None`` leaves it to the plan (this machine's choice, or the
            ``AMP_POLICY`` environment variable).
        **overrides: The other keywords of ``auto_configure`` (``loss_scale``, ``xla``, ``force``...).

    Returns:
        The plan, applied: models built afterwards follow its policy.
    """
    return amp_backends.auto_configure(verbose=False, policy=policy, **overrides)


def mlp(features: int = 4, *, hidden: int | None = 8, classes: int = 3, dropout: float = 0.0,
        activation: str | None = None):
    """A small Keras classifier: ``features`` inputs, a ReLU layer of ``hidden`` units, ``classes`` outputs.

    Args:
        features: The width of its input.
        hidden: The units of its hidden ReLU layer; ``None``: no hidden layer (one Dense layer, a linear classifier).
        classes: The units of its output layer.
        dropout: The rate of a Dropout layer after the hidden one; ``0.0``: none.
        activation: The output layer's activation; ``None``: logits.

    Returns:
        A ``tf.keras.Sequential``, its weights created (it starts from an ``Input``).
    """
    import tensorflow as tf

    layers = [tf.keras.Input((features,))]
    if hidden:
        layers.append(tf.keras.layers.Dense(hidden, activation="relu"))
    if dropout:
        layers.append(tf.keras.layers.Dropout(dropout))
    return tf.keras.Sequential([*layers, tf.keras.layers.Dense(classes, activation=activation)])


def classification_data(n: int = 64, features: int = 4, classes: int = 3, seed: int = 0):
    """``n`` random samples and labels: the features standard normal, the labels uniform (nothing to learn).

    Args:
        n: The number of samples.
        features: The features of each sample.
        classes: The number of classes the labels are drawn from.
        seed: The seed of the one NumPy generator that draws the features, then the labels.

    Returns:
        ``(x, y)``: float32 features of shape ``(n, features)`` and int64 labels of shape ``(n,)``.
    """
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, features)).astype("float32"), rng.integers(0, classes, n)
