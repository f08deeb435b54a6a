"""Mixed precision trains as well as float32: real digits, the GAN under float16."""

from __future__ import annotations

import sys

import numpy as np
import pytest

pytestmark = pytest.mark.tensorflow
tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
from amp_backends.data import digits_as_mnist  # noqa: E402
from amp_backends.models import gan_discriminator, gan_generator, mnist_cnn  # noqa: E402
from amp_backends.training import (  # noqa: E402
    Trainer,
    classifier_updates,
    gan_updates,
    mnist_batch_fn,
)


def plan(**kw):
    return amp_backends.auto_configure(verbose=False, **kw)


@pytest.mark.slow
def test_fp16_reaches_the_float32_accuracy_on_real_digits():
    """The MNIST CNN on scikit-learn's real handwritten digits: float32 vs forced mixed_float16 + dynamic scaling."""
    if "intel_extension_for_tensorflow" in sys.modules or _itex_loaded():
        pytest.skip("ITEX's CPU float16 kernels are ~10x slower than TF's: fidelity runs in the TF 2.21 session")
    (x, y), (xt, yt) = digits_as_mnist()
    accs = {}
    for policy in ("float32", "mixed_float16"):
        p = plan(policy=policy, force=True, loss_scale="dynamic" if policy == "mixed_float16" else None)
        tf.keras.utils.set_random_seed(1)
        m = mnist_cnn()
        opt = tf.keras.optimizers.Adam(1e-3)
        t = Trainer(classifier_updates(m, opt), p, batch_size=64, checkpoint_objects={"m": m}, batch_fn=mnist_batch_fn,
                    progress=False, steps_per_call=4, seed=1, metrics=["accuracy"])
        t.fit(x, y, epochs=6)
        accs[policy] = t.evaluate(xt, yt)["accuracy"]
    print(f"digits test accuracy: {accs}")
    assert accs["float32"] > 0.9, accs
    assert abs(accs["float32"] - accs["mixed_float16"]) <= 0.01, accs


@pytest.mark.slow
def test_gan_losses_stay_finite_under_fp16():
    if _itex_loaded():
        pytest.skip("ITEX's CPU float16 kernels are ~10x slower than TF's: this runs in the TF 2.21 session")
    p = plan(policy="fp16", force=True)
    (x, _), _ = digits_as_mnist()
    g, d = gan_generator(), gan_discriminator()
    go, do = tf.keras.optimizers.Adam(1e-3), tf.keras.optimizers.RMSprop(1e-4)
    t = Trainer(gan_updates(g, d, go, do), p, batch_size=64, images_per_step=128, checkpoint_objects={"g": g},
                batch_fn=mnist_batch_fn, progress=False, steps_per_call=4)
    r = t.fit(x, None, epochs=1, max_steps=12)
    assert all(np.isfinite(h["generator"]) and np.isfinite(h["discriminator"]) for h in r.history)
    assert all(np.isfinite(v.numpy()).all() for v in g.trainable_variables + d.trainable_variables)


def _itex_loaded() -> bool:
    from amp_backends.backends.intel import itex_status

    return itex_status().compatible
