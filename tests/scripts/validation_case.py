"""The validation case the distributed scripts beside it share (mirrored_run.py, validation_workers.py): data whose
37 validation samples make batches of 16, 16 and 5, a small classifier, and the numbers one device gives."""
import numpy as np
import tensorflow as tf


def data():
    """``(x, y, x_val, y_val)``: 64 training samples, 37 validation samples (the last batch of 16 is short)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype("float32")
    xv = rng.normal(size=(37, 6)).astype("float32")
    label = lambda a: (a[:, 0] > 0).astype("int64") + (a[:, 1] > 1).astype("int64")  # noqa: E731
    return x, label(x), xv, label(xv)


def model_and_optimizer(strategy):
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(16, activation="relu"),
                                     tf.keras.layers.Dense(3, activation="softmax")])
        return model, tf.keras.optimizers.Adam(0.01)


def one_device(model, xv, yv):
    """The loss and accuracy of ``model`` over all of ``xv``, computed by hand from its outputs."""
    probs = model(xv, training=False).numpy()
    return {"loss": float(np.mean(-np.log(probs[np.arange(len(yv)), yv]))),
            "accuracy": float(np.mean(probs.argmax(-1) == yv))}


def validation_values(result):
    """The last epoch's ``val_*`` values, without the prefix."""
    return {k[4:]: v for k, v in result.epochs[-1].items() if k.startswith("val_")}
