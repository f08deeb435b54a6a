"""Dtype policy and XLA on/off for the MNIST CNN training step on this machine's CPU.

Batch 256, median of 8 timed steps after 3 warm-up steps, one tf.function per step.
Run: python benchmarks/cpu_xla.py   (prints one line per configuration)

Superseded by benchmarks/cpu_policy.py (child process per configuration, oneDNN on and off, interleaved
rounds, JSON); kept because results/cpu-policy-zen1.json, the Zen 1 figures the CPU plan quotes, were made
with it.
"""
import os
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (machine.py beside it, however it is loaded)

keras = tf.keras
BATCH = 256


def model():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Dropout(0.25),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(10, activation="softmax", dtype="float32"),
    ])


def measure(policy, jit):
    keras.mixed_precision.set_global_policy(policy)
    x = tf.random.uniform((BATCH, 28, 28, 1))
    y = tf.random.uniform((BATCH,), maxval=10, dtype=tf.int32)
    m = model()
    opt = keras.optimizers.Adam(0.01)
    lossf = keras.losses.SparseCategoricalCrossentropy()

    @tf.function(jit_compile=jit)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = lossf(y, m(x, training=True))
        grads = tape.gradient(loss, m.trainable_variables)
        opt.apply_gradients(zip(grads, m.trainable_variables, strict=True))
        return loss

    for _ in range(3):
        step(x, y).numpy()
    times = []
    for _ in range(8):
        t0 = time.perf_counter()
        step(x, y).numpy()
        times.append(time.perf_counter() - t0)
    return BATCH / np.median(times)


if __name__ == "__main__":
    keras_version = keras.__version__ if hasattr(keras, "__version__") else ""
    from machine import machine_record

    print(f"# {machine_record()['machine_kind']}, TF {tf.__version__}, Keras {keras_version}")
    for policy, jit in [("float32", False), ("float32", True), ("mixed_float16", False), ("mixed_bfloat16", False)]:
        print(f"policy={policy} jit_compile={jit}: {measure(policy, jit):.0f} img/s", flush=True)
