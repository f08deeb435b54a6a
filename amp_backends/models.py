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


def gan_labels(batch_size: Any) -> tuple[Any, Any]:
    """Real labels 0 + 0.01, fake labels 1 - 0.01, the first 10% unsoftened (as in the original); ``batch_size`` a
    number or a scalar tensor (a size known only when the step runs)."""
    import tensorflow as tf

    n = tf.convert_to_tensor(batch_size, tf.int32)
    unsoftened = tf.cast(tf.range(n) < tf.cast(tf.cast(n, tf.float32) * SWAP_FRACTION, tf.int32), tf.float32)[:, None]
    return SOFTEN - SOFTEN * unsoftened, (1.0 - SOFTEN) + SOFTEN * unsoftened


def gan_losses(generator: Any, discriminator: Any, real: Any, noise: Any, training: bool = True) -> tuple[Any, Any]:
    """The tutorial GAN's losses on one batch, with `gan_labels`: the generator's (its images judged real) and the
    discriminator's (the mean of its losses on generated and on real images). The generator runs first, then the
    discriminator on the real images, then on the generated ones (dropout draws its randomness in that order)."""
    import tensorflow as tf

    fake = generator(noise, training=training)
    on_real, on_fake = discriminator(real, training=training), discriminator(fake, training=training)
    real_labels, fake_labels = gan_labels(real.shape[0] if real.shape[0] is not None else tf.shape(real)[0])
    d_loss = 0.5 * (sigmoid_loss(on_fake, fake_labels) + sigmoid_loss(on_real, real_labels))
    return sigmoid_loss(on_fake, real_labels), d_loss


def sigmoid_loss(logits: Any, targets: Any) -> Any:
    """The mean sigmoid cross-entropy of ``logits`` against ``targets``, in float32 (the tutorial GAN's loss).

    Args:
        logits: The discriminator's outputs, logits in any float dtype.
        targets: The labels, 0 to 1 (`gan_labels`).

    Returns:
        The mean loss, a float32 scalar tensor.
    """
    import tensorflow as tf

    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=targets, logits=tf.cast(logits, tf.float32)))
