"""The random layers' state, kept in every checkpoint: a resumed run draws what the uninterrupted run would.

Dropout, SpatialDropout, GaussianDropout and GaussianNoise, the augmentation layers (RandomFlip,
RandomRotation, RandomCrop, RandomZoom, ...), keras_hub's layers with dropout and a layer's own generator
each draw from a generator whose state moves at every step. A model's checkpoint
(``tf.train.Checkpoint(model=...)``) leaves that state out: without it a resumed run draws other masks than
the uninterrupted run, and every loss after the resume differs. `random_state` finds it, for the
trainer's checkpoints to carry:

* Keras 3: each ``keras.random.SeedGenerator`` keeps its state in a variable that ``model.variables``
  lists and ``model.weights`` does not (a SeedGenerator is no trackable object). ``keras.random`` ops given
  no seed draw from Keras's global SeedGenerator, kept in Keras's global state: it is made now if no draw
  made it yet (from Python's ``random``, which `seed_everything`
  seeds), so that its state is saved from the first checkpoint on.
* Keras 2: a random layer draws through its ``RandomGenerator``: from a ``tf.random.Generator`` (the
  augmentation layers always; Dropout, GaussianNoise and GaussianDropout once Keras's
  ``enable_tf_random_generator`` is on, which ``seed_everything`` does), whose state is a variable; or from
  TensorFlow's stateful random ops, whose state lives inside the op where no checkpoint reaches: such
  layers are named in a warning (`saved_random_state`).

The trainer's own draws need nothing saved: shuffling is a function of ``(seed, epoch)`` and
`step_seed` of ``(seed, global step)``, both restored with the position.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import tensorflow as tf

logger = logging.getLogger("amp_backends.train")

KEY = "random_state"  # its name in the trainer's checkpoints and their signature


class RandomState(tf.Module):
    """The random generators' state variables as one checkpoint object: the layers' ``states`` and Keras's
    global generator's (``shared``). Its ``variables``, the layers' states, are what the checkpoint's
    signature lists, so a model with other random layers is named as a mismatch."""

    def __init__(self, states: Sequence[Any], shared: Sequence[Any] = ()) -> None:
        super().__init__(name=KEY)
        self.states = list(states)
        self.shared = list(shared)

    @property
    def variables(self) -> tuple[Any, ...]:  # (Keras 3's variables are no tf.Variable for tf.Module's own walk)
        return tuple(self.states)


def random_state(models: Sequence[Any]) -> tuple[RandomState, list[str]]:
    """The state of every random generator ``models`` draw from (see the module docstring), and the names of
    their layers whose draws no checkpoint can hold (Keras 2's stateful random ops)."""
    states: list[Any] = []
    seen: set[int] = set()
    unsaved: list[str] = []

    def add(variable: Any) -> None:
        if id(variable) not in seen:
            seen.add(id(variable))
            states.append(variable)

    for model in models:
        weights = {id(w) for w in model.weights}
        for v in model.variables:  # Keras 3: the SeedGenerators' states (Keras 2: the same list as weights)
            if id(v) not in weights:
                add(v)
        for layer in _layers(model):  # Keras 2
            generator = getattr(layer, "_random_generator", None)
            if generator is None or not hasattr(generator, "_rng_type"):
                continue
            if isinstance(getattr(generator, "_generator", None), tf.random.Generator):
                add(generator._generator.state)
            elif generator._rng_type == "legacy_stateful":
                unsaved.append(layer.name)
    shared = _keras_global_generator()
    return RandomState(states, [shared.state] if shared is not None else []), unsaved


def _layers(model: Any) -> list[Any]:
    return [model, *(m for m in getattr(model, "submodules", ()) if hasattr(m, "_random_generator"))]


def _keras_global_generator() -> Any:
    """Keras 3's global SeedGenerator (made now if no draw made it yet); ``None`` under Keras 2."""
    from ..keras_compat import keras_info

    if keras_info(tf).generation != 3:
        return None
    from keras.src.random.seed_generator import global_seed_generator  # (Keras has no public name for it)

    return global_seed_generator()


def saved_random_state(models: Sequence[Any], say: bool) -> RandomState:
    """`random_state` for the trainer's checkpoints; with ``say``, a warning names the layers whose draws a
    resumed run cannot repeat, with the fix."""
    state, unsaved = random_state(models)
    if unsaved and say:
        logger.warning(
            f"The random layers {', '.join(unsaved)} draw from TensorFlow's stateful random ops, whose state no "
            "checkpoint can hold: after a resume they draw other values than an uninterrupted run would. Fix: call "
            "amp_backends.seed_everything(seed) (or tf.keras.backend.experimental.enable_tf_random_generator()) "
            "before building the model.")
    return state
