"""The layers behind a model's outputs, for the layer plan's classifier heads: a subclassed model's too (Keras 3)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import applied_plan

pytestmark = pytest.mark.tensorflow
tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
from amp_backends.model_outputs import output_layers  # noqa: E402

keras = tf.keras
if not str(getattr(keras, "__version__", "2")).startswith("3"):
    pytest.skip("a subclassed model keeps its build shape from Keras 3 on", allow_module_level=True)


class OneHead(keras.Model):
    def __init__(self, name="one_head"):
        super().__init__(name=name)
        self.hidden = keras.layers.Dense(8, name="hidden")
        self.head = keras.layers.Dense(3, activation="softmax", name="head")

    def call(self, x):
        return self.head(self.hidden(x))


class TwoHeads(keras.Model):
    """A dict of inputs, a dict of outputs, and an output computed after its last layer."""

    def __init__(self):
        super().__init__(name="two_heads")
        self.trunk = keras.layers.Dense(16, name="trunk")
        self.cls = keras.layers.Dense(3, activation="softmax", name="cls")
        self.bin = keras.layers.Dense(1, activation="sigmoid", name="bin")
        self.score = keras.layers.Dense(1, name="score")

    def call(self, inputs):
        h = self.trunk(inputs["img"])
        return {"cls": self.cls(h), "bin": self.bin(h), "score": tf.squeeze(self.score(h), -1)}


def test_a_subclassed_models_softmax_head_is_planned_in_float32_as_a_functional_ones():
    """It used to stay in the plan's bfloat16: the head was found through ``model.outputs``, which a subclassed
    model does not have, and prepare_model said only that fp8 was off."""
    plan = applied_plan("mixed_bfloat16", force=True)  # (bf16 on any CPU: the policy is what this is about)
    model = OneHead()
    model(np.zeros((2, 8), "float32"))
    losses = list(model.losses)
    prepared = amp_backends.prepare_model(model, plan)
    assert prepared.float32 == ("one_head/head",) and "softmax" in prepared.float32_why, prepared
    assert model.head.dtype_policy.name == "float32" and model.hidden.dtype_policy.name == "mixed_bfloat16"
    assert model(np.zeros((2, 8), "float32")).dtype == tf.float32
    assert list(model.losses) == losses and "call" not in model.head.__dict__  # the trace left nothing behind


def test_a_model_whose_name_starts_with_an_underscore_is_prepared_and_checked():
    """Keras names a class ``_Net`` ``__net``; TensorFlow takes no root name scope of that name, and the traces of
    `prepare_model` (the head: left in bfloat16, "nothing changed") and of the check (a ModelCallError) failed."""
    from amp_backends.model_check import check_model

    plan = applied_plan("mixed_bfloat16", force=True)
    model = OneHead(name="__net")
    model(np.zeros((2, 8), "float32"))
    assert amp_backends.prepare_model(model, plan).float32 == ("__net/head",)
    assert model(np.zeros((2, 8), "float32")).dtype == tf.float32
    from amp_backends.training import Trainer, classifier_updates

    x, y = np.zeros((32, 8), "float32"), np.zeros(32, "int64")
    trainer = Trainer(classifier_updates(model, keras.optimizers.SGD()), plan, batch_size=16, progress=False)
    assert trainer.fit(x, y, max_steps=2).steps == 2 and np.isfinite(trainer.evaluate(x, y)["loss"])
    functional = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3, activation="softmax")], name="_clf")
    assert "final-activation" in [f.code for f in check_model(functional, plan).findings]


def test_a_subclassed_model_of_named_inputs_and_outputs_names_each_output_layer():
    model = TwoHeads()
    model({"img": np.zeros((4, 8), "float32")})
    # "score" comes out of tf.squeeze, not out of a layer as it is: no layer is its output
    assert sorted(path for path, _ in output_layers(model)) == ["two_heads/bin", "two_heads/cls"]


def test_a_subclassed_model_not_yet_built_names_no_output_and_is_left_as_it_is():
    model = OneHead()
    assert output_layers(model) == [] and not model.built


def test_the_check_of_a_subclassed_model_of_named_inputs_reads_the_shapes_it_was_built_with():
    """`check_model` said it "cannot tell the input shape" of a model built by a call on a dict of arrays."""
    plan = applied_plan("mixed_bfloat16", force=True)
    model = TwoHeads()
    model({"img": np.zeros((4, 8), "float32")})
    result = amp_backends.check_model(model, plan, batch_size=4)
    assert "final-activation" in [f.code for f in result.findings]  # its heads, before prepare_model
