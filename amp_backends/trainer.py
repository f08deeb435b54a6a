"""One trainer for every vendor: compiled steps, loss scaling, logging, TensorBoard, profiling, checkpoints.

The model code stays the same everywhere; the :class:`~amp_backends.plan.Plan` decides the dtype policy
(set before the models are built), whether the step is XLA-compiled and how losses are scaled.

A training step is a sequence of :class:`Update`\\ s. Each computes one loss with its own forward pass and
updates one or more variable groups, each with its own optimizer, from that loss — a classifier has one
update; the GAN has two (generator, then discriminator); an embedding model may update its embedding
and dense variables from one loss with two optimizers. Each update has its own :class:`LossScaler`;
a step whose gradients are not finite is skipped for every group of that update.

Data are kept on the device as whole arrays and each compiled call runs ``steps_per_call`` steps,
gathering its batches from a per-epoch permutation: no host round trip between steps, and the epoch's
order is reproducible from ``(seed, epoch)``, so a resumed run continues at the right batch.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .loss_scaling import LossScaler
from .options import LossScale
from .plan import Plan

logger = logging.getLogger("amp_backends.train")


# With XLA, up to this many steps per call are unrolled into one graph: on this CPU a step inside an
# XLA-compiled while loop ran 10x slower than the same step unrolled (0.27 s vs 2.7 s, MNIST CNN, batch 64).
UNROLL_LIMIT = 16


class NonFiniteError(RuntimeError):
    """Training cannot continue: too many non-finite steps under a fixed loss scale, or non-finite weights."""


class DistributedFailure(RuntimeError):
    """A collective failed or timed out: another worker died, hung or cannot be reached."""


@dataclass
class Update:
    """One optimisation inside a training step.

    ``loss_fn(batch)`` runs the forward pass (with ``training=True``) and returns a scalar loss; ``groups``
    are ``(variables, optimizer)`` pairs updated from that one loss.
    """

    name: str
    loss_fn: Callable[[Any], Any]
    groups: Sequence[tuple[Sequence[Any], Any]]


@dataclass
class TrainResult:
    steps: int
    epochs_completed: int
    median_throughput: float | None
    throughputs: list[float]
    last_losses: dict[str, float]
    skipped: dict[str, int]
    loss_scales: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)

    def summary(self) -> str:
        tp = f"{self.median_throughput:.4g} img/s" if self.median_throughput else "n/a (too few steps after warm-up)"
        return (f"Summary: {self.steps} steps, median throughput {tp}, skipped steps "
                f"{self.skipped}, loss scales {self.loss_scales}, last losses "
                + ", ".join(f"{k}: {v:.5g}" for k, v in self.last_losses.items()))


def parse_profile_steps(text: str | None) -> tuple[int, int] | None:
    """``"20:30"`` -> (20, 30): steps 20..29 are traced. ``None``/``""`` -> no profiling."""
    if not text:
        return None
    try:
        a, b = (int(p) for p in text.split(":"))
    except ValueError:
        raise ValueError(f"--profile-steps must be START:STOP, such as 20:30. Received: {text!r}.") from None
    if not 0 <= a < b:
        raise ValueError(f"--profile-steps must be START:STOP with 0 <= START < STOP, such as 20:30. Received: {text!r}.")
    return a, b


def _tf() -> Any:
    import tensorflow as tf

    return tf


class Trainer:
    """Train ``updates`` on in-memory arrays under a plan.

    ``checkpoint_objects`` names what to save besides the loss-scale state and the position (models and
    optimizers). ``images_per_step`` defaults to the batch size (the GAN counts ``2 * batch``).
    """

    WARMUP_CALLS = 2  # calls excluded from the throughput summary (tracing, XLA compilation)

    def __init__(
        self,
        updates: Sequence[Update],
        plan: Plan,
        *,
        batch_size: int,
        checkpoint_objects: Mapping[str, Any],
        images_per_step: int | None = None,
        steps_per_call: int = 1,
        log_every: int = 1,
        logdir: str | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_every: int | None = None,
        keep_checkpoints: int = 3,
        profile_steps: tuple[int, int] | None = None,
        max_consecutive_nonfinite: int = 25,
        progress: bool | None = None,
        seed: int = 0,
        batch_fn: Callable[[Any, Any, Any], Any] | None = None,
        strategy: Any = None,
        unroll_steps: bool | None = None,
    ) -> None:
        tf = _tf()
        from .distribute import is_chief, worker_id

        self.strategy = strategy or tf.distribute.get_strategy()
        self.replicas = int(self.strategy.num_replicas_in_sync)
        if isinstance(batch_size, int) and batch_size % self.replicas:
            raise ValueError(
                f"batch_size is the global batch and must be divisible by the {self.replicas} replicas in sync. "
                f"Received: batch_size={batch_size}. Fix: use a multiple of {self.replicas}."
            )
        self.is_chief = is_chief(self.strategy)
        self.worker = worker_id(self.strategy)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, such as 1024. Received: {batch_size!r}.")
        if steps_per_call < 1 or log_every < 1:
            raise ValueError(f"steps_per_call and log_every must be >= 1. Received: {steps_per_call}, {log_every}.")
        if checkpoint_every is not None and checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1 or None. Received: {checkpoint_every!r}.")
        self.updates = list(updates)
        self.plan = plan
        self.batch_size = batch_size
        self.images_per_step = images_per_step or batch_size
        self.steps_per_call = steps_per_call
        self.unroll_steps = unroll_steps
        self.log_every = log_every
        self.logdir = logdir
        self.checkpoint_every = checkpoint_every
        self.profile_steps = profile_steps
        self.max_consecutive_nonfinite = max_consecutive_nonfinite
        self.progress = (sys.stdout.isatty() if progress is None else progress) and self.is_chief
        self.seed = seed
        self.batch_fn = batch_fn or (lambda x, y, idx: (tf.gather(x, idx), None if y is None else tf.gather(y, idx)))

        with self.strategy.scope():
            self.scalers = {u.name: LossScaler(plan.loss_scale, name=u.name) for u in self.updates}
            for u in self.updates:  # build optimizers now: their state must exist before restore and outside tf.cond
                for variables, opt in u.groups:
                    if hasattr(opt, "build"):
                        opt.build(list(variables))
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
            self.step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="step_in_epoch")
        scaler_state = {name: tf.train.Checkpoint(**s.variables()) for name, s in self.scalers.items()}
        self.checkpoint = tf.train.Checkpoint(
            **dict(checkpoint_objects),
            loss_scale=tf.train.Checkpoint(**scaler_state),
            position=tf.train.Checkpoint(global_step=self.global_step, epoch=self.epoch, step_in_epoch=self.step_in_epoch),
        )
        # Under MultiWorkerMirroredStrategy every worker saves (saving is collective); only the chief's
        # files are kept, the others write to a scratch folder removed after each save.
        self.checkpoint_dir = checkpoint_dir
        write_dir = checkpoint_dir if self.is_chief or not checkpoint_dir else os.path.join(
            checkpoint_dir, f".worker-{self.worker}")
        self.manager = (
            tf.train.CheckpointManager(self.checkpoint, write_dir, max_to_keep=keep_checkpoints,
                                       step_counter=self.global_step)
            if checkpoint_dir else None
        )
        self._weights = [v for u in self.updates for vs, _ in u.groups for v in vs]
        self._writer = None
        if logdir and self.is_chief:
            import importlib.util

            if importlib.util.find_spec("tensorboard") is None:
                logger.warning("TensorBoard is not installed: no scalars are written to %s (pip install tensorboard)", logdir)
            else:
                self._writer = tf.summary.create_file_writer(os.path.join(logdir, "train"))
        self._compiled: dict[int, Any] = {}
        # Per update, the replica function computing gradients. With several replicas the outer step cannot
        # be XLA-compiled (it holds the all-reduces), so the replica's forward and backward pass is instead.
        self._grads_fns = {}
        for u in self.updates:
            fn = (lambda x, y, idx, u=u: self._replica_grads(u, x, y, idx))
            self._grads_fns[u.name] = tf.function(fn, jit_compile=True) if plan.xla and self.replicas > 1 else fn
        self._perm: tuple[int, Any] | None = None

    # ------------------------------------------------------------------ compiled step
    def _replica_grads(self, u: Update, x: Any, y: Any, idx: Any) -> Any:
        """In each replica: its slice of the global batch, the scaled loss, unscaled gradients, a non-finite flag."""
        tf = _tf()
        ctx = tf.distribute.get_replica_context()
        n = ctx.num_replicas_in_sync
        if n > 1:
            local = self.batch_size // n
            start = tf.cast(ctx.replica_id_in_sync_group, tf.int64) * local
            idx = tf.gather(idx, start + tf.range(local, dtype=tf.int64))
        batch = self.batch_fn(x, y, idx)
        scaler = self.scalers[u.name]
        variables = [v for vs, _ in u.groups for v in vs]
        with tf.GradientTape() as tape:
            loss = u.loss_fn(batch)
            # each replica's mean loss / n: the optimizer sums gradients over replicas, giving the global mean
            scaled = scaler.scale(loss / n if n > 1 else loss)
        grads = scaler.unscale(tape.gradient(scaled, variables))
        nonfinite = tf.cast(tf.logical_not(scaler.all_finite(grads)), tf.int32)
        return tf.cast(loss, tf.float32), grads, nonfinite

    def _apply(self, u: Update, grads: Sequence[Any]) -> None:
        offset = 0
        for vs, opt in u.groups:
            n = len(vs)
            opt.apply_gradients([(g, v) for g, v in zip(grads[offset:offset + n], vs) if g is not None])
            offset += n

    def _one_step(self, x: Any, y: Any, idx: Any) -> Any:
        """One training step, in cross-replica context.

        Gradients are computed in every replica; whether *any* replica's are non-finite is reduced across
        all replicas (and workers) before deciding, so every replica applies or skips the step together
        and every loss scale changes identically. The apply runs inside ``tf.cond`` here, outside the
        replica function, because optimizers synchronise (all-reduce) inside ``apply_gradients``.
        """
        tf = _tf()
        losses = []
        for u in self.updates:
            loss, grads, nonfinite = self.strategy.run(self._grads_fns[u.name], args=(x, y, idx))
            finite = tf.equal(self.strategy.reduce(tf.distribute.ReduceOp.SUM, nonfinite, axis=None), 0)

            def apply(u=u, grads=grads):
                self.strategy.run(self._apply, args=(u, grads))
                return tf.constant(True)

            tf.cond(finite, apply, lambda: tf.constant(False))
            self.scalers[u.name].update(finite)
            losses.append(self.strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None))
        return tf.stack(losses)

    def _call_fn(self, k: int) -> Any:
        if k not in self._compiled:
            tf = _tf()
            B = self.batch_size

            unroll = self.unroll_steps if self.unroll_steps is not None else (self.plan.xla and k <= UNROLL_LIMIT)

            def positions(perm, first, i):
                # a gather of B positions: static shape, and no slice bounds that XLA would treat as
                # compile-time constants (recompiling for every call's starting step)
                start = (first + tf.cast(i, tf.int64)) * B
                return tf.gather(perm, start + tf.range(B, dtype=tf.int64))

            def run(x, y, perm, first):
                if unroll:  # k copies of the step in one graph: longer compilation, no loop overhead
                    out = tf.stack([self._one_step(x, y, positions(perm, first, i)) for i in range(k)])
                else:
                    ta = tf.TensorArray(tf.float32, size=k)
                    for i in tf.range(k):
                        ta = ta.write(i, self._one_step(x, y, positions(perm, first, i)))
                    out = ta.stack()
                self.global_step.assign_add(k)
                self.step_in_epoch.assign_add(k)
                return out

            self._compiled[k] = tf.function(run, jit_compile=self.plan.xla and self.replicas == 1)
        return self._compiled[k]

    # ------------------------------------------------------------------ checkpoints
    def restore(self) -> int | None:
        """Restore the latest checkpoint, if any. Returns its global step."""
        tf = _tf()
        latest = tf.train.latest_checkpoint(self.checkpoint_dir) if self.checkpoint_dir else None
        if not latest:
            return None
        self.checkpoint.restore(latest).assert_existing_objects_matched()
        step = int(self.global_step.numpy())
        optimizers = {f"{u.name}[{i}]": int(opt.iterations.numpy()) for u in self.updates
                      for i, (_, opt) in enumerate(u.groups) if hasattr(opt, "iterations")}
        if self.is_chief:
            logger.info(f"Resumed from {latest}: global step {step}, epoch {int(self.epoch.numpy())}, "
                        f"step in epoch {int(self.step_in_epoch.numpy())}, loss scales "
                        + ", ".join(f"{n}={s.current:g}" for n, s in self.scalers.items())
                        + ", optimizer iterations " + ", ".join(f"{k}={v}" for k, v in optimizers.items()))
        return step

    def weights_finite(self) -> bool:
        tf = _tf()
        return bool(tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in self._weights]).numpy())

    def save(self) -> str | None:
        """Write a checkpoint (atomically: TensorFlow writes the data, then swaps the 'checkpoint' index).

        Non-finite weights are never written: that raises :class:`NonFiniteError` and the previous
        checkpoint stays the latest.
        """
        if not self.manager:
            return None
        if not self.weights_finite():
            raise NonFiniteError(
                f"Not saving step {int(self.global_step.numpy())}: the weights contain NaN or Inf. The latest good "
                f"checkpoint is {self.manager.latest_checkpoint}. Lower the learning rate or use dynamic loss scaling."
            )
        path = self.manager.save(checkpoint_number=int(self.global_step.numpy()))
        if not self.is_chief:
            import shutil

            shutil.rmtree(self.manager.directory, ignore_errors=True)
            return None
        return path

    # ------------------------------------------------------------------ the loop
    def fit(self, x: Any, y: Any = None, *, epochs: int, max_steps: int | None = None, resume: bool = False) -> TrainResult:
        tf = _tf()
        n = int(x.shape[0])
        steps_per_epoch = n // self.batch_size
        if steps_per_epoch < 1:
            raise ValueError(f"The data has {n} samples, fewer than one batch of {self.batch_size}: lower --batch_size.")
        if resume:
            self.restore()
        with tf.device(self.plan.device):
            x = tf.convert_to_tensor(x)
            y = None if y is None else tf.convert_to_tensor(y)
        total = epochs * steps_per_epoch if max_steps is None else min(max_steps, epochs * steps_per_epoch)
        throughputs: list[float] = []
        history: list[dict[str, float]] = []
        last: dict[str, float] = {}
        calls = 0
        progress = self._progress(total)
        profiling = False
        try:
            while int(self.global_step.numpy()) < total:
                epoch = int(self.epoch.numpy())
                first = int(self.step_in_epoch.numpy())
                if first >= steps_per_epoch:
                    self.epoch.assign_add(1)
                    self.step_in_epoch.assign(0)
                    continue
                if self._perm is None or self._perm[0] != epoch:  # each epoch's order, from (seed, epoch)
                    perm = np.random.RandomState((self.seed * 100003 + epoch) % 2**32).permutation(n)
                    with tf.device(self.plan.device):
                        self._perm = (epoch, tf.constant(perm, dtype=tf.int64))
                perm_t = self._perm[1]
                step = int(self.global_step.numpy())
                k = min(self.steps_per_call, steps_per_epoch - first, total - step)
                if self.checkpoint_every:
                    k = min(k, self.checkpoint_every - step % self.checkpoint_every)
                if self.profile_steps:
                    a, b = self.profile_steps
                    for edge in (a, b):
                        if step < edge:
                            k = min(k, edge - step)
                if k < self.steps_per_call:
                    # a shorter call (epoch end, checkpoint or profile edge) runs single steps: one more
                    # compiled variant at most, instead of one per remainder length
                    k = 1
                if self.profile_steps:
                    if step == self.profile_steps[0] and not profiling and self.logdir:
                        tf.profiler.experimental.start(self.logdir)
                        profiling = True
                compiling = k not in self._compiled
                t0 = time.perf_counter()
                try:
                    losses = self._call_fn(k)(x, y, perm_t, tf.constant(first, tf.int64)).numpy()
                except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.CancelledError,
                        tf.errors.AbortedError, tf.errors.InternalError) as exc:
                    if getattr(self.strategy, "cluster_resolver", None) is None:
                        raise
                    latest = tf.train.latest_checkpoint(self.checkpoint_dir) if self.checkpoint_dir else None
                    raise DistributedFailure(
                        f"Worker {self.worker}: a collective with the other workers failed at step {step} "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0][:300]}). Another worker died, hung past the "
                        f"cluster timeout or cannot be reached. Restart every worker with --resume to continue from "
                        f"{latest or 'the start (no checkpoint yet)'}."
                    ) from None
                dt = time.perf_counter() - t0
                calls += 1
                step += k
                if profiling and step >= self.profile_steps[1]:
                    tf.profiler.experimental.stop()
                    profiling = False
                    logger.info(f"Profiler trace of steps {self.profile_steps[0]}:{self.profile_steps[1]} written to {self.logdir}")
                step_time = dt / k
                throughput = self.images_per_step / step_time
                if calls > self.WARMUP_CALLS and not compiling:
                    throughputs.append(throughput)
                last = {u.name: float(losses[-1][i]) for i, u in enumerate(self.updates)}
                self._log(epoch, first, k, losses, step_time, throughput, step)
                history.append({"step": step, "throughput": throughput, **last})
                if progress:
                    progress[0].update(progress[1], completed=step)
                self._check_nonfinite()
                if self.checkpoint_every and step % self.checkpoint_every == 0:
                    self.save()
        finally:
            if profiling:
                tf.profiler.experimental.stop()
            if progress:
                progress[0].stop()
        if self.manager and (not self.manager.latest_checkpoint or
                             not self.manager.latest_checkpoint.endswith(f"-{int(self.global_step.numpy())}")):
            self.save()
        result = TrainResult(
            steps=int(self.global_step.numpy()),
            epochs_completed=int(self.global_step.numpy()) // steps_per_epoch,
            median_throughput=statistics.median(throughputs) if throughputs else None,
            throughputs=throughputs,
            last_losses=last,
            skipped={name: int(s.skipped.numpy()) for name, s in self.scalers.items()},
            loss_scales={name: s.current for name, s in self.scalers.items()},
            history=history,
        )
        if self.is_chief:
            logger.info(result.summary())
        if self._writer:
            self._writer.flush()
        return result

    def _check_nonfinite(self) -> None:
        for name, s in self.scalers.items():
            run = int(s.consecutive.numpy())
            if s.config.mode == "fixed" and run >= self.max_consecutive_nonfinite:
                saved = None
                if self.manager and self.weights_finite():
                    saved = self.save()
                raise NonFiniteError(
                    f"{run} consecutive steps of '{name}' had non-finite gradients under the fixed loss scale "
                    f"{s.current:g}: every one was skipped. Lower the scale (for example --loss-scale fixed:"
                    f"{max(s.current / 64, 1):g}) or use dynamic loss scaling (--loss-scale dynamic)."
                    + (f" The state was saved to {saved}; continue with --resume." if saved else "")
                )

    def _log(self, epoch: int, first: int, k: int, losses: Any, step_time: float, throughput: float, step: int) -> None:
        if not self.is_chief:
            return
        names = [u.name for u in self.updates]
        for i in range(k):
            s = first + i
            gstep = step - k + i + 1
            if gstep % self.log_every:
                continue
            if len(names) == 1:
                loss_text = f"Loss: {losses[i][0]:.5f}"
            else:
                loss_text = ", ".join(f"{_short(n)} Loss: {losses[i][j]:.3f}" for j, n in enumerate(names))
            logger.info(f"({epoch}, {s}), {loss_text}, step_time: {step_time:.5f}, throughput: {throughput:.3e} img/s.")
        if self._writer:
            with self._writer.as_default():
                tf = _tf()
                for j, n in enumerate(names):
                    tf.summary.scalar(f"loss/{n}", float(losses[-1][j]), step=step)
                    tf.summary.scalar(f"loss_scale/{n}", self.scalers[n].current, step=step)
                    tf.summary.scalar(f"skipped_steps/{n}", int(self.scalers[n].skipped.numpy()), step=step)
                tf.summary.scalar("throughput_img_per_s", throughput, step=step)

    def _progress(self, total: int) -> Any:
        if not self.progress:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        p = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                     transient=True)
        task = p.add_task("training", total=total, completed=int(self.global_step.numpy()))
        p.start()
        return p, task


def _short(name: str) -> str:
    return {"generator": "G", "discriminator": "D"}.get(name, name)


# ---------------------------------------------------------------------- ready-made tasks
def classifier_updates(model: Any, optimizer: Any, loss: Any | None = None) -> list[Update]:
    """One update: the mean of ``loss(y, model(x, training=True))`` (sparse categorical cross-entropy by default).

    ``loss`` must return per-example values (``reduction="none"``): Keras 2 refuses reducing losses under
    tf.distribute, and the trainer averages them itself.
    """
    tf = _tf()
    loss = loss or tf.keras.losses.SparseCategoricalCrossentropy(reduction="none")

    def loss_fn(batch):
        xb, yb = batch
        return tf.reduce_mean(loss(yb, model(xb, training=True)))

    return [Update("model", loss_fn, [(model.trainable_variables, optimizer)])]


def gan_updates(generator: Any, discriminator: Any, g_opt: Any, d_opt: Any, batch_size: int) -> list[Update]:
    """Generator update, then discriminator update, each with its own forward pass (as in the original)."""
    tf = _tf()
    from .models import NOISE_DIM, gan_labels, sigmoid_loss

    def forward(real):
        noise = tf.random.uniform([batch_size, NOISE_DIM], -1.0, 1.0)
        fake = generator(noise, training=True)
        on_real = discriminator(real, training=True)
        on_fake = discriminator(fake, training=True)
        real_labels, fake_labels = gan_labels(batch_size)
        d_loss = 0.5 * (sigmoid_loss(on_fake, fake_labels) + sigmoid_loss(on_real, real_labels))
        g_loss = sigmoid_loss(on_fake, real_labels)
        return g_loss, d_loss

    return [
        Update("generator", lambda b: forward(b[0])[0], [(generator.trainable_variables, g_opt)]),
        Update("discriminator", lambda b: forward(b[0])[1], [(discriminator.trainable_variables, d_opt)]),
    ]


def mnist_batch_fn(x: Any, y: Any, idx: Any) -> Any:
    """Gather a batch of uint8 MNIST images on the device and scale to [0, 1] (as the tutorials: /255)."""
    tf = _tf()
    xb = tf.cast(tf.gather(x, idx), tf.float32) / 255.0
    xb = tf.reshape(xb, [-1, 28, 28, 1])
    return xb, (None if y is None else tf.gather(y, idx))


class ThroughputLogger:
    """A Keras ``fit`` callback that logs the tutorials' line: ``(epoch, step), Loss: …, step_time: …, throughput: … img/s.``"""

    def __new__(cls, batch_size: int, log_every: int = 1, images_per_step: int | None = None):
        tf = _tf()

        class _Callback(tf.keras.callbacks.Callback):
            def __init__(self) -> None:
                super().__init__()
                self.images = images_per_step or batch_size
                self.throughputs: list[float] = []
                self._epoch = 0
                self._t0 = 0.0

            def on_epoch_begin(self, epoch, logs=None):
                self._epoch = epoch

            def on_train_batch_begin(self, batch, logs=None):
                self._t0 = time.perf_counter()

            def on_train_batch_end(self, batch, logs=None):
                dt = time.perf_counter() - self._t0
                tp = self.images / dt if dt > 0 else math.inf
                self.throughputs.append(tp)
                if batch % log_every == 0:
                    loss = (logs or {}).get("loss", float("nan"))
                    logger.info(f"({self._epoch}, {batch}), Loss: {float(loss):.5f}, step_time: {dt:.5f}, "
                                f"throughput: {tp:.3e} img/s.")

            def on_train_end(self, logs=None):
                if len(self.throughputs) > Trainer.WARMUP_CALLS:
                    logger.info(f"Summary: median throughput {statistics.median(self.throughputs[Trainer.WARMUP_CALLS:]):.4g} img/s")

        return _Callback()
