"""The variants ``cpu_step_profile.py`` measures: the tutorials' MNIST CNN step as the trainer runs it, the
same step written by hand (whole, gradients only, forward only), the model with other Dropouts or a float32
first convolution, and the matmul peak every share of peak is taken against.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

BATCH = 256


def _setup() -> Any:
    sys.path.insert(0, os.getcwd())
    import tensorflow as tf

    inter = os.environ.get("CPU_STEP_PROFILE_INTER")
    if inter:
        tf.config.threading.set_inter_op_parallelism_threads(int(inter))
    return tf


def _data(spc: int, calls: int) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    n = BATCH * spc * calls
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, (n,)).astype(np.int64)


def byte_dropout_class(tf: Any) -> Any:
    """A prototype Dropout drawing one random byte per element (four per 32-bit Philox output) instead of one
    float: the same keep probability when ``rate * 256`` is whole (0.25 and 0.5 are), a quarter of the draws."""

    class ByteDropout(tf.keras.layers.Dropout):
        def call(self, inputs, training=False):  # type: ignore[override]
            if not training or self.rate <= 0:
                return inputs
            seed = tf.cast(tf.math.floormod(self.seed_generator.next(), 2**31 - 2), tf.int32)
            n = tf.size(inputs)
            words = tf.random.stateless_uniform([(n + 3) // 4], seed=seed, minval=None, maxval=None, dtype=tf.uint32)
            byte = tf.reshape(tf.bitcast(words, tf.uint8), [-1])[:n]
            keep = tf.reshape(byte >= tf.constant(round(self.rate * 256), tf.uint8), tf.shape(inputs))
            scaled = inputs * tf.cast(1.0 / (1.0 - self.rate), inputs.dtype)
            return tf.where(keep, scaled, tf.zeros_like(inputs))

    return ByteDropout


def _model(tf: Any, dropout: str = "keras", conv1_dtype: str | None = None) -> Any:
    """The tutorials' CNN; ``dropout`` "none" drops the Dropout layers (a diagnostic), "byte" uses the prototype."""
    from amp_backends.models import mnist_cnn

    m = mnist_cnn()
    if dropout == "keras" and conv1_dtype is None:
        return m
    L = tf.keras.layers
    layers: list[Any] = []
    for layer in m.layers:
        if isinstance(layer, L.Dropout):
            if dropout == "byte":
                layers.append(byte_dropout_class(tf)(layer.rate))
            elif dropout == "keras":
                layers.append(L.Dropout(layer.rate))
        elif isinstance(layer, L.Conv2D) and layer.filters == 32 and conv1_dtype:
            layers.append(L.Conv2D(32, 3, activation="relu", dtype=conv1_dtype))
        else:
            layers.append(layer.__class__.from_config(layer.get_config()))
    return tf.keras.Sequential([tf.keras.Input((28, 28, 1)), *layers], name=f"mnist_cnn_{dropout}_{conv1_dtype}")


class TrainerRun:
    """The trainer under the plan; ``run()`` trains one call of ``spc`` steps and returns img/s."""

    def __init__(self, tf: Any, plan: Any, spc: int, dropout: str = "keras", group: int = 1,
                 conv1_dtype: str | None = None) -> None:
        from amp_backends.training import Trainer, classifier_updates, mnist_batch_fn

        self.x, self.y = _data(spc * group, 64)
        self.spc, self.group = spc, group
        m = _model(tf, dropout, conv1_dtype)
        opt = tf.keras.optimizers.Adam(1e-3)
        self.trainer = Trainer(classifier_updates(m, opt), plan, batch_size=BATCH, steps_per_call=spc,
                               log_every=10**9, progress=False, batch_fn=mnist_batch_fn, check_models=False)
        self.steps = 0

    def run(self) -> float:
        """One ``fit`` of ``group`` calls (wall clock: the trainer's loop between calls included)."""
        self.steps += self.spc * self.group
        t0 = time.perf_counter()
        self.trainer.fit(self.x, self.y, epochs=10**6, max_steps=self.steps)
        return self.spc * self.group * BATCH / (time.perf_counter() - t0)


class RawRun:
    """A hand-written compiled call of ``spc`` steps: ``mode`` "step" (forward, backward, Adam), "grads"
    (no update), "forward" (loss only). Same batch gather as the trainer; the losses fetched once per call."""

    def __init__(self, tf: Any, spc: int, mode: str) -> None:
        from amp_backends.training import mnist_batch_fn

        x, y = _data(spc, 64)
        self.x, self.y = tf.constant(x), tf.constant(y)
        self.spc, self.mode = spc, mode
        m = _model(tf)
        opt = tf.keras.optimizers.Adam(1e-3)
        opt.build(m.trainable_variables)
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
        n = len(x)

        def one(i: Any) -> Any:
            idx = tf.math.floormod(i * BATCH + tf.range(BATCH, dtype=tf.int64), n)
            xb, yb = mnist_batch_fn(self.x, self.y, idx)
            if mode == "forward":
                return loss_fn(yb, tf.cast(m(xb, training=True), tf.float32))
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, tf.cast(m(xb, training=True), tf.float32))
            grads = tape.gradient(loss, m.trainable_variables)
            if mode == "step":
                opt.apply_gradients(zip(grads, m.trainable_variables, strict=True))
            else:  # every gradient is used (summed into the returned value), so none is pruned
                loss = tf.add_n([tf.reduce_sum(tf.cast(g, tf.float32)) for g in grads])
            return loss

        @tf.function
        def call(start: Any) -> Any:
            ta = tf.TensorArray(tf.float32, size=spc)
            for i in tf.range(spc, dtype=tf.int64):
                ta = ta.write(tf.cast(i, tf.int32), one(start + i))
            return ta.stack()

        self.call = call
        self.start = 0

    def run(self) -> float:
        import tensorflow as tf

        t0 = time.perf_counter()
        self.call(tf.constant(self.start, tf.int64)).numpy()
        self.start += self.spc
        return self.spc * BATCH / (time.perf_counter() - t0)


def matmul_peak(tf: Any, dtype: str, n: int = 2048, reps: int = 10) -> float:
    a = tf.random.uniform((n, n), dtype=tf.float32)
    a = tf.cast(a, dtype)

    @tf.function
    def mm(a: Any) -> Any:
        return tf.reduce_sum(tf.cast(tf.matmul(a, a)[:1, :1], tf.float32))

    mm(a).numpy()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mm(a).numpy()
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9
