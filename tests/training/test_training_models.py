"""The example models: the tutorials' parameter counts, float32 outputs under a mixed policy."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from amp_backends.models import gan_discriminator, gan_generator, mnist_cnn  # noqa: E402


def test_models_match_the_originals_and_output_float32():
    from conftest import policy

    with policy("mixed_float16"):  # built under float16 (the Keras policy alone: a plan may refuse it on this CPU)
        m, g, d = mnist_cnn(), gan_generator(), gan_discriminator()
    assert (m.count_params(), g.count_params(), d.count_params()) == (1_199_882, 477_713, 245_169)
    assert m.layers[0].compute_dtype == "float16"
    assert m(tf.zeros((2, 28, 28, 1))).dtype == tf.float32
    assert d(g(tf.zeros((2, 100)))).dtype == tf.float32
