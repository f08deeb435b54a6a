"""Run by test_custom_loop.py in a process of its own: LossScaler in a loop of one's own under MirroredStrategy over 2
logical CPUs. Replica 1 alone gets a non-finite loss on the first step; prints a JSON summary."""
import json
import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import amp_backends  # noqa: E402
from amp_backends.request import LossScale  # noqa: E402

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4)])
    opt = tf.keras.optimizers.SGD(0.1)
    scaler = amp_backends.LossScaler(opt, plan=LossScale.dynamic(initial=1024))
    poison = tf.Variable(True, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


@tf.function
def train_step(x, y):
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y)) / strategy.num_replicas_in_sync
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            loss = tf.cond(tf.logical_and(poison, tf.equal(replica, 1)), lambda: loss * np.inf, lambda: loss)
            scaled_loss = scaler.scale(loss)
        grads = tape.gradient(scaled_loss, model.trainable_variables)
        return scaler.apply(grads, model.trainable_variables)

    applied = strategy.run(replica_step, args=(x, y))  # one flag: every replica applied or skipped alike
    return strategy.experimental_local_results(applied)


x = tf.random.stateless_normal((16, 8), seed=(1, 2))
y = tf.random.stateless_normal((16, 4), seed=(3, 4))
dist = next(iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors((x, y)))))
w0 = [v.numpy().copy() for v in model.trainable_variables]
first = train_step(*dist)
unchanged = all(np.array_equal(a, v.numpy()) for a, v in zip(w0, model.trainable_variables, strict=True))
scales = [scaler.current]
poison.assign(False)
second = train_step(*dist)
scales.append(scaler.current)
# Keras 3 variables hold the MirroredVariable in .value; Keras 2's are one
tf_variables = [v if callable(getattr(v, "value", None)) else v.value for v in model.trainable_variables]
components = [[c.numpy() for c in strategy.experimental_local_results(v)] for v in tf_variables]
print(json.dumps({
    "applied": [bool(first[0]), bool(second[0])],
    "replicas_agree": len(components[0]) == 2 and all(np.array_equal(c[0], c[1]) for c in components),
    "scales": scales,
    "unchanged_after_skip": unchanged,
    "changed_after_apply": not all(np.array_equal(a, v.numpy())
                                   for a, v in zip(w0, model.trainable_variables, strict=True)),
}))
sys.stdout.flush()
