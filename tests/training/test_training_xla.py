"""A plan with XLA on and a call XLA cannot compile: the trainer drops XLA with a warning and trains on.

The GPU plans have XLA on. A model holding an op without an XLA kernel (``tf.numpy_function``, ...) used to end
training with TensorFlow's traceback from inside the graph. Where nothing of a call that fails to compile can have
run (one replica, batches of one shape), the trainer compiles its calls without XLA and runs the same call again
from the same position: the run is the one XLA off would have trained; elsewhere it stops with our error and the
fix; with a stop requested while compiling, it stops at the position.
"""

from __future__ import annotations

import logging
import signal
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import applied_plan, classification_data

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from amp_backends.errors import AmpConfigError, TrainingInterrupted, xla_compile_failure  # noqa: E402
from amp_backends.training import Trainer, classifier_updates  # noqa: E402
from amp_backends.training import trainer as trainer_module  # noqa: E402


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


# TensorFlow 2.21's words for an op without an XLA kernel (the first op only), and XLA's GPU autotuner's
MISSING_OP = ("Detected unsupported operations when trying to compile graph __inference_run_303[_XlaMustCompile=true] "
              "on XLA_GPU_JIT: PyFunc (No registered 'PyFunc' OpKernel for XLA_GPU_JIT devices compatible with node "
              "{{node sequential_1/odd_1/PyFunc}}){{node sequential_1/odd_1/PyFunc}}\nThe op is created at: \n\t"
              "tf2xla conversion failed while converting __inference_run_303. [Op:__inference_run_303]")
AUTOTUNER = ("Autotuner could not compile any configs for HLO: %loop_add_compare_is_finite_reduce_fusion = (pred[]) "
             "fusion(...)\nmore")


def test_only_xla_failing_to_compile_is_taken_for_it():
    assert (xla_compile_failure(tf.errors.InvalidArgumentError(None, None, MISSING_OP))
            == "the model holds ops XLA has no kernel for (PyFunc)")
    assert xla_compile_failure(tf.errors.InternalError(None, None, AUTOTUNER)) == (
        "XLA could not compile it (Autotuner could not compile any configs for HLO: "
        "%loop_add_compare_is_finite_reduce_fusion = (pred[]) fusion(...))")
    for other in (tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor; XLA compilation failed"),
                  tf.errors.InvalidArgumentError(None, None, "indices[3] = 12 is not in [0, 10)"),
                  tf.errors.InternalError(None, None, "CUDA error: an illegal memory access"),
                  ValueError(MISSING_OP)):
        assert xla_compile_failure(other) is None, other


class _Source:
    """A call that fails to compile once, then runs: what `run_call` sees of the training data."""

    def __init__(self, error, fixed_shape=True):
        self.error, self.fixed_shape, self.calls, self.starts = error, fixed_shape, 0, 0

    def start(self):
        self.starts += 1

    def run(self, program, at, k, capacity):
        self.calls += 1
        if self.calls == 1:
            raise self.error
        return "ran"


def _program(replicas=1):
    dropped = []
    return SimpleNamespace(xla=True, replica_jit=False, replicas=replicas, without_xla=dropped.append), dropped


def test_a_call_that_failed_to_compile_runs_again_only_where_nothing_of_it_can_have_run():
    at = SimpleNamespace(step=12)
    program, dropped = _program()
    source = _Source(tf.errors.InternalError(None, None, AUTOTUNER))
    assert trainer_module.run_call(program, source, at, 4, 4, lambda: False) == "ran"
    assert source.calls == 2 and source.starts == 1 and dropped and "Autotuner" in dropped[0]
    # a stop asked for while compiling (a Ctrl-C to the process group stops XLA's compiler too): nothing runs again
    program, dropped = _program()
    source = _Source(tf.errors.InternalError(None, None, AUTOTUNER))
    assert trainer_module.run_call(program, source, at, 4, 4, lambda: True) is None
    assert source.calls == 1 and not dropped
    # several replicas, or a step compiled anew for each batch shape: a part may have run; our error, with the fix
    for program, source in ((_program(replicas=2)[0], _Source(tf.errors.InvalidArgumentError(None, None, MISSING_OP))),
                            (_program()[0], _Source(tf.errors.InvalidArgumentError(None, None, MISSING_OP), False))):
        with pytest.raises(AmpConfigError, match=r"at step 12: the model holds ops XLA has no kernel for \(PyFunc\)"
                                                 r".*Fix: train with XLA off \(auto_configure\(xla='off'\)") as e:
            trainer_module.run_call(program, source, at, 4, 4, lambda: False)
        assert source.calls == 1 and ("padded_shapes=<fixed>" in str(e.value)) is (not source.fixed_shape)
    # any other error is raised as it is
    program, _ = _program()
    with pytest.raises(tf.errors.InternalError, match="illegal memory access"):
        trainer_module.run_call(program, _Source(tf.errors.InternalError(None, None, "illegal memory access")), at,
                                4, 4, lambda: False)


def test_a_stop_asked_for_while_xla_compiles_stops_at_the_position_with_a_checkpoint(tmp_path, monkeypatch):
    real = trainer_module.run_call

    def sigterm_during_compile(program, source, at, k, capacity, stopping):
        trainer.checkpointing.signals.signum = signal.SIGTERM  # as the handler sets it
        return real(program, source, at, k, capacity, stopping)

    monkeypatch.setattr(trainer_module, "run_call", sigterm_during_compile)
    with pytest.warns(Warning, match="xla=on"):
        plan = applied_plan(xla="on")
    updates = classifier_updates(_model(), tf.keras.optimizers.SGD(0.1),
                                 tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = Trainer(updates, plan, batch_size=8, progress=False, seed=5, steps_per_call=4,
                      checkpoint_dir=str(tmp_path / "ckpt"))
    with pytest.raises(TrainingInterrupted) as stopped:
        trainer.fit(*classification_data(64), epochs=1)
    assert stopped.value.step == 0 and stopped.value.checkpoint and trainer.program.xla is True
