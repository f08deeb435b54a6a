"""Reproducible runs: one seed for weights, dropout, shuffling and the trainer's random draws.

On the CPU the same seed gives the same losses, run after run: `seed_everything` seeds Python,
NumPy, TensorFlow and Keras (Keras 3's initializers and dropout draw from its own seed generator, which
``tf.random.set_seed`` alone does not reach; Keras 2's random layers made afterwards are set to draw
from a ``tf.random.Generator``, whose state checkpoints keep: see `random_state`); the trainer's
shuffling is a function of ``(seed, epoch)`` and random draws inside a step use
`step_seed`. ``deterministic=True``
also makes TensorFlow choose deterministic kernels (``tf.config.experimental.enable_op_determinism``):
on GPUs that is what makes two runs equal (cuDNN and atomics otherwise reorder float additions, so losses
differ in the last digits and drift apart), at some cost in speed; ops without a deterministic GPU kernel
then raise an error naming themselves. Results still differ between GPU models, drivers and TensorFlow
versions, and between a CPU and a GPU.
"""

from __future__ import annotations

import tensorflow as tf

from ..errors import AmpConfigError
from ..keras_compat import keras_info

_seed = {"value": 0}  # the process's seed, like the generators it seeds


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy, TensorFlow and Keras, and the trainers made afterwards (their shuffling and
    `step_seed`, unless given ``seed=``).

    Args:
        seed: A non-negative integer.
        deterministic: Also use deterministic kernels (``tf.config.experimental.enable_op_determinism``).

    Raises:
        AmpConfigError: ``seed`` is not a non-negative integer.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise AmpConfigError(f"seed must be a non-negative integer. Received: {seed!r}.")
    tf.keras.utils.set_random_seed(seed)
    if keras_info(tf).generation == 2:
        # Keras 2's Dropout and noise layers made from now on draw from a tf.random.Generator, whose state a
        # checkpoint holds, instead of TensorFlow's stateful ops (see .random_state)
        tf.keras.backend.experimental.enable_tf_random_generator()
    _seed["value"] = seed
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def current_seed() -> int:
    """The seed last given to `seed_everything` (0 before any)."""
    return _seed["value"]
