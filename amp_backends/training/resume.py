"""A run that stops and goes on exactly: Ctrl-C and SIGTERM, what a trainer's checkpoints hold, what a resume keeps.

`Checkpointing` is a trainer's side of it. The first Ctrl-C (or SIGTERM) stops after the current call (on every
worker: `distribute.StopAgreement`), saves and raises `TrainingInterrupted`; a second acts at once. A resume checks
the seed (it orders each epoch's samples: `check_seed`, `run_seed`), follows or restarts loss scaling
(`loss_scaling.LossScaler.follow`) and counts ``max_steps`` and ``epochs`` over the whole run (`nothing_left`).
The random layers' generator state, which ``tf.train.Checkpoint(model=...)`` leaves out, is saved too
(`saved_random_state`), so a resumed run draws the masks the uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any, ContextManager, Iterator

import numpy as np
import tensorflow as tf

from ..errors import CheckpointMismatchError, TrainingInterrupted, warn
from ..keras_compat import keras_info
from ..plan import Plan
from .checkpoints import CheckpointStore, Restored, checkpoint_paths, read_signature
from .distribute import StopAgreement, collectives
from .inputs import Stream
from .loss_scaling import LossScaler
from .precision import TrainedModels
from .runs import At, Position, holding
from .step import Update
from .validation import Validation

logger = logging.getLogger("amp_backends.train")

RANDOM_STATE = "random_state"  # the random layers' state: its name in the trainer's checkpoints and signature


# ------------------------------------------------------------------------------------ stopping
class StopSignals:
    """Turn the first Ctrl-C (or SIGTERM) into a request to stop after the current call; a second one acts at once."""

    asked = False  # a stop was asked in this process (a later KeyboardInterrupt is the second Ctrl-C)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # ignored on purpose (nohup, a background job): it stays ignored
                try:
                    previous = signal.signal(sig, self._handle)
                except (ValueError, OSError):
                    continue
                # None: a handler installed outside Python; the default is the closest we can give back
                self._previous[sig] = signal.SIG_DFL if previous is None else previous
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum, StopSignals.asked = signum, True
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
        logger.warning(f"{signal.Signals(signum).name} received: stopping after the current call "
                       "(again to stop at once, without a checkpoint).")

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def interrupted_message(signum: int, step: int, path: str | None, *, checkpointing: bool, by: str | None = None) -> str:
    """What an interrupted run says; ``by``: the worker the signal reached, among several."""
    name = signal.Signals(signum).name if by is None else f"{signal.Signals(signum).name} to {by}"
    if not checkpointing:
        return f"Interrupted ({name}) at step {step}: checkpointing is off, nothing was saved."
    where = f"checkpoint saved to {path}" if path else "checkpoint saved in the chief's checkpoint directory"
    if by is None:
        return f"Interrupted ({name}) at step {step}: {where}. Continue with --resume (fit(..., resume=True))."
    return (f"Interrupted ({name}) at step {step}: {where} (every worker stopped at this step). Continue with "
            "--resume on every worker.")


# ------------------------------------------------------------------------------------ resuming
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


def nothing_left(at: At, epoch_done: bool, epochs: int, max_steps: int | None, say: bool = True) -> str | None:
    """The warning (logged with ``say``) for a run ``fit`` would not move; ``epoch_done``: no batch left in ``at``'s."""
    done, left = at.epoch + int(epoch_done), None
    if max_steps is not None and at.step >= max_steps:
        left = (
            f"Nothing to train: the run is already at global step {at.step}, "
            + ("which is" if at.step == max_steps else "past") + f" max_steps={max_steps} (--max-steps: the steps of "
            f"the whole run, resumed ones included). Fix: to train further, pass a max_steps above {at.step}, such as "
            f"{at.step + max(at.step, 1)}.")
    elif done >= epochs:
        left = (f"Nothing to train: the run has already completed {done} epoch{'s' if done != 1 else ''}, and "
                f"epochs={epochs} (--epochs) counts the epochs of the whole run. Fix: to train further, pass epochs "
                f"above {done}, such as {done + 1}.")
    if left and say:
        logger.warning(left)
    return left


def run_seed(checkpoints: str | os.PathLike) -> int | None:
    """The seed the newest readable checkpoint in folder ``checkpoints`` records, if any."""
    for path in checkpoint_paths(os.fspath(checkpoints)):
        try:
            seed = (read_signature(path) or {}).get("seed")
        except Exception:  # missing or truncated files: the restore says which
            continue
        return None if seed is None else int(seed)
    return None


def learning_rates(updates: Sequence[Update]) -> dict[str, float]:
    """Each optimizer's learning rate where it is a number (not a schedule), by ``update[group]``."""
    rates = {f"{u.name}[{i}]": getattr(o, "learning_rate", None) for u in updates for i, (_, o) in enumerate(u.groups)
             if not callable(getattr(o, "_learning_rate", None))}
    return {k: float(np.asarray(r)) for k, r in rates.items() if r is not None and np.size(r) == 1}


# ------------------------------------------------------------------------------------ the trainer's checkpoints
class Checkpointing:
    """A trainer's checkpoints (``store``: its `CheckpointStore`, or ``None``), saves (with the other workers:
    `together`), resume (`restore`) and stops on Ctrl-C or SIGTERM (`fitting`); ``every``:
    ``checkpoint_every``."""

    def __init__(self, directory: str | None, *, objects: Mapping[str, Any] | None, keep: int, every: int | None,
                 plan: Plan, updates: Sequence[Update], scalers: Mapping[str, LossScaler], position: Position,
                 seed: int, strategy: Any, is_chief: bool, worker: str, validation: Validation,
                 trained: Sequence[Any]) -> None:
        self.updates, self.scalers, self.position, self.seed, self.every = updates, scalers, position, seed, every
        self.plan_headline, self.validation = str(plan.headline), validation
        self.strategy, self.is_chief, self.worker = strategy, is_chief, worker  # (the trainer's: `distribute`)
        self.agree = StopAgreement(strategy)  # every worker stops after the same call
        self.signals = StopSignals()  # `fitting`'s; ``stopped``: the signal every worker stops on
        self.stopped: int | None = None
        self.saved_at: At | None = None  # the position of the last save (an epoch's end moves on at the same step)
        self.store = self._store(directory, objects, keep, trained) if directory else None
        self.directory = self.store.directory if self.store else None  # absolute

    def _store(self, directory: str, objects: Mapping[str, Any] | None, keep: int,
               trained: Sequence[Any]) -> CheckpointStore:
        """The store of ``objects`` (default: the updates' variables and optimizers), the loss-scale state, the
        position, the models' random state and the training metrics' state; the signature records the plan, the
        seed and each update's loss scaling, for a resume to compare."""
        updates, position = self.updates, self.position
        models = [m for m in (objects or {}).values() if hasattr(m, "layers")]
        every = [*(v for u in updates for v in [*u.variables, *u.state]), *(v for m in models for v in m.variables)]
        weights = [v for v in {id(v): v for v in every}.values() if tf.as_dtype(v.dtype).is_floating]
        if objects:
            _say_what_objects_leave_out(objects, updates)
        objects = dict(objects) if objects else {
            **{f"{u.name}_{i}_{part}": obj for u in updates for i, (vs, opt) in enumerate(u.groups)
               for part, obj in (("variables", list(vs)), ("optimizer", opt))},
            **{f"{u.name}_state": list(u.state) for u in updates if u.state}}
        scaler_state = {name: tf.train.Checkpoint(**s.variables()) for name, s in self.scalers.items()}
        objects = {**objects, "loss_scale": tf.train.Checkpoint(**scaler_state), "position": position.checkpoint()}
        metrics = [v for m in self.validation.train_metrics for v in m.variables]  # (a resumed epoch's go on)
        extra = {"batch_size": position.batch_size, "plan": self.plan_headline, "seed": int(self.seed),
                 "loss_scaling": {name: s.config.to_dict() for name, s in self.scalers.items()}}
        return CheckpointStore(objects, directory, step_counter=position.global_step, keep=keep,
                               is_chief=self.is_chief, worker=self.worker, extra=extra, weights=weights,
                               optional={RANDOM_STATE: saved_random_state([*models, *trained], self.is_chief),
                                         **({"metrics": _Variables(metrics)} if metrics else {})})

    def together(self, step: int) -> ContextManager[None]:
        """A call or save made with the other workers: a failure says who to restart and from where."""
        return collectives(self.strategy, self.worker, step, lambda: self.store.latest if self.store else None)

    def save(self) -> str | None:
        """Write a checkpoint now (atomically; with the other workers): `checkpoints.CheckpointStore.save_finite`."""
        if self.store is None:
            return None
        self.store.annotate("monitor", self.validation.monitor.state())  # the history, best value, waiting
        path = self.store.save_finite(self.together(self.position.step))
        self.saved_at = self.position.now()
        return path

    def after_call(self, step: int, done: int) -> None:
        """Save after the call of ``done`` steps from ``step`` if it reached a multiple of ``checkpoint_every``."""
        if (every := self.every) and (step + done) // every > step // every:
            self.save()

    def before_failing(self) -> str | None:
        """The save before training fails on non-finite steps: in one process only, and of finite weights only."""
        if self.store and getattr(self.strategy, "cluster_resolver", None) is None and self.store.weights_finite():
            return self.save()
        return None

    def restore(self, models: TrainedModels, source: Any = None) -> int | None:
        """Restore the newest checkpoint, if any, and what the run decided and learnt; its global step (``source``: the
        input, arrays or a ``tf.data`` pipeline (`inputs.Stream`, which resumes at a whole batch))."""
        given = learning_rates(self.updates)
        restored = self.store.restore(models.quantize) if self.store else None  # float8 layers first
        if restored is None:
            return None
        check_seed(restored.stored, self.seed, restored.path)
        at, then_batch = self.position.restored()
        self.saved_at = self.position.now()
        stored = restored.stored or {}
        if self.is_chief:
            self._log_resume(restored, at, then_batch, given, source)
        then = stored.get("loss_scaling") or {}
        for name, scaler in self.scalers.items():
            scaler.follow(then.get(name), say=self.is_chief)
        models.restored(stored.get("layer_plans") or stored.get("float32_choice"))
        self.validation.load(stored.get("monitor"))
        return at.step

    def _log_resume(self, restored: Restored, at: At, then_batch: int, given: Mapping[str, float],
                    source: Any) -> None:
        """The resume line: where it continues, what differs from the checkpoint's run (``given``: rates before it)."""
        stream = source if isinstance(source, Stream) else None
        then, now = (restored.stored or {}).get("samples"), getattr(source, "samples", None)
        if then and now and then != now:
            where = (f"at sample {at.offset} of epoch {at.epoch} of these, in their own order" if at.offset < now else
                     f"with epoch {at.epoch + 1} (it stood at sample {at.offset}, past their end)")
            logger.warning(f"The checkpoint's run trained on {then} samples; this fit is given {now}: it goes on "
                           f"{where} (a resume continues a run on its data; for other data, start a new run from its "
                           "weights).")
        optimizers = {f"{u.name}[{i}]": int(opt.iterations.numpy()) for u in self.updates
                      for i, (_, opt) in enumerate(u.groups) if hasattr(opt, "iterations")}
        scales = ", ".join(f"{n}={s.current:g}" for n, s in self.scalers.items())
        logger.info(f"Resumed from {restored.path}: global step {at.step}, epoch {at.epoch}, step in epoch "
                    f"{at.offset // then_batch}, loss scales {scales}, optimizer iterations "
                    + ", ".join(f"{k}={v}" for k, v in optimizers.items()))
        if then_batch != (batch := self.position.batch_size):
            said = " (the position is kept in samples, so no sample is read twice or skipped)."
            if stream is not None:  # a pipeline skips whole batches of the new size
                skip, again = stream.batches_before(at), at.offset % batch
                said = (f": the pipeline skips the first {skip} batch{'' if skip == 1 else 'es'} of {batch} of its pass"
                        + (" (one stream across epochs, counted in batches of the new size: samples may be read "
                           "again or left out)." if stream.continuous else
                           f", so {again} samples are read again." if again else said))
            logger.info(f"The checkpoint was written with batch size {then_batch}; this run uses {batch}: it continues "
                        f"at sample {at.offset} of epoch {at.epoch}{said}")
        if RANDOM_STATE in restored.lacking:
            logger.warning(f"{restored.path} holds no state of the random layers (Dropout, noise, augmentation; it was "
                           "written before checkpoints kept it): they draw from the start of their sequences again, so "
                           "the losses from here on differ from an uninterrupted run's.")
        for key, rate in learning_rates(self.updates).items():
            if key in given and not np.isclose(rate, given[key]):
                logger.warning(f"The optimizer {key} trains on at the checkpoint's learning rate {rate:g}, restored "
                               f"with its state; it was given {given[key]:g} (a resumed run continues the run it "
                               "resumes: for another rate, start a new run from its weights, or give a schedule).")
        then = (restored.stored or {}).get("plan")
        if then and then != self.plan_headline:
            logger.info(f"The checkpoint was written under another plan ({then}); this run: {self.plan_headline}.")

    @contextlib.contextmanager
    def fitting(self, resume: bool, models: TrainedModels, source: Any = None) -> Iterator[At]:
        """A ``fit`` from where the run stands (yielded), holding the folder's lock (`runs.holding`): a new run refuses
        another's checkpoints, ``resume`` restores (`restore`; ``source``: the input, its sample count recorded); the
        folder is made ready for saves; a final save. From its start (the set-up too), a first Ctrl-C or SIGTERM asks
        the fit to stop at the next call boundary (`stop_agreed`); then every worker saves there and `interrupted`
        raises."""
        store, self.stopped = self.store, None
        with holding(store.directory if store and self.is_chief else None), StopSignals() as self.signals:
            if store is not None:
                if not resume:
                    store.ensure_fresh()
                elif self.restore(models, source) is None and self.is_chief:
                    logger.warning(f"Nothing to resume in {store.directory}: starting from the beginning (where a "
                                   "run was expected, check checkpoint_dir for a typo).")
                store.annotate("samples", getattr(source, "samples", None))  # (arrays: a resume compares)
                store.ready_to_save()
            yield self.position.now()
            if self.stopped is not None:  # every worker stopped at this call boundary: save together, say where
                self.interrupted(self.stopped)
            # a final save unless the last was of this very position (a save at this step before the epoch ended
            # there is not: the epoch's end recorded, the position moved on, a resume does not end it a second time)
            if store and self.saved_at != self.position.now():
                self.save()

    def stop_requested(self) -> bool:
        """Whether a Ctrl-C or SIGTERM asked this worker to stop (inside `fitting`)."""
        return self.signals.signum is not None

    def stop_agreed(self) -> bool:
        """At a call boundary: whether every worker stops here (`distribute.StopAgreement`)."""
        self.stopped = self.agree.at(self.signals.signum, self.together(self.position.step))
        return self.stopped is not None

    def interrupted(self, signum: int) -> None:
        """Every worker stopped at this step: save unless saved, and raise `TrainingInterrupted` saying where."""
        step, store, path = self.position.step, self.store, None
        if store:
            path = self.save() if store.last_saved_step != step else store.latest
            with self.together(step):
                self.agree.saved(step)
            if self.agree.by is not None:  # the chief's checkpoint (a non-chief's save returns None)
                path = store.latest
        message = interrupted_message(signum, step, path, checkpointing=store is not None, by=self.agree.by)
        if self.is_chief:
            logger.warning(message)
        raise TrainingInterrupted(signum, step, path, message)


def _say_what_objects_leave_out(objects: Mapping[str, Any], updates: Sequence[Update]) -> None:
    """An `AmpWarning` for each update's optimizer or weights that ``checkpoint_objects`` cannot reach: a resume
    would restart them (an optimizer's moments and step count) without a word."""
    root = tf.train.Checkpoint(**objects)  # (the view holds it weakly)
    held = {id(t) for t in tf.train.TrackableView(root).descendants()}
    for u in updates:
        for i, (variables, optimizer) in enumerate(u.groups):
            left = ([f"the optimizer ({type(optimizer).__name__})"] if id(optimizer) not in held else []) + (
                ["weights it trains"] if any(id(v) not in held for v in variables) else [])
            if left:
                group = f" (group {i})" if len(u.groups) > 1 else ""
                warn(f"checkpoint_objects leaves out {' and '.join(left)} of the update {u.name!r}{group}: its "
                     "checkpoints would not hold them, and a resume would start them anew (an optimizer's moments "
                     "and step count). Fix: add them to checkpoint_objects, e.g. {'model': model, 'optimizer': "
                     "optimizer}, or leave checkpoint_objects out: by default checkpoints hold every update's weights "
                     "and optimizer.")


# ------------------------------------------------------------------------------------ the random layers' state
class RandomState(tf.Module):
    """The random generators' state as one checkpoint object: the layers' (``variables``) and Keras's global one."""

    def __init__(self, states: Sequence[tf.Variable], shared: Sequence[tf.Variable] = ()) -> None:
        super().__init__(name=RANDOM_STATE)
        self.states = list(states)
        self.shared = list(shared)

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        """The layers' generator states (Keras 3's variables are no ``tf.Variable`` for ``tf.Module``'s walk)."""
        return tuple(self.states)


def saved_random_state(models: Sequence[Any], say: bool) -> RandomState:
    """The state of every random generator ``models`` draw from, for the trainer's checkpoints; ``say``: warn of the
    layers whose draws no checkpoint holds (a resume cannot repeat them)."""
    states: dict[int, tf.Variable] = {}
    unsaved: dict[str, None] = {}  # (in order, once each)
    for model in models:
        weights = {id(w) for w in model.weights}
        # Keras 3: the SeedGenerators' states (Keras 2: the same list as weights)
        states.update((id(v), v) for v in model.variables if id(v) not in weights)
        for layer in [model, *(m for m in getattr(model, "submodules", ()) if hasattr(m, "_random_generator"))]:
            generator = getattr(layer, "_random_generator", None)  # Keras 2
            if generator is None or not hasattr(generator, "_rng_type"):
                continue
            if isinstance(getattr(generator, "_generator", None), tf.random.Generator):
                states.setdefault(id(generator._generator.state), generator._generator.state)
            elif generator._rng_type == "legacy_stateful":
                unsaved[layer.name] = None
    shared = []
    if keras_info(tf).generation == 3:  # Keras's global SeedGenerator, made now if no draw made it yet
        from keras.src.random.seed_generator import global_seed_generator  # (Keras has no public name for it)

        shared = [global_seed_generator().state]
    if unsaved and say:
        logger.warning(
            f"The random layers {', '.join(unsaved)} draw from TensorFlow's stateful random ops, whose state no "
            "checkpoint can hold: after a resume they draw other values than an uninterrupted run would. Fix: call "
            "amp_backends.seed_everything(seed) (or tf.keras.backend.experimental.enable_tf_random_generator()) "
            "before building the model.")
    return RandomState(list(states.values()), shared)


class _Variables(tf.Module):
    """Variables a checkpoint holds as one object (the training metrics' state)."""

    def __init__(self, variables: Sequence[tf.Variable]) -> None:
        super().__init__(name="metrics")
        self.state = list(variables)
