"""Run twice by test_training_validation.py, as the two workers of a MultiWorkerMirroredStrategy (TF_CONFIG set):
trains and validates, then prints this worker's validation and evaluate() numbers and the single-device ones."""
import json
import sys

import numpy as np
import tensorflow as tf

import amp_backends
from amp_backends.training import Trainer, classifier_updates

amp_backends.seed_everything(0)
plan = amp_backends.auto_configure(policy="float32", verbose=False)
strategy = tf.distribute.MultiWorkerMirroredStrategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 6)).astype("float32")
y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 1).astype("int64")
xv = rng.normal(size=(37, 6)).astype("float32")  # batches of 16, 16 and 5: worker 1 gets 2 rows of the last
yv = (xv[:, 0] > 0).astype("int64") + (xv[:, 1] > 1).astype("int64")
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(3, activation="softmax")])
    opt = tf.keras.optimizers.Adam(0.01)
trainer = Trainer(classifier_updates(model, opt), plan, batch_size=16, strategy=strategy, progress=False,
                  check_models=False, metrics=["accuracy"], seed=0, keep_best="val_accuracy",
                  checkpoint_dir=sys.argv[1])
result = trainer.fit(x, y, epochs=2, validation_data=(xv, yv))
probs = model(xv, training=False).numpy()
print(json.dumps({
    "worker": trainer.worker,
    "one_device": {"loss": float(np.mean(-np.log(probs[np.arange(37), yv]))),
                   "accuracy": float(np.mean(probs.argmax(-1) == yv))},
    "last_epoch": {k[4:]: v for k, v in result.epochs[-1].items() if k.startswith("val_")},
    "evaluate": trainer.evaluate(xv, yv),
    "train_accuracy": result.epochs[-1]["accuracy"],
    "best": result.best,
}))
sys.stdout.flush()
