"""The precision check: the tutorials' models, models built to break each rule, one it has not seen, the CLI.

GPU rules run here on plans made for fake hardware (an H100, an A100, a Sapphire Rapids CPU): the check
judges a model for the plan's device, wherever it runs.
"""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap

import numpy as np
import pytest
from schema_check import assert_valid

pytestmark = pytest.mark.intel

tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
import amp_backends.errors  # noqa: E402
from amp_backends.model_check import ModelCheck, check_model  # noqa: E402
from amp_backends.commands.check_command import check_command, parse_input_shape  # noqa: E402
from amp_backends.model_check.target import make_target  # noqa: E402
from amp_backends.models import gan_discriminator, gan_generator, mnist_cnn  # noqa: E402
from fakes import A100, AMD_HERE, H100, SAPPHIRE_RAPIDS, ZEN4, cpu_of, machine, nvidia  # noqa: E402

K = tf.keras
from conftest import policy  # noqa: E402
L = K.layers
KERAS3 = int(str(getattr(K, "__version__", "2")).split(".")[0] or 2) >= 3


def build(factory, name="mixed_float16"):
    with policy(name):
        return factory()


@pytest.fixture(scope="module")
def h100():
    return amp_backends.plan_for(machine(nvidia(H100)))


@pytest.fixture(scope="module")
def cpu_fp32():
    """The plan for a CPU without bf16 instructions (an AVX2 AMD EPYC): float32, no matrix units."""
    return amp_backends.plan_for(machine(cpu_of(AMD_HERE)))


def codes(result: ModelCheck, severity: str | None = None) -> list[str]:
    return [f.code for f in result.findings if severity is None or f.severity == severity]


def by_code(result: ModelCheck, code: str):
    return [f for f in result.findings if f.code == code]


def bad_sizes_generator():
    """The GAN tutorial's "bad sizes" generator: widths 63/31/7 and Dense 7*7*63 instead of 64/32/8, 7*7*64."""
    return K.Sequential([
        K.Input((100,)), L.Dense(7 * 7 * 63), L.Reshape((7, 7, 63)), L.BatchNormalization(),
        L.Conv2D(63, 5, padding="same", activation="tanh"), L.UpSampling2D(2), L.BatchNormalization(),
        L.Conv2D(31, 5, padding="same", activation="tanh"), L.UpSampling2D(2), L.BatchNormalization(),
        L.Conv2D(7, 5, padding="same", activation="tanh"), L.BatchNormalization(),
        L.Conv2D(1, 5, padding="same", activation="sigmoid", dtype="float32"),
    ], name="bad_sizes_generator")


class CastToFloat32Dense(L.Layer):
    """A custom layer that computes its matmul in float32 whatever the policy: the kind of layer the graph reveals."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(name="w", shape=(int(input_shape[-1]), self.units))

    def call(self, x):
        y = tf.matmul(tf.cast(x, tf.float32), tf.cast(self.w, tf.float32))
        return tf.cast(y, self.compute_dtype)


# -- the tutorials' models -------------------------------------------------------------------------------------

def test_mnist_cnn_on_h100_gives_only_the_expected_infos(h100):
    result = check_model(build(mnist_cnn), plan=h100, batch_size=1024)
    assert codes(result, "error") == [] and codes(result, "warning") == []
    shapes = {f.details["dims"].get("input channels") or f.details["dims"].get("units"): f
              for f in by_code(result, "tensor-core-shape")}
    assert set(shapes) == {1, 10}  # the one-channel first convolution, the 10-way output
    assert all("expected" in f.what for f in shapes.values())
    # the unit named apart from the verb: "the Acme MXU run" read wrong for a vendor's unit of one name
    assert all(f.why.startswith("on the ") and "Tensor Cores, " in f.why and " run at full efficiency only on " in f.why
               for f in shapes.values()), [f.why for f in shapes.values()]
    # the float32 softmax output Dense is the layer plan's classifier head: as planned, nothing to report
    assert by_code(result, "float32-compute") == []
    assert len(result.findings) == 2
    s = result.summary
    assert s.flops_per_image == pytest.approx(2 * (26 * 26 * 9 * 32 + 24 * 24 * 9 * 32 * 64 + 9216 * 128 + 1280))
    assert s.reduced_precision_share > 0.999 and 0.95 < s.eligible_share < 0.99
    assert result.headline().endswith(", batch 1024")


def test_a_check_without_a_batch_says_the_batch_it_traced_at(h100):
    """Its findings and errors show shapes at the batch it traced; the headline said only "batch not given"."""
    result = check_model(build(mnist_cnn), plan=h100)
    assert result.headline().endswith(", batch not given (traced at 8)"), result.headline()


def test_gan_discriminator_on_h100(h100):
    result = check_model(build(gan_discriminator), plan=h100, batch_size=4096)
    assert codes(result, "error") == [] and codes(result, "warning") == []
    assert sorted(codes(result)) == ["float32-compute", "tensor-core-shape", "tensor-core-shape"]


def test_gan_generator_on_h100_flags_the_upsampling(h100):
    result = check_model(build(gan_generator), plan=h100, batch_size=4096)
    assert codes(result, "error") == []
    slow = by_code(result, "slow-op")
    assert len(slow) == 2 and all(f.severity == "warning" for f in slow)
    assert all(0.05 <= f.details["traffic_share"] < 0.5 for f in slow)
    assert [f.code for f in result.findings if f.severity == "warning"] == ["slow-op", "slow-op"]
    (noise,) = [f for f in by_code(result, "tensor-core-shape") if "input features" in f.details["dims"]]
    assert noise.severity == "info" and "104" in noise.fix  # the noise vector's size is a choice


def test_bad_sizes_generator_is_flagged_with_its_flop_share(h100):
    good = check_model(build(gan_generator), plan=h100, batch_size=4096)
    bad = check_model(build(bad_sizes_generator), plan=h100, batch_size=4090)
    warned = {f.layer.split("/")[-1]: f for f in bad.findings
              if f.code == "tensor-core-shape" and f.severity == "warning"}
    dims = sorted(sorted(v for k, v in f.details["dims"].items() if k not in f.details["expected"])
                  for f in warned.values())
    assert dims == [[7, 31], [31, 63], [63, 63], [3087]]  # the Dense's 100 noise inputs are expected
    assert sum(f.flops_share for f in warned.values()) > 0.95
    (batch,) = by_code(bad, "batch-size")
    assert batch.severity == "warning" and "4096" in batch.fix and "4090" in batch.what
    assert bad.summary.eligible_share < 0.05 < good.summary.eligible_share - 0.9
    text = str(bad)
    assert "63" in text and "4090" in text and "warning" in text
    lines = bad.log_lines()
    assert len(lines) == 1 + len(bad.findings) + len(bad.summary_lines()) and lines[1].startswith("warning: ")


def test_tutorial_models_on_a_float32_cpu_plan_give_nothing(cpu_fp32):
    for factory in (mnist_cnn, gan_discriminator, gan_generator):
        result = check_model(build(factory, "float32"), plan=cpu_fp32, batch_size=4090)
        assert result.findings == (), result
        assert result.summary.eligible_share is None and result.summary.reduced_precision_share == 0
        assert "not checked" in str(result)


def test_this_machines_plan_is_used_when_none_is_given():
    model = build(mnist_cnn, "float32")
    before = K.mixed_precision.global_policy().name
    result = check_model(model)
    assert K.mixed_precision.global_policy().name == before
    assert result.plan["policy"] == amp_backends.plan_for().policy and result.batch_size is None
    assert any("batch size not given" in n for n in result.notes)


def test_the_applied_plan_wins_over_this_machines(monkeypatch, h100):
    monkeypatch.setattr(amp_backends.configure._state, "plan", h100)  # as if auto_configure had applied it
    assert check_model(build(mnist_cnn)).plan["backend"] == "nvidia"


# -- models built to break one rule each ---------------------------------------------------------------------

def test_custom_layer_casting_to_float32_is_read_from_the_graph(h100):
    def factory():
        x = K.Input((256,))
        h = L.Dense(512, activation="relu")(x)
        h = CastToFloat32Dense(512, name="sneaky")(h)
        return K.Model(x, L.Dense(10, dtype="float32")(h), name="custom")

    result = check_model(build(factory), plan=h100, batch_size=256)
    (f,) = [f for f in by_code(result, "float32-compute") if f.layer == "custom/sneaky"]
    assert f.severity == "warning" and not f.details["pinned"] and f.flops_share > 0.4
    assert "tf.cast" in f.why and "MatMul" in f.details["ops"]


def lambda_matmul_model():
    """A Lambda multiplying by a float32 constant with tf.matmul: given output_shape=, Keras 3 builds it without
    calling the function, so under mixed_float16 the first call is where float16 x float32 fails."""
    weight = tf.constant(np.random.default_rng(0).normal(size=(64, 32)).astype(np.float32))
    x = K.Input((64,))
    h = L.Lambda(lambda t: tf.matmul(t, weight), output_shape=(32,), name="matmul_lambda")(L.Dense(64)(x))
    return K.Model(x, L.Dense(10, dtype="float32")(h), name="lam")


def test_a_lambda_that_cannot_run_under_the_plan_is_an_error_finding_naming_it(h100):
    """A Lambda that mixes a float32 tensor into float16 ones raises under the plan's policy: that is the check's
    finding about the model (an error with the layer's path and the fix), not an exception from the check."""
    if not KERAS3:
        pytest.skip("Keras 2 calls a Lambda's function when the model is built: the model cannot be built to check")
    model = build(lambda_matmul_model)
    result = check_model(model, plan=h100, batch_size=8)
    (f,) = result.findings
    assert (f.severity, f.code, f.layer) == ("error", "layer-call-fails", "lam/matmul_lambda")
    assert "(Lambda" in f.what and "when called on float16 (8, 64)" in f.what and "'MatMul'" in f.what
    assert "ampchk" not in f.what and not f.what.endswith(".")  # (the check's own scopes; it rendered as '..')
    assert "the Lambda's own" in f.why and "output_shape=" in f.why
    assert f.fix.startswith("make the function work on them") and "keras.Input" not in f.fix
    assert not result.sized and result.notes
    # it said "could not size most of the model: 0 of 0 matmul/convolution ops have dynamic shapes"
    assert "could not size" not in result.headline() and "0 of 0" not in "\n".join(result.summary_lines())
    assert "the check stopped before it reached any" in "\n".join(result.summary_lines())
    assert_valid("check", result.to_dict())


def test_a_lambda_matmul_of_bfloat16_by_float32_is_a_float32_matmul():
    """Under this CPU's bfloat16 plan the same Lambda runs: tf.matmul(bfloat16, float32) is a SparseMatMul, which
    computes in float32, and the check said nothing of it."""
    plan = amp_backends.plan_for(machine(cpu_of(ZEN4)))
    assert plan.policy == "mixed_bfloat16"
    result = check_model(build(lambda_matmul_model, "mixed_bfloat16"), plan=plan, batch_size=8)
    (f,) = [f for f in by_code(result, "float32-compute") if f.layer == "lam/matmul_lambda"]
    assert f.details["ops"] == "SparseMatMul" and not f.details["pinned"] and f.flops_share > 0.3


def test_float16_softmax_head_is_an_error(h100):
    def factory():
        x = K.Input((64,))
        return K.Model(x, L.Dense(10, activation="softmax", name="head")(L.Dense(64)(x)), name="fp16_head")

    result = check_model(build(factory), plan=h100)
    (f,) = by_code(result, "final-activation")
    assert (f.severity, f.layer) == ("error", "fp16_head/head")
    assert "float16" in f.what and "Activation('softmax', dtype='float32')" in f.fix
    assert by_code(result, "output-dtype") == []  # one finding for one cause


def test_bfloat16_sigmoid_as_a_separate_layer_and_a_float16_regression_output():
    a100_bf16 = amp_backends.plan_for(machine(nvidia(A100)), policy="mixed_bfloat16")

    def factory():
        x = K.Input((32,))
        h = L.Dense(32)(x)
        return K.Model(x, [L.Activation("sigmoid", name="prob")(h), L.Dense(1, name="value")(h)], name="two_heads")

    result = check_model(build(factory, "mixed_bfloat16"), plan=a100_bf16)
    final = by_code(result, "final-activation")
    assert [(f.layer, f.details["dtype"]) for f in final] == [("two_heads/prob", "bfloat16")]
    (out,) = by_code(result, "output-dtype")
    assert out.layer == "two_heads/value" and out.severity == "warning" and "output 1" in out.what


def test_pinned_float32_dense_in_the_middle_is_a_warning(h100):
    def factory():
        x = K.Input((512,))
        h = L.Dense(512)(x)
        h = L.Dense(512, dtype="float32", name="pinned")(h)
        return K.Model(x, L.Dense(16, dtype="float32")(L.Dense(512)(h)), name="middle")

    result = check_model(build(factory), plan=h100, batch_size=64)
    warned = [f for f in by_code(result, "float32-compute") if f.severity == "warning"]
    assert [f.layer for f in warned] == ["middle/pinned"] and "remove dtype='float32'" in warned[0].fix


def test_nested_models_and_sublayers_get_their_paths(h100):
    class Block(L.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = L.Dense(60, name="inner")

        def call(self, x):
            return self.inner(x)

    def factory():
        block = K.Sequential([K.Input((64,)), L.Dense(64, name="first"), Block(name="block")], name="encoder")
        x = K.Input((64,))
        return K.Model(x, L.Dense(8, dtype="float32", name="out")(block(x)), name="outer")

    result = check_model(build(factory), plan=h100, batch_size=128)
    (f,) = [f for f in by_code(result, "tensor-core-shape") if f.severity == "warning"]
    assert f.layer == "outer/encoder/block/inner" and f.details["dims"] == {"units": 60}
    assert "64" in f.fix


def test_functional_model_with_two_inputs(h100):
    def factory():
        image, meta = K.Input((16, 16, 3), name="image"), K.Input((5,), name="meta")
        h = L.GlobalAveragePooling2D()(L.Conv2D(16, 3, name="conv")(image))
        h = L.Concatenate()([h, L.Dense(16, name="meta_dense")(meta)])
        return K.Model([image, meta], L.Dense(4, dtype="float32", name="out")(h), name="two_inputs")

    result = check_model(build(factory), plan=h100, batch_size=32)
    found = {f.layer: f for f in by_code(result, "tensor-core-shape")}
    assert found["two_inputs/conv"].severity == "info"
    assert found["two_inputs/conv"].details["expected"] == ["input channels"]
    assert found["two_inputs/meta_dense"].details["expected"] == ["input features"]
    assert codes(result, "warning") == [] and codes(result, "error") == []


def test_model_built_before_the_plan_is_one_finding_not_one_per_layer(h100):
    result = check_model(build(mnist_cnn, "float32"), plan=h100, batch_size=1024)
    assert codes(result)[0] == "policy-mismatch" and "float32-compute" not in codes(result)
    assert "auto_configure()" in result.findings[0].fix
    assert result.summary.reduced_precision_share == 0


def test_a_layer_given_float32_in_a_model_built_under_the_plan_is_no_policy_mismatch(h100):
    """Half the FLOPs in a layer the user gave dtype="float32", the rest under the plan: the check said the model was
    built before the plan (policy-mismatch), which it was not."""
    def factory():
        return K.Sequential([K.Input((64,)), L.Dense(64, dtype="float32", name="pinned"), L.Dense(64, name="planned"),
                             L.Dense(8, activation="softmax", dtype="float32", name="head")], name="pinned_one")

    result = check_model(build(factory), plan=h100, batch_size=64)
    assert "policy-mismatch" not in codes(result), [(f.code, f.what) for f in result.findings]
    assert result.summary.reduced_precision_share > 0


def test_model_in_float16_under_a_float32_plan(cpu_fp32):
    result = check_model(build(mnist_cnn), plan=cpu_fp32)
    (f,) = by_code(result, "policy-mismatch")
    assert "float16" in f.what and "emulat" in f.why


def test_emulated_policy_is_a_warning():
    forced = amp_backends.plan_for(machine(cpu_of(AMD_HERE)), policy="mixed_float16", force=True)
    assert forced.policy == "mixed_float16"
    result = check_model(build(mnist_cnn), plan=forced)
    (f,) = by_code(result, "emulated-policy")
    assert f.severity == "warning" and "slower than float32" in f.why
    assert by_code(result, "tensor-core-shape") == []  # no matrix units for an emulated policy


def test_amx_cpu_with_its_hardware_gets_shape_rules():
    hw = machine(cpu_of(SAPPHIRE_RAPIDS))
    plan = amp_backends.plan_for(hw)
    # the CPU backend's assessment names its AMX tiles: the plan alone knows them
    assert make_target(plan).units["bfloat16"] == make_target(plan, hw).units["bfloat16"] == ("AMX tiles", 8)
    assert make_target(amp_backends.plan_for(machine(cpu_of(AMD_HERE)), policy="bf16", force=True)).units == {}
    result = check_model(build(bad_sizes_generator, "mixed_bfloat16"), plan=plan, hardware=hw)
    assert any(f.code == "tensor-core-shape" and f.severity == "warning" for f in result.findings)


def test_fp8_plans_need_multiples_of_16_on_the_middle_dense_layers(h100):
    fp8 = dataclasses.replace(h100, fp8=True)

    def factory():  # 2048 wide: large enough to gain from float8 (input features > 1024)
        x = K.Input((64,))
        h = L.Dense(24, name="narrow")(L.Dense(2048, name="first")(x))
        h = L.Dense(2048, name="wide")(L.Dense(2048, name="mid")(h))
        return K.Model(x, L.Dense(10, dtype="float32", name="out")(h), name="mlp")

    result = check_model(build(factory), plan=fp8, batch_size=256)
    assert result.fp8_eligible_layers == ("mlp/wide",)  # not first, not last, not 24 wide (nor mid: its K is 24)
    why = dict(result.fp8_ineligible_layers)
    assert set(why) == {"mlp/first", "mlp/narrow", "mlp/mid", "mlp/out"}
    assert why["mlp/first"].startswith("the first layer") and why["mlp/out"].startswith("the last layer")
    assert why["mlp/narrow"].endswith("units 24") and why["mlp/mid"].endswith("input features 24")
    assert json.loads(result.to_json())["fp8_ineligible_layers"] == why
    flagged = {f.layer: f for f in by_code(result, "tensor-core-shape")}
    assert set(flagged) == {"mlp/narrow", "mlp/mid", "mlp/out"}  # 24 is a multiple of 8, not of 16
    assert flagged["mlp/mid"].details == {**flagged["mlp/mid"].details, "alignment": 16, "unit": "fp8 Tensor Cores"}
    assert "fp8-eligible layers: mlp/wide" in str(result)
    assert check_model(build(factory), plan=h100, batch_size=256).fp8_eligible_layers == ("mlp/wide",)


def test_mobilenet_v2_from_keras_applications(h100):
    model = build(lambda: K.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None, classes=10))
    result = check_model(model, plan=h100, batch_size=64)
    (f,) = by_code(result, "final-activation")
    assert f.severity == "error" and "prepare_model(model, plan)" in f.fix and "dtype='float32'" in f.fix
    assert by_code(result, "depthwise")[0].details["layers"]
    assert result.summary.reduced_precision_share > 0.99


def test_flops_of_each_kind_of_op(h100):
    """2*M*N*K per matmul; 2*H_out*W_out*K_h*K_w*C_in*C_out per image per convolution (transposed: over its input)."""
    def factory():
        x = K.Input((14, 14, 16))
        h = L.Conv2DTranspose(8, 3, strides=2, padding="same", name="up")(x)  # 14x14x16 -> 28x28x8
        h = L.DepthwiseConv2D(3, name="dw")(h)  # -> 26x26x8
        h = L.Reshape((26 * 26, 8))(h)
        h = L.EinsumDense("abc,cd->abd", output_shape=(None, 24), name="einsum")(h)
        h = L.Conv1D(16, 5, name="conv1d")(h)  # 676 -> 672 positions
        return K.Model(x, L.Activation("linear", dtype="float32")(h), name="kinds")

    result = check_model(build(factory), plan=h100, batch_size=4)
    expected = (2 * 14 * 14 * 9 * 16 * 8) + (2 * 26 * 26 * 9 * 8) + (2 * 676 * 8 * 24) + (2 * 672 * 5 * 24 * 16)
    assert result.summary.flops_per_image == pytest.approx(expected)
    (dw,) = by_code(result, "depthwise")
    assert dw.layer == "kinds/dw" and dw.flops_share == pytest.approx(2 * 26 * 26 * 9 * 8 / expected, rel=1e-4)


def test_graph_level_amp_plan_checks_float32_ops_as_bfloat16():
    from fakes import MAX1550, intel

    plan = amp_backends.plan_for(machine(intel(MAX1550)), graph_amp="on")
    assert plan.policy == "float32"
    result = check_model(build(bad_sizes_generator, "float32"), plan=plan, batch_size=4096)
    assert "float32-compute" not in codes(result) and "policy-mismatch" not in codes(result)
    shapes = [f for f in by_code(result, "tensor-core-shape") if f.severity == "warning"]
    assert shapes and all(f.details["unit"] == "XMX engines" and f.details["alignment"] == 8 for f in shapes)
    assert any("graph" in n for n in result.notes)


# -- a model the check has not seen --------------------------------------------------------------------------

def test_unseen_text_classifier(h100):
    def factory():
        tokens = K.Input((40,), dtype="int32")
        h = L.Embedding(1000, 60)(tokens)
        h = L.MultiHeadAttention(num_heads=2, key_dim=30, name="attention")(h, h)
        h = L.Dense(120, activation="relu", name="ffn")(L.GlobalAveragePooling1D()(h))
        return K.Model(tokens, L.Dense(3, activation="softmax", dtype="float32", name="out")(h), name="text")

    result = check_model(build(factory), plan=h100, batch_size=48)
    warned = {f.layer for f in result.findings if f.severity == "warning"}
    assert any(p.startswith("text/attention") for p in warned)  # width 60, heads of 30
    assert codes(result, "error") == []
    assert result.summary.flops_per_image > 0 and result.summary.unknown_flops_ops == 0


# -- output, state, errors -----------------------------------------------------------------------------------

def test_json_follows_the_documented_schema(h100):
    result = check_model(build(bad_sizes_generator), plan=h100, batch_size=4090)
    data = json.loads(result.to_json())
    assert data["schema_version"] == 1 and data["model"] == "bad_sizes_generator" and data["batch_size"] == 4090
    assert {"backend", "policy", "compute_dtype", "policy_support", "matrix_units", "tf32", "xla", "fp8"} <= set(
        data["plan"])
    assert {"flops_per_image", "dtype_shares", "reduced_precision_share", "eligible_share", "matrix_units",
            "unknown_flops_ops"} <= set(data["summary"])
    assert sum(data["counts"].values()) == len(data["findings"])
    for f in data["findings"]:
        assert set(f) == {"severity", "code", "layer", "what", "why", "fix", "flops_share", "details"}
        assert f["severity"] in ("error", "warning", "info") and f["layer"].startswith("bad_sizes_generator")


def test_the_check_changes_no_state(h100):
    class WithLoss(L.Layer):
        def call(self, x):
            self.add_loss(tf.reduce_sum(x))
            return x

    model = build(lambda: K.Sequential([K.Input((8,)), L.Dense(8), WithLoss()], name="stateful"))
    weights = [w.numpy().copy() for w in model.weights]
    policy_before = K.mixed_precision.global_policy().name
    check_model(model, plan=h100)
    assert K.mixed_precision.global_policy().name == policy_before
    assert all("call" not in layer.__dict__ for layer in model.layers)
    assert list(model.losses) == [] or all(not hasattr(t, "graph") or t.graph is not None for t in model.losses)
    assert all((w.numpy() == v).all() for w, v in zip(model.weights, weights, strict=True))
    model(tf.ones((2, 8)))  # still callable eagerly


def test_subclassed_model_built_with_build(h100):
    class Net(K.Model):
        def __init__(self):
            super().__init__(name="net")
            self.a, self.b = L.Dense(32, name="a"), L.Dense(4, dtype="float32", name="b")

        def call(self, x):
            return self.b(self.a(x))

    with policy("mixed_float16"):
        net = Net()
        net(tf.zeros((2, 20)))
    result = check_model(net, plan=h100)
    assert {f.layer for f in result.findings} <= {"net/a", "net/b"}
    with policy("mixed_float16"):
        with pytest.raises(ValueError, match="not built"):
            check_model(Net(), plan=h100)
        unbuilt = Net()
    # inputs= builds it (`amp-backends check --input-shape`), as a first call would: it was refused as not built
    built = check_model(unbuilt, plan=h100, inputs=(None, 20))
    assert unbuilt.built and built.summary.flops_per_image > 0
    assert [(f.code, f.layer) for f in built.findings] == [(f.code, f.layer) for f in result.findings]
    with pytest.raises(ValueError, match=r"not built.*inputs= builds it where every dimension after the batch is "):
        check_model(Net(), plan=h100, inputs=(None, None))


def test_a_final_softmax_prepare_model_cannot_place_gets_the_fix_by_hand(h100):
    """The fix of a float16 softmax output said to call prepare_model, which does nothing for a softmax inside a
    call or a Lambda (it sets the activation of a layer that ends the model): the Trainer warned the same."""
    class Net(K.Model):
        def __init__(self):
            super().__init__(name="net")
            self.a, self.b = L.Dense(16), L.Dense(3)

        def call(self, x):
            return tf.nn.softmax(self.b(self.a(x)))

    def fixes(model):
        return [f.fix for f in check_model(model, plan=h100, batch_size=64).findings if f.code == "final-activation"]

    with policy("mixed_float16"):
        net = Net()
        net(tf.zeros((2, 4)))
        lam = K.Sequential([K.Input((4,)), L.Dense(3), L.Lambda(lambda t: tf.nn.softmax(t))])
        head = K.Sequential([K.Input((4,)), L.Dense(3, activation="softmax")])
    for model in (net, lam):
        (fix,) = fixes(model)
        assert fix.startswith("compute the softmax in float32 yourself, as prepare_model leaves it") and \
            "Activation('softmax', dtype='float32')" in fix and "prepare_model(model, plan)" not in fix
    (fix,) = fixes(head)
    assert fix.startswith("call amp_backends.prepare_model(model, plan)")


@pytest.mark.parametrize("kwargs, error, match", [
    ({"model": "mnist"}, TypeError, "takes a Keras model"),
    ({"plan": "nvidia"}, TypeError, "takes an amp_backends Plan"),
    ({"batch_size": 0}, ValueError, "positive int"),
    ({"batch_size": 8.0}, TypeError, "positive int"),
    ({"batch_size": True}, TypeError, "positive int"),
])
def test_wrong_arguments_say_what_was_expected(h100, kwargs, error, match):
    args = {"model": build(mnist_cnn, "float32"), "plan": h100, **kwargs}
    with pytest.raises(error, match=match):
        check_model(args.pop("model"), **args)


def test_a_fixed_batch_that_contradicts_batch_size(h100):
    model = build(lambda: K.Sequential([K.Input((4,), batch_size=16), L.Dense(8)]))
    assert check_model(model, plan=h100).batch_size == 16
    with pytest.raises(ValueError, match="fixed batch size of 16"):
        check_model(model, plan=h100, batch_size=32)


# -- the command ---------------------------------------------------------------------------------------------

@pytest.fixture
def cli(tmp_path, monkeypatch):
    import typer
    from typer.testing import CliRunner

    (tmp_path / "user_models.py").write_text(textwrap.dedent("""
        import tensorflow as tf
        from amp_backends.models import mnist_cnn
        def good():
            return mnist_cnn()
        def not_a_model():
            return [1, 2]
        class Sub(tf.keras.Model):
            def __init__(self):
                super().__init__(name="sub")
                self.dense = tf.keras.layers.Dense(3)
            def call(self, x):
                return self.dense(x)
        def subclassed():
            return Sub()
        def two_inputs():
            a, b = tf.keras.Input((4,), name="a"), tf.keras.Input((6,), name="b")
            return tf.keras.Model({"a": a, "b": b}, tf.keras.layers.Dense(2)(tf.keras.layers.Concatenate()([a, b])))
        def chatty():
            model = mnist_cnn()
            model.summary()
            print("built the model")
            return model
        def broken():
            raise RuntimeError("boom")
        def any_length():
            # a sequence model that takes any length: its Dense runs on (batch, length, 64) rows
            inputs = tf.keras.Input((None, 32))
            x = tf.keras.layers.Dense(64)(inputs)
            return tf.keras.Model(inputs, tf.keras.layers.Dense(8, dtype="float32")(x))
        def classifier():
            # the most common Keras model: a softmax head in the policy's dtype (the layer plan keeps it in float32)
            inputs = tf.keras.Input((16,))
            return tf.keras.Model(inputs, tf.keras.layers.Dense(4, "softmax")(tf.keras.layers.Dense(32)(inputs)))
        def bf16_softmax():
            # a head the user set to bfloat16 itself: the layer plan keeps it, the check calls it an error
            inputs = tf.keras.Input((16,))
            return tf.keras.Model(inputs, tf.keras.layers.Dense(4, "softmax", dtype="mixed_bfloat16")(inputs))
        class Positions(tf.keras.layers.Layer):
            # a learned position table of 16 rows, sliced to the sequence length, as keras_hub's PositionEmbedding
            def build(self, shape):
                self.table = self.add_weight(shape=(16, shape[-1]), initializer="zeros")
            def call(self, x):
                return x + tf.slice(tf.convert_to_tensor(self.table), [0, 0], tf.shape(x)[1:])
        def positions():
            inputs = tf.keras.Input((None,), dtype="int32")
            x = Positions()(tf.keras.layers.Embedding(50, 8)(inputs))
            return tf.keras.Model(inputs, tf.keras.layers.Dense(2, dtype="float32")(x))
        WIDTH = 3
    """))
    (tmp_path / "does_not_import.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    app = typer.Typer()
    app.command()(check_command)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def test_check_command_prints_json(cli):
    result = cli("user_models:good", "--batch-size", "64", "--json", "--policy", "float32")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model"] == "mnist_cnn" and data["plan"]["policy"] == "float32" and data["batch_size"] == 64


def test_check_command_json_is_alone_on_stdout_whatever_the_factory_prints(cli):
    """A factory calling model.summary() or print() wrote before the JSON: json.load of stdout failed."""
    result = cli("user_models:chatty", "--json", "--policy", "float32")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"] == "mnist_cnn" and "built the model" in result.stderr


def test_check_command_on_a_subclassed_model_not_built_names_its_own_option(cli):
    """The fix named check_model(..., inputs=x[:32]) alone, on the command line."""
    result = cli("user_models:subclassed", "--policy", "float32")
    assert result.exit_code == 2 and "On this command line: --input-shape SHAPE" in result.output, result.output
    assert cli("user_models:subclassed", "--policy", "float32", "--input-shape", "8").exit_code == 0


def test_check_command_refuses_an_input_shape_named_for_no_input(cli):
    """``--input-shape a=4,b=6,extra=3``: the extra name was ignored without a word."""
    result = cli("user_models:two_inputs", "--policy", "float32", "--input-shape", "a=4,b=6,extra=3")
    assert result.exit_code == 2, result.output
    assert "names 'extra', which the model" in result.output and "Expected its inputs' names: a, b" in result.output
    assert cli("user_models:two_inputs", "--policy", "float32", "--input-shape", "a=4,b=6").exit_code == 0


def test_check_command_prints_a_table(cli):
    result = cli("amp_backends.models:mnist_cnn")
    assert result.exit_code == 0, result.output
    assert "Precision check of 'mnist_cnn'" in result.stdout and "per image" in result.stdout


@pytest.mark.parametrize("json_flag", [(), ("--json",)])
def test_check_command_exits_1_when_a_finding_is_an_error(cli, json_flag):
    """A script or CI job gates on the exit status: an error finding (wrong numbers) is 1, as a linter's; the report
    is printed all the same. Warnings alone stay 0 (the table test above)."""
    result = cli("user_models:bf16_softmax", "--policy", "float32", *json_flag)
    assert result.exit_code == 1, result.output
    assert "softmax computed in bfloat16" in result.stdout


@pytest.mark.parametrize("target, code, message", [
    ("user_models.py", 2, "expected MODULE:FACTORY"),
    ("user_models:good:extra", 2, "expected MODULE:FACTORY"),
    ("does_not_import:good", 2, "importing it raised ModuleNotFoundError"),
    ("no_such_module_xyz:good", 2, "expected an importable module"),
    ("user_models:missing", 2, "Functions defined there: Positions, Sub, any_length, bf16_softmax, broken, chatty, "
                               "classifier, good"),
    ("user_models:WIDTH", 2, "it is 3 (of type int)"),
    ("user_models:not_a_model", 2, "returned builtins.list"),
    ("user_models:broken", 2, "raised RuntimeError: boom"),  # (1 is an error finding's: a CI gate tells them apart)
])
def test_check_command_errors_say_what_was_expected(cli, target, code, message):
    result = cli(target, "--policy", "float32")
    assert result.exit_code == code
    assert message in " ".join(result.output.split()) and "Fix:" in result.output


@pytest.mark.parametrize("args", [("--seq-len", "128"), ("--input-shape", "128x32")])
def test_check_command_sizes_open_dimensions(cli, args):
    unsized = json.loads(cli("user_models:any_length", "--batch-size", "16", "--json", "--policy", "float32").stdout)
    assert unsized["summary"]["sized"] is False
    result = cli("user_models:any_length", "--batch-size", "16", "--json", "--policy", "float32", *args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    assert summary["sized"] is True and summary["flops_per_image"] == 2 * 128 * (32 * 64 + 64 * 8)


def test_a_sequence_past_the_models_position_table_is_refused_not_approved(cli):
    """The check only traced the model symbolically, and approved a keras_hub BERT at a sequence length past its
    position embedding (exit 0), where training fails on its first step: the model now runs once on zeros of one
    example at the shapes given."""
    past = cli("user_models:positions", "--seq-len", "32", "--policy", "float32")
    assert past.exit_code == 2, past.output
    assert "does not run on inputs of shape (None, 32)" in past.output and "/positions' (Positions)" in past.output
    assert "Expected size[0] in [0, 16], but got 32" in " ".join(past.output.split()) and "Fix:" in past.output
    within = cli("user_models:positions", "--seq-len", "16", "--policy", "float32", "--json")
    assert within.exit_code == 0, within.output
    assert json.loads(within.stdout)["summary"]["sized"] is True


def test_check_command_prepare_checks_the_model_with_its_layer_plan_as_it_trains(cli):
    """A plain softmax classifier failed the check (exit 1: its head in the low precision) with a fix, prepare_model,
    that the command gave no way to apply; the Trainer and prepare_model keep that head in float32."""
    as_built = cli("user_models:classifier", "--device", "a100")
    said = " ".join(as_built.output.split())
    assert as_built.exit_code == 1 and "softmax" in said, said
    assert "note: the model was checked as the factory built it; --prepare checks it with the layer plan" in said
    prepared = cli("user_models:classifier", "--device", "a100", "--prepare", "--json")
    assert prepared.exit_code == 0, prepared.output
    assert not [f for f in json.loads(prepared.stdout)["findings"] if f["severity"] == "error"]


def test_check_command_refuses_both_shape_options_and_a_bad_shape(cli):
    both = cli("user_models:any_length", "--seq-len", "8", "--input-shape", "8x32", "--policy", "float32")
    assert both.exit_code == 2 and "at most one of --seq-len and --input-shape" in both.output
    # a model with no open dimension: --seq-len changed nothing and the check ran as if it was not given
    fixed = cli("user_models:bf16_softmax", "--seq-len", "8", "--policy", "float32")
    said = " ".join(fixed.output.split())
    assert fixed.exit_code == 2 and "sets the open dimensions of the inputs of the model" in said, said
    assert "it has none (its inputs: (None, 16))" in said and "Fix: leave the sequence length (--seq-len) out" in said
    bad = cli("user_models:any_length", "--input-shape", "8xx32", "--policy", "float32")
    assert bad.exit_code == 2 and "Received: '8xx32'" in bad.output and "Fix:" in bad.output
    # a shape of another rank: its fix was Python's ("give the batch's full shape, the batch first, e.g. (None, 128,
    # 32)"), where the option takes one example's shape without the batch
    rank = cli("user_models:any_length", "--input-shape", "8", "--policy", "float32")
    said = " ".join(rank.output.split())
    assert rank.exit_code == 2 and "--input-shape 8 gives an input of shape (None, 8) to the model" in said, said
    assert said.endswith("Fix: give one example's shape without the batch, such as --input-shape 128x32")


def test_the_shape_options_are_refused_before_the_factory_is_loaded_or_tensorflow_started(cli):
    """Both options, or a malformed --input-shape, were refused only after the model was built."""
    for args, said in ((("--seq-len", "8", "--input-shape", "8"), "at most one of --seq-len and --input-shape"),
                       (("--input-shape", "8y8"), "Received: '8y8' in --input-shape")):
        out = cli("no_such_module_of_the_user:build", *args)
        assert out.exit_code == 2 and said in out.output and "no_such_module" not in out.output, out.output


def test_parse_input_shape():
    assert parse_input_shape("28x28x1") == (None, 28, 28, 1)
    assert parse_input_shape("token_ids=128, padding_mask=128") == {"token_ids": (None, 128),
                                                                    "padding_mask": (None, 128)}
    for text in ("", "0", "a=", "=12", "12,13"):
        with pytest.raises(ValueError, match="Fix:"):
            parse_input_shape(text)
    # the fix names the size that is wrong (it said to leave the batch out, for 28x28xa too)
    for text, fix in (("28x28xa", "Fix: give 'a' as a positive whole number, such as 28x28x1"),
                      ("0x28", "Fix: give '0' as a positive whole number (leave the batch out: it comes from "
                               "--batch-size)"),
                      ("28xx28", "Fix: give the empty size as a positive whole number")):
        with pytest.raises(ValueError, match=re.escape(fix)):
            parse_input_shape(text)


@pytest.mark.parametrize("rnn", ["LSTM", "GRU"])
def test_a_recurrent_layer_counts_its_cells_matmuls_once_per_time_step(rnn):
    """An LSTM's FLOPs were one time step's (the same for 5 and 50 steps: its loop's matmuls were read once), so its
    share of the model and the findings' thresholds were wrong: looped, it now counts as its unrolled twin."""
    if not KERAS3:  # Keras 2 runs the loop inside a function call the check does not read into: it says so
        model = tf.keras.Sequential([tf.keras.Input((5, 64)), getattr(tf.keras.layers, rnn)(128, name="rnn"),
                                     tf.keras.layers.Dense(8, dtype="float32")], name="seq")
        result = amp_backends.check_model(model, amp_backends.plan_for(policy="float32"), batch_size=64)
        assert any(note.startswith("not counted: the matmuls inside a function call of seq/rnn") for note in
                   result.notes), result.notes  # (the FLOPs were the Dense's alone, without a word)
        return

    def flops(steps, unroll):
        layer = getattr(tf.keras.layers, rnn)(128, unroll=unroll)
        model = tf.keras.Sequential([tf.keras.Input((steps, 64)), layer, tf.keras.layers.Dense(8, dtype="float32")])
        return amp_backends.check_model(model, amp_backends.plan_for(policy="float32"),
                                        batch_size=64).summary.flops_per_image

    for steps in (5, 50):
        assert flops(steps, unroll=False) == flops(steps, unroll=True)
    assert flops(50, unroll=False) > 9 * flops(5, unroll=False)


def test_a_dense_layer_beside_a_recurrent_layer_is_neither_the_first_nor_the_last():
    """A Dense after an LSTM was 'the first layer: it reads the input data' in the float8 choice, and one before an
    LSTM that ends the model 'the last layer': the LSTM's loop (a While loop, or Keras 2's function call) hid its
    matmuls from the layers around it."""
    h100 = amp_backends.plan_for(device="h100")
    after = tf.keras.Sequential([tf.keras.Input((12,), dtype="int32"), tf.keras.layers.Embedding(100, 32),
                                 tf.keras.layers.LSTM(64), tf.keras.layers.Dense(64, name="after"),
                                 tf.keras.layers.Dense(8, name="head")], name="tagger")
    why = dict(amp_backends.check_model(after, h100, batch_size=64).fp8_ineligible_layers)
    assert "input data" not in why["tagger/after"], why
    before = tf.keras.Sequential([tf.keras.Input((12, 16)), tf.keras.layers.Dense(64, name="first"),
                                  tf.keras.layers.Dense(64, name="before"), tf.keras.layers.LSTM(32, name="rnn")],
                                 name="encoder")
    why = dict(amp_backends.check_model(before, h100, batch_size=64).fp8_ineligible_layers)
    assert "last layer" not in why["encoder/before"] and "too small" in why["encoder/before"], why


def test_a_matmul_made_float32_by_a_numpy_constant_gets_the_fix_for_the_constant():
    """keras.ops promotes bfloat16 x float32: a NumPy weight in a layer's call makes its matmul float32. The fix
    used to say to drop a tf.cast(..., tf.float32) the layer does not have."""
    if not KERAS3:
        pytest.skip("keras.ops is Keras 3's")
    import keras

    weight = np.random.default_rng(0).random((16, 16)).astype("float32")

    class Project(keras.layers.Layer):
        def call(self, x):
            return keras.ops.matmul(x, weight)

    def factory():
        x = K.Input((16,))
        return K.Model(x, L.Dense(4, dtype="float32")(Project(name="project")(L.Dense(16)(x))), name="const")

    plan = amp_backends.plan_for(machine(cpu_of(ZEN4)))
    (f,) = [f for f in by_code(check_model(build(factory, "mixed_bfloat16"), plan=plan, batch_size=16),
                                "float32-compute") if f.layer == "const/project"]
    assert "float32 constant" in f.why and "dtype=self.compute_dtype" in f.fix and "tf.cast" not in f.fix


def test_the_check_under_the_applied_plan_probes_no_hardware(monkeypatch):
    """check_model() without a plan probed the hardware (every backend's probe) before taking the applied plan,
    which needs none."""
    import amp_backends.probe

    amp_backends.auto_configure(verbose=False)
    try:
        monkeypatch.setattr(amp_backends.probe, "probe_hardware", lambda *a, **k: pytest.fail("probed the hardware"))
        result = check_model(build(mnist_cnn, amp_backends.current_plan().policy))
        applied = amp_backends.current_plan()
        assert (result.plan["policy"], result.plan["backend"]) == (applied.policy, applied.backend)
    finally:
        amp_backends.reset()


def test_the_input_shape_fix_names_the_inputs_of_a_model_with_several():
    """For a model with the inputs a and b, a wrong --input-shape was answered "Fix: ... such as --input-shape 128",
    a shape that model cannot take; the fix now gives one that it can."""
    from amp_backends.model_check.shapes import checked_inputs, example_shape, in_flag_words, parse_input_shape

    K = tf.keras
    a, b = K.Input((4,), name="a"), K.Input((6,), name="b")
    model = K.Model([a, b], K.layers.Dense(2)(K.layers.Concatenate()([a, b])))
    assert example_shape(model) == "a=4,b=6"
    with pytest.raises(ValueError) as info:
        checked_inputs(model, parse_input_shape("a=4,c=6"), amp_backends.keras_compat.input_structure(model))
    said = in_flag_words("a=4,c=6", info.value, model)
    assert "Expected the keys ['a', 'b']" in said and said.endswith("such as --input-shape a=4,b=6")
    given = checked_inputs(model, parse_input_shape(example_shape(model)),
                           amp_backends.keras_compat.input_structure(model))  # the fix is a shape it takes
    assert [tuple(leaf.shape) for leaf in given] == [(None, 4), (None, 6)]


def test_a_language_models_head_kept_in_float32_as_logits_dtype_advises_is_not_warned_back(h100):
    """The logits-dtype finding told to give the head dtype='float32'; done, float32-compute warned to remove it
    again (a warning of 22% of the FLOPs on a keras_hub Gemma with reverse_dtype='float32')."""
    K = tf.keras

    def lm(head_dtype):
        with policy("mixed_float16"):
            ids = K.Input((16,), dtype="int32")
            h = K.layers.Dense(64, activation="relu")(K.layers.Embedding(2048, 64)(ids))
            return K.Model(ids, K.layers.Dense(2048, dtype=head_dtype, name="head")(h), name="lm")

    before = amp_backends.check_model(lm(None), h100, batch_size=8)
    assert by_code(before, "logits-dtype") and "dtype='float32'" in by_code(before, "logits-dtype")[0].fix
    after = amp_backends.check_model(lm("float32"), h100, batch_size=8)
    assert not by_code(after, "logits-dtype") and not codes(after, "warning")
    (f,) = by_code(after, "float32-compute")
    assert f.severity == "info" and "logits over a vocabulary of 2048 in float32" in f.what
    assert f.fix.startswith("nothing to do")
