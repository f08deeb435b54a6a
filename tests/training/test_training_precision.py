"""The trainer checks the models it trains, at the batch it trains on, and says what it finds as warnings."""

from __future__ import annotations

import logging
import re
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import applied_plan, classification_data, mlp

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
from amp_backends import model_check  # noqa: E402
from amp_backends.data import synthetic_mnist  # noqa: E402
from amp_backends.errors import AmpWarning  # noqa: E402
from amp_backends.models import gan_discriminator, gan_generator, mnist_cnn  # noqa: E402
from amp_backends.training import Trainer, Update, classifier_updates, gan_updates, mnist_batch_fn  # noqa: E402
from amp_backends.training.precision import trained_models  # noqa: E402


def train(model, p, x, y, **kw):
    t = Trainer(classifier_updates(model, tf.keras.optimizers.SGD(0.1)), p, batch_size=16, progress=False, **kw)
    return t.fit(x, y, max_steps=1)


def test_a_model_built_before_auto_configure_is_said_plainly_and_once(caplog):
    """It was said three times: prepare_model's warning, then the trainer's log line and its warning; the layer plan's
    line said "the other layers follow mixed_bfloat16"."""
    model = mlp(hidden=64, activation="softmax")  # built under float32: before the plan's policy is set
    p = amp_backends.auto_configure(verbose=False, policy="mixed_bfloat16", force=True)
    caplog.set_level(logging.INFO, logger="amp_backends.train")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        train(model, p, *classification_data())  # not among checkpoint_objects: the trainer finds it through its update
        train(model, p, *classification_data())  # a second trainer of the same model says it again, once
    said = [str(w.message) for w in seen if issubclass(w.category, AmpWarning)
            and ("computes in" in str(w.message) or "auto_configure()" in str(w.message))]  # (the check's too)
    assert len(said) == 2 and all(re.search(r"computes in float32 under the plan's mixed_bfloat16.*build it after "
                                            r"auto_configure\(\)", m) for m in said), said
    logged = [r for r in caplog.records if "auto_configure()" in r.message and r.levelno >= logging.WARNING]
    assert len(logged) == 2 and all("build it after auto_configure()" in r.message for r in logged), logged
    # the layer plan's line does not say the layers follow the plan without saying they compute in float32
    assert "the other layers follow mixed_bfloat16, planned, but compute in float32: the model was built before the " \
        "plan" in caplog.text, caplog.text
    # the precision check's own finding stays in its report (a check a trainer), as information once the trainer said it
    assert [r.levelno for r in caplog.records if "although the plan's policy is mixed_bfloat16" in r.message] == [
        logging.INFO] * 2, caplog.text


def test_a_model_built_before_auto_configure_is_said_before_evaluate_too(caplog):
    """Evaluated before any fit (its layer plan applied then), the model is said once, logged, as in fit."""
    model = mlp(hidden=64)
    p = amp_backends.auto_configure(verbose=False, policy="mixed_bfloat16", force=True)
    caplog.set_level(logging.INFO, logger="amp_backends.train")
    t = Trainer(classifier_updates(model, tf.keras.optimizers.SGD(0.1)), p, batch_size=16, progress=False)
    x, y = classification_data()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        t.evaluate(x, y)
        t.fit(x, y, max_steps=1)
    said = [str(w.message) for w in seen if issubclass(w.category, AmpWarning)
            and ("computes in" in str(w.message) or "auto_configure()" in str(w.message))]  # (the check's too)
    assert len(said) == 1 and "build it after auto_configure()" in said[0], said
    # a model loaded from a file cannot be built again: its fix is named too (it was only the prepare_model warning's)
    assert "amp_backends.prepare_model(model, plan, reset_policies=True)" in said[0], said
    assert len([r for r in caplog.records if "auto_configure()" in r.message and r.levelno >= logging.WARNING]) == 1


def test_a_model_built_after_auto_configure_is_not_flagged():
    p = amp_backends.auto_configure(verbose=False, policy="mixed_bfloat16", force=True)
    model = mlp(hidden=64)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        train(model, p, *classification_data())
    assert not [w for w in seen if "build it after" in str(w.message)]


class Recorder:
    def __init__(self, with_inputs=True, findings=()):
        self.calls, self.with_inputs, self.findings = [], with_inputs, list(findings)

    def __call__(self, model, plan=None, batch_size=None, **kw):
        if "inputs" in kw and not self.with_inputs:
            raise TypeError("check_model() got an unexpected keyword argument 'inputs'")
        self.calls.append((model.name, batch_size, kw.get("inputs")))
        lines = ["headline"] + [f"{f.severity}: layer: {f.what}. Fix: {f.fix}" for f in self.findings] + ["summary"]
        return SimpleNamespace(findings=self.findings, log_lines=lambda: lines)


def test_the_check_is_given_the_batch_the_model_is_trained_on(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(model_check, "check_model", rec)
    p = applied_plan()
    (x, y), _ = synthetic_mnist(64, 8)
    model = mnist_cnn()
    Trainer(classifier_updates(model, tf.keras.optimizers.SGD(0.1)), p, batch_size=16, batch_fn=mnist_batch_fn,
            progress=False).fit(x, y, max_steps=1)
    (name, batch, inputs), = rec.calls
    assert name == model.name and batch == 16
    assert tuple(inputs.shape) == (16, 28, 28, 1) and inputs.dtype == tf.float32  # after the batch function
    # a dataset: the x part of its first batch
    rec.calls.clear()
    ds = tf.data.Dataset.from_tensor_slices(classification_data()).batch(8, drop_remainder=True)
    model = mlp(hidden=64)
    Trainer(classifier_updates(model, tf.keras.optimizers.SGD(0.1)), p, batch_size=8, progress=False).fit(
        ds, max_steps=1)
    (_, batch, inputs), = rec.calls
    assert batch == 8 and np.shape(inputs) == (8, 4)


def test_the_check_runs_without_inputs_where_check_model_does_not_take_them(monkeypatch):
    rec = Recorder(with_inputs=False)
    monkeypatch.setattr(model_check, "check_model", rec)
    train(mlp(hidden=64), applied_plan(), *classification_data())
    assert [c[2] for c in rec.calls] == [None]


def test_the_gan_checks_both_models_and_gives_the_images_to_neither_generator(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(model_check, "check_model", rec)
    p = applied_plan()
    (x, _), _ = synthetic_mnist(32, 8)
    g, d = gan_generator(), gan_discriminator()
    Trainer(gan_updates(g, d, tf.keras.optimizers.Adam(), tf.keras.optimizers.Adam()), p, batch_size=16,
            batch_fn=mnist_batch_fn, progress=False).fit(x, None, max_steps=1)
    calls = {name: inputs for name, _, inputs in rec.calls}
    assert set(calls) == {g.name, d.name}
    assert calls[g.name] is None and tuple(calls[d.name].shape) == (16, 28, 28, 1)


def test_warnings_of_the_check_are_logged_as_warnings_and_raised_as_amp_warnings(monkeypatch, caplog):
    finding = SimpleNamespace(severity="warning", code="tensor-core-shape",
                              what="Dense width 10 is not a multiple of 8", fix="use 16")
    monkeypatch.setattr(model_check, "check_model", Recorder(findings=[finding]))
    caplog.set_level(logging.INFO, logger="amp_backends.train")
    with pytest.warns(AmpWarning, match="not a multiple of 8"):
        train(mlp(hidden=64), applied_plan(), *classification_data())
    levels = {r.message.split(": ", 1)[-1][:9]: r.levelno for r in caplog.records if "multiple of 8" in r.message}
    assert list(levels.values()) == [logging.WARNING]


def test_the_models_are_found_through_the_updates():
    a, b = mlp(hidden=64), mlp(hidden=64)
    outer = tf.keras.Sequential([tf.keras.Input((4,)), a])
    opt = tf.keras.optimizers.SGD()

    class Holder:
        def __init__(self):
            self.net = b

    holder = Holder()
    ups = [Update("a", lambda batch: tf.reduce_mean(outer(batch[0])), [(a.trainable_variables, opt)]),
           Update("b", lambda batch: tf.reduce_mean(holder.net(batch[0])), [(b.trainable_variables, opt)])]
    assert [m.name for m in trained_models(ups, None)] == [outer.name, b.name]
    assert trained_models(ups[:1], {"other": mlp(hidden=64)}) == [outer]  # a model training nothing here is not checked


def test_the_model_behind_decorated_loss_functions_is_found_as_behind_a_plain_one():
    """A ``loss_fn`` under decorators (``functools.wraps``: a logging wrapper, AutoGraph's ``do_not_convert``) hid its
    model: each wrapper counted as one more level of the bounded search."""
    import functools

    model, opt = mlp(hidden=64), tf.keras.optimizers.SGD()

    def logged(fn):
        @functools.wraps(fn)
        def wrapper(batch):
            return fn(batch)
        return wrapper

    def loss_fn(batch):
        return tf.reduce_mean(model(batch[0]))

    wrapped = tf.autograph.experimental.do_not_convert(logged(logged(loss_fn)))
    assert trained_models([Update("m", wrapped, [(model.trainable_variables, opt)])], None) == [model]

    def uses(m):  # a decorator factory: the model only in the wrapper's closure
        def deco(fn):
            @functools.wraps(fn)
            def wrapper(batch):
                return fn(m, batch)
            return wrapper
        return deco

    @uses(model)
    def injected(m, batch):
        return tf.reduce_mean(m(batch[0]))

    assert trained_models([Update("m", injected, [(model.trainable_variables, opt)])], None) == [model]


def test_a_classifier_head_holding_most_weights_is_not_called_built_before_the_plan():
    """The layer plan keeps the softmax head in float32; where that head holds most of the weights (a small
    convolution, then Dense(10) over its flattened maps), the model is still the plan's, not one built before it."""
    p = amp_backends.auto_configure(verbose=False, policy="mixed_bfloat16", force=True)
    m = tf.keras.Sequential([tf.keras.Input((28, 28, 1)), tf.keras.layers.Conv2D(8, 3), tf.keras.layers.Flatten(),
                             tf.keras.layers.Dense(10, activation="softmax")])
    t = Trainer(classifier_updates(m, tf.keras.optimizers.Adam()), p, batch_size=16, progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AmpWarning)
        t.fit(np.zeros((32, 28, 28, 1), "float32"), np.zeros(32, "int64"), epochs=1)
    assert t.layer_plans[m.name].float32 == (f"{m.name}/{m.layers[-1].name}",)  # the head, in float32 as planned
    said = [str(w.message) for w in caught if issubclass(w.category, AmpWarning)]
    assert not [s for s in said if "auto_configure()" in s], said


def test_a_subclassed_model_that_keeps_no_input_shape_is_checked_at_the_training_batch(caplog):
    """A subclassed model called on a list of two inputs keeps no shape the check can read: it used to log "the
    precision check failed (Cannot tell the input shape ...)"; the trainer has the batch, and checks it there."""
    if not str(getattr(tf.keras, "__version__", "2")).startswith("3"):
        pytest.skip("a Keras 3 subclassed model (Keras 2 keeps its first call's spec)")

    class Pair(tf.keras.Model):
        def __init__(self):
            super().__init__(name="pair")
            self.a, self.b = tf.keras.layers.Dense(8), tf.keras.layers.Dense(8)
            self.out = tf.keras.layers.Dense(3)

        def call(self, inputs):
            return self.out(self.a(inputs[0]) + self.b(inputs[1]))

    model = Pair()
    x = [np.zeros((32, 4), "float32"), np.zeros((32, 5), "float32")]
    model([v[:2] for v in x])
    with pytest.raises(ValueError, match="Cannot tell the input shape"):
        model_check.check_model(model, applied_plan())  # (the premise: alone, the check cannot tell)
    with caplog.at_level("INFO", logger="amp_backends"):
        train(model, applied_plan(), x, np.zeros(32, "int64"))
    assert "precision check of 'pair' failed" not in caplog.text
    assert "pair" in caplog.text and "precision check" in caplog.text.lower()


def test_a_model_whose_only_float32_layer_is_the_head_the_layer_plan_pins_is_not_called_built_before(caplog):
    """A one-layer classifier built after auto_configure(): its softmax head is the layer plan's float32 pin, not a
    sign of a model built before the plan (it used to get the policy-mismatch warning, 100% of its FLOPs)."""
    p = applied_plan("mixed_bfloat16", force=True)
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(3, activation="softmax")])
    with warnings.catch_warnings(record=True) as caught, caplog.at_level("INFO", logger="amp_backends"):
        warnings.simplefilter("always")
        train(model, p, np.zeros((32, 8), "float32"), np.zeros(32, "int64"))
    assert model.layers[-1].dtype_policy.name == "float32"  # (pinned by the layer plan)
    assert "policy-mismatch" not in caplog.text and "built before" not in caplog.text
    assert not [w for w in caught if "built before" in str(w.message) or "dtype policy is float32" in str(w.message)]


def test_sequences_longer_than_the_models_position_embedding_are_our_error_naming_the_layer(tmp_path):
    """A keras_hub backbone of max_sequence_length 32 given sequences of 40 passed the trainer's check (a symbolic
    trace) and failed inside the step's gradient: "Paddings must be non-negative for {{node gradient_tape/...}}"."""
    keras_hub = pytest.importorskip("keras_hub")  # (Keras 3)
    keras = tf.keras
    amp_backends.auto_configure(verbose=False)
    backbone = keras_hub.models.DistilBertBackbone(vocabulary_size=200, num_layers=1, num_heads=2, hidden_dim=32,
                                                   intermediate_dim=64, max_sequence_length=32)
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in ("token_ids", "padding_mask")}
    pooled = keras.layers.GlobalAveragePooling1D()(backbone(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", dtype="float32")(pooled))
    tokens = np.random.default_rng(0).integers(1, 200, (32, 40)).astype("int32")
    trainer = Trainer(classifier_updates(model, keras.optimizers.Adam()), amp_backends.current_plan(), batch_size=16,
                      progress=False, logdir=str(tmp_path))
    with pytest.raises(amp_backends.errors.ModelCallError,
                       match=r"its layer '\S*position_embedding' \(PositionEmbedding\) raised.*Fix: .*sequence length"):
        trainer.fit({"token_ids": tokens, "padding_mask": np.ones_like(tokens)}, np.zeros(32, "int32"), max_steps=1)


def test_a_models_own_train_step_that_the_trainer_does_not_call_is_said():
    """The trainer runs its own step: a subclassed model's train_step (here adding a penalty) was skipped without a
    word (and prepare_model's warning about its loss scaling was filtered out)."""
    keras = tf.keras

    class Penalized(keras.Model):
        def __init__(self):
            super().__init__(name="penalized")
            self.dense = keras.layers.Dense(3, activation="softmax")

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):  # pragma: no cover  (never called: that is the point)
            raise AssertionError("the trainer called train_step")

    model = Penalized()
    model(np.zeros((1, 8), "float32"))
    x, y = np.zeros((32, 8), "float32"), np.zeros(32, "int64")
    trainer = Trainer(classifier_updates(model, keras.optimizers.SGD()), applied_plan(), batch_size=16, progress=False)
    with pytest.warns(AmpWarning, match=r"'penalized' defines its own train_step \(.*Penalized.train_step\), and the "
                                        r"trainer never calls it.*Fix: .*model.fit"):
        trainer.fit(x, y, max_steps=1)

    class Weighted(Penalized):  # Keras 3's hook for a loss of one's own, skipped alike
        train_step = keras.Model.train_step

        def compute_loss(self, *args, **kwargs):  # pragma: no cover
            raise AssertionError("the trainer called compute_loss")

    model = Weighted()
    model(np.zeros((1, 8), "float32"))
    trainer = Trainer(classifier_updates(model, keras.optimizers.SGD()), applied_plan(), batch_size=16, progress=False)
    with pytest.warns(AmpWarning, match=r"defines its own compute_loss \(.*Weighted.compute_loss\)") as said:
        trainer.fit(x, y, max_steps=1)
    assert not [str(w.message) for w in said if "its own train_step" in str(w.message)]  # (Keras's own: not said)


def test_a_layer_that_raises_in_any_dtype_stops_the_trainer_with_our_error_naming_it():
    """The precision check made it a finding, the trainer went on, and its step ended in Keras's traceback
    ("Dimension size must be evenly divisible by 3")."""
    keras = tf.keras
    p = applied_plan()
    model = keras.Sequential([keras.Input((8,)), keras.layers.Lambda(lambda t: tf.reshape(t, (-1, 3)), name="fold"),
                              keras.layers.Dense(3, activation="softmax")], name="folded")
    x, y = np.zeros((32, 8), "float32"), np.zeros(32, "int64")
    trainer = Trainer(classifier_updates(model, keras.optimizers.Adam()), p, batch_size=16, progress=False)
    with pytest.raises(amp_backends.errors.ModelCallError, match=r"its layer 'folded/fold' \(Lambda, .*raised "
                                                                 r"\w+Error: .*Fix: make the function work on them"):
        trainer.fit(x, y, max_steps=1)


def test_logits_trained_with_a_loss_that_takes_probabilities_are_said_once():
    """A model ending in a plain Dense (logits) trained with the default sparse cross-entropy (from_logits=False)
    trained on a meaningless loss without a word (8.2 where ln 4 is 1.39)."""
    x, y = classification_data(64)
    p = amp_backends.auto_configure(verbose=False)
    logits = mlp(hidden=16)
    t = Trainer(classifier_updates(logits, tf.keras.optimizers.SGD(0.1)), p, batch_size=16, progress=False,
                check_models=False)
    with pytest.warns(AmpWarning, match=r"takes probabilities \(from_logits=False\), but the model .* outputs values "
                                        r"from .*: logits.*Fix: give the loss from_logits=True"):
        t.fit(x, y, validation_data=(x[:16], y[:16]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", AmpWarning)
        t.fit(x, y, epochs=2)  # said once a model
        fine = Trainer(classifier_updates(mlp(hidden=16), tf.keras.optimizers.SGD(0.1),
                                          tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)), p,
                       batch_size=16, progress=False, check_models=False)
        fine.fit(x, y)
        probabilities = mlp(hidden=16, activation="softmax")
        Trainer(classifier_updates(probabilities, tf.keras.optimizers.SGD(0.1)), p, batch_size=16, progress=False,
                check_models=False).fit(x, y)
