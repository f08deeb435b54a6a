"""Run by test_distribute.py in a fresh process: the trainer under MirroredStrategy over 2 logical CPUs.

Replica 1 alone gets a non-finite loss on the first step; validation batches split across the replicas (the last
one leaves replica 1 few rows or none) against the same model's numbers on one device. Prints JSON summaries.
"""
import json
import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import amp_backends  # noqa: E402
import validation_case  # noqa: E402  (beside this script)
from amp_backends.data import synthetic_mnist  # noqa: E402
from amp_backends.models import mnist_cnn  # noqa: E402
from amp_backends.training import Trainer, Update, classifier_updates, mnist_batch_fn  # noqa: E402

plan = amp_backends.auto_configure(loss_scale="dynamic", verbose=False)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = mnist_cnn()
    opt = tf.keras.optimizers.Adam(1e-3)
    poison = tf.Variable(True, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

base = classifier_updates(model, opt)[0]


def loss_fn(batch):
    loss = base.loss_fn(batch)
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    bad = tf.logical_and(poison, tf.equal(replica, 1))
    return tf.cond(bad, lambda: loss * np.inf, lambda: loss)


trainer = Trainer([Update("model", loss_fn, base.groups)], plan, batch_size=16, checkpoint_objects={"model": model},
                  batch_fn=mnist_batch_fn, progress=False, strategy=strategy)
(x, y), _ = synthetic_mnist(64, 8)
w0 = [v.numpy().copy() for v in model.trainable_variables]

# an embedding's gradient stays sparse through both replicas, the scale, the finite check and the apply
with strategy.scope():
    emb = tf.keras.layers.Embedding(20000, 64)
    emb.build((None,))
    e_opt = tf.keras.optimizers.SGD(0.1)
seen = []


def emb_loss(batch):
    return tf.reduce_mean(tf.cast(emb(batch[0]), tf.float32) ** 2)


real_apply = e_opt.apply_gradients


def recording_apply(grads_and_vars, *a, **k):
    grads_and_vars = list(grads_and_vars)
    seen.extend(type(g).__name__ for g, _ in grads_and_vars)
    return real_apply(grads_and_vars, *a, **k)


e_opt.apply_gradients = recording_apply
e_rows = emb.embeddings.numpy()[[0, 1]].copy()
Trainer([Update("emb", emb_loss, [(emb.trainable_variables, e_opt)])], plan, batch_size=16, progress=False,
        strategy=strategy).fit(np.arange(32) * 600, epochs=1)
sparse = bool(seen) and set(seen) == {"IndexedSlices"}
rows = emb.embeddings.numpy()
rows_ok = (not np.array_equal(rows[0], e_rows[0])) and np.array_equal(rows[1], e_rows[1])
first = trainer.fit(x, y, epochs=1, max_steps=1)
unchanged = all(np.array_equal(a, v.numpy()) for a, v in zip(w0, model.trainable_variables, strict=True))
poison.assign(False)
rest = trainer.fit(x, y, epochs=1)
# XLA asked for with two replicas on logical CPUs (one XLA device): trains, without per-replica compilation;
# a BatchNormalization's statistics come back after a step skipped in one replica only
amp_backends.reset()
xla_plan = amp_backends.auto_configure(xla="on", policy="float32", verbose=False)
with strategy.scope():
    bn_model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.BatchNormalization(),
                                    tf.keras.layers.Dense(3)])
    bn_opt = tf.keras.optimizers.SGD(0.1)
bn_base = classifier_updates(bn_model, bn_opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))[0]
bn_x = np.ones((16, 4), np.float32)
bn_x[12, 0] = np.inf  # one global batch per epoch: every step sees it (in one replica's half) and is skipped
xla_trainer = Trainer([bn_base], xla_plan, batch_size=16, progress=False, strategy=strategy, seed=0)
bn_result = xla_trainer.fit(bn_x, np.zeros(16, int), epochs=2)
print(json.dumps({"xla_replica_jit": xla_trainer.program.replica_jit, "xla_steps": bn_result.steps,
                  "bn_skipped": bn_result.skipped["model"],
                  "bn_finite": bool(all(np.isfinite(v.numpy()).all() for v in bn_model.variables))}))
print(json.dumps({
    "replicas": strategy.num_replicas_in_sync,
    "skipped_after_first": first.skipped["model"],
    "scale_after_first": first.loss_scales["model"],
    "unchanged_after_poisoned_step": unchanged,
    "steps": rest.steps,
    "skipped": rest.skipped["model"],
    "optimizer_iterations": int(opt.iterations.numpy()),
    "finite": bool(all(np.isfinite(v.numpy()).all() for v in model.trainable_variables)),
    "changed_after": not all(np.array_equal(a, v.numpy())
                             for a, v in zip(w0, model.trainable_variables, strict=True)),
    "sparse_gradients": sparse,
    "only_looked_up_rows_changed": rows_ok,
}))
sys.stdout.flush()

# validation: each replica evaluates its slice of every batch; losses and metrics reduced to the one-device numbers
amp_backends.reset()
amp_backends.seed_everything(0)
val_plan = amp_backends.auto_configure(policy="float32", verbose=False)
vx, vy, xv, yv = validation_case.data()
v_model, v_opt = validation_case.model_and_optimizer(strategy)
v_trainer = Trainer(classifier_updates(v_model, v_opt), val_plan, batch_size=16, strategy=strategy, progress=False,
                    check_models=False, metrics=["accuracy"], seed=0)
v_result = v_trainer.fit(vx, vy, epochs=2, validation_data=(xv, yv))
print(json.dumps({
    "one_device": validation_case.one_device(v_model, xv, yv),
    "arrays": v_trainer.evaluate(xv, yv),
    "dataset": v_trainer.evaluate(tf.data.Dataset.from_tensor_slices((xv, yv)).batch(16)),
    "last_epoch": validation_case.validation_values(v_result),
    "train_accuracy": v_result.epochs[-1]["accuracy"],
}))
sys.stdout.flush()
