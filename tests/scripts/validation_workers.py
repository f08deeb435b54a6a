"""Run twice by test_training_validation.py, as the two workers of a MultiWorkerMirroredStrategy (TF_CONFIG set):
trains and validates, then prints this worker's validation and evaluate() numbers and the single-device ones."""
import json
import sys

import tensorflow as tf

import amp_backends
import validation_case  # (beside this script)
from amp_backends.training import Trainer, classifier_updates

amp_backends.seed_everything(0)
plan = amp_backends.auto_configure(policy="float32", verbose=False)
strategy = tf.distribute.MultiWorkerMirroredStrategy()
x, y, xv, yv = validation_case.data()  # batches of 16, 16 and 5: worker 1 gets 2 rows of the last
model, opt = validation_case.model_and_optimizer(strategy)
trainer = Trainer(classifier_updates(model, opt), plan, batch_size=16, strategy=strategy, progress=False,
                  check_models=False, metrics=["accuracy"], seed=0, keep_best="val_accuracy",
                  checkpoint_dir=sys.argv[1])
result = trainer.fit(x, y, epochs=2, validation_data=(xv, yv))
print("RESULT", json.dumps({
    "worker": trainer.worker,
    "one_device": validation_case.one_device(model, xv, yv),
    "last_epoch": validation_case.validation_values(result),
    "evaluate": trainer.evaluate(xv, yv),
    "train_accuracy": result.epochs[-1]["accuracy"],
    "best": result.best,
}))
sys.stdout.flush()
