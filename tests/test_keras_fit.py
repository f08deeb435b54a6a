"""Keras fit follows the plan's loss scaling: dynamic, fixed and none, on the Keras installed (3 or 2).

``model.compile(optimizer=plan.wrap_optimizer(opt), loss=..., **plan.compile_kwargs())`` under a
mixed_float16 plan (an H100's, made on fake hardware; XLA off to keep the tests fast). Each mode is
checked by what fit really does to a one-weight model, ``y = w * x`` computed in float16, whose loss has a
gradient of 1e-8 with respect to ``y``: below float16's smallest subnormal (6e-8), so without loss scaling
the weight's gradient is exactly 0, and with a scale of 1024 or more it is not. A second loss with a
gradient of 10 overflows float16 once scaled by 2^15: a dynamic scale skips that step and halves itself.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytestmark = pytest.mark.intel

tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
from amp_backends import keras_compat as kc  # noqa: E402
from amp_backends.errors import AmpWarning  # noqa: E402

from fakes import AMD_HERE, H100, cpu_of, machine, nvidia  # noqa: E402

K = tf.keras
KERAS3 = (kc.keras_info(tf).generation or 2) >= 3
X, Y = np.ones((1, 1), np.float32), np.zeros((1, 1), np.float32)


def fp16_plan(loss_scale):
    return amp_backends.plan_for(machine(nvidia(H100)), xla="off", loss_scale=loss_scale)


def tiny_gradient(y_true, y_pred):
    """dL/dy = 1e-8: flushed to zero in float16 unless the loss is scaled."""
    return 1e-8 * tf.cast(y_pred, tf.float32)


def large_gradient(y_true, y_pred):
    """dL/dy = 10: 327680 once scaled by 2^15, beyond float16's 65504."""
    return 10.0 * tf.cast(y_pred, tf.float32)


def fit_one_step(plan, loss, lr=1e4, model_class=None):
    """Build y = w * x (w = 1) under mixed_float16, compile it as the plan says, fit one step; the model."""
    kc.set_global_policy("mixed_float16", tf)
    model = (model_class or K.Sequential)([K.Input((1,)), K.layers.Dense(1, use_bias=False,
                                                                         kernel_initializer="ones")])
    assert model.layers[0].compute_dtype == "float16"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmpWarning)
        optimizer = plan.wrap_optimizer(K.optimizers.SGD(lr))
    model.compile(optimizer=optimizer, loss=loss, **plan.compile_kwargs())
    model.fit(X, Y, batch_size=1, epochs=1, verbose=0)
    return model


def weight(model) -> float:
    return float(model.layers[0].kernel.numpy().ravel()[0])


def test_compile_kwargs_per_keras_generation():
    assert kc.compile_kwargs(True, 4, generation=3) == {"jit_compile": True, "steps_per_execution": 4,
                                                         "auto_scale_loss": False}
    assert kc.compile_kwargs(False, 1, generation=2) == {"jit_compile": False, "steps_per_execution": 1}
    assert ("auto_scale_loss" in fp16_plan("dynamic").compile_kwargs()) is KERAS3


def test_without_the_plan_keras_adds_dynamic_scaling_under_float16():
    """What wrap_optimizer and compile_kwargs are for: plain compile ignores a plan without scaling."""
    kc.set_global_policy("mixed_float16", tf)
    model = K.Sequential([K.Input((1,)), K.layers.Dense(1)])
    model.compile(optimizer=K.optimizers.SGD(0.1), loss="mse")
    assert kc.loss_scale_of(model.optimizer)[0] == "dynamic"


def test_dynamic_scales_the_loss_and_skips_an_overflowing_step():
    scaled = fit_one_step(fp16_plan("dynamic"), tiny_gradient)
    assert kc.is_loss_scale_optimizer(scaled.optimizer)
    assert 0.9998 < weight(scaled) < 0.99995  # 1 - 1e4 * 1e-8: the gradient survived float16
    overflow = fit_one_step(fp16_plan("dynamic"), large_gradient)
    assert kc.loss_scale_of(overflow.optimizer) == ("dynamic", 2.0**14)  # halved from 2^15
    assert weight(overflow) == 1.0  # the step was skipped


def test_dynamic_takes_the_plans_initial_scale_and_growth():
    plan = amp_backends.plan_for(machine(nvidia(H100)), xla="off",
                                 loss_scale=amp_backends.LossScale.dynamic(initial=256, growth_interval=7))
    opt = plan.wrap_optimizer(K.optimizers.SGD(0.1))
    assert kc.loss_scale_of(opt) == ("dynamic", 256.0)
    assert (opt.dynamic_growth_steps if KERAS3 else int(opt.dynamic_growth_steps)) == 7


def test_fixed_multiplies_the_loss_and_keeps_its_scale():
    model = fit_one_step(fp16_plan("fixed:1024"), tiny_gradient)
    assert kc.loss_scale_of(model.optimizer) == ("fixed", 1024.0)
    assert 0.9998 < weight(model) < 0.99995  # 1e-8 * 1024 survived float16, unscaled before the update
    if KERAS3:  # Keras 3: the optimizer itself, with loss_scale_factor; no LossScaleOptimizer
        assert not kc.is_loss_scale_optimizer(model.optimizer) and model.optimizer.loss_scale_factor == 1024.0
    else:
        assert kc.is_loss_scale_optimizer(model.optimizer) and not model.optimizer.dynamic


def test_fixed_applies_an_overflowing_step_as_documented():
    """Neither Keras skips a non-finite step under a fixed scale: the scale stays, the weight is lost."""
    model = fit_one_step(fp16_plan("fixed:65536"), large_gradient)
    assert kc.loss_scale_of(model.optimizer) == ("fixed", 65536.0)
    assert not np.isfinite(weight(model))


def test_fixed_warns_under_float16_that_overflowing_steps_are_not_skipped():
    with pytest.warns(AmpWarning, match="applied, not skipped"):
        fp16_plan("fixed:1024").wrap_optimizer(K.optimizers.SGD(0.1))


def test_none_means_no_scaling_even_under_mixed_float16():
    model = fit_one_step(fp16_plan("none"), tiny_gradient)
    assert weight(model) == 1.0  # the 1e-8 gradient flushed to zero in float16: nothing scaled it
    if KERAS3:
        assert not kc.is_loss_scale_optimizer(model.optimizer) and model.optimizer.loss_scale_factor is None
        assert kc.loss_scale_of(model.optimizer) == ("none", None)
    else:  # Keras 2 wraps any other optimizer under mixed_float16: a fixed scale of 1 stands in for none
        assert kc.loss_scale_of(model.optimizer) == ("fixed", 1.0)


class Unscaled(K.Sequential):
    """A model with its own training step, which scales no loss."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.cast(self(x, training=True), tf.float32))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        return {"loss": loss}


class Scaled(K.Sequential):
    """The same step, scaling its loss as Keras's own step does."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.cast(self(x, training=True), tf.float32))
            scaled = self.optimizer.scale_loss(loss) if KERAS3 else self.optimizer.get_scaled_loss(loss)
        grads = tape.gradient(scaled, self.trainable_variables)
        if not KERAS3:
            grads = self.optimizer.get_unscaled_gradients(grads)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        return {"loss": loss}


class ScaledInAHelper(K.Sequential):
    """A step that hands its work to a method of its own, which scales."""

    def train_step(self, data):
        return self._step(data)

    def _step(self, data):
        with tf.GradientTape() as tape:
            loss = self.optimizer.scale_loss(tf.reduce_mean(tf.cast(self(data[0], training=True), tf.float32)))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables,
                                           strict=True))
        return {"loss": loss}


class KerasStepNamedOld(Unscaled):
    """A step that ends in Keras's own, named the old way."""

    def train_step(self, data):
        return super(Unscaled, self).train_step(data)


def test_prepare_model_warns_of_an_own_train_step_that_scales_no_loss():
    """A model's own train_step must scale its loss where the plan scales losses: on Keras 3 the optimizer divides
    the gradients by the scale (every update 1024x too small, shown by fit), on Keras 2 they are unprotected."""
    plan, unscaled_plan = fp16_plan("fixed:1024"), fp16_plan("none")
    kc.set_global_policy("mixed_float16", tf)
    layers = [K.Input((1,)), K.layers.Dense(1, use_bias=False)]
    with pytest.warns(AmpWarning, match=r"own train_step \(Unscaled.train_step\), which does not scale its loss, "
                                        r"and the plan scales losses \(fixed:1024\).* Fix: in train_step, loss = "):
        amp_backends.prepare_model(Unscaled(layers), plan)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AmpWarning)
        amp_backends.prepare_model(Scaled([K.Input((1,)), K.layers.Dense(1, use_bias=False)]), plan)
        amp_backends.prepare_model(K.Sequential([K.Input((1,)), K.layers.Dense(1)]), plan)  # Keras's own step
        amp_backends.prepare_model(Unscaled([K.Input((1,)), K.layers.Dense(1)]), unscaled_plan)
        amp_backends.prepare_model(Unscaled([K.Input((1,)), K.layers.Dense(1)]), fp16_plan("fixed:1"))  # (scales 1x)
        for cls in (ScaledInAHelper, KerasStepNamedOld):  # (it read train_step's own lines alone)
            amp_backends.prepare_model(cls([K.Input((1,)), K.layers.Dense(1)]), plan)
    if KERAS3:
        own, right = (1 - weight(fit_one_step(plan, "mse", lr=0.01, model_class=cls)) for cls in (Unscaled, Scaled))
        assert right == pytest.approx(0.01, rel=1e-3) and own == pytest.approx(0.01 / 1024, rel=1e-2)


def test_a_bfloat16_plan_leaves_the_optimizer_alone():
    plan = amp_backends.plan_for(machine(cpu_of(AMD_HERE)), policy="bf16", force=True)
    opt = K.optimizers.SGD(0.1)
    assert plan.loss_scale.mode == "none" and plan.wrap_optimizer(opt) is opt


def test_wrapping_is_idempotent_and_refuses_other_scaling():
    plan = fp16_plan("fixed:1024")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmpWarning)
        once = plan.wrap_optimizer("sgd")  # a name, as compile takes
        assert plan.wrap_optimizer(once) is once  # compiling twice with one optimizer
        dynamic = fp16_plan("dynamic").wrap_optimizer(K.optimizers.SGD(0.1))
        with pytest.raises(ValueError, match=r"Received \w+ with dynamic loss scaling.*Fix: pass the plain optimizer"):
            plan.wrap_optimizer(dynamic)
    with pytest.raises(TypeError, match="takes a Keras optimizer.*Received: 0.1"):
        plan.wrap_optimizer(0.1)


@pytest.mark.parametrize("loss_scale", ["dynamic", "fixed:1024", "none"])
def test_an_optimizer_class_is_refused_before_fit(loss_scale):
    """wrap_optimizer(keras.optimizers.Adam) (the class, not called) was wrapped, or returned as it was under a
    fixed scale after a warning about the scale, and fit failed inside Keras: "build() missing ... 'var_list'"."""
    with pytest.raises(TypeError, match=r"takes a Keras optimizer.*Received: the class Adam, not an optimizer made "
                                        r"from it.*Fix"):
        fp16_plan(loss_scale).wrap_optimizer(K.optimizers.Adam)


def test_a_model_saved_under_float32_takes_a_mixed_plan_with_the_documented_call(tmp_path):
    """The other way: saved all in float32, loaded under mixed_bfloat16. The loaded model object itself took the
    global mixed policy, so reset_policies read every float32 layer as kept in float32 on purpose and changed none."""
    plan = amp_backends.auto_configure(policy="float32", verbose=False)
    K.Sequential([K.Input((6,)), K.layers.Dense(16, activation="relu", name="hidden"),
                  K.layers.Dense(3, activation="softmax", name="head")], name="saved").save(tmp_path / "m.keras")
    plan = amp_backends.auto_configure(policy="mixed_bfloat16", force=True, verbose=False)  # (any CPU: the policy)
    loaded = K.models.load_model(tmp_path / "m.keras")
    assert loaded.get_layer("hidden").compute_dtype == "float32"  # as saved
    prep = amp_backends.prepare_model(loaded, plan, reset_policies=True)
    assert "saved/hidden" in prep.applied, prep
    assert [layer.compute_dtype for layer in loaded.layers] == ["bfloat16", "float32"]
    assert not [f for f in amp_backends.check_model(loaded, plan=plan, batch_size=8).findings
                if f.code == "policy-mismatch"]


def test_a_model_saved_under_bfloat16_trains_in_float32_under_a_float32_plan_after_the_documented_call(tmp_path):
    """A .keras file keeps each layer's policy: loaded where the plan is float32 it stays bfloat16. The check says
    so and names the call; prepare_model(..., reset_policies=True) brings it to the plan, and it trains there."""
    kc.set_global_policy("mixed_bfloat16", tf)
    try:
        saved = K.Sequential([K.Input((6,)), K.layers.Dense(16, activation="relu", name="hidden"),
                              K.layers.Dense(3, activation="softmax", dtype="float32", name="head")], name="saved")
    finally:
        kc.set_global_policy("float32", tf)
    saved.save(tmp_path / "m.keras")
    plan = amp_backends.auto_configure(policy="float32", verbose=False)
    loaded = K.models.load_model(tmp_path / "m.keras")
    assert loaded.get_layer("hidden").compute_dtype == "bfloat16"  # as saved
    x = np.random.default_rng(0).normal(size=(32, 6)).astype("float32")
    y = np.random.default_rng(1).integers(0, 3, 32)
    found = [f for f in amp_backends.check_model(loaded, plan=plan, inputs=x[:8]).findings
             if f.code == "policy-mismatch"]
    assert found and "reset_policies=True" in found[0].fix, found
    prep = amp_backends.prepare_model(loaded, plan, reset_policies=True)
    assert "saved/hidden" in prep.applied
    assert {layer.compute_dtype for layer in loaded.layers} == {"float32"}
    assert not [f for f in amp_backends.check_model(loaded, plan=plan, inputs=x[:8]).findings
                if f.code == "policy-mismatch"]
    loaded.compile(optimizer=plan.wrap_optimizer(K.optimizers.Adam(1e-2)), loss="sparse_categorical_crossentropy",
                   **plan.compile_kwargs())
    history = loaded.fit(x, y, epochs=2, batch_size=16, verbose=0).history["loss"]
    assert all(np.isfinite(history)) and loaded.get_layer("hidden").compute_dtype == "float32"
