"""The trainer's arguments, checked before anything is built, and the optimizers' state created once."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import AmpConfigError
from ..keras_compat import build_optimizer, loss_scale_of
from .step import Update


def checked_arguments(updates: Sequence[Update], replicas: int, *, checkpoint_every: int | None,
                       **positive: Any) -> list[Update]:
    """The updates as a list, after checking every argument of the trainer that can be checked alone.

    Problems raise `AmpConfigError` (a ``ValueError``), or ``TypeError`` for arguments of the wrong kind.
    """
    for name, value in positive.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise AmpConfigError(f"{name} must be an integer >= 1. Received: {name}={value!r}.")
    if checkpoint_every is not None and (not isinstance(checkpoint_every, int) or checkpoint_every < 1):
        raise AmpConfigError(f"checkpoint_every must be an integer >= 1 or None. Received: {checkpoint_every!r}.")
    batch_size = positive["batch_size"]
    if batch_size % replicas:
        raise AmpConfigError(
            f"batch_size is the global batch and must be divisible by the {replicas} replicas in sync. "
            f"Received: batch_size={batch_size}. Fix: use a multiple of {replicas}.")
    updates = list(updates)
    if not updates or not all(isinstance(u, Update) for u in updates):
        raise TypeError(f"updates must be a non-empty list of Update. Received: {updates!r}.")
    names = [u.name for u in updates]
    if len(set(names)) != len(names):
        raise AmpConfigError(f"Update names must be unique (they name losses, scales and logs). Received: {names}.")
    for u in updates:
        if not u.variables:
            raise AmpConfigError(
                f"Update {u.name!r} has no variables to train: its model is not built yet "
                "(or every layer is frozen). Fix: build the model before the Trainer "
                "(start it with keras.Input(shape), or call model.build(shape)).")
        for _, opt in u.groups:
            mode, _ = loss_scale_of(opt)
            if mode != "none":
                raise AmpConfigError(
                    f"The optimizer of update {u.name!r} scales losses itself "
                    f"({mode} loss scaling: a LossScaleOptimizer or loss_scale_factor). "
                    "The Trainer scales losses as the plan says, so they would be scaled twice. "
                    "Fix: give the Trainer the plain optimizer (plan.wrap_optimizer is for Keras fit).")
    return updates


def build_optimizers(updates: Sequence[Update]) -> None:
    """Create each optimizer's state now (before restore, outside tf.cond), once, for all the variables it updates:
    one optimizer may serve several groups or updates."""
    owned: dict[int, tuple[Any, list[Any]]] = {}
    for u in updates:
        for variables, opt in u.groups:
            owned.setdefault(id(opt), (opt, []))[1].extend(variables)
    for opt, variables in owned.values():
        unique = list({id(v): v for v in variables}.values())
        build_optimizer(opt, unique)




def saved_weights(updates: Sequence[Update], models: Sequence[Any]) -> list[Any]:
    """Every floating-point variable a checkpoint holds and a step can change (checked finite before a save;
    not the dropout seed generators' integer state)."""
    import tensorflow as tf

    every = [*(v for u in updates for v in [*u.variables, *u.state]), *(v for m in models for v in m.variables)]
    return [v for v in {id(v): v for v in every}.values() if tf.as_dtype(v.dtype).is_floating]


def check_fit_arguments(*, epochs: Any, max_steps: Any, resume: bool, checkpoints: bool) -> None:
    """``fit``'s own arguments: positive counts, and ``resume`` only with a checkpoint directory."""
    for name, value in (("epochs", epochs), ("max_steps", max_steps)):
        if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be a positive integer{' or None' if name == 'max_steps' else ''}. "
                             f"Received: {name}={value!r}.")
    if resume and not checkpoints:
        raise AmpConfigError("fit(resume=True) continues from checkpoints, but this Trainer has no checkpoint_dir. "
                             "Fix: build the Trainer with checkpoint_dir=..., or leave resume out.")
