"""The precision check and fp8 on real keras_hub transformers (built from configs, no weights): BERT and GPT-2.

keras_hub backbones take any sequence length, so the check must be given the shapes (``inputs=``) to size
them; without them it says so first, and gives no FLOP share over the little it could size. Needs Keras 3
and keras_hub (the TensorFlow 2.15 + Keras 2 environment has neither: skipped there).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
if int(str(getattr(tf.keras, "__version__", "2")).split(".")[0] or 2) < 3:
    pytest.skip("keras_hub needs Keras 3; this tf.keras is Keras 2", allow_module_level=True)
keras_hub = pytest.importorskip("keras_hub", reason="keras_hub is not installed (it needs Keras 3)")

import amp_backends  # noqa: E402
from amp_backends.prepare import prepare_model  # noqa: E402
from amp_backends.model_check import check_model  # noqa: E402
from amp_backends.model_check import shapes_with_sequence_length  # noqa: E402
from fakes import H100, machine, nvidia  # noqa: E402

K = tf.keras
from conftest import policy  # noqa: E402
SEQ = 64
BERT = {"vocabulary_size": 30522, "num_layers": 2, "num_heads": 2, "hidden_dim": 128, "intermediate_dim": 256,
        "max_sequence_length": SEQ}
# Per sample at 64 tokens: per layer Q, K, V and output projections 4 x 2*64*128*128, scores and weighted
# values 2 x 2*64*64*128, feed-forward 2 x 2*64*128*256; two layers; the pooled Dense 2*128*128.
BERT_FLOPS = 2 * (4 * 2 * SEQ * 128 * 128 + 2 * 2 * SEQ * SEQ * 128 + 2 * 2 * SEQ * 128 * 256) + 2 * 128 * 128


@pytest.fixture(scope="module")
def h100():
    return amp_backends.plan_for(machine(nvidia(H100)))


@pytest.fixture(scope="module")
def bert():
    with policy("mixed_float16"):
        return keras_hub.models.BertBackbone(**BERT, name="bert_backbone")  # named: auto-names count earlier models


@pytest.fixture(scope="module")
def odd_bert():
    """A feed-forward width of 250 (not a multiple of 8): the feed-forward layers have something to report."""
    with policy("mixed_float16"):
        return keras_hub.models.BertBackbone(**{**BERT, "intermediate_dim": 250}, name="odd_bert_backbone")


def test_bert_without_inputs_says_first_that_it_could_not_size_it(h100, bert):
    result = check_model(bert, plan=h100)
    assert not result.sized and result.summary.unknown_flops_ops >= 16 and result.summary.gemm_ops >= 17
    assert "could not size enough of the model" in result.headline()
    assert result.findings[0].code == "unsized-model" and "inputs=" in result.findings[0].fix
    # the issue: the small pooled Dense came out at 97.7% of the FLOPs; now no share is over part of the graph
    assert all(f.flops_share is None for f in result.findings)
    assert result.summary.dtype_shares == {} and result.summary.eligible_share is None


@pytest.mark.parametrize("form", ["sequence_length", "sample_batch"])
def test_bert_with_inputs_counts_every_matmul(h100, bert, form):
    if form == "sequence_length":
        result = check_model(bert, plan=h100, inputs=shapes_with_sequence_length(bert, SEQ), batch_size=32)
        assert result.batch_size == 32
    else:
        batch = {"token_ids": np.ones((4, SEQ), np.int32), "segment_ids": np.zeros((4, SEQ), np.int32),
                 "padding_mask": np.ones((4, SEQ), np.int32)}
        result = check_model(bert, plan=h100, inputs=batch)
        assert result.batch_size == 4
    assert result.sized and result.summary.unknown_flops_ops == 0
    assert result.summary.flops_per_image == BERT_FLOPS
    assert result.summary.dtype_shares == {"float16": 1.0}
    codes = {f.code for f in result.findings}
    assert "unsized-model" not in codes and "mask-overflow" not in codes and "layernorm-precision" not in codes
    (softmax,) = [f for f in result.findings if f.code == "attention-softmax"]
    assert softmax.severity == "info" and len(softmax.details["layers"]) == 2
    (vocab,) = [f for f in result.findings if f.code == "vocabulary-size"]  # a lookup only: info
    assert vocab.severity == "info" and vocab.details["padded"] == 30528


def test_bert_feed_forward_widths_weigh_as_much_as_they_compute(h100, odd_bert):
    """The issue: feed-forward and attention came out info at 0.0%, the pooled Dense a warning at 97.7%."""
    sized = check_model(odd_bert, plan=h100, inputs=shapes_with_sequence_length(odd_bert, SEQ), batch_size=32)
    ff = [f for f in sized.findings if f.code == "tensor-core-shape" and "feedforward" in f.layer]
    assert len(ff) == 4 and all(f.severity == "warning" and f.flops_share > 0.05 for f in ff)
    assert not [f for f in sized.findings if f.layer.endswith("pooled_dense") and (f.flops_share or 0) > 0.01]
    unsized = check_model(odd_bert, plan=h100)
    ff = [f for f in unsized.findings if f.code == "tensor-core-shape" and "feedforward" in f.layer]
    assert ff and all(f.severity == "warning" and f.flops_share is None for f in ff)


def test_bert_fp8_layers_are_sized_by_inputs_and_the_small_ones_skipped(h100, bert):
    fp8 = dataclasses.replace(h100, fp8=True)
    unsized = check_model(bert, plan=fp8)
    assert any("unknown" in layer.why for layer in unsized.fp8_layers)
    result = check_model(bert, plan=fp8, inputs=shapes_with_sequence_length(bert, SEQ), batch_size=32)
    layers = {layer.path: layer for layer in result.fp8_layers}
    assert len(layers) == 13  # per transformer layer query, key, value, attention output, two feed-forward; pooled
    assert not any("unknown" in layer.why for layer in layers.values())
    small = [layer for layer in layers.values() if layer.small]
    assert small and all(layer.why.startswith("too small to gain from float8") for layer in small)
    assert result.fp8_eligible_layers == ()  # 128 and 256 wide: every middle layer is too small to gain
    # a residual block's output projection feeds the next block: it is not "the last layer"
    assert layers["bert_backbone/transformer_layer_0/feedforward_output_dense"].small
    prep = prepare_model(bert, fp8, inputs=shapes_with_sequence_length(bert, SEQ))
    assert not prep.changed and len(prep.layers) == 13 and all(why for _, _, why in prep.layers)


@pytest.fixture(scope="module")
def gpt2():
    with policy("mixed_float16"):
        backbone = keras_hub.models.GPT2Backbone(vocabulary_size=50257, num_layers=2, num_heads=2, hidden_dim=128,
                                                 intermediate_dim=256, max_sequence_length=SEQ, name="gpt2_backbone")
        hidden = backbone(backbone.input)
        tied = K.Model(backbone.input, backbone.token_embedding(hidden, reverse=True), name="gpt2_tied")
        head = K.layers.Dense(50257, name="lm_head")
        untied = K.Model(backbone.input, head(hidden), name="gpt2_dense_head")
    return tied, untied


def test_gpt2_logits_and_vocabulary(h100, gpt2):
    tied, untied = gpt2
    inputs = shapes_with_sequence_length(tied, SEQ)
    result = check_model(tied, plan=h100, inputs=inputs, batch_size=8)
    assert result.sized and "mask-overflow" not in {f.code for f in result.findings}
    (vocab,) = [f for f in result.findings if f.code == "vocabulary-size"]
    assert vocab.severity == "warning" and vocab.details["padded"] == 50304 and vocab.flops_share > 0.5
    assert vocab.layer == "gpt2_tied/gpt2_backbone/token_embedding"
    # the tied head's float32 embedding promotes its matmul: float32 logits, as logits-dtype advises: an info line
    # (it was a finding whose fix undid what logits-dtype advises)
    (f32,) = [f for f in result.findings if f.code == "float32-compute"]
    assert f32.severity == "info" and "logits over a vocabulary of 50257 in float32" in f32.what
    assert f32.fix.startswith("nothing to do")
    assert "logits-dtype" not in {f.code for f in result.findings}
    result = check_model(untied, plan=h100, inputs=inputs, batch_size=8)
    (logits,) = [f for f in result.findings if f.code == "logits-dtype"]
    assert logits.severity == "warning" and logits.layer == "gpt2_dense_head/lm_head"
    assert logits.details["vocabulary"] == 50257 and "dtype='float32'" in logits.fix
    assert "output-dtype" not in {f.code for f in result.findings}


@pytest.fixture(scope="module")
def vit():
    """16 patches and a class token: 17 positions; at batch 16 its Dense and EinsumDense layers run 272 rows."""
    with policy("mixed_float16"):
        return keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2,
                                            hidden_dim=64, mlp_dim=128, name="vit_backbone")


def test_vit_rows_are_batch_times_positions_in_attention_projections_as_in_the_mlp(h100, vit):
    """The issue: Keras 3's EinsumDense is a BatchMatMulV2 of (16, 17, 64) activations by one (64, 64) weight,
    read as 16 GEMMs of 17 rows: 8 warnings "rows 17 -> 24", while the MLP's Dense layers passed the same 272."""
    aligned = check_model(vit, plan=h100, batch_size=16)
    rows = [f for f in aligned.findings
            if f.code == "tensor-core-shape" and "rows (batch x positions)" in f.details["dims"]]
    assert rows == [] and "batch-size" not in {f.code for f in aligned.findings}
    # at batch 15 (255 rows) the projections and the MLP are misaligned alike: one finding for the 12 matmuls
    (batch,) = [f for f in check_model(vit, plan=h100, batch_size=15).findings if f.code == "batch-size"]
    assert "rows of 12 matmul(s)" in batch.what and batch.fix.startswith("use a batch of 16")
    # attention's own matmuls are batched over batch and heads: one GEMM has the 17 positions as its rows
    attention = [f for f in aligned.findings if f.code == "tensor-core-shape" and f.layer.endswith("/mha")]
    assert len(attention) == 2 and all(f.details["dims"]["rows M"] == 17 for f in attention)
