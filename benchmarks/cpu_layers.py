"""Which Keras layers train slower in bfloat16 than in float32 on this CPU, and what keeping them in float32 gives.

A mixed_bfloat16 plan is faster on the whole only where oneDNN has bf16 kernels for the model's ops. Some
layers' gradients have none worth the name on CPUs without AMX: on an AVX512-BF16 CPU, oneDNN (TF 2.21)
runs a bfloat16 depthwise convolution's backward-data pass with its grouped ``brgconv_strided`` kernel and
its backward-weights pass with the old ``jit_bf16`` kernel, where float32 gets the ``jit_dw`` / ``jit``
kernels (``ONEDNN_VERBOSE=1`` shows each). The CPU backend reads this file: a layer kind whose bfloat16
training step is slower than its float32 one in every round is kept in float32 by the plan
(``Plan.float32_layers``, applied by ``amp_backends.prepare_model`` and the trainer).

Two parts, in one process, interleaved (every configuration once per round, the order rotated every round:
:func:`amp_backends.autotune.timing.interleaved`), each configuration's figure the median over rounds with its
min and max:

* ``layers``: one layer alone, at a shape from the zoo's models, forward and backward (input and weight
  gradients) and an SGD update, under float32 and under mixed_bfloat16;
* ``models``: Keras ``applications`` with depthwise convolutions (MobileNetV3Small, EfficientNetB0) trained
  under float32, mixed_bfloat16, and mixed_bfloat16 with the depthwise layers kept in float32;
* ``activations`` (not in the default parts): the activations of those models (sigmoid, swish, hard_swish)
  and relu, as layers, the same way as ``layers``: TensorFlow has no oneDNN kernel for them, Eigen runs them.

Run (writes JSON with the machine, versions, command and date; the CPU backend quotes it)::

    python benchmarks/cpu_layers.py --rounds 5 --steps 6 \\
        --out results/cpu-layers-zen4.json
    python benchmarks/cpu_layers.py --parts activations --rounds 5 --steps 6 \\
        --out results/cpu-activations-zen4.json
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_policy import document, write  # noqa: E402  (the sibling script's results file)

from amp_backends.autotune.timing import Sample, interleaved  # noqa: E402  (the package's one interleaved harness)

DEPTHWISE = ("DepthwiseConv2D", "SeparableConv2D", "DepthwiseConv1D", "SeparableConv1D")


@dataclass(frozen=True)
class LayerCase:
    name: str  # "<Keras class> <shape detail>"
    layer: str  # the Keras class
    batch: int
    shape: tuple[int, ...]  # one sample's input shape
    build: Callable[[Any], Any]  # keras -> layer
    ids: int = 0  # >0: integer inputs below this (an Embedding)


CASES = (
    LayerCase("Conv2D 3x3 at 28x28x64", "Conv2D", 64, (28, 28, 64), lambda k: k.layers.Conv2D(64, 3, padding="same")),
    LayerCase("Conv2D 1x1 at 24x24x96", "Conv2D", 64, (24, 24, 96), lambda k: k.layers.Conv2D(96, 1)),
    LayerCase("DepthwiseConv2D 3x3 at 24x24x96", "DepthwiseConv2D", 64, (24, 24, 96),
              lambda k: k.layers.DepthwiseConv2D(3, padding="same")),
    LayerCase("DepthwiseConv2D 3x3 stride 2 at 24x24x96", "DepthwiseConv2D", 64, (24, 24, 96),
              lambda k: k.layers.DepthwiseConv2D(3, strides=2, padding="same")),
    LayerCase("DepthwiseConv2D 5x5 at 12x12x288", "DepthwiseConv2D", 64, (12, 12, 288),
              lambda k: k.layers.DepthwiseConv2D(5, padding="same")),
    LayerCase("DepthwiseConv2D 5x5 stride 2 at 12x12x288", "DepthwiseConv2D", 64, (12, 12, 288),
              lambda k: k.layers.DepthwiseConv2D(5, strides=2, padding="same")),
    LayerCase("SeparableConv2D 3x3 at 24x24x96", "SeparableConv2D", 64, (24, 24, 96),
              lambda k: k.layers.SeparableConv2D(96, 3, padding="same")),
    LayerCase("SeparableConv2D 3x3 stride 2 at 24x24x96", "SeparableConv2D", 64, (24, 24, 96),
              lambda k: k.layers.SeparableConv2D(96, 3, strides=2, padding="same")),
    LayerCase("DepthwiseConv1D 3 at 128x128", "DepthwiseConv1D", 64, (128, 128),
              lambda k: k.layers.DepthwiseConv1D(3, padding="same")),
    LayerCase("DepthwiseConv1D 5 stride 2 at 128x128", "DepthwiseConv1D", 64, (128, 128),
              lambda k: k.layers.DepthwiseConv1D(5, strides=2, padding="same")),
    LayerCase("Conv1D 5 at 128x128", "Conv1D", 64, (128, 128), lambda k: k.layers.Conv1D(128, 5, padding="same")),
    LayerCase("Conv2DTranspose 3x3 stride 2 at 14x14x64", "Conv2DTranspose", 64, (14, 14, 64),
              lambda k: k.layers.Conv2DTranspose(32, 3, strides=2, padding="same")),
    LayerCase("Conv3D 3x3x3 at 16x16x16x16", "Conv3D", 8, (16, 16, 16, 16), lambda k: k.layers.Conv3D(16, 3)),
    LayerCase("Dense 1024x1024", "Dense", 256, (1024,), lambda k: k.layers.Dense(1024)),
    LayerCase("LSTM 128 at 64 steps", "LSTM", 64, (64, 128), lambda k: k.layers.LSTM(128)),
    LayerCase("GRU 128 at 64 steps", "GRU", 64, (64, 128), lambda k: k.layers.GRU(128)),
    LayerCase("MultiHeadAttention 4x64 at 128x256", "MultiHeadAttention", 32, (128, 256),
              lambda k: _SelfAttention(k)),
    LayerCase("LayerNormalization at 128x256", "LayerNormalization", 64, (128, 256),
              lambda k: k.layers.LayerNormalization()),
    LayerCase("BatchNormalization at 24x24x96", "BatchNormalization", 64, (24, 24, 96),
              lambda k: k.layers.BatchNormalization()),
    LayerCase("Embedding 8192x256 at 128 ids", "Embedding", 64, (128,), lambda k: k.layers.Embedding(8192, 256),
              ids=8192),
)


def _SelfAttention(keras: Any) -> Any:
    mha = keras.layers.MultiHeadAttention(num_heads=4, key_dim=64)

    class SelfAttention(keras.layers.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.mha = mha

        def call(self, x: Any) -> Any:
            return self.mha(x, x)

    return SelfAttention()


ACTIVATIONS = tuple(
    LayerCase(f"Activation {name} at 32x32x96", "Activation", 32, (32, 32, 96),
              (lambda n: lambda k: k.layers.Activation(n))(name))
    for name in ("sigmoid", "swish", "hard_swish", "relu"))

MODELS = {  # name -> (keras.applications class, image size, batch)
    "MobileNetV3Small 96x96": ("MobileNetV3Small", 96, 64),
    "EfficientNetB0 64x64": ("EfficientNetB0", 64, 32),
}
MODEL_VARIANTS = ("float32", "mixed_bfloat16", "mixed_bfloat16 + float32 strided or large-kernel depthwise",
                  "mixed_bfloat16 + float32 depthwise")


def slow_depthwise(layer: Any) -> bool:
    """A depthwise layer whose bfloat16 gradients take oneDNN's slow kernels here: a stride above 1 (backward
    data: ``brgconv_strided``) or a kernel above 3 (backward weights: ``jit_bf16``)."""
    strides = getattr(layer, "strides", 1)
    kernel = getattr(layer, "kernel_size", 1)
    def as_tuple(v: Any) -> tuple[int, ...]:
        return tuple(v) if isinstance(v, (tuple, list)) else (v,)

    return max(as_tuple(strides)) > 1 or max(as_tuple(kernel)) > 3


class Runner:
    """One configuration: a model, its data and a compiled training step (forward, backward, SGD update)."""

    def __init__(self, name: str, model: Any, x: Any, y: Any | None, batch: int, input_grad: bool) -> None:
        import tensorflow as tf

        self.name, self.batch = name, batch
        opt = tf.keras.optimizers.SGD(0.01)
        xv = tf.Variable(x) if input_grad else x
        # A layer alone gets its output gradient as a constant in the output's dtype, and its input in the
        # compute dtype: no loss and no casts around it, which in a network its neighbours would not need.
        dy = None if y is not None else tf.random.normal([batch, *model.output.shape[1:]], seed=3)

        @tf.function
        def step() -> Any:
            with tf.GradientTape() as tape:
                out = model(xv, training=True)
                if y is None:
                    target, seed = out, tf.cast(dy, out.dtype)
                else:
                    target = tf.reduce_mean(
                        tf.keras.losses.sparse_categorical_crossentropy(y, tf.cast(out, tf.float32)))
                    seed = None
            sources = model.trainable_variables + ([xv] if input_grad else [])
            grads = tape.gradient(target, sources, output_gradients=seed)
            loss = tf.reduce_sum(tf.cast(grads[0], tf.float32))
            opt.apply_gradients(zip(grads[:len(model.trainable_variables)], model.trainable_variables, strict=True))
            return loss

        self.step = step

    def run(self, steps: int) -> Sample:
        """``steps`` steps, timed to the last one's result: one round's sample for the harness."""
        start = time.perf_counter()
        for _ in range(steps):
            loss = self.step()
        float(loss)
        return Sample(self.batch * steps, time.perf_counter() - start)


LAYER_VARIANTS = ("float32", "mixed_bfloat16", "mixed_bfloat16 + layer float32")


def layer_runner(case: LayerCase, variant: str) -> Runner:
    """The layer between two Dense layers (1x1 convolutions on images) that stay in the variant's policy:
    ``layer float32`` is the island a plan would make, with the casts into and out of it."""
    import tensorflow as tf

    keras = tf.keras
    keras.mixed_precision.set_global_policy(variant.split(" + ")[0])
    try:
        if case.ids:
            inp = keras.Input(case.shape, dtype="int32")
            x = tf.random.uniform((case.batch, *case.shape), maxval=case.ids, dtype=tf.int32, seed=1)
            h = inp
        else:
            inp = keras.Input(case.shape)
            x = tf.random.normal((case.batch, *case.shape), seed=1)
            h = keras.layers.Dense(case.shape[-1])(inp)
        layer = case.build(keras)
        out = keras.layers.Dense(64)(layer(h))
        model = keras.Model(inp, out)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    if variant.endswith("+ layer float32"):
        for sub in layer._flatten_layers(include_self=True, recursive=True):
            sub.dtype_policy = "float32"
    return Runner(f"{case.name} {variant}", model, x, None, case.batch, input_grad=False)


def model_runner(title: str, variant: str) -> Runner:
    import tensorflow as tf

    keras = tf.keras
    cls, size, batch = MODELS[title]
    keras.mixed_precision.set_global_policy(variant.split(" + ")[0])
    try:
        base = getattr(keras.applications, cls)(weights=None, include_top=False, input_shape=(size, size, 3),
                                                pooling="avg")
        out = keras.layers.Dense(10, activation="softmax", dtype="float32")(base.output)
        model = keras.Model(base.input, out)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    if "float32" in variant and "depthwise" in variant:
        for layer in model._flatten_layers(include_self=False, recursive=True):
            if type(layer).__name__ in DEPTHWISE and ("strided" not in variant or slow_depthwise(layer)):
                layer.dtype_policy = "float32"
    x = tf.random.uniform((batch, size, size, 3), maxval=255.0, seed=1)
    y = tf.random.uniform((batch,), maxval=10, dtype=tf.int32, seed=2)
    return Runner(f"{title} {variant}", model, x, y, batch, input_grad=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=6, help="timed steps per configuration and round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--parts", default="layers,models", help="comma-separated: layers, models, activations")
    p.add_argument("--out", help="write the JSON here")
    p.add_argument("--note", default="")
    a = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    parts = {s.strip() for s in a.parts.split(",") if s.strip()}
    runners: list[Runner] = []
    meta: dict[str, dict[str, Any]] = {}
    started = datetime.datetime.now(datetime.timezone.utc)
    cases = (CASES if "layers" in parts else ()) + (ACTIVATIONS if "activations" in parts else ())
    if cases:
        for case in cases:
            for variant in LAYER_VARIANTS:
                r = layer_runner(case, variant)
                runners.append(r)
                meta[r.name] = {"part": "layers", "layer": case.layer, "case": case.name, "variant": variant,
                                "batch": case.batch}
    if "models" in parts:
        for title in MODELS:
            for variant in MODEL_VARIANTS:
                r = model_runner(title, variant)
                runners.append(r)
                meta[r.name] = {"part": "models", "model": title, "variant": variant, "batch": MODELS[title][2]}
    for r in runners:  # compile and warm up
        for _ in range(a.warmup):
            r.step()
    timings = interleaved({r.name: functools.partial(r.run, a.steps) for r in runners}, rounds=a.rounds,
                          after_round=lambda n, _: print(f"round {n + 1}/{a.rounds} done", flush=True))
    results: dict[str, Any] = {}
    for r in runners:
        low, high = timings.spread(r.name)
        results[r.name] = dict(meta[r.name], median=round(timings.median(r.name), 1), min=round(low, 1),
                               max=round(high, 1), rounds=[round(v, 1) for v in timings.rates[r.name]])
    for case in cases:
        f32, bf16, island = (results[f"{case.name} {v}"] for v in LAYER_VARIANTS)
        ratio = island["median"] / bf16["median"]
        faster = island["min"] > bf16["max"]
        print(f"{case.name:44s} float32 {f32['median']:9.1f}  bf16 {bf16['median']:9.1f}  "
              f"island {island['median']:9.1f}  island/bf16 {ratio:5.2f}{'  faster in every round' if faster else ''}")
    for name, entry in results.items():
        if entry["part"] == "models":
            print(f"{name:60s} {entry['median']:8.1f} ({entry['min']}-{entry['max']})")
    doc = document("training step (forward, backward with input and weight gradients, SGD update) per layer kind "
                   "and per model, float32 against mixed_bfloat16; one process, configurations interleaved "
                   f"({a.rounds} rounds of {a.steps} timed steps after {a.warmup} warm-up steps); samples/s",
                   "cpu_layers.py", argv, started, a, "samples/s", results, onednn_enabled=_onednn(tf))
    write(doc, a.out)
    return 0


def _onednn(tf: Any) -> bool | None:
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
