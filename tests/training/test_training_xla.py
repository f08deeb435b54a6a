"""A plan with XLA on and a call XLA cannot compile: the trainer drops XLA with a warning and trains on.

The GPU plans have XLA on. A model holding an op without an XLA kernel (``tf.numpy_function``, ...), or a fusion
XLA's GPU autotuner builds no kernel for, used to end training with TensorFlow's traceback from inside the graph.
Nothing of a call that fails to compile ran, so the trainer compiles its calls without XLA and runs the same call
again from the same position: the run is the one XLA off would have trained.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from helpers import applied_plan, classification_data

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from amp_backends.training import Trainer, classifier_updates  # noqa: E402
from amp_backends.errors import xla_compile_failure  # noqa: E402


def _model():
    class HostOp(tf.keras.layers.Layer):
        """An identity through ``tf.numpy_function``: an op (PyFunc) XLA has no kernel for."""

        def call(self, x):
            y = tf.numpy_function(lambda a: a, [x], x.dtype)
            y.set_shape(x.shape)
            return x + tf.stop_gradient(y - x)  # the value through the host op, the gradient around it

    tf.keras.utils.set_random_seed(3)
    return tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"), HostOp(),
                                tf.keras.layers.Dense(3)])


def _fit(xla, data, **kw):
    plan = applied_plan(xla=xla)
    updates = classifier_updates(_model(), tf.keras.optimizers.SGD(0.1),
                                 tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = Trainer(updates, plan, batch_size=8, progress=False, seed=5, **kw)
    x, y = classification_data(64)
    return trainer, trainer.fit(*data(x, y), epochs=2, validation_data=(x, y))


@pytest.mark.parametrize("data", [lambda x, y: (x, y),
                                  # the pass opens again after the failed call: the same order needs a dataset that
                                  # gives the same order on every pass
                                  lambda x, y: (tf.data.Dataset.from_tensor_slices((x, y))
                                                .shuffle(64, seed=2, reshuffle_each_iteration=False).batch(8),)],
                         ids=["arrays", "tf.data"])
def test_a_model_xla_cannot_compile_trains_without_it_as_xla_off_would(data, caplog):
    caplog.set_level(logging.WARNING, logger="amp_backends.train")
    with pytest.warns(Warning, match="xla=on"):  # honoured on a CPU, with the warning that it may not pay
        trainer, ran = _fit("on", data, steps_per_call=4)
    warned = [r.getMessage() for r in caplog.records if "XLA is not used" in r.getMessage()]
    assert any("this training" in w and "PyFunc" in w for w in warned), warned
    assert any("validation_data" in w and "PyFunc" in w for w in warned), warned
    assert trainer.program.xla is False and ran.steps == 16
    _, off = _fit("off", data, steps_per_call=4)
    # the failed call trained nothing and ran again from the same batch: the same run as with XLA off
    assert [h["model"] for h in ran.history] == [h["model"] for h in off.history]
    assert [e["val_loss"] for e in ran.epochs] == [e["val_loss"] for e in off.epochs]
    assert np.isfinite(trainer.evaluate(*classification_data(64))["loss"])


def test_only_xla_failing_to_compile_is_taken_for_it():
    autotuner = tf.errors.InternalError(None, None, "Autotuner could not compile any configs for HLO: "
                                        "%loop_add_compare_is_finite_reduce_fusion = (pred[]) fusion(...)\nmore")
    assert xla_compile_failure(autotuner) == ("XLA could not compile it (Autotuner could not compile any configs "
                                              "for HLO: %loop_add_compare_is_finite_reduce_fusion = (pred[]) "
                                              "fusion(...))")
    missing = tf.errors.InvalidArgumentError(None, None, "Detected unsupported operations when trying to compile "
                                             "graph __inference_run_3 on XLA_GPU_JIT: PyFunc, Unique (No registered "
                                             "'PyFunc' OpKernel for XLA_GPU_JIT devices)")
    assert xla_compile_failure(missing) == "the model holds ops XLA has no kernel for (PyFunc, Unique)"
    for other in (tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor; XLA compilation failed"),
                  tf.errors.InvalidArgumentError(None, None, "indices[3] = 12 is not in [0, 10)"),
                  tf.errors.InternalError(None, None, "CUDA error: an illegal memory access"),
                  ValueError("Detected unsupported operations when trying to compile graph")):
        assert xla_compile_failure(other) is None, other
