"""The smallest auto-configured training run: ``python -m amp_backends.examples.tiny``.

Shows the plan for this machine, then trains a small Keras model on random data under it.
"""

from __future__ import annotations

import os


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import amp_backends

    plan = amp_backends.auto_configure()
    print(plan.explain())

    import tensorflow as tf

    keras = tf.keras
    model = keras.Sequential([
        keras.Input((32,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
        keras.layers.Activation("softmax", dtype="float32"),  # outputs in float32 under any policy
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", **plan.compile_kwargs())
    x = tf.random.normal((2048, 32))
    y = tf.random.uniform((2048,), maxval=10, dtype=tf.int32)
    hist = model.fit(x, y, batch_size=256, epochs=2, verbose=2)
    print(f"trained under {plan.policy}: final loss {hist.history['loss'][-1]:.4f}")


if __name__ == "__main__":
    main()
