"""The tutorials' MNIST CNN and GAN, layer for layer, built (``tf.keras``) under the dtype policy in force.

Outputs are float32 under any policy (the final layer has ``dtype="float32"``).
"""

from __future__ import annotations

from typing import Any

NOISE_DIM = 100
SOFTEN = 0.01  # label softening of the GAN
SWAP_FRACTION = 0.1  # the original removes the softening from the first 10% of each batch's labels


def _keras() -> Any:
    import tensorflow as tf

    return tf.keras


def mnist_cnn() -> Any:
    """Conv(32,3)-Conv(64,3)-MaxPool-Dropout(.25)-Flatten-Dense(128)-Dropout(.5)-Dense(10, softmax): 1,199,882 params"""
    k = _keras()
    L = k.layers
    return k.Sequential([k.Input((28, 28, 1)), L.Conv2D(32, 3, activation="relu"), L.Conv2D(64, 3, activation="relu"),
                         L.MaxPooling2D(2), L.Dropout(0.25), L.Flatten(), L.Dense(128, activation="relu"),
                         L.Dropout(0.5), L.Dense(10, activation="softmax", dtype="float32")], name="mnist_cnn")


def gan_discriminator() -> Any:
    """Three [Conv 5x5 same, tanh -> MaxPool -> Dropout .4] blocks, Flatten, Dense(1) logit. 245,169 params."""
    k = _keras()
    L = k.layers
    layers: list[Any] = [k.Input((28, 28, 1))]
    for filters in (24, 64, 128):
        layers += [L.Conv2D(filters, 5, padding="same", activation="tanh"), L.MaxPooling2D(2), L.Dropout(0.4)]
    layers += [L.Flatten(), L.Dense(1, dtype="float32")]
    return k.Sequential(layers, name="discriminator")


def gan_generator() -> Any:
    """Dense(7*7*64) -> 7x7x64 -> BN/Conv/Upsample x2 -> BN/Conv(8) -> BN -> Conv(1, sigmoid). 477,713 params."""
    k = _keras()
    L = k.layers
    layers: list[Any] = [k.Input((NOISE_DIM,)), L.Dense(7 * 7 * 64), L.Reshape((7, 7, 64))]
    for filters in (64, 32):
        layers += [L.BatchNormalization(), L.Conv2D(filters, 5, padding="same", activation="tanh"),
                   L.UpSampling2D(2, interpolation="nearest")]
    layers += [L.BatchNormalization(), L.Conv2D(8, 5, padding="same", activation="tanh"), L.BatchNormalization(),
               L.Conv2D(1, 5, padding="same", activation="sigmoid", dtype="float32")]
    return k.Sequential(layers, name="generator")


def gan_labels(batch_size: int) -> tuple[Any, Any]:
    """Real labels 0 + 0.01, fake labels 1 - 0.01, the first 10% unsoftened (as in the original)."""
    import tensorflow as tf

    n_swap = int(batch_size * SWAP_FRACTION)
    unsoftened = tf.concat([tf.ones([n_swap, 1]), tf.zeros([batch_size - n_swap, 1])], axis=0)
    real = tf.fill([batch_size, 1], SOFTEN) - SOFTEN * unsoftened
    fake = tf.fill([batch_size, 1], 1.0 - SOFTEN) + SOFTEN * unsoftened
    return real, fake


def sigmoid_loss(logits: Any, targets: Any) -> Any:
    import tensorflow as tf

    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=targets, logits=tf.cast(logits, tf.float32)))
