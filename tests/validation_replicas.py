"""Run by test_training_validation.py in a fresh process: validation under MirroredStrategy over 2 logical CPUs
against the same model's numbers on one device; prints a JSON summary."""
import json
import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import amp_backends  # noqa: E402
from amp_backends.training import Trainer, classifier_updates  # noqa: E402

amp_backends.seed_everything(0)
plan = amp_backends.auto_configure(policy="float32", verbose=False)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 6)).astype("float32")
y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 1).astype("int64")
xv = rng.normal(size=(37, 6)).astype("float32")  # batches of 16, 16 and 5: the last leaves replica 1 with 3 or none
yv = (xv[:, 0] > 0).astype("int64") + (xv[:, 1] > 1).astype("int64")
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(3, activation="softmax")])
    opt = tf.keras.optimizers.Adam(0.01)
trainer = Trainer(classifier_updates(model, opt), plan, batch_size=16, strategy=strategy, progress=False,
                  check_models=False, metrics=["accuracy"], seed=0)
result = trainer.fit(x, y, epochs=2, validation_data=(xv, yv))
probs = model(xv, training=False).numpy()
one = {"loss": float(np.mean(-np.log(probs[np.arange(37), yv]))), "accuracy": float(np.mean(probs.argmax(-1) == yv))}
print(json.dumps({
    "replicas": strategy.num_replicas_in_sync,
    "one_device": one,
    "arrays": trainer.evaluate(xv, yv),
    "dataset": trainer.evaluate(tf.data.Dataset.from_tensor_slices((xv, yv)).batch(16)),
    "last_epoch": {k[4:]: v for k, v in result.epochs[-1].items() if k.startswith("val_")},
    "train_accuracy_finite": bool(np.isfinite(result.epochs[-1]["accuracy"])),
}))
sys.stdout.flush()
