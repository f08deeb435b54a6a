"""Layers a plan keeps in float32 inside a mixed-precision model (``plan.float32_layers``).

On CPUs with AVX512-BF16 and no AMX, oneDNN runs the bfloat16 gradients of a depthwise convolution with a
stride or a kernel above 3 several times slower than float32's (MobileNetV3Small and EfficientNetB0 trained
slower under mixed_bfloat16 than in float32). The CPU backend names those layers, the planner puts them in
the plan, ``prepare_model`` and the trainer set them to float32, the precision check says whether they are.
"""

from __future__ import annotations

import json

import pytest

from amp_backends.assessment import Float32Layer
from amp_backends.layer_names import layer_geometry
from amp_backends.errors import AmpConfigError
from amp_backends.request import build_request
from fakes import AMD_HERE, SAPPHIRE_RAPIDS, ZEN4, cpu_of, machine, plan_of

pytestmark = pytest.mark.intel


# ------------------------------------------------------------------------------------- the rule (fake hardware)
def test_a_bf16_cpu_without_amx_keeps_strided_and_large_depthwise_layers_in_float32(registry):
    p = plan_of(machine(cpu_of(ZEN4)), registry)
    assert p.policy == "mixed_bfloat16"
    assert [(k.layer, k.strides_over, k.kernel_over, k.dtypes) for k in p.float32_layers] == [
        ("DepthwiseConv2D", 1, 3, ("bfloat16",)), ("DepthwiseConv1D", 1, 3, ("bfloat16",)),
        ("SeparableConv2D", 1, 3, ("bfloat16",)), ("LSTM", None, None, ("bfloat16",))]
    why = p.reasons["float32_layers"]
    assert "brgconv_strided" in why and "jit_bf16" in why and "results/cpu-layers-zen4.json" in why
    assert "a 3x3 one at stride 1 stays in bfloat16" in why
    assert "float32_layers=DepthwiseConv2D,DepthwiseConv1D,SeparableConv2D,LSTM" in p.headline
    assert why.count("brgconv_strided") == 1  # one reason for the three depthwise classes
    assert "LSTM: TensorFlow runs an LSTM's recurrent loop" in why
    assert p.to_dict()["float32_layers"][0]["layer"] == "DepthwiseConv2D"


@pytest.mark.parametrize("probe, why", [
    (cpu_of(SAPPHIRE_RAPIDS), "AMX"),
    (cpu_of(ZEN4, itex=True), "ITEX"),
    (cpu_of(ZEN4, environ={"TF_ENABLE_ONEDNN_OPTS": "0"}), "computes every layer in float32"),
    (cpu_of(AMD_HERE), "computes every layer in float32"),
])
def test_elsewhere_nothing_is_kept_and_the_plan_says_why(registry, probe, why):
    p = plan_of(machine(probe), registry)
    assert p.float32_layers == ()
    assert p.reasons["float32_layers"].startswith("none: ") and why in p.reasons["float32_layers"]
    assert "float32_layers" not in p.headline


def test_the_user_overrides_the_list_by_keyword_or_environment(registry):
    hw = machine(cpu_of(ZEN4))
    assert plan_of(hw, registry, float32_layers="none").float32_layers == ()
    mine = plan_of(hw, registry, float32_layers="Conv1D, LayerNormalization")
    assert [k.layer for k in mine.float32_layers] == ["Conv1D", "LayerNormalization"]
    assert all(k.strides_over is None and k.kernel_over is None for k in mine.float32_layers)  # every such layer
    assert mine.reasons["float32_layers"] == "Conv1D, LayerNormalization: requested (float32_layers)"
    env = plan_of(hw, registry, environ={"AMP_FLOAT32_LAYERS": "none"})
    assert env.float32_layers == () and env.request.sources["float32_layers"] == "AMP_FLOAT32_LAYERS"
    assert plan_of(hw, registry, float32_layers=["Dense"]).float32_layers[0].layer == "Dense"
    assert plan_of(hw, registry).training_key() != plan_of(hw, registry, float32_layers="none").training_key()
    # under a float32 policy there is nothing to keep, and the reason says the request changes nothing
    f32 = plan_of(hw, registry, policy="float32", float32_layers="Dense")
    assert f32.float32_layers == () and "changes nothing" in f32.reasons["float32_layers"]


@pytest.mark.parametrize("value, source", [("Depthwise-Conv2D", "argument"), ("Dense,,", "env"), (3, "argument")])
def test_a_bad_list_is_refused_with_what_was_expected_and_the_fix(registry, value, source):
    kwargs = {"float32_layers": value} if source == "argument" else {}
    environ = {"AMP_FLOAT32_LAYERS": value} if source == "env" else {}
    with pytest.raises((AmpConfigError, TypeError)) as err:
        build_request(registry.names(), environ=environ, **kwargs)
    text = str(err.value)
    assert "float32_layers" in text or "AMP_FLOAT32_LAYERS" in text
    assert repr(value) in text or str(value) in text
    if isinstance(err.value, AmpConfigError):
        assert "Fix:" in text


def test_conditions_match_by_class_base_class_stride_and_kernel():
    rule = Float32Layer("DepthwiseConv2D", ("bfloat16",), "why", strides_over=1, kernel_over=3)
    assert rule.matches(("DepthwiseConv2D", "BaseDepthwiseConv"), (2, 2), (3, 3))
    assert rule.matches(("MyDepthwise", "DepthwiseConv2D"), (1, 1), (5, 5))  # a subclass, a large kernel
    assert not rule.matches(("DepthwiseConv2D",), (1, 1), (3, 3))
    assert not rule.matches(("Conv2D",), (2, 2), (5, 5))
    every = Float32Layer("Conv1D", ("bfloat16",), "why")
    assert every.matches(("Conv1D",)) and every.describe() == "Conv1D"
    assert rule.describe() == "DepthwiseConv2D (stride > 1 or kernel > 3)"


# ------------------------------------------------------------------------------------- the committed measurement
def test_the_committed_measurement_supports_the_rule():
    from amp_backends.backends.cpu import rules
    from amp_backends.backends.cpu.measured import LAYERS, RESULTS_DIR

    doc = json.loads((RESULTS_DIR / LAYERS).read_text(encoding="utf-8"))
    res = doc["results"]
    assert doc["machine_kind"] and doc["command"].startswith("python benchmarks/cpu_layers.py") and doc["date"]
    for case in rules.SLOW_DEPTHWISE:  # kept in float32, faster
        assert res[case + rules.ISLAND]["median"] > res[case + " mixed_bfloat16"]["median"], case
    recurrent = res[rules.RECURRENT + rules.ISLAND]["median"], res[rules.RECURRENT + " mixed_bfloat16"]["median"]
    assert recurrent[0] > recurrent[1]
    fast = rules.FAST_DEPTHWISE  # a 3x3 at stride 1: bfloat16 is faster, the rule leaves it
    assert res[fast + " mixed_bfloat16"]["median"] > res[fast + rules.ISLAND]["median"]
    planned, bf16 = (res[f"{rules.MODEL} {v}"]["median"] for v in (rules.MODEL_VARIANTS[2], "mixed_bfloat16"))
    assert planned > bf16


# ------------------------------------------------------------------------------------- on a real model
tf = pytest.importorskip("tensorflow")


@pytest.fixture
def zen4_plan(registry):
    return plan_of(machine(cpu_of(ZEN4)), registry)


def depthwise_model():
    from conftest import policy

    keras = tf.keras
    with policy("mixed_bfloat16"):
        inp = keras.Input((16, 16, 8))
        h = keras.layers.DepthwiseConv2D(3, strides=2, padding="same", name="dw_strided")(inp)
        h = keras.layers.DepthwiseConv2D(3, padding="same", name="dw_3x3")(h)
        h = keras.layers.DepthwiseConv2D(5, padding="same", name="dw_5x5")(h)
        h = keras.layers.DepthwiseConv2D(3, strides=2, padding="same", dtype="float16", name="dw_user")(h)
        h = keras.layers.Conv2D(16, 1, name="pointwise")(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        out = keras.layers.Dense(4, dtype="float32", name="head")(h)
        return keras.Model(inp, out, name="dw")


def dtypes(model):
    return {layer.name: str(layer.compute_dtype) for layer in model.layers if layer.name.startswith(("dw", "point"))}


def test_prepare_model_sets_the_planned_layers_to_float32_and_leaves_the_rest(zen4_plan):
    import amp_backends

    model = depthwise_model()
    prep = amp_backends.prepare_model(model, zen4_plan)
    assert prep.float32 == ("dw/dw_strided", "dw/dw_5x5") and prep.changed
    assert dtypes(model) == {"dw_strided": "float32", "dw_3x3": "bfloat16", "dw_5x5": "float32",
                             "dw_user": "float16", "pointwise": "bfloat16"}
    assert "float32 (2 layers" in str(prep) and "dw/dw_strided" in str(prep)
    assert prep.to_dict()["float32"] == ["dw/dw_strided", "dw/dw_5x5"]
    again = amp_backends.prepare_model(model, zen4_plan)
    assert again.float32 == prep.float32 and not again.changed  # idempotent: the same layer plan, nothing to change
    out = model(tf.random.normal((2, 16, 16, 8)), training=True)
    assert out.dtype == tf.float32 and bool(tf.reduce_all(tf.math.is_finite(out)))


def test_nothing_changes_under_a_plan_without_float32_layers(registry, zen4_plan):
    import amp_backends

    model = depthwise_model()
    none = plan_of(machine(cpu_of(ZEN4)), registry, float32_layers="none")
    assert amp_backends.prepare_model(model, none).float32 == ()
    assert dtypes(model)["dw_strided"] == "bfloat16"


def test_layers_kept_in_float32_on_request_are_said_requested_not_measured(registry):
    """float32_layers= is the user's list: the preparation said "faster than bfloat16 on this hardware" of it."""
    import amp_backends

    asked = plan_of(machine(cpu_of(ZEN4)), registry, float32_layers="Conv2D")
    prep = amp_backends.prepare_model(depthwise_model(), asked)
    assert prep.float32 == ("dw/pointwise",) and "Conv2D in float32 as requested (float32_layers)" in prep.float32_why
    assert "faster" not in prep.float32_why, prep.float32_why
    measured = amp_backends.prepare_model(depthwise_model(), plan_of(machine(cpu_of(ZEN4)), registry))
    assert "faster than bfloat16 on this hardware" in measured.float32_why and "requested" not in measured.float32_why


def test_the_check_warns_until_the_model_is_prepared(zen4_plan):
    import amp_backends

    model = depthwise_model()
    before = amp_backends.check_model(model, zen4_plan)
    warning = next(f for f in before.findings if f.code == "float32-layers")
    assert warning.severity == "warning" and "prepare_model" in warning.fix
    assert warning.details["layers"] == ["dw/dw_strided", "dw/dw_5x5"]
    amp_backends.prepare_model(model, zen4_plan)
    after = amp_backends.check_model(model, zen4_plan)
    kept = next(f for f in after.findings if f.code == "float32-layers")
    assert kept.severity == "info"
    # the planned float32 layers are not reported as float32 islands or as a model built before the plan
    assert not [f for f in after.findings if f.code in ("policy-mismatch", "float32-compute")
                and f.layer in ("dw/dw_strided", "dw/dw_5x5")]


def test_the_trainer_keeps_the_planned_layers_in_float32_before_its_first_step(zen4_plan, tmp_path):
    import amp_backends

    model = depthwise_model()
    updates = amp_backends.classifier_updates(model, tf.keras.optimizers.SGD(0.01),
                                              tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = amp_backends.Trainer(updates, zen4_plan, batch_size=8, log_every=100, progress=False,
                                   measure_float32=False)
    x = tf.random.normal((16, 16, 16, 8)).numpy()
    y = (tf.range(16) % 4).numpy()
    result = trainer.fit(x, y, epochs=1)
    assert dtypes(model)["dw_strided"] == "float32" and dtypes(model)["dw_3x3"] == "bfloat16"
    assert trainer.layer_plans["dw"].float32 == ("dw/dw_strided", "dw/dw_5x5")
    assert result.steps == 2 and all(v == v for v in result.last_losses.values())


def test_layer_geometry_reads_keras_layers():
    layer = tf.keras.layers.DepthwiseConv2D((5, 3), strides=(2, 1))
    classes, strides, kernel = layer_geometry(layer)
    assert "DepthwiseConv2D" in classes and strides == (2, 1) and kernel == (5, 3)
    assert layer_geometry(tf.keras.layers.Dense(3))[1:] == ((), ())


# ------------------------------------------------------------------------------------- every layer float32, measured
def bn_depthwise_model():
    from conftest import policy

    keras = tf.keras
    with policy("mixed_bfloat16"):
        inp = keras.Input((16, 16, 8))
        h = keras.layers.DepthwiseConv2D(3, strides=2, padding="same", name="dw_strided")(inp)
        h = keras.layers.BatchNormalization(name="bn")(h)
        h = keras.layers.Conv2D(16, 1, activation="relu", name="pointwise")(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        out = keras.layers.Dense(4, dtype="float32", name="head")(h)
        return keras.Model(inp, out, name="bn_dw")


@pytest.mark.parametrize("faster", [True, False])
def test_measuring_keeps_the_faster_and_puts_the_model_state_back(zen4_plan, monkeypatch, faster):
    import amp_backends
    from amp_backends.autotune import layers

    # the timings' verdict, whatever this machine's noise: float32 won every round, or the plan did
    monkeypatch.setattr(layers, "verdict_of", lambda *a: "float32" if faster else "plan")
    model = bn_depthwise_model()
    stats = [v.numpy().copy() for v in model.non_trainable_variables]
    x = tf.random.normal((8, 16, 16, 8)).numpy()
    prep = amp_backends.prepare_model(model, zen4_plan, inputs=x)
    assert prep.float32 == ("bn_dw/dw_strided",) and prep.choice is not None
    assert prep.choice.float32 is faster and prep.choice.plan_rate > 0 and prep.choice.float32_rate > 0
    assert all((a == b.numpy()).all() for a, b in zip(stats, model.non_trainable_variables, strict=True))
    pointwise = model.get_layer("pointwise").compute_dtype
    assert pointwise == ("float32" if faster else "bfloat16")
    assert ("every layer float32" if faster else "kept") in str(prep)
    codes = {f.code: f.severity for f in amp_backends.check_model(model, zen4_plan).findings}
    if faster:  # float32 on purpose: said once, not as a model built before the plan
        assert codes.get("measured-float32") == "info" and "policy-mismatch" not in codes
    else:
        assert "measured-float32" not in codes and codes.get("float32-layers") == "info"


def test_without_a_batch_it_says_how_to_measure_and_refuses_a_forced_measurement(zen4_plan):
    import amp_backends

    model = bn_depthwise_model()
    prep = amp_backends.prepare_model(model, zen4_plan)
    assert prep.choice is None and "give one batch as inputs=" in prep.choice_note
    with pytest.raises(ValueError, match="needs one batch of the model's inputs"):
        amp_backends.prepare_model(model, zen4_plan, inputs=(None, 16, 16, 8), measure_float32=True)
    assert amp_backends.prepare_model(depthwise_model(), zen4_plan, inputs=tf.zeros((2, 16, 16, 8)),
                                      measure_float32=False).choice is None


def test_a_model_without_such_layers_is_not_measured(zen4_plan):
    import amp_backends
    from conftest import policy

    with policy("mixed_bfloat16"):
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4)])
    prep = amp_backends.prepare_model(model, zen4_plan, inputs=tf.zeros((2, 8)))
    assert prep.choice is None and prep.choice_note == "" and not prep.changed
    # it said only "fp8 is off in this plan, nothing changed", nothing of the layer plan
    assert str(prep).startswith("nothing changed: the layer plan keeps no layer in float32 under mixed_bfloat16")
    assert str(prep).splitlines()[1].startswith("fp8 is off in this plan"), str(prep)


def test_the_trainer_measures_once_and_a_resumed_run_follows_the_checkpoint(zen4_plan, monkeypatch, tmp_path):
    import amp_backends
    from amp_backends.autotune import layers

    monkeypatch.setattr(layers, "verdict_of", lambda *a: "float32")
    x = tf.random.normal((16, 16, 16, 8)).numpy()
    y = (tf.range(16) % 4).numpy()

    def trainer(model, **kw):
        updates = amp_backends.classifier_updates(model, tf.keras.optimizers.SGD(0.01),
                                                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return amp_backends.Trainer(updates, zen4_plan, batch_size=8, log_every=100, progress=False,
                                    checkpoint_dir=str(tmp_path / "ckpt"), check_models=False, **kw)

    model = bn_depthwise_model()
    trainer(model).fit(x, y, epochs=1)
    assert model.get_layer("pointwise").compute_dtype == "float32"  # measured: every layer float32

    def no_measuring(*args, **kwargs):
        raise AssertionError("a resumed run follows its checkpoint, without measuring")

    monkeypatch.setattr(layers, "measure", no_measuring)
    again = bn_depthwise_model()
    trainer(again, measure_float32=False).fit(x, y, epochs=2, resume=True)  # the checkpoint's choice wins
    assert again.get_layer("pointwise").compute_dtype == "float32"
    third = bn_depthwise_model()
    trainer(third).fit(x, y, epochs=3, resume=True)  # and is kept in the checkpoints written after a resume
    assert third.get_layer("pointwise").compute_dtype == "float32"
    off = bn_depthwise_model()
    updates = amp_backends.classifier_updates(off, tf.keras.optimizers.SGD(0.01),
                                              tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    amp_backends.Trainer(updates, zen4_plan, batch_size=8, log_every=100, progress=False,
                         measure_float32=False).fit(x, y, epochs=1)
    assert off.get_layer("pointwise").compute_dtype == "bfloat16"
    assert off.get_layer("dw_strided").compute_dtype == "float32"  # the plan's float32 layers all the same


def test_a_measurement_that_fails_puts_the_policies_back(zen4_plan):
    import amp_backends
    from conftest import policy

    class BreaksInFloat32(tf.keras.layers.Layer):
        def call(self, x):
            if self.compute_dtype == "float32":
                raise RuntimeError("this layer cannot run in float32")
            return x

    with policy("mixed_bfloat16"):
        inp = tf.keras.Input((16, 16, 8))
        h = tf.keras.layers.DepthwiseConv2D(3, strides=2, padding="same")(inp)
        h = BreaksInFloat32(name="breaks")(h)
        model = tf.keras.Model(inp, tf.keras.layers.GlobalAveragePooling2D()(h))
    x = tf.zeros((2, 16, 16, 8))
    prep = amp_backends.prepare_model(model, zen4_plan, inputs=x)  # measuring is optional: said, not raised
    assert prep.choice is None and "could not measure" in prep.choice_note and "RuntimeError" in prep.choice_note
    assert model.get_layer("breaks").compute_dtype == "bfloat16"
    with pytest.raises(RuntimeError, match="cannot run in float32"):
        amp_backends.prepare_model(model, zen4_plan, inputs=x, measure_float32=True)
    assert model.get_layer("breaks").compute_dtype == "bfloat16"


def test_a_model_measured_once_is_not_measured_again(zen4_plan, monkeypatch):
    import amp_backends
    from amp_backends.autotune import layers

    monkeypatch.setattr(layers, "verdict_of", lambda *a: "float32")
    model = bn_depthwise_model()
    x = tf.zeros((4, 16, 16, 8))
    first = amp_backends.prepare_model(model, zen4_plan, inputs=x)
    assert first.choice.float32 and first.choice.origin == "measured"

    def no_measuring(*args, **kwargs):
        raise AssertionError("a model measured once on this machine is not measured again")

    monkeypatch.setattr(layers, "measure", no_measuring)
    again = amp_backends.prepare_model(model, zen4_plan, inputs=x)
    assert again.choice.float32 and again.choice.origin == "cached" and not again.changed
    # the same architecture built again (a new process, a reloaded model) gets the same layer plan, unmeasured
    model = bn_depthwise_model()
    rebuilt = amp_backends.prepare_model(model, zen4_plan, inputs=x)
    assert rebuilt.choice.origin == "cached" and len(rebuilt.layer_plan.float32) == len(first.layer_plan.float32)
    assert model.get_layer("pointwise").compute_dtype == "float32"



def test_prepare_model_refuses_what_is_not_a_keras_model_and_an_unbuilt_model_under_a_mixed_plan():
    """It said "nothing changed" for None, a string or a layer, and for a subclassed model not yet built, whose
    softmax head then ran in the plan's low precision."""
    import amp_backends
    from helpers import applied_plan

    plan = applied_plan("mixed_bfloat16", force=True)
    for bad in (None, "model", 42, tf.keras.layers.Dense(3)):
        with pytest.raises(TypeError, match="takes a Keras model.*Received"):
            amp_backends.prepare_model(bad, plan)

    class Net(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden, self.head = tf.keras.layers.Dense(8), tf.keras.layers.Dense(3, activation="softmax")

        def call(self, x):
            return self.head(self.hidden(x))

    with pytest.raises(ValueError, match=r"not built.*Fix: give a few samples to build it on, "
                                         r"prepare_model\(model, \.\.\., inputs=x\[:32\]\)"):
        amp_backends.prepare_model(Net(), plan)
    float32 = applied_plan("float32")
    assert amp_backends.prepare_model(Net(), float32).applied == ()  # nothing to do under float32: accepted
    for flag in ("reset_policies", "skip_small", "measure_float32"):  # "yes" was taken as True
        with pytest.raises(TypeError, match=rf"prepare_model\({flag}=...\) takes True or False.*Received: 'yes'"):
            amp_backends.prepare_model(Net(), float32, **{flag: "yes"})


def test_prepare_model_refuses_the_inputs_the_precision_check_refuses_before_changing_a_layer():
    """``inputs="hello"``, or a batch of 7 features for a model of 4, were accepted in silence (the layer plan
    applied, nothing sized by them), while check_model refused both; and a policy name given as the plan raised
    ``AttributeError: 'str' object has no attribute 'policy'``."""
    import numpy as np

    import amp_backends
    from amp_backends.keras_compat import policy_name
    from helpers import applied_plan

    plan = applied_plan("mixed_bfloat16", force=True)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3, activation="softmax")])
    for bad, error in (("hello", TypeError), (np.zeros((4, 7), "float32"), ValueError)):
        with pytest.raises(error) as prepared:
            amp_backends.prepare_model(model, plan, inputs=bad)
        with pytest.raises(error) as checked:
            amp_backends.check_model(model, plan, inputs=bad)
        assert str(prepared.value) == str(checked.value) and "Fix:" in str(prepared.value)
    assert policy_name(model.layers[-1]) == "mixed_bfloat16"  # refused before the head was set to float32
    with pytest.raises(TypeError, match=r"prepare_model\(model, plan\) takes an amp_backends Plan.*Received: "
                                        r"'mixed_bfloat16'.*Fix: plan = amp_backends.auto_configure\(policy="):
        amp_backends.prepare_model(model, "mixed_bfloat16")
    assert amp_backends.prepare_model(model, plan, inputs=np.zeros((4, 4), "float32")).float32  # a batch it takes


def test_prepare_model_says_a_model_built_before_the_plan_computes_in_float32_and_reset_policies_mends_it():
    """A model built before auto_configure() (float32 layers under a mixed plan) was left all in float32 by
    prepare_model without a word: it trained without the plan's speed (the trainer said so; Keras fit did not)."""
    import warnings

    import numpy as np

    import amp_backends
    from amp_backends.errors import AmpWarning
    from amp_backends.keras_compat import set_global_policy
    from helpers import applied_plan

    set_global_policy("float32")
    early = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(16), tf.keras.layers.Dense(3)])
    plan = applied_plan("mixed_bfloat16", force=True)
    try:
        with pytest.warns(AmpWarning, match=r"computes in float32 under the plan's mixed_bfloat16: it was built "
                                            r"before auto_configure\(\).*Fix: .*reset_policies=True") as said:
            amp_backends.prepare_model(early, plan)
        # a head in float32 is where the layer plan keeps it: 'left as it is' contradicted the report's float32 line
        assert "head is left as it is" not in str(said[0].message)
        with warnings.catch_warnings():
            warnings.simplefilter("error", AmpWarning)  # mended: nothing to say
            mended = amp_backends.prepare_model(early, plan, reset_policies=True)
            assert early.layers[0].compute_dtype == "bfloat16"
            assert early.layers[0](np.ones((2, 4), "float32")).dtype == tf.bfloat16  # (Keras 2: it said so, in
            # float32: its weights were plain float32 variables, which only a layer built under the policy wraps)
            # it said "fp8 is off in this plan, nothing changed" (the reset untold)
            assert str(mended).startswith("reset to mixed_bfloat16 (") and "nothing changed" not in str(mended)
            assert mended.reset and set(mended.reset) <= set(mended.applied)
            built_after = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
            amp_backends.prepare_model(built_after, plan)
    finally:
        set_global_policy("float32")


def test_reset_policies_makes_each_layer_compute_in_the_plan_dtype_and_keeps_its_variables(tmp_path):
    """Keras 2: reset_policies renamed a built model's policies, but its Dense and Conv layers went on computing
    in float32 (plain float32 weights; only add_weight under a mixed policy wraps them to be read in bfloat16).
    Now they compute in the plan's dtype as a model built under it does, Keras's float32 parameters (normalization,
    embedding) stay float32, and the variables are the same: a checkpoint written before the reset restores."""
    import numpy as np

    import amp_backends
    from amp_backends.keras_compat import set_global_policy
    from helpers import applied_plan

    set_global_policy("float32")
    layers = tf.keras.layers
    inputs = tf.keras.Input((6,), dtype="int32")
    x = layers.Embedding(10, 4)(inputs)
    x = layers.Conv1D(8, 3)(x)
    x = layers.LayerNormalization()(layers.BatchNormalization()(x))
    x = layers.Dense(8)(layers.Flatten()(x))
    early = tf.keras.Model(inputs, layers.Dense(3, activation="softmax")(x))
    saved = tf.train.Checkpoint(model=early).write(str(tmp_path / "before"))
    before = [w.numpy() for w in early.weights]
    plan = applied_plan("mixed_bfloat16", force=True)
    try:
        amp_backends.prepare_model(early, plan, reset_policies=True)
        ids = np.array([[1, 2, 3, 4, 5, 6]], "int32")
        assert early.layers[2](early.layers[1](ids)).dtype == tf.bfloat16  # the convolution
        assert early.layers[-2](np.ones((1, 32), "float32")).dtype == tf.bfloat16  # the Dense before the head
        assert early(ids).dtype == tf.float32  # the head, kept in float32 by the layer plan
        assert all(w.dtype == tf.float32 for w in early.weights)  # stored in float32, as under the policy
        for w in early.weights:
            w.assign(tf.zeros_like(w))
        tf.train.Checkpoint(model=early).read(saved).assert_consumed()
        assert all(np.array_equal(a, w.numpy()) for a, w in zip(before, early.weights, strict=True))
        early.compile(optimizer="adam", loss="mse")
        assert np.isfinite(early.fit(np.ones((4, 6), "int32"), np.ones((4, 3)), verbose=0).history["loss"][0])
    finally:
        set_global_policy("float32")


def test_reset_policies_keeps_a_float32_layer_the_model_was_built_with_under_a_mixed_policy(tmp_path):
    """A regression model saved under a mixed policy, ended with Activation('linear', dtype='float32') as the docs
    say: reset_policies set that layer to the plan's policy, and the output became bfloat16 (the check then asked
    for the very layer the reset had undone)."""
    import numpy as np

    import amp_backends
    from conftest import policy
    from helpers import applied_plan

    with policy("mixed_bfloat16"):
        inputs = tf.keras.Input((8,))
        hidden = tf.keras.layers.Dense(1)(tf.keras.layers.Dense(16, activation="relu")(inputs))
        tf.keras.Model(inputs, tf.keras.layers.Activation("linear", dtype="float32", name="out")(hidden)).save(
            tmp_path / "regression.keras")
    try:
        plan = applied_plan("mixed_bfloat16", force=True)
        loaded = tf.keras.models.load_model(tmp_path / "regression.keras")
        prepared = amp_backends.prepare_model(loaded, plan, reset_policies=True)
        assert loaded(np.ones((2, 8), "float32")).dtype == tf.float32
        assert loaded.layers[-1].compute_dtype == "float32" and loaded.layers[1].compute_dtype == "bfloat16"
        assert not any(path.endswith("/out") for path in prepared.reset), prepared.reset
    finally:
        applied_plan("float32")


def test_prepare_model_says_a_model_saved_under_another_plan_computes_in_that_dtype():
    """A model built (or saved) under one mixed policy and prepared under the other or a float32 plan was left as it
    was without a word: its softmax head stayed in the first one's dtype (only a model in float32 was reported)."""
    import warnings

    import amp_backends
    from amp_backends.errors import AmpWarning
    from conftest import policy
    from helpers import applied_plan, mlp

    mixed = applied_plan("mixed_float16", force=True)  # (ITEX on a CPU with avx512_fp16 plans bfloat16 instead)
    saved_under = "mixed_bfloat16" if mixed.policy == "mixed_float16" else "mixed_float16"
    saved_dtype, planned_dtype = saved_under.removeprefix("mixed_"), mixed.policy.removeprefix("mixed_")
    with policy(saved_under):
        saved = mlp(activation="softmax")
    try:
        for plan_policy in (mixed.policy, "float32"):
            plan = applied_plan(plan_policy, force=True)
            with pytest.warns(AmpWarning, match=rf"computes in {saved_dtype} under the plan's {plan_policy}: it was "
                                                r"built before auto_configure\(\) set the dtype policy, or saved under "
                                                r"another plan.*reset_policies=True"):
                amp_backends.prepare_model(saved, plan)
        plan = applied_plan(mixed.policy, force=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error", AmpWarning)  # mended: nothing more to say
            amp_backends.prepare_model(saved, plan, reset_policies=True)
        assert [layer.compute_dtype for layer in saved.layers] == [planned_dtype, "float32"]  # the head in float32
        with policy("float64"), warnings.catch_warnings():  # float64 on purpose: no plan's dtype, nothing to say
            warnings.simplefilter("error", AmpWarning)
            amp_backends.prepare_model(mlp(), applied_plan("float32"))
    finally:
        applied_plan("float32")


@pytest.mark.parametrize("activation", ["tf.nn.softmax", "tf.nn.log_softmax", "tf.math.sigmoid"])
def test_prepare_model_keeps_a_head_with_tensorflows_own_activation_in_float32(activation):
    """Dense(n, activation=tf.nn.softmax) stayed in bfloat16 ("nothing changed"): TensorFlow names its softmax
    softmax_v2, and the head was recognized by name; the precision check reported it as an error."""
    import amp_backends
    from helpers import applied_plan

    plan = applied_plan("mixed_bfloat16", force=True)
    try:
        fn = {"tf.nn.softmax": tf.nn.softmax, "tf.nn.log_softmax": tf.nn.log_softmax,
              "tf.math.sigmoid": tf.math.sigmoid}[activation]
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8),
                                     tf.keras.layers.Dense(3, activation=fn)])
        done = amp_backends.prepare_model(model, plan)
        assert model.layers[-1].compute_dtype == "float32" and len(done.float32) == 1
        codes = {f.code for f in amp_backends.check_model(model, plan).findings}
        assert "final-activation" not in codes
    finally:
        applied_plan("float32")


def test_an_rnn_of_lstm_cells_is_an_lstm_to_the_float32_rules(zen4_plan):
    """keras.layers.RNN(LSTMCell(...)) stayed in bfloat16 where the plan keeps LSTMs in float32, and the check
    said nothing: the rule matched the layer's class (RNN), not its cell's kind."""
    from amp_backends import layer_plan as lp
    from amp_backends.layer_names import kept_in_float32
    from conftest import policy

    lstm_rule = [k for k in zen4_plan.float32_layers if k.layer == "LSTM"]
    assert lstm_rule
    keras = tf.keras
    with policy("mixed_bfloat16"):
        rnn = keras.layers.RNN(keras.layers.LSTMCell(8), name="rnn_lstm")
        stacked = keras.layers.RNN([keras.layers.GRUCell(8), keras.layers.LSTMCell(8)], name="stacked")
        gru = keras.layers.RNN(keras.layers.GRUCell(8), name="rnn_gru")
        inp = keras.Input((5, 4))
        model = keras.Model(inp, keras.layers.Dense(2)(rnn(inp)), name="m")
    assert kept_in_float32(lstm_rule, rnn) and kept_in_float32(lstm_rule, stacked)
    assert not kept_in_float32(lstm_rule, gru)
    assert "LSTM" in layer_geometry(rnn)[0] and "RNN" in layer_geometry(rnn)[0]
    decided = lp.decide(model, zen4_plan, use_cache=False)
    assert "m/rnn_lstm" in decided.float32
    why = {d.path: d.reason for d in decided.decisions}["m/rnn_lstm"]
    assert "LSTM in float32" in why and "Depthwise" not in why  # the kind that keeps it, not every kind
    import amp_backends

    found = {f.code: f for f in amp_backends.check_model(model, zen4_plan).findings}
    assert found["float32-layers"].severity == "warning" and "1 RNN layers" in found["float32-layers"].what
    assert "recurrent loop" in found["float32-layers"].why and "brgconv" not in found["float32-layers"].why


def test_prepare_model_builds_a_subclassed_model_from_its_inputs_as_the_check_does():
    """prepare_model(model, plan, inputs=x) refused a subclassed model not built yet ("not built ... call
    model.build"), which check_model(model, plan, inputs=x) builds from the same inputs."""
    import numpy as np

    import amp_backends
    from helpers import applied_plan

    class Net(tf.keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.hidden, self.head = tf.keras.layers.Dense(8), tf.keras.layers.Dense(3, activation="softmax")

        def call(self, x):
            return self.head(self.hidden(x))

    plan = applied_plan("mixed_bfloat16", force=True)
    try:
        net = Net()
        done = amp_backends.prepare_model(net, plan, inputs=np.zeros((4, 6), "float32"))
        assert net.built and len(done.float32) == 1
        assert net.head.compute_dtype == "float32" and net.hidden.compute_dtype == "bfloat16"
        with pytest.raises(ValueError, match=r"not built.*inputs= builds it where every dimension after the batch"):
            amp_backends.prepare_model(Net(), plan, inputs=(None, None))  # an open dimension builds nothing
    finally:
        applied_plan("float32")


def test_the_troubleshooting_fix_for_output_dtype_is_the_one_that_works():
    """docs/troubleshooting.md told to fix `output-dtype` with prepare_model, which leaves a regression output in
    the plan's precision (it keeps softmax and sigmoid heads in float32 only): the entry now names the fix that
    does, and this follows it."""
    import re
    from pathlib import Path

    import amp_backends
    from helpers import applied_plan

    entry = re.split(r"^### `output-dtype`$", (Path(__file__).parents[1] / "docs" / "troubleshooting.md").read_text(
        encoding="utf-8"), flags=re.M)[1].split("\n### ", 1)[0]
    fix = entry.split("**Fix**:", 1)[1]
    assert 'Activation("linear", dtype="float32")' in fix and "not a regression output" in fix
    plan = applied_plan("mixed_bfloat16", force=True)
    try:
        keras = tf.keras
        inp = keras.Input((4,))
        value = keras.layers.Dense(1, name="value")(keras.layers.Dense(8)(inp))
        model = keras.Model(inp, value)
        amp_backends.prepare_model(model, plan)
        assert "output-dtype" in {f.code for f in amp_backends.check_model(model, plan).findings}  # as documented
        fixed = keras.Model(inp, keras.layers.Activation("linear", dtype="float32")(value))
        assert "output-dtype" not in {f.code for f in amp_backends.check_model(fixed, plan).findings}
    finally:
        applied_plan("float32")
