"""The Keras 2 / Keras 3 layer: which Keras tf.keras is (from metadata, and for real), the policy, loss scaling."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import NEUTRAL_CWD

from amp_backends.software import KerasInfo, expected_keras, generation_of, uses_legacy_keras

pytestmark = pytest.mark.intel

INSTALLED = {"keras": "3.15.1", "tf-keras": "2.21.0"}.get
OLD = {"keras": "2.15.0"}.get


@pytest.mark.parametrize("tf_version,environ,versions,expected", [
    ("2.21.0", {}, INSTALLED, KerasInfo("3.15.1", 3, "keras")),
    ("2.21.0", {"TF_USE_LEGACY_KERAS": "1"}, INSTALLED, KerasInfo("2.21.0", 2, "tf-keras")),
    ("2.21.0", {"TF_USE_LEGACY_KERAS": "True"}, INSTALLED, KerasInfo("2.21.0", 2, "tf-keras")),
    ("2.21.0", {"TF_USE_LEGACY_KERAS": "yes"}, INSTALLED, KerasInfo("3.15.1", 3, "keras")),  # not a value TF accepts
    ("2.15.1", {"TF_USE_LEGACY_KERAS": "1"}, OLD, KerasInfo("2.15.0", 2, "keras")),  # TF 2.15: always Keras 2
    ("2.21.0", {"TF_USE_LEGACY_KERAS": "1"}, OLD, KerasInfo(None, None, None)),  # tf-keras missing: unknown
])
def test_expected_keras_follows_tensorflows_rule(tf_version, environ, versions, expected):
    assert expected_keras(tf_version, environ, versions) == expected


def test_generation_and_legacy_switch():
    generations = (generation_of("3.15.1"), generation_of("2.15.0"), generation_of(None), generation_of("dev"))
    assert generations == (3, 2, None, None)
    assert uses_legacy_keras({"TF_USE_LEGACY_KERAS": "true"}) and not uses_legacy_keras({})


@pytest.mark.tensorflow
def test_metadata_answer_matches_the_imported_tf_keras():
    """What the report says without importing TensorFlow is what tf.keras turns out to be."""
    code = ("from amp_backends.keras_compat import keras_info; from amp_backends.software import expected_keras, "
            "tensorflow_version; before = expected_keras(tensorflow_version()); import tensorflow as tf; "
            "print(before == keras_info(tf), keras_info(tf).generation, str(tf.keras.mixed_precision.Policy))")
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"} | {"TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=NEUTRAL_CWD,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    same, generation, _ = out.stdout.split(maxsplit=2)
    assert same == "True" and generation in ("2", "3")


@pytest.mark.tensorflow
def test_policy_and_loss_scaling_helpers_on_the_installed_keras():
    tf = pytest.importorskip("tensorflow")
    from amp_backends import keras_compat as kc

    kc.set_global_policy("mixed_float16", tf)
    assert kc.global_policy_name(tf) == "mixed_float16"
    kc.set_global_policy("float32", tf)
    var = tf.Variable([1.0, 2.0])
    opt = kc.dynamic_loss_scale_optimizer(tf.keras.optimizers.SGD(0.5), tf)
    kc.build_optimizer(opt, [var])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(var * var)
        scaled = kc.scale_loss(opt, loss)
    assert float(scaled) == pytest.approx(float(loss) * 2.0**15)
    grads = kc.unscale_gradients(opt, tape.gradient(scaled, [var]))
    opt.apply_gradients(zip(grads, [var], strict=True))
    assert var.numpy().tolist() == pytest.approx([0.0, 0.0])  # w - 0.5 * 2w: the scale fully removed
