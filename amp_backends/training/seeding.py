"""Reproducible runs: one seed for weights, dropout, shuffling and the trainer's random draws.

On the CPU the same seed gives the same losses, run after run: `seed_everything` seeds Python,
NumPy, TensorFlow and Keras (Keras 3's initializers and dropout draw from its own seed generator, which
``tf.random.set_seed`` alone does not reach; Keras 2's random layers made afterwards are set to draw
from a ``tf.random.Generator``, whose state checkpoints keep: see `saving`); the trainer's
shuffling is a function of ``(seed, epoch)`` and random draws inside a step use
`step_seed`. ``deterministic=True``
also makes TensorFlow choose deterministic kernels (``tf.config.experimental.enable_op_determinism``):
on GPUs that is what makes two runs equal (cuDNN and atomics otherwise reorder float additions, so losses
differ in the last digits and drift apart), at some cost in speed; ops without a deterministic GPU kernel
then raise an error naming themselves. Results still differ between GPU models, drivers and TensorFlow
versions, and between a CPU and a GPU.
"""

from __future__ import annotations

import threading
from typing import Any

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


# ------------------------------------------------------------------------------------- step seeds
_context = threading.local()


def step_seed(salt: int = 0) -> Any:
    """A seed for stateless random ops inside a training step:
    ``tf.random.stateless_uniform(shape, seed=step_seed(1))``.

    It depends on the trainer's seed, the global step, the replica and ``salt`` (use a different salt per
    random draw in a step) — so random draws are reproducible from the seed, different in every step and
    replica, and continue exactly where a resumed run left off. Only valid inside a trainer's step.

    Args:
        salt: Tells apart the random draws of one step (a different salt for each).

    Returns:
        A ``[2]`` int64 tensor for ``tf.random.stateless_*``'s ``seed``.

    Raises:
        RuntimeError: Called outside a training step run by the trainer.
    """
    ctx = getattr(_context, "current", None)
    if ctx is None:
        raise RuntimeError("step_seed() is only available inside a training step run by amp_backends' Trainer (in "
                           "an Update's loss_fn). Outside, seed random ops yourself (tf.random.stateless_*).")
    seed, step, replica, replicas = ctx
    return tf.stack([tf.constant(seed * 1_000_003 + salt, tf.int64),
                     tf.cast(step, tf.int64) * replicas + tf.cast(replica, tf.int64)])


class _StepContext:
    def __init__(self, seed: int, step: Any, replica: Any, replicas: int) -> None:
        self.value = (seed, step, replica, replicas)

    def __enter__(self) -> None:
        self.saved = getattr(_context, "current", None)
        _context.current = self.value

    def __exit__(self, *exc: Any) -> None:
        _context.current = self.saved
