"""The process's seed: `seed_everything` seeds Python, NumPy, TensorFlow and Keras (and the trainers made
afterwards); `current_seed` reads it back. TensorFlow is imported only when a seed is set.
"""

from __future__ import annotations

from .errors import AmpConfigError
from .keras_compat import keras_info

_seed = {"value": 0}  # the process's seed, like the generators it seeds


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy, TensorFlow, Keras and the trainers made afterwards (unless given ``seed=``).

    Args:
        seed: A non-negative integer.
        deterministic: Also use deterministic kernels (``tf.config.experimental.enable_op_determinism``).

    Raises:
        AmpConfigError: ``seed`` is not a non-negative integer.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise AmpConfigError(f"seed must be a non-negative integer. Received: {seed!r}. Fix: pass such as seed=0.")
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    if keras_info(tf).generation == 2:  # Keras 2's random layers made from now on: state a checkpoint holds
        tf.keras.backend.experimental.enable_tf_random_generator()
    _seed["value"] = seed
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def current_seed() -> int:
    """The seed last given to `seed_everything` (0 before any)."""
    return _seed["value"]
