"""One precision decision per layer: the layer plan decided, applied, measured reproducibly, kept and compared.

Decisions are checked on fake hardware (a Zen 4-like CPU plan with AVX512-BF16 and no AMX, whose plan keeps
strided depthwise convolutions in float32) and for real with TensorFlow on this machine. The timing harness and
the verdict are checked in tests/autotune/.
"""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")
pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]


@pytest.fixture
def zen4_plan(registry):
    from fakes import ZEN4, cpu_of, machine, plan_of

    return plan_of(machine(cpu_of(ZEN4)), registry)


def keras3() -> bool:
    return str(getattr(tf.keras, "__version__", "2")).startswith("3")


def dw_model(name="dw", head="softmax"):
    from conftest import policy

    keras = tf.keras
    with policy("mixed_bfloat16"):
        inp = keras.Input((16, 16, 8))
        h = keras.layers.DepthwiseConv2D(3, strides=2, padding="same", name="dw_strided")(inp)
        h = keras.layers.Conv2D(32, 1, activation="relu", name="pointwise")(h)
        h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
        out = keras.layers.Dense(4, activation=head, name="predictions")(h)
        return keras.Model(inp, out, name=name)


def test_the_layer_plan_names_each_layer_with_its_reason_and_apply_is_the_one_setter(zen4_plan):
    from amp_backends import layer_plan as lp

    model = dw_model()
    decided = lp.decide(model, zen4_plan)
    assert decided.float32 == ("dw/dw_strided", "dw/predictions")
    reasons = {d.path: (d.source, d.reason) for d in decided.decisions}
    assert reasons["dw/dw_strided"][0] == lp.RULE and "DepthwiseConv2D" in reasons["dw/dw_strided"][1]
    assert reasons["dw/predictions"][0] == lp.HEAD and "softmax" in reasons["dw/predictions"][1]
    assert model.get_layer("dw_strided").compute_dtype == "bfloat16"  # deciding changes nothing
    assert lp.apply(model, decided) == ("dw/dw_strided", "dw/predictions")
    assert lp.apply(model, decided) == ()  # applying again changes nothing
    assert model.get_layer("pointwise").compute_dtype == "bfloat16"
    assert lp.LayerPlan.from_dict(decided.to_dict()) == decided
    with pytest.raises(Exception, match="does not have: dw/nope"):
        lp.apply(model, lp.LayerPlan("dw", "mixed_bfloat16", (lp.LayerDecision("dw/nope", "float32", "", ""),)))


@pytest.mark.parametrize("head", ["softmax", "sigmoid"])
def test_a_classifier_head_in_bfloat16_is_set_to_float32_and_the_check_has_nothing_to_say(zen4_plan, head):
    import amp_backends

    model = dw_model(head=head)
    before = {f.code for f in amp_backends.check_model(model, zen4_plan, batch_size=8).findings}
    assert "final-activation" in before  # an unprepared classifier: the check's error, with prepare_model as fix
    prep = amp_backends.prepare_model(model, zen4_plan)
    assert "dw/predictions" in prep.float32 and head in prep.float32_why
    assert model.get_layer("predictions").compute_dtype == "float32"
    after = amp_backends.check_model(model, zen4_plan, batch_size=8).findings
    assert not [f for f in after if f.code in ("final-activation", "output-dtype") or f.layer == "dw/predictions"]


def test_a_keras_applications_classifier_is_prepared_to_a_float32_softmax(zen4_plan):
    import amp_backends
    from conftest import policy

    with policy("mixed_bfloat16"):
        model = tf.keras.applications.MobileNetV3Small(input_shape=(32, 32, 3), weights=None, classes=5,
                                                       include_preprocessing=False)
    errors = [f.code for f in amp_backends.check_model(model, zen4_plan, batch_size=8).findings
              if f.severity == "error"]
    assert "final-activation" in errors
    prep = amp_backends.prepare_model(model, zen4_plan)
    heads = [d for d in prep.layer_plan.decisions if d.source == "head"]
    assert len(heads) == 1 and model.get_layer(heads[0].path.split("/")[-1]).compute_dtype == "float32"
    codes = {f.code for f in amp_backends.check_model(model, zen4_plan, batch_size=8).findings}
    assert "final-activation" not in codes and "output-dtype" not in codes


def test_the_same_model_gets_the_same_measured_layer_plan_ten_times(zen4_plan, monkeypatch):
    import amp_backends
    from amp_backends.autotune import layers

    calls = []
    real = layers.measure

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(layers, "measure", counted)
    x = tf.random.normal((8, 16, 16, 8)).numpy()
    answers = set()
    for _ in range(10):  # ten runs of one script: each builds the model anew and prepares it
        prep = amp_backends.prepare_model(dw_model(), zen4_plan, inputs=x)
        answers.add((prep.choice.verdict, prep.layer_plan.all_float32, len(prep.layer_plan.float32)))
    assert len(answers) == 1 and len(calls) == 1  # measured once, then read from the cache


def test_a_saved_reloaded_or_cloned_model_keeps_its_measured_layer_plan(zen4_plan, monkeypatch, tmp_path):
    if not keras3():
        pytest.skip("Keras 2 saves no per-layer dtype policy in a .keras file's config")
    import amp_backends
    from amp_backends.autotune import layers

    monkeypatch.setattr(layers, "verdict_of", lambda *a: "float32")  # this model measured faster in float32
    model = dw_model()
    prep = amp_backends.prepare_model(model, zen4_plan, inputs=tf.zeros((4, 16, 16, 8)))
    assert prep.layer_plan.all_float32
    path = tmp_path / "m.keras"
    model.save(path)
    for other in (tf.keras.models.load_model(path), tf.keras.models.clone_model(model)):
        codes = {f.code: f.severity for f in amp_backends.check_model(other, zen4_plan, batch_size=8).findings}
        assert "policy-mismatch" not in codes and codes.get("measured-float32") == "info"


def test_without_its_cache_a_reloaded_all_float32_model_is_told_how_to_get_its_plan_back(zen4_plan, monkeypatch,
                                                                                         tmp_path):
    if not keras3():
        pytest.skip("Keras 2 saves no per-layer dtype policy in a .keras file's config")
    import amp_backends
    from amp_backends.autotune import layers

    monkeypatch.setattr(layers, "verdict_of", lambda *a: "float32")
    model = dw_model()
    amp_backends.prepare_model(model, zen4_plan, inputs=tf.zeros((4, 16, 16, 8)))
    model.save(tmp_path / "m.keras")
    monkeypatch.setenv("AMP_CACHE_DIR", str(tmp_path / "another-machine"))
    reloaded = tf.keras.models.load_model(tmp_path / "m.keras")
    (finding,) = [f for f in amp_backends.check_model(reloaded, zen4_plan, batch_size=8).findings
                  if f.code == "policy-mismatch"]
    assert "prepare_model(model, plan, inputs=<one batch>)" in finding.fix


def test_the_trainer_checkpoints_the_layer_plan_and_a_resume_applies_it(zen4_plan, monkeypatch, tmp_path):
    import amp_backends
    from amp_backends.autotune import layers

    monkeypatch.setattr(layers, "verdict_of", lambda *a: "float32")
    x = tf.random.normal((16, 16, 16, 8)).numpy()
    y = (tf.range(16) % 4).numpy()

    def run(epochs, resume):
        model = dw_model(head=None)
        updates = amp_backends.classifier_updates(model, tf.keras.optimizers.SGD(0.01),
                                                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        trainer = amp_backends.Trainer(updates, zen4_plan, batch_size=8, log_every=100, progress=False,
                                       checkpoint_dir=str(tmp_path / "ckpt"), check_models=False)
        trainer.fit(x, y, epochs=epochs, resume=resume)
        return model, trainer

    model, trainer = run(1, False)
    assert trainer.layer_plans["dw"].all_float32
    monkeypatch.setenv("AMP_CACHE_DIR", str(tmp_path / "empty"))  # nothing cached: the checkpoint decides
    monkeypatch.setattr(layers, "verdict_of", lambda *a: "plan")
    again, resumed = run(2, True)
    assert resumed.layer_plans["dw"].measurement.origin == "checkpoint"
    assert again.get_layer("pointwise").compute_dtype == "float32"


def test_plan_facts_are_read_from_data_never_parsed_back_out_of_warnings(zen4_plan):
    import dataclasses

    from amp_backends.fp8 import fp8_forced
    from amp_backends.model_check.target import EMULATED, NATIVE, policy_support

    forced = dataclasses.replace(zen4_plan, fp8=True, warnings=(), honoured={"fp8": "emulated"})
    assert fp8_forced(forced)
    worded = dataclasses.replace(zen4_plan, fp8=True, honoured={},
                                 warnings=("fp8=on (from argument) honoured because force is on, although it is slow",))
    assert not fp8_forced(worded)  # a sentence is no fact
    bare = dataclasses.replace(zen4_plan, assessment=None, honoured={"policy": "emulated"}, warnings=())
    assert policy_support(bare, bare.policy)[0] == EMULATED
    assert policy_support(dataclasses.replace(bare, honoured={}), bare.policy)[0] == NATIVE


def test_a_softmax_head_inside_a_wrapper_is_kept_in_float32_with_the_layer_it_wraps(zen4_plan):
    """A TimeDistributed(Dense(softmax)) output (a tagger's) was no head: left in bfloat16 ("nothing changed"), and
    the check's final-activation error followed on Keras 2, where the wrapper's policy alone leaves its Dense as it
    was."""
    import numpy as np

    from amp_backends import layer_plan as lp
    from conftest import policy

    keras = tf.keras
    with policy("mixed_bfloat16"):
        model = keras.Sequential([keras.Input((5, 4)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.TimeDistributed(keras.layers.Dense(3, activation="softmax"),
                                                               name="tags")], name="tagger")
    decided = lp.decide(model, zen4_plan)
    assert decided.float32 == ("tagger/tags",) and "softmax" in decided.decisions[0].reason
    lp.apply(model, decided)
    assert model(np.ones((2, 5, 4), "float32")).dtype == tf.float32
    assert model.get_layer("tags").layer.compute_dtype == "float32"
