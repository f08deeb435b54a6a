"""The precision check on models with open dimensions: shapes given by the caller, and what it says without them.

Also the attention rules that need no keras_hub: mask constants that overflow float16, a normalization in
float16, Keras's own attention (which must give neither). Plain tf.keras: runs under Keras 2 and 3.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytestmark = pytest.mark.intel

tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
from amp_backends.prepare import prepare_model  # noqa: E402
from amp_backends.model_check import check_model  # noqa: E402
from amp_backends.model_check import shapes_with_sequence_length  # noqa: E402
from fakes import H100, ZEN4, cpu_of, machine, nvidia  # noqa: E402

K = tf.keras
from conftest import policy  # noqa: E402
L = K.layers
SEQ = 128


@pytest.fixture(scope="module")
def h100():
    return amp_backends.plan_for(machine(nvidia(H100)))


def text_model():
    """Token ids of any length -> embedding -> two Dense layers per position -> pooled -> 2 classes."""
    with policy("mixed_float16"):
        ids = K.Input((None,), dtype="int32", name="ids")
        h = L.Embedding(1000, 64)(ids)
        h = L.Dense(256, activation="relu", name="up")(h)
        h = L.Dense(64, name="down")(h)
        h = L.GlobalAveragePooling1D()(h)
        return K.Model(ids, L.Dense(2, dtype="float32", name="head")(h), name="text")


def test_without_inputs_an_unsized_model_says_so_first_and_gives_no_shares(h100):
    result = check_model(text_model(), plan=h100)
    assert not result.sized and result.summary.unknown_flops_ops >= 2
    assert "could not size enough of the model" in result.headline() and "inputs=" in result.headline()
    first = result.findings[0]
    assert first.code == "unsized-model" and first.severity == "warning" and "--seq-len" in first.fix
    assert all(f.flops_share is None for f in result.findings)  # no share over part of the graph
    assert result.summary.dtype_shares == {} and result.summary.reduced_precision_share is None
    text = result.render(200)
    assert "no shares are given" in text and "100.0%" not in text
    data = result.to_dict()
    assert data["summary"]["sized"] is False and data["findings"][0]["code"] == "unsized-model"


@pytest.mark.parametrize("form", ["array", "tensor", "shape", "spec", "dataset", "x_y_tuple", "sequence_length"])
def test_inputs_in_every_form_size_the_model(h100, form):
    model = text_model()
    x = np.zeros((32, SEQ), np.int32)
    given = {
        "array": x,
        "tensor": tf.constant(x),
        "shape": (32, SEQ),
        "spec": tf.TensorSpec((32, SEQ), tf.int32),
        "dataset": tf.data.Dataset.from_tensor_slices((x, np.zeros(32))).batch(32, drop_remainder=True),
        "x_y_tuple": (x, np.zeros(32)),
        "sequence_length": shapes_with_sequence_length(model, SEQ, 32),
    }[form]
    result = check_model(model, plan=h100, inputs=given)
    assert result.sized and result.summary.unknown_flops_ops == 0
    assert "unsized-model" not in [f.code for f in result.findings]
    assert result.batch_size == 32  # the inputs' batch is the batch size
    # per sample: embedding 64 -> 256 -> 64 at each of the 128 positions, then the 64 -> 2 head
    assert result.summary.flops_per_image == pytest.approx(2 * SEQ * (64 * 256 + 256 * 64) + 2 * 64 * 2)
    assert sum(result.summary.dtype_shares.values()) == pytest.approx(1.0)


def test_batch_size_fills_an_open_batch_and_wins_over_the_inputs(h100):
    model = text_model()
    assert check_model(model, plan=h100, inputs=(None, SEQ), batch_size=16).batch_size == 16
    assert check_model(model, plan=h100, inputs=np.zeros((4, SEQ), np.int32), batch_size=64).batch_size == 64
    assert check_model(model, plan=h100, inputs=(None, SEQ)).batch_size is None


def test_shapes_with_sequence_length_fills_only_open_dimensions():
    with policy("float32"):
        a, b = K.Input((None,), dtype="int32", name="a"), K.Input((None, 3), name="b")
        model = K.Model({"a": a, "b": b}, L.Dense(2)(b))
    assert shapes_with_sequence_length(model, 50) == {"a": (None, 50), "b": (None, 50, 3)}
    with pytest.raises(ValueError, match="positive int"):
        shapes_with_sequence_length(model, 0)


@pytest.mark.parametrize("inputs,error,match", [
    ((32, SEQ, 4), ValueError, r"rank 2.*Fix"),
    ("ids", TypeError, "inputs= takes"),
    ({"other": (None, SEQ)}, ValueError, "does not match"),
])
def test_wrong_inputs_say_what_was_expected(h100, inputs, error, match):
    with pytest.raises(error, match=match):
        check_model(text_model(), plan=h100, inputs=inputs)


def test_fixed_dimensions_must_agree(h100):
    with policy("float32"):
        model = K.Sequential([K.Input((28, 28)), L.Flatten(), L.Dense(10)], name="fixed")
    with pytest.raises(ValueError, match="dimension 1 is 32, the model's is 28"):
        check_model(model, plan=h100, inputs=(None, 32, 28))
    assert check_model(model, plan=h100, inputs=np.zeros((8, 28, 28), np.float64)).sized


def test_a_batch_of_strings_for_a_model_of_numbers_is_refused_and_the_other_way_round(h100):
    """check_model(model, inputs=<raw text>) on a model that takes numbers said "No findings": the model would
    fail on that batch, as the trainer says before its first step."""
    with policy("float32"):
        numbers = K.Sequential([K.Input((4,)), L.Dense(8)], name="numbers")
        text = K.Sequential([K.Input((1,), dtype="string"), L.StringLookup(vocabulary=["a", "b"]), L.Dense(8)],
                            name="text")
    with pytest.raises(ValueError, match=r"gives strings \(string\) to a model input that takes numbers "
                                         r"\(float32\).*Fix: "):
        check_model(numbers, plan=h100, inputs=np.array([["a", "b", "c", "d"]] * 8))
    with pytest.raises(ValueError, match=r"gives numbers \(float32\) to a model input that takes strings.*Fix: "):
        check_model(text, plan=h100, inputs=np.zeros((8, 1), np.float32))
    assert check_model(numbers, plan=h100, inputs=np.zeros((8, 4), np.int64)).sized  # numbers: converted by Keras


def test_a_dict_model_takes_a_dict_batch_with_extra_keys(h100):
    with policy("mixed_float16"):
        a, b = K.Input((None,), dtype="int32", name="a"), K.Input((None, 8), name="b")
        h = L.Dense(32)(L.Embedding(100, 32)(a)) + L.Dense(32)(b)
        model = K.Model({"a": a, "b": b}, L.Dense(1, dtype="float32")(L.GlobalAveragePooling1D()(h)), name="two")
    batch = {"a": np.zeros((8, 20), np.int32), "b": np.zeros((8, 20, 8), np.float32), "label": np.zeros(8)}
    result = check_model(model, plan=h100, inputs=batch)
    assert result.sized and result.summary.unknown_flops_ops == 0 and result.batch_size == 8
    with pytest.raises(ValueError, match=r"lacks the model 'two''s input\(s\) \['b'\]"):
        check_model(model, plan=h100, inputs={"a": (None, 20)})


def test_fp8_preparation_is_sized_by_inputs(h100):
    """Without inputs the rows are unknown and the reason says how to size them; with inputs every layer is judged."""
    fp8 = dataclasses.replace(h100, fp8=True)
    with policy("mixed_float16"):
        ids = K.Input((None,), dtype="int32")
        h = L.Dense(2048, name="first")(L.Embedding(1000, 64)(ids))
        h = L.Dense(512, name="narrow")(L.Dense(2048, name="big")(h))  # narrow: input features 2048 > 1024
        h = L.Dense(256, name="small")(h)
        model = K.Model(ids, L.Dense(2, dtype="float32", name="head")(L.GlobalAveragePooling1D()(h)), name="lm")
    unsized = dict(check_model(model, plan=fp8).fp8_ineligible_layers)
    assert "unknown" in unsized["lm/big"] and "inputs=" in unsized["lm/big"]
    result = check_model(model, plan=fp8, inputs=(None, SEQ), batch_size=8)
    assert result.fp8_eligible_layers == ("lm/big", "lm/narrow")
    why = dict(result.fp8_ineligible_layers)
    assert why["lm/small"].startswith("too small to gain from float8 (units 256, input features 512")
    assert why["lm/first"].startswith("the first layer") and why["lm/head"].startswith("the last layer")
    assert [layer.path for layer in result.fp8_layers] == ["lm/first", "lm/big", "lm/narrow", "lm/small", "lm/head"]


def test_prepare_model_lists_every_dense_layer_with_its_reason(h100, monkeypatch):
    """Keras 3.3+ only (float8 layers); the decision, not the training: nothing is quantized on this plan."""
    fp8 = dataclasses.replace(h100, fp8=True)
    model = text_model()
    prep = prepare_model(model, fp8, inputs=(None, SEQ))
    if "nothing changed" in prep.note:
        pytest.skip(f"this Keras has no float8 layers: {prep.note}")
    assert not prep.changed and [path for path, _, _ in prep.layers] == ["text/up", "text/down", "text/head"]
    assert "too small" in dict(prep.skipped)["text/down"]
    assert "no layer is eligible" in prep.note


# -- attention without keras_hub -----------------------------------------------------------------------------

class AdditiveMaskSoftmax(L.Layer):
    """The classic hand-written mask: scores + (1 - keep) * -1e9, in the layer's compute dtype."""

    def __init__(self, constant="python", **kwargs):
        super().__init__(**kwargs)
        self.constant = constant

    def call(self, scores, keep):
        big = -1e9 if self.constant == "python" else tf.cast(tf.constant(tf.float32.min), scores.dtype)
        return tf.nn.softmax(scores + (1.0 - tf.cast(keep, scores.dtype)) * big)


def masked_model(constant, policy_name):
    with policy(policy_name):
        x, keep = K.Input((8, 16)), K.Input((8, 16))
        s = AdditiveMaskSoftmax(constant, name="masked_softmax")(L.Dense(16)(x), keep)
        return K.Model([x, keep], L.Dense(4, dtype="float32")(L.Flatten()(s)), name="masked")


@pytest.mark.parametrize("constant,policy_name,flagged", [
    ("python", "mixed_float16", True),  # -1e9 is -inf in float16
    ("float32_min", "mixed_float16", True),
    ("python", "mixed_bfloat16", False),  # -1e9 fits bfloat16's range
    ("float32_min", "mixed_bfloat16", True),  # float32's min rounds to -inf in bfloat16
])
def test_mask_constants_beyond_the_reduced_range_are_errors(h100, constant, policy_name, flagged):
    result = check_model(masked_model(constant, policy_name), plan=h100)
    found = [f for f in result.findings if f.code == "mask-overflow"]
    assert bool(found) is flagged
    if flagged:
        (f,) = found
        assert f.severity == "error" and f.layer == "masked/masked_softmax" and "NaN" in f.why
        assert f.details["dtype"] == policy_name.split("_")[1] and "-0.7 * scores.dtype.max" in f.fix


class NumberMaskSoftmax(L.Layer):
    """scores + (1 - keep) * <a Python/NumPy number>: TensorFlow writes the number in the scores' dtype."""

    def __init__(self, number, **kwargs):
        super().__init__(**kwargs)
        self.number = number

    def call(self, scores, keep):
        return tf.nn.softmax(scores + (1.0 - tf.cast(keep, scores.dtype)) * self.number)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # TensorFlow writing the number, as it warns
@pytest.mark.parametrize("number", [float(np.finfo(np.float32).min), tf.float32.min], ids=["np_finfo", "tf_float32"])
@pytest.mark.parametrize("policy_name", ["mixed_bfloat16", "mixed_float16"])
def test_a_float32_min_number_written_in_the_compute_dtype_is_an_error_in_bfloat16_too(h100, number, policy_name):
    """float32.min as a number is written as a bfloat16 constant, -inf already (not a float32 one cast later):
    the check read only NumPy's own float types and missed it. The model really gives NaN, kept rows too."""
    plan = amp_backends.plan_for(machine(cpu_of(ZEN4))) if policy_name == "mixed_bfloat16" else h100
    assert plan.policy == policy_name
    with policy(policy_name):
        x, keep = K.Input((8, 16)), K.Input((8, 16))
        s = NumberMaskSoftmax(number, name="masked_softmax")(L.Dense(16)(x), keep)
        model = K.Model([x, keep], L.Dense(4, dtype="float32")(L.Flatten()(s)), name="masked")
    keep_rows = np.ones((2, 8, 16), np.float32)
    keep_rows[0, :, 8:] = 0  # half of each row masked
    keep_rows[1] = 0  # every position masked
    out = model([np.random.default_rng(0).normal(size=(2, 8, 16)).astype(np.float32), keep_rows]).numpy()
    assert np.isnan(out).all()  # 0 * -inf at the kept positions: both samples are NaN
    (f,) = [f for f in check_model(model, plan=plan, batch_size=8).findings if f.code == "mask-overflow"]
    dtype = policy_name.split("_")[1]
    assert f.severity == "error" and f.layer == "masked/masked_softmax" and f.details["dtype"] == dtype
    assert f"written as -inf in {dtype}" in f.what and "0 * -inf" in f.why


def test_a_mask_cast_after_its_float32_math_is_a_warning(h100):
    """(1 - keep) * -1e9 in float32, then cast: kept positions are 0, masked ones -inf (NaN on fully masked rows)."""

    class CastAfter(L.Layer):
        def call(self, scores, keep):
            adder = tf.cast((1.0 - tf.cast(keep, tf.float32)) * -1e9, scores.dtype)
            return tf.nn.softmax(scores + adder)

    with policy("mixed_float16"):
        x, keep = K.Input((8, 16)), K.Input((8, 16))
        s = CastAfter(name="late_cast")(L.Dense(16)(x), keep)
        model = K.Model([x, keep], L.Dense(4, dtype="float32")(L.Flatten()(s)), name="late")
    (f,) = [f for f in check_model(model, plan=h100).findings if f.code == "mask-overflow"]
    assert f.severity == "warning" and "every position masked" in f.why and "0 * -inf" not in f.why
    assert "written in float32, cast to float16" in f.what


def test_keras_attention_masks_and_layer_norm_are_not_reported(h100):
    with policy("mixed_float16"):
        x, mask = K.Input((16, 64)), K.Input((16, 16), dtype="bool")
        h = L.MultiHeadAttention(num_heads=2, key_dim=32, dropout=0.1)(x, x, attention_mask=mask)
        h = L.LayerNormalization()(L.Add()([h, x]))  # (Keras 2 adds no float16 to float32 with +)
        model = K.Model([x, mask], L.Dense(2, dtype="float32")(L.Flatten()(h)), name="attn")
    result = check_model(model, plan=h100, batch_size=8)
    codes = [f.code for f in result.findings]
    assert "mask-overflow" not in codes and "layernorm-precision" not in codes
    (softmax,) = [f for f in result.findings if f.code == "attention-softmax"]
    assert softmax.severity == "info" and softmax.details["dtype"] == "float16"


def test_a_softmax_head_inside_time_distributed_is_the_output_not_attention(h100):
    """Keras 3 runs TimeDistributed's layer once per time step (the output's producer is the stack, not the
    softmax): its softmax head was reported as 'attention's probabilities' beside the output's own warning."""
    with policy("mixed_float16"):
        x = K.Input((5, 8))
        model = K.Model(x, L.TimeDistributed(L.Dense(4, activation="softmax"))(L.Dense(16)(x)), name="tagger")
    codes = [f.code for f in check_model(model, plan=h100, batch_size=8).findings]
    assert "attention-softmax" not in codes and {"output-dtype", "final-activation"} & set(codes), codes


class HalfLayerNorm(L.Layer):
    """A hand-written layer norm whose mean and variance run in the compute dtype."""

    def call(self, x):
        mean = tf.reduce_mean(x, -1, keepdims=True)
        var = tf.reduce_mean(tf.math.squared_difference(x, mean), -1, keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-3)


def test_a_normalization_in_float16_is_a_warning(h100):
    with policy("mixed_float16"):
        x = K.Input((16, 64))
        h = HalfLayerNorm(name="norm")(L.Dense(64)(x))
        model = K.Model(x, L.Dense(2, dtype="float32")(L.Flatten()(h)), name="ln")
    (f,) = [f for f in check_model(model, plan=h100, batch_size=8).findings if f.code == "layernorm-precision"]
    assert f.severity == "warning" and f.layer == "ln/norm" and "LayerNormalization" in f.fix


def test_inputs_of_another_batch_than_a_fixed_one_are_refused(h100):
    with policy("float32"):
        model = K.Sequential([K.Input((4,), batch_size=16), L.Dense(8)], name="fixed_batch")
    assert check_model(model, plan=h100, inputs=(None, 4)).batch_size == 16
    with pytest.raises(ValueError, match=r"fixed batch size of 16, but inputs= of batch 8 was given"):
        check_model(model, plan=h100, inputs=np.zeros((8, 4), np.float32))


def test_a_dict_of_inputs_for_a_model_that_lists_them_is_matched_by_name():
    """A functional model built on [ids, feat] takes {"ids": ..., "feat": ...} as Keras does; the check used to
    match the dict in sorted key order (feat first) and refuse a batch Keras accepts."""
    ids = tf.keras.Input((None,), name="ids", dtype="int32")
    feat = tf.keras.Input((5,), name="feat")
    pooled = tf.keras.layers.GlobalAveragePooling1D()(tf.keras.layers.Embedding(100, 16)(ids))
    model = tf.keras.Model([ids, feat], tf.keras.layers.Dense(2)(tf.keras.layers.Concatenate()([pooled, feat])))
    batch = {"ids": np.zeros((4, 12), "int32"), "feat": np.zeros((4, 5), "float32")}
    model(batch)  # (Keras takes it)
    result = check_model(model, amp_backends.plan_for(environ={}), inputs=batch)
    assert result.batch_size == 4
    with pytest.raises(ValueError, match=r"lacks the model '\w+''s input\(s\) \['ids'\].*'idz'"):
        check_model(model, amp_backends.plan_for(environ={}), inputs={"idz": batch["ids"], "feat": batch["feat"]})
