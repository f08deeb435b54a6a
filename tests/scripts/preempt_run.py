"""Run by test_distribute.py as each of two workers (TF_CONFIG set): the Trainer under MultiWorkerMirroredStrategy,
preempted by a real SIGTERM to one worker (sent by that worker to itself after a given step), then resumed.

A model without dropout, so a resumed run's losses are exactly the uninterrupted run's. Prints one JSON line:
this worker's per-step losses and how each run ended.
"""
import json
import os
import signal
import sys

import numpy as np
import tensorflow as tf

import amp_backends
from amp_backends.errors import TrainingInterrupted
from amp_backends.training import Trainer, classifier_updates, seed_everything
from amp_backends.training.distribute import make_strategy, worker_id
from amp_backends.training.observers import Observer

STEPS = 24
directory = sys.argv[1]
strategy = make_strategy("multiworker", timeout_s=20)
me = worker_id(strategy)
plan = amp_backends.auto_configure(verbose=False)
rng = np.random.default_rng(0)
x, y = rng.normal(size=(16 * STEPS, 8)).astype("float32"), rng.integers(0, 4, 16 * STEPS)


class Record(Observer):
    def __init__(self, losses, sigterm_after):
        self.losses, self.sigterm_after = losses, sigterm_after

    def after_call(self, r):
        self.losses += [[r.step - r.steps + i, float(r.losses[i][0])] for i in range(r.steps)]
        if self.sigterm_after is not None and r.step >= self.sigterm_after:
            os.kill(os.getpid(), signal.SIGTERM)
            self.sigterm_after = None


def run(where, *, resume=False, sigterm=None):
    """Train to STEPS in ``where``; ``sigterm=(worker, step)``: that worker gets a SIGTERM after that step."""
    seed_everything(3)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                     tf.keras.layers.Dense(4, dtype="float32")])
        opt = tf.keras.optimizers.Adam(1e-2)
    losses = []
    after = sigterm[1] if sigterm and sigterm[0] == me else None
    trainer = Trainer(classifier_updates(model, opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
                      plan, batch_size=16, steps_per_call=3, checkpoint_dir=os.path.join(directory, where),
                      checkpoint_every=5, strategy=strategy, progress=False, observers=[Record(losses, after)])
    try:
        trainer.fit(x, y, epochs=1, max_steps=STEPS, resume=resume)
        return {"losses": losses, "ended": None}
    except TrainingInterrupted as exc:
        return {"losses": losses, "ended": [exc.exit_code, exc.step, exc.checkpoint, exc.message]}


result = {"worker": me, "whole": run("whole")}
result["runs"] = [run("run", sigterm=("worker-0", 7)),  # the chief (worker 0)
                  run("run", resume=True, sigterm=("worker-1", 16)),  # the other worker
                  run("run", resume=True)]
print(json.dumps(result), flush=True)
