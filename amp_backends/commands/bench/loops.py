"""The tutorials' hand-written loops under their manual configurations against the auto plan (the default benchmark).

In one process, on the same data: the loops as written (a ``tf.function`` call per step, the loss fetched every step)
under each configuration of `MANUAL`, Keras ``fit`` and the trainer under the auto plan; one warm-up epoch, then the
median of ``--epochs`` timed ones. Writes ``bench.json`` (schema ``amp_backends/schemas/bench.schema.json``) and
``bench.png``; the method in full is on ``docs/benchmarks.md``.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ...configure import auto_configure, plan_for, reset
from ...keras_compat import dynamic_loss_scale_optimizer, scale_loss, set_global_policy, unscale_gradients
from .output import environment, interrupted, loops_chart, loops_table, run_header, unsafe_policies, write_json
from .supervisor import terminate_as_exit
from ...errors import AmpConfigError

if TYPE_CHECKING:  # numpy is imported by the data helpers when a run starts, not by the command line
    import numpy as np

# (name, policy, tf32, xla, loss scaling): each configuration without, then with XLA
MANUAL = [(name + ("+XLA" if xla else ""), policy, tf32, xla, scaling)
          for name, policy, tf32, scaling in (("fp32", "float32", False, "none"), ("TF32", "float32", True, "none"),
                                              ("fp16 fixed", "mixed_float16", True, "fixed"),
                                              ("fp16 dynamic", "mixed_float16", True, "dynamic"),
                                              ("bf16", "mixed_bfloat16", True, "none"))
          for xla in (False, True)]
FIXED_SCALE = 1024.0


@dataclass
class Result:
    """One configuration's timing, an entry of ``bench.json``'s ``results``.

    Attributes:
        model: The model timed, ``"mnist"`` or ``"gan"``.
        config: The configuration's name (``"fp16 dynamic+XLA"``, ``"Keras fit (mixed_float16)"``,
            ``"auto plan (trainer)"``).
        kind: ``"manual"`` (a tutorial's loop), ``"keras_fit"`` or ``"auto"`` (the trainer under the auto plan).
        img_per_s: The median of the timed epochs' images per second; ``None`` where it failed or was skipped.
        epoch_img_per_s: Each timed epoch's images per second.
        error: Why it failed or was skipped; ``None`` where it ran.
        detail: The auto plan's settings (policy, loss scale, XLA, steps per call); empty for the other kinds.
    """

    model: str
    config: str
    kind: str  # "manual", "keras_fit", "auto"
    img_per_s: float | None
    epoch_img_per_s: list[float] = field(default_factory=list)
    error: str | None = None
    detail: str = ""


def _tf() -> Any:
    import tensorflow as tf

    return tf


# --------------------------------------------------------------------------- the tutorials' loops
# loss scaling as the tutorials did it, with the installed Keras's API where it still exists: mode -> (scale the
# loss, unscale the gradients), each given the optimizer (a dynamic loss-scale optimizer for "dynamic")
SCALING: dict[str, tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any]]] = {
    "none": (lambda opt, loss: loss, lambda opt, grads: grads),
    "fixed": (lambda opt, loss: loss * FIXED_SCALE, lambda opt, grads: [g / FIXED_SCALE for g in grads]),
    "dynamic": (scale_loss, unscale_gradients),
}


def _manual_step(model: str, policy: str, xla: bool, scaling: str, lr: float, batch: int) -> Callable:
    """The tutorial's step as written: for each model it trains, a tape, the scaled loss, the update."""
    tf = _tf()
    from ...models import NOISE_DIM, gan_discriminator, gan_generator, gan_losses, mnist_cnn

    set_global_policy(policy, tf)
    scale, unscale = SCALING[scaling]

    def optimizer(opt: Any) -> Any:
        return dynamic_loss_scale_optimizer(opt) if scaling == "dynamic" else opt

    if model == "mnist":
        m, loss_obj = mnist_cnn(), tf.keras.losses.SparseCategoricalCrossentropy()
        updates = [(m, optimizer(tf.keras.optimizers.Adam(lr)), lambda x, y: loss_obj(y, m(x, training=True)))]
    else:
        g, d = gan_generator(), gan_discriminator()

        def forward(real):
            return gan_losses(g, d, real, tf.random.uniform([batch, NOISE_DIM], -1.0, 1.0))

        updates = [(g, optimizer(tf.keras.optimizers.Adam(1e-3)), lambda x, y: forward(x)[0]),
                   (d, optimizer(tf.keras.optimizers.RMSprop(1e-4)), lambda x, y: forward(x)[1])]

    @tf.function(jit_compile=xla)
    def step(x, y):
        for trained, opt, loss_of in updates:  # the GAN: the generator, then the discriminator (its loss returned)
            with tf.GradientTape() as tape:
                loss = loss_of(x, y)
                scaled = scale(opt, loss)
            grads = unscale(opt, tape.gradient(scaled, trained.trainable_variables))
            opt.apply_gradients(zip(grads, trained.trainable_variables, strict=True))
        return loss

    return step


def _dataset(x: np.ndarray, y: np.ndarray, batch: int) -> Any:
    tf = _tf()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0)
    ds = ds.batch(batch, drop_remainder=True).map(
        lambda a, b: (tf.reshape(tf.cast(a, tf.float32) / 255.0, [-1, 28, 28, 1]), b))
    return ds.prefetch(tf.data.AUTOTUNE)


def _timed(run_epoch: Callable[[], int], epochs: int, model: str, config: str, kind: str, detail: str = "") -> Result:
    """One warm-up epoch, then ``epochs`` timed ones: the median and each epoch's images per second."""
    run_epoch()
    rates = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        images = run_epoch()
        rates.append(images / (time.perf_counter() - t0))
    return Result(model, config, kind, statistics.median(rates), rates, detail=detail)


def bench_manual(model: str, config: tuple, x: np.ndarray, y: np.ndarray, batch: int, epochs: int, lr: float) -> Result:
    """Time a tutorial's hand-written loop under one manual configuration, the loss fetched every step as written.

    Args:
        model: ``"mnist"`` or ``"gan"``.
        config: One entry of `MANUAL`: ``(name, policy, tf32, xla, loss scaling)``.
        x: The training images, uint8 (N, 28, 28).
        y: Their labels (the GAN does not read them).
        batch: Images per step.
        epochs: Timed epochs, after one warm-up epoch.
        lr: The MNIST CNN's Adam learning rate (the GAN's optimizers keep the tutorial's rates).

    Returns:
        The configuration's `Result`.
    """
    tf = _tf()
    name, policy, tf32, xla, scaling = config
    tf.config.experimental.enable_tensor_float_32_execution(tf32)
    step = _manual_step(model, policy, xla, scaling, lr, batch)
    ds = _dataset(x, y, batch)
    per_step = batch if model == "mnist" else 2 * batch

    def epoch() -> int:
        n = 0
        for xb, yb in ds:
            float(step(xb, yb))  # the tutorials logged the loss every step
            n += per_step
        return n

    return _timed(epoch, epochs, model, name, "manual")


def bench_fit(x: np.ndarray, y: np.ndarray, batch: int, epochs: int, lr: float) -> Result:
    """Time Keras ``fit`` of the MNIST CNN under the auto plan (its optimizer wrapped, its ``compile`` arguments).

    Args:
        x: The training images, uint8 (N, 28, 28).
        y: Their labels.
        batch: Images per step.
        epochs: Timed epochs, after one warm-up epoch.
        lr: The Adam learning rate.

    Returns:
        The configuration's `Result`.
    """
    tf = _tf()
    from ...models import mnist_cnn

    plan = auto_configure(verbose=False)
    model = mnist_cnn()
    model.compile(optimizer=plan.wrap_optimizer(tf.keras.optimizers.Adam(lr)), loss="sparse_categorical_crossentropy",
                  **plan.compile_kwargs())
    xf = (x.astype("float32") / 255.0).reshape(-1, 28, 28, 1)
    n = (len(x) // batch) * batch

    def epoch() -> int:
        model.fit(xf[:n], y[:n], batch_size=batch, epochs=1, verbose=0, shuffle=True)
        return n

    return _timed(epoch, epochs, "mnist", f"Keras fit ({plan.policy})", "keras_fit")


def bench_auto(model: str, x: np.ndarray, y: np.ndarray, batch: int, epochs: int, lr: float,
               steps_per_call: int | None, loss_scale: str | None = None, label: str = "auto plan (trainer)") -> Result:
    """Time the trainer under the auto plan.

    Args:
        model: ``"mnist"`` or ``"gan"``.
        x: The training images, uint8 (N, 28, 28).
        y: Their labels (the GAN does not read them).
        batch: Images per step.
        epochs: Timed epochs, after one warm-up epoch.
        lr: The MNIST CNN's Adam learning rate (the GAN's optimizers keep the tutorial's rates).
        steps_per_call: Trainer steps per compiled call; ``None``: one epoch.
        loss_scale: The plan's ``loss_scale`` override (``"none"``: loss scaling off); ``None``: the plan decides.
        label: The configuration's name in the results.

    Returns:
        The configuration's `Result`, with the plan's settings as its ``detail``.
    """
    tf = _tf()
    from ...models import gan_discriminator, gan_generator, mnist_cnn
    from ...training import Trainer, classifier_updates, gan_updates, mnist_batch_fn

    plan = auto_configure(loss_scale=loss_scale, verbose=False)
    steps = len(x) // batch
    spc = steps_per_call or steps
    if model == "mnist":
        m = mnist_cnn()
        opt = tf.keras.optimizers.Adam(lr)
        updates, objs, per_step, yy = classifier_updates(m, opt), {"m": m, "o": opt}, batch, y
    else:
        g, d = gan_generator(), gan_discriminator()
        go, do = tf.keras.optimizers.Adam(1e-3), tf.keras.optimizers.RMSprop(1e-4)
        updates, objs, per_step, yy = gan_updates(g, d, go, do), {"g": g, "d": d}, 2 * batch, None
    trainer = Trainer(updates, plan, batch_size=batch, images_per_step=per_step, checkpoint_objects=objs,
                      steps_per_call=spc, log_every=10**9, progress=False, batch_fn=mnist_batch_fn,
                      check_models=False)  # (a timing: `amp-backends check` is the check)
    fits = itertools.count(1)  # each fit() call one more epoch

    def epoch() -> int:
        trainer.fit(x, yy, epochs=next(fits))
        return steps * per_step

    return _timed(epoch, epochs, model, label, "auto", detail=f"{plan.policy}, loss scale {plan.loss_scale.mode}, "
                  f"XLA {'on' if plan.xla else 'off'}, {spc} steps/call")


# --------------------------------------------------------------------------- the run
def check_batches(models: list[str], samples: int, mnist_batch: int, gan_batch: int) -> None:
    """Refuse, before any work, a model whose batch is larger than ``samples`` (a ``ValueError`` with the fix): the
    command checks it before it makes the results folder and starts TensorFlow."""
    for model, batch, flag in (("mnist", mnist_batch, "--mnist-batch"), ("gan", gan_batch, "--gan-batch")):
        if model in models and samples < batch:
            raise AmpConfigError(
                f"--samples {samples} is smaller than one {model} batch of {batch}. Fix: raise --samples "
                f"to {batch} or more, or lower {flag}.")


def run(models: list[str], configs: list[str] | None, epochs: int, samples: int, mnist_batch: int, gan_batch: int,
        steps_per_call: int | None, out: Path, with_fit: bool = True) -> dict[str, Any]:
    """Run the default benchmark: time every configuration of each model, then write ``bench.json`` and ``bench.png``
    into ``out`` and show the table. A configuration that fails is recorded with its error; one unsafe on this machine
    is skipped.

    Args:
        models: The models to time, ``"mnist"`` and/or ``"gan"``.
        configs: The names of the `MANUAL` configurations to time; ``None``: every one.
        epochs: Timed epochs per configuration, after one warm-up epoch.
        samples: Synthetic MNIST-shaped images per epoch.
        mnist_batch: The MNIST CNN's batch size.
        gan_batch: The GAN's batch size.
        steps_per_call: Trainer steps per compiled call; ``None``: one epoch.
        out: The folder the results are written to.
        with_fit: Whether to time Keras ``fit`` too (the MNIST CNN only).

    Returns:
        The report, as written to ``bench.json``.

    Raises:
        KeyboardInterrupt: Ctrl-C or SIGTERM (`amp_backends.errors.TrainingInterrupted`) stopped the run; what was
            timed before it is written first.
    """
    tf = _tf()
    from ...data import synthetic_mnist

    (x, y), _ = synthetic_mnist(samples, 8)
    chosen = [c for c in MANUAL if configs is None or c[0] in configs]
    unsafe = unsafe_policies(plan_for(environ={}))
    results: list[Result] = []
    stopped: KeyboardInterrupt | None = None
    terminate_as_exit()
    try:
        for model in models:
            batch = mnist_batch if model == "mnist" else gan_batch
            jobs: list[tuple[str, str, Callable[..., Result]]] = []  # label, kind, the timed run
            for c in chosen:
                if c[1] in unsafe:  # e.g. bf16 with ITEX on a CPU without bf16: it would abort the whole process
                    results.append(Result(model, c[0], "manual", None, error=f"skipped, unsafe here: {unsafe[c[1]]}"))
                    continue
                jobs.append((c[0], "manual", functools.partial(bench_manual, model, c, x, y, batch, epochs, 0.01)))
            if with_fit and model == "mnist":
                jobs.append(("Keras fit", "keras_fit", functools.partial(bench_fit, x, y, batch, epochs, 0.01)))
            auto = functools.partial(bench_auto, model, x, y, batch, epochs, 0.01, steps_per_call)
            for label, loss_scale in (("auto plan (trainer)", None), ("auto plan, loss scaling off", "none")):
                jobs.append((label, "auto", functools.partial(auto, loss_scale=loss_scale, label=label)))
            for label, kind, job in jobs:
                saved_tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
                try:
                    r = job()
                except Exception as exc:  # one broken configuration must not lose the others
                    error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                    r = Result(model, label, kind, None, error=error)
                finally:
                    tf.config.experimental.enable_tensor_float_32_execution(saved_tf32)
                    reset()
                    set_global_policy("float32", tf)
                results.append(r)
                outcome = f"{r.img_per_s:12,.0f} img/s" if r.img_per_s else f"failed: {r.error}"
                print(f"  {model:5s} {r.config:32s} {outcome}", file=sys.stderr, flush=True)  # (progress; the table:
                # stdout, a line a configuration when piped)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the configurations timed so far are written, then it goes on
        stopped = exc
    report = {
        **run_header(), "environment": environment(),
        "settings": {"epochs_timed": epochs, "warmup_epochs": 1, "samples": samples, "mnist_batch": mnist_batch,
                     "gan_batch": gan_batch, "steps_per_call": steps_per_call or "one epoch", "data": "synthetic"},
        "results": [asdict(r) for r in results],
        **({"interrupted": interrupted(stopped)} if stopped else {}),
    }
    for model in models:
        best = max(((r.img_per_s or 0) for r in results if r.model == model and r.kind == "manual"), default=0)
        for r in report["results"]:
            if r["model"] == model:
                r["ratio_to_best_manual"] = (r["img_per_s"] / best) if (best and r["img_per_s"]) else None
    write_json(out / "bench.json", report)
    loops_table(report)
    loops_chart(report, out / "bench.png")
    print(f"Written to {out}: bench.json{', bench.png' if (out / 'bench.png').exists() else ''}", flush=True)
    if stopped:
        raise stopped
    return report
