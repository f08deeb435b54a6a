"""Real auto_configure() with real TensorFlow on this machine."""

from __future__ import annotations

import os
import warnings

import pytest

pytestmark = pytest.mark.tensorflow

tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
from amp_backends.errors import AmpConfigError, AmpWarning, UnsupportedRequestError  # noqa: E402


def machine_has_native_bf16() -> bool:
    from amp_backends.backends.cpu import probe_cpu

    return probe_cpu().native_bf16


def test_auto_configure_applies_and_returns_the_plan(caplog):
    caplog.set_level("INFO", logger="amp_backends")
    plan = amp_backends.auto_configure()
    assert plan.backend in ("nvidia", "intel", "cpu")
    assert tf.keras.mixed_precision.global_policy().name == plan.policy
    assert tf.config.experimental.tensor_float_32_execution_enabled() is plan.tf32
    if plan.backend == "cpu" and not machine_has_native_bf16():
        assert plan.policy == "float32" and plan.loss_scale.mode == "none" and plan.xla is False
    assert amp_backends.current_plan() is plan
    assert [r.message for r in caplog.records if r.name == "amp_backends"][0].startswith("amp_backends plan: backend=")


def test_auto_configure_is_idempotent():
    first = amp_backends.auto_configure(verbose=False)
    assert amp_backends.auto_configure(verbose=False) is first
    other = amp_backends.auto_configure(xla="on", verbose=False)
    assert other is not first and other.xla is True


def test_tiny_model_trains_under_the_plan():
    plan = amp_backends.auto_configure(verbose=False)
    keras = tf.keras
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1, dtype="float32")])
    model.compile(optimizer="adam", loss="mse", **plan.compile_kwargs())
    hist = model.fit(tf.random.normal((64, 4)), tf.random.normal((64, 1)), epochs=2, verbose=0)
    assert len(hist.history["loss"]) == 2 and all(v == v for v in hist.history["loss"])
    assert model.layers[0].compute_dtype == plan.compute_dtype


@pytest.mark.skipif(machine_has_native_bf16(), reason="this CPU has bf16: the downgrade does not apply")
def test_forced_fp16_on_this_cpu():
    with pytest.warns(AmpWarning, match="downgraded"):
        plan = amp_backends.auto_configure(policy="fp16", verbose=False)
    assert plan.policy == "float32" and tf.keras.mixed_precision.global_policy().name == "float32"
    with pytest.raises(UnsupportedRequestError):
        amp_backends.auto_configure(policy="fp16", strict=True, verbose=False)
    with pytest.warns(AmpWarning, match="force"):
        plan = amp_backends.auto_configure(policy="fp16", force=True, verbose=False)
    assert tf.keras.mixed_precision.global_policy().name == "mixed_float16"
    layer = tf.keras.layers.Dense(2)
    layer.build((None, 3))
    assert layer.compute_dtype == "float16" and layer.variable_dtype == "float32"


def test_environment_overrides_and_errors(monkeypatch):
    monkeypatch.setenv("AMP_TF32", "off")
    plan = amp_backends.auto_configure(verbose=False)
    assert plan.tf32 is False and tf.config.experimental.tensor_float_32_execution_enabled() is False
    monkeypatch.setenv("AMP_POLICY", "bogus")
    with pytest.raises(AmpConfigError, match="AMP_POLICY must be one of auto, float32"):
        amp_backends.auto_configure()


def test_xla_off_turns_global_autoclustering_off():
    tf.config.optimizer.set_jit(True)
    plan = amp_backends.auto_configure(xla="off", verbose=False)
    assert plan.xla is False and not tf.config.optimizer.get_jit()
