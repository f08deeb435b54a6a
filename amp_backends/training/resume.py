"""What a resumed run keeps from the checkpoint it continues, and what it says where a setting changed.

A trainer's checkpoints record the run's seed and each update's loss scaling in their signature (besides the
models, the batch size and the plan: `checkpoints`). Resuming:

* **the seed** orders each epoch's samples and draws the steps' randomness: continuing with another would
  read samples of the epoch in progress twice and skip others. A trainer with another seed is refused
  (`check_seed`); the examples, which load their data before they train, read the run's seed first
  (`run_seed`) and follow it, or refuse a ``--seed`` that differs.
* **loss scaling** restored from a checkpoint written under another one does not fit the plan: a run begun
  without loss scaling (bfloat16 on a CPU) and continued under float16 (on an NVIDIA GPU) would start at
  scale 1 — float16 without scaling until the scale grows, ``growth_interval`` steps later. Where the
  checkpoint's loss scaling differs from the plan's, the plan's starts afresh (at its initial scale, as a new
  run does; ``none`` drops the scale) and the log says so (`follow_loss_scaling`); the same dynamic
  scaling continues from the restored scale.
* **max_steps and epochs** count the whole run: a run already past them has nothing to train, and a warning
  says so and what to pass (`nothing_left`); ``fit`` returns without a step.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from ..errors import CheckpointMismatchError
from .checkpoints import SIGNATURE_KEY
from .position import At

logger = logging.getLogger("amp_backends.train")


def settings(seed: int, scalers: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint's signature records for a resume to compare: the seed, each update's loss scaling."""
    return {"seed": int(seed), "loss_scaling": {name: s.config.to_dict() for name, s in scalers.items()}}


def check_seed(stored: Mapping[str, Any] | None, seed: int, path: str) -> None:
    """`CheckpointMismatchError` when the checkpoint at ``path`` was written by a run with another seed."""
    then = (stored or {}).get("seed")
    if then is None or int(then) == seed:
        return
    raise CheckpointMismatchError(
        f"The checkpoint {path} was written by a run with seed {then}; this trainer's seed is {seed}. The seed orders "
        "each epoch's samples and draws the steps' randomness: continuing with another would read samples of the "
        f"epoch in progress twice and skip others. Fix: resume with seed={then} (on the command line: leave --seed "
        f"out, a resumed run keeps its own), or start a new run with seed {seed} (without resume=True / --resume, "
        "or in another directory).")


def follow_loss_scaling(stored: Mapping[str, Any] | None, scalers: Mapping[str, Any], say: bool = True) -> list[str]:
    """Restart each scaler whose loss scaling differs from the checkpoint's at the plan's initial scale; what
    changed, as lines (logged with ``say``). A checkpoint that does not record its loss scaling (an older
    one) is followed as is."""
    then = (stored or {}).get("loss_scaling") or {}
    lines = []
    for name, scaler in scalers.items():
        old, new = then.get(name), scaler.config.to_dict()
        if old is None or old == new or (old.get("mode") == new["mode"] == "dynamic"):
            continue
        restored = scaler.current
        scaler.restart()
        was = "without loss scaling" if old.get("mode") == "none" else f"with {_describe(old)} loss scaling"
        if scaler.config.mode == "none":
            now = f"this plan scales no losses: the restored scale {restored:g} of {name!r} is dropped"
        else:
            now = (f"this plan's loss scaling is {scaler.config}: {name!r} starts at scale {scaler.current:g}, as a "
                   f"new run does, not at the restored {restored:g}")
        lines.append(f"The checkpoint was written {was}; {now}.")
        if say:
            logger.info(lines[-1])
    return lines


def _describe(config: Mapping[str, Any]) -> str:
    return f"fixed ({config.get('scale', 0):g})" if config.get("mode") == "fixed" else str(config.get("mode"))


def nothing_left(at: At, epoch_done: bool, epochs: int, max_steps: int | None) -> str | None:
    """The warning for a run that ``fit(epochs=..., max_steps=...)`` would not move (``None``: steps to train);
    ``epoch_done``: the epoch ``at`` stands in has no batch left."""
    if max_steps is not None and at.step >= max_steps:
        return (f"Nothing to train: the run is already at global step {at.step}, "
                + ("which is" if at.step == max_steps else "past") + f" max_steps={max_steps} (--max-steps: "
                "the steps of the whole run, resumed ones included). Fix: to train further, pass a max_steps above "
                f"{at.step}, such as {at.step + max(at.step, 1)}.")
    done = at.epoch + int(epoch_done)
    if done >= epochs:
        return (f"Nothing to train: the run has already completed {done} epoch{'s' if done != 1 else ''}, and "
                f"epochs={epochs} (--epochs) counts the epochs of the whole run. Fix: to train further, pass epochs "
                f"above {done}, such as {done + 1}.")
    return None


def run_seed(checkpoints: str | os.PathLike) -> int | None:
    """The seed recorded by the newest readable checkpoint in folder ``checkpoints`` (``None``: none records
    one), read without building anything."""
    folder = os.fspath(checkpoints)
    state = tf.train.get_checkpoint_state(folder)
    names = {os.path.basename(p) for p in (state.all_model_checkpoint_paths or [state.model_checkpoint_path])} \
        if state else set()
    for name in sorted(names, key=lambda n: int(n.rsplit("-", 1)[-1]) if n.rsplit("-", 1)[-1].isdigit() else -1,
                       reverse=True):
        try:
            reader = tf.train.load_checkpoint(os.path.join(folder, name))
            raw = reader.get_tensor(SIGNATURE_KEY) if reader.has_tensor(SIGNATURE_KEY) else None
        except Exception:  # missing or truncated files: the restore says which
            continue
        seed = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw)).get("seed") if raw else None
        return None if seed is None else int(seed)
    return None


def restore_run(store: Any, position: Any, *, seed: int, scalers: Mapping[str, Any], updates: Any, batch_size: int,
                plan_headline: str, is_chief: bool) -> tuple[int, dict[str, Any]] | None:
    """Restore ``store``'s newest intact checkpoint, if any: its seed checked, the resume said (by the chief),
    loss scaling followed; ``(its global step, its signature)``: the signature holds what the run decided and
    learnt (``layer_plans``, ``monitor``: its history and best value)."""
    from .checkpoints import log_resume

    restored = store.restore()
    if restored is None:
        return None
    check_seed(restored.stored, seed, restored.path)
    at, then_batch = position.restored()
    stored = restored.stored or {}
    if is_chief:
        log_resume(restored, at, then_batch, batch_size, updates=updates, scalers=scalers,
                   plan_headline=plan_headline)
    follow_loss_scaling(restored.stored, scalers, say=is_chief)
    return at.step, stored

