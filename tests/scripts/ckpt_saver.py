"""Run by test_distribute.py: save checkpoints of a model in a tight loop, printing each completed save."""
import sys

import tensorflow as tf

from amp_backends.models import mnist_cnn

directory = sys.argv[1]
model = mnist_cnn()
step = tf.Variable(0, dtype=tf.int64)
ckpt = tf.train.Checkpoint(model=model, step=step)
manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=3)
if manager.latest_checkpoint:
    ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
while True:
    step.assign_add(1)
    for v in model.trainable_variables:  # every weight encodes the step, so a torn checkpoint is detectable
        v.assign(tf.fill(v.shape, tf.cast(step, v.dtype)))
    manager.save(checkpoint_number=int(step.numpy()))
    print("saved", int(step.numpy()), flush=True)
