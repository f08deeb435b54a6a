"""Updates: several variable groups and optimizers from one loss, the GAN's two updates."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import applied_plan

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from amp_backends.data import synthetic_mnist  # noqa: E402
from amp_backends.models import gan_discriminator, gan_generator  # noqa: E402
from amp_backends.training import Trainer, Update, gan_updates, mnist_batch_fn  # noqa: E402


def test_several_variable_groups_and_optimizers_in_one_update():
    """As SparseOperationKit does: embedding and dense variables from one scaled loss, two optimizers."""
    p = applied_plan(policy=None, loss_scale="dynamic")
    emb = tf.keras.layers.Embedding(50, 8)
    dense = tf.keras.layers.Dense(1)
    emb.build((None,))
    dense.build((None, 8))
    o1, o2 = tf.keras.optimizers.SGD(0.1), tf.keras.optimizers.Adam(0.01)

    def loss_fn(batch):
        ids, target = batch
        return tf.reduce_mean((tf.cast(dense(emb(ids))[:, 0], tf.float32) - target) ** 2)

    upd = Update("sok", loss_fn, [(emb.trainable_variables, o1), (dense.trainable_variables, o2)])
    ids = np.arange(64) % 50
    target = np.ones(64, np.float32)
    t = Trainer([upd], p, batch_size=16, checkpoint_objects={"emb": emb, "dense": dense}, progress=False)
    e0, d0 = emb.embeddings.numpy().copy(), dense.kernel.numpy().copy()
    r = t.fit(ids, target, epochs=3)
    assert r.skipped == {"sok": 0} and r.steps == 12
    assert not np.array_equal(e0, emb.embeddings.numpy()) and not np.array_equal(d0, dense.kernel.numpy())
    assert int(o1.iterations.numpy()) == 12 and int(o2.iterations.numpy()) == 12


def test_gan_trains_with_two_optimizers_and_two_scales():
    p = applied_plan(policy=None, loss_scale="dynamic")
    (x, _), _ = synthetic_mnist(64, 8)
    g, d = gan_generator(), gan_discriminator()
    go, do = tf.keras.optimizers.Adam(1e-3), tf.keras.optimizers.RMSprop(1e-4)
    t = Trainer(gan_updates(g, d, go, do), p, batch_size=16, images_per_step=32,
                checkpoint_objects={"g": g, "d": d}, batch_fn=mnist_batch_fn, progress=False, steps_per_call=2)
    r = t.fit(x, None, epochs=1)
    assert set(r.last_losses) == {"generator", "discriminator"} and all(np.isfinite(list(r.last_losses.values())))
    assert set(r.loss_scales) == {"generator", "discriminator"}


def test_gan_batches_without_a_fixed_size_are_our_input_error_with_the_fix():
    """Traced for batches of no fixed size (a custom loop's ``tf.function`` with ``[None, ...]``), the GAN's loss
    raised a bare ValueError."""
    from amp_backends.errors import InputError

    generator_update, _ = gan_updates(gan_generator(), gan_discriminator(), tf.keras.optimizers.Adam(1e-3),
                                      tf.keras.optimizers.RMSprop(1e-4))
    loss = tf.function(generator_update.loss_fn, input_signature=[tf.TensorSpec([None, 28, 28, 1], tf.float32)])
    with pytest.raises(InputError, match="gan_updates needs batches of a fixed size.*drop_remainder=True"):
        loss.get_concrete_function()
