"""Every batch checked, not only the first: variable-length batches, labels in every batch, string features."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import applied_plan, mlp

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from amp_backends.errors import InputError  # noqa: E402
from amp_backends.training import Trainer, classifier_updates  # noqa: E402

KERAS3 = int(str(getattr(tf.keras, "__version__", None) or "2").split(".")[0]) >= 3


def classifier(model, batch_size=16, loss=None, **kw):
    opt = tf.keras.optimizers.SGD(0.05)
    return Trainer(classifier_updates(model, opt, loss), kw.pop("plan", None) or applied_plan(),
                   batch_size=batch_size, progress=False, check_models=False, **kw)


# --------------------------------------------------------------------------- variable-length batches
def test_variable_length_batches_of_another_size_are_refused_before_training_with_the_fix():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, 50, rng.integers(3, 12)).tolist() for _ in range(64)]
    ds = tf.data.Dataset.from_generator(lambda: ((s, i % 3) for i, s in enumerate(seqs)),
                                        output_signature=(tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64)))
    model = tf.keras.Sequential([tf.keras.Input((None,), dtype="int64"), tf.keras.layers.Embedding(50, 4),
                                 tf.keras.layers.GlobalAveragePooling1D(), tf.keras.layers.Dense(3)])
    t = classifier(model)
    with pytest.raises(InputError, match=r"variable length.*padded_batch\(16, padded_shapes=.*drop_remainder=True\)"):
        t.fit(ds.padded_batch(8))
    assert int(t.global_step.numpy()) == 0
    # the fix trains
    fixed = ds.padded_batch(16, padded_shapes=([12], []), drop_remainder=True)
    assert t.fit(fixed).steps == 4


# --------------------------------------------------------------------------- labels in every batch
@pytest.mark.parametrize("bad", [np.nan, 10.0, -1.0, 2.5])
def test_a_bad_label_deep_in_a_dataset_stops_at_its_step_with_the_library_error(bad):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype("float32")
    y = (np.arange(200) % 10).astype("float32")
    y[150] = bad  # batch 9 of 16 rows; the check before training sees batch 0
    model = mlp(hidden=None, classes=10)
    t = classifier(model, steps_per_call=4)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    with pytest.raises(InputError,
                       match=r"The batch of step 9 \(epoch 0, step 9 of the epoch\).*class ids in 0\.\.9.*Fix"):
        t.fit(ds, epochs=1)
    assert t.scalers["model"].current == 1.0 and int(t.scalers["model"].skipped.numpy()) == 0
    assert all(np.isfinite(v.numpy()).all() for v in model.variables)


@pytest.mark.parametrize("bad, loss", [(-1.0, "sparse_categorical_crossentropy"), (np.nan, "mse"),
                                       (np.inf, "sparse_categorical_crossentropy")])
def test_a_bad_sample_weight_deep_in_a_dataset_stops_at_its_step_with_the_library_error(bad, loss):
    """Only the first batch's weights were checked: a negative weight later trained on (the loss scaled up without
    bound), a NaN one made the step non-finite. Now every batch's weights are, as its class ids are."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype("float32")
    y = (np.arange(200) % 10).astype("float32")
    w = np.ones(200, "float32")
    w[150] = bad  # batch 9 of 16 rows; the check before training sees batch 0
    model = mlp(hidden=None, classes=10 if loss.startswith("sparse") else 1)
    t = Trainer(classifier_updates(model, tf.keras.optimizers.SGD(0.05), loss=loss), applied_plan(), batch_size=16,
                progress=False, check_models=False, steps_per_call=4)
    ds = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(16, drop_remainder=True)
    with pytest.raises(InputError, match=r"The batch of step 9 \(epoch 0, step 9 of the epoch\).*sample weights "
                                         r"that are negative or not finite.*Fix: clean the pipeline"):
        t.fit(ds, epochs=1)
    assert int(t.scalers["model"].skipped.numpy()) == 0  # refused, not taken for an overflow
    assert all(np.isfinite(v.numpy()).all() for v in model.variables)
    good = tf.data.Dataset.from_tensor_slices((x, y, np.ones(200, "float32"))).batch(16, drop_remainder=True)
    assert t.fit(good, epochs=1).skipped == {"model": 0}


@pytest.mark.parametrize("steps_per_call", [1, 3])
def test_a_fit_with_corrected_data_after_a_refused_batch_ends_as_a_run_that_never_met_it(steps_per_call):
    """The refused step counted as done: a fit with the corrected data went on after it (that batch never trained),
    its epoch's mean loss took the refused batch's loss in, the summary counted a step the optimizer never took, and
    under several steps per call the steps after it in the same call trained on."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 4)).astype("float32")
    y = (np.arange(96) % 3).astype("int64")
    bad = y.copy()
    bad[40] = 9  # in the batch of step 2 (16 rows a batch)

    def run(first=None):
        tf.keras.utils.set_random_seed(1)
        model, opt = mlp(), tf.keras.optimizers.SGD(0.05)
        t = Trainer(classifier_updates(model, opt), applied_plan(), batch_size=16, progress=False,
                    check_models=False, steps_per_call=steps_per_call, seed=0)
        batches = lambda labels: tf.data.Dataset.from_tensor_slices((x, labels)).batch(16)  # noqa: E731
        if first is not None:
            with pytest.raises(InputError, match=r"The batch of step 2 \(epoch 0, step 2 of the epoch\).*skipped.*"
                                                 r"A fit with corrected data runs that step again\."):
                t.fit(batches(first), epochs=2)
            assert int(opt.iterations.numpy()) == int(t.global_step.numpy()) == 2
        result = t.fit(batches(y), epochs=2)
        return result, [v.numpy() for v in model.variables], int(opt.iterations.numpy())

    result, weights, iterations = run(first=bad)
    uninterrupted, expected, _ = run()
    assert result.steps == iterations == 12 and result.applied == {"model": 12}
    assert [e["loss"] for e in result.epochs] == pytest.approx([e["loss"] for e in uninterrupted.epochs], rel=1e-6)
    for got, want in zip(weights, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_bad_label_in_arrays_is_refused_before_training():
    x = np.zeros((64, 4), "float32")
    y = np.arange(64) % 10
    y[50] = 12
    t = classifier(mlp(hidden=None, classes=10))
    with pytest.raises(ValueError, match="class ids in 0..9"):
        t.fit(x, y)
    assert int(t.global_step.numpy()) == 0


def test_the_label_check_is_part_of_every_compiled_call_and_good_data_trains():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 10, 64)
    r = classifier(mlp(hidden=None, classes=10), steps_per_call=2).fit(x, y, epochs=2)
    assert r.steps == 8 and r.skipped == {"model": 0}


# --------------------------------------------------------------------------- strings
def string_model():
    lookup = tf.keras.layers.StringLookup(vocabulary=["red", "green", "blue"])
    return tf.keras.Sequential([tf.keras.Input((1,), dtype="string"), lookup, tf.keras.layers.Embedding(5, 4),
                                tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])


WORDS = np.array(["red", "green", "blue", "red"] * 16)[:, None]
LABELS = np.arange(64) % 3


@pytest.mark.skipif(not KERAS3, reason="StringLookup inside a compiled step as a first layer is checked on Keras 3")
@pytest.mark.parametrize("as_objects", [False, True])
def test_numpy_strings_train_a_model_that_looks_them_up(as_objects):
    words = WORDS.astype(object) if as_objects else WORDS
    r = classifier(string_model()).fit(words, LABELS, epochs=2)
    assert r.steps == 8 and np.isfinite(r.last_losses["model"])


@pytest.mark.skipif(not KERAS3, reason="StringLookup inside a compiled step as a first layer is checked on Keras 3")
def test_strings_under_an_xla_plan_train_without_xla_and_say_why(caplog):
    caplog.set_level("WARNING", logger="amp_backends.train")
    t = classifier(string_model(), plan=applied_plan(xla=True, force=True))
    ds = tf.data.Dataset.from_tensor_slices((WORDS, LABELS)).batch(16, drop_remainder=True)
    assert t.fit(ds).steps == 4
    assert any("XLA is not used" in r.message and "strings" in r.message for r in caplog.records)


def test_strings_for_a_model_that_takes_numbers_are_refused_with_the_fix():
    t = classifier(mlp(1, hidden=None, classes=3))
    with pytest.raises(InputError, match=r"takes numbers.*x holds strings.*StringLookup"):
        t.fit(WORDS, LABELS)
    assert int(t.global_step.numpy()) == 0


def test_features_of_the_wrong_shape_in_a_dataset_are_refused_with_the_fix():
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((64, 5), "float32"), LABELS)).batch(16, drop_remainder=True)
    t = classifier(mlp(4, hidden=None, classes=3))
    with pytest.raises(InputError, match=r"takes inputs of shape \('batch', 4\); x has rows of shape \(5,\)"):
        t.fit(ds)
    assert int(t.global_step.numpy()) == 0


def test_binary_labels_outside_0_1_are_refused_before_training_and_in_any_batch():
    """A sigmoid model under loss="binary_crossentropy" trained on labels 0 and 3 without a word (Keras fit gave
    negative losses); with the default loss, the fix for a one-unit model never named binary cross-entropy."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1, activation="sigmoid")])
    t = classifier(model, loss="binary_crossentropy")
    with pytest.raises(InputError, match=r"Binary cross-entropy takes labels from 0 to 1.*Received labels from 0\.0 "
                                         r"to 3\.0\. Fix: map them to 0 and 1"):
        t.fit(x, (np.arange(64) % 2) * 3.0)
    y = (np.arange(64) % 2).astype("float32")
    y[50] = 2.0  # batch 3 of 16 rows: the check before training sees batch 0
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    with pytest.raises(InputError, match=r"The batch of step 3 .*labels outside 0\.\.1"):
        t.fit(ds)
    assert t.fit(x, (np.arange(64) % 2).astype("float32")).steps > 0  # 0 and 1 train
    with pytest.raises(ValueError, match="pass loss='binary_crossentropy'"):
        classifier(model).fit(x, np.arange(64) % 2)


def test_max_steps_past_the_epochs_says_that_the_epochs_end_the_fit_first(caplog):
    """fit(x, y, max_steps=8) with the default epochs=1 trained one epoch of 4 steps without a word."""
    x = np.zeros((64, 4), "float32")
    t = Trainer(classifier_updates(mlp(), tf.keras.optimizers.SGD(0.1)), applied_plan(), batch_size=16,
                progress=False, check_models=False)
    with caplog.at_level("INFO", logger="amp_backends"):
        assert t.fit(x, np.zeros(64, int), max_steps=8).steps == 4
        assert t.fit(x, np.zeros(64, int), epochs=2, max_steps=8).steps == 8
    said = [r.getMessage() for r in caplog.records if "before max_steps" in r.getMessage()]
    assert said == ["epochs=1 (--epochs) ends this fit at global step 4, before max_steps=8 (--max-steps; the first "
                    "reached ends it); to train to step 8, pass epochs=2 (--epochs 2)."]  # (the command's words too)


# --------------------------------------------------------------------------- a late batch TensorFlow cannot run
def late_bad_batches(bad, x_shape, y_shape):
    """Six batches of 16 (4 features, 3 classes) from a generator of the shapes given; the fourth is ``bad(x, y)``."""
    x, y = np.random.default_rng(0).normal(size=(96, 4)).astype("float32"), np.arange(96) % 3

    def batches():
        for i in range(6):
            xb, yb = x[16 * i:16 * (i + 1)], y[16 * i:16 * (i + 1)]
            yield bad(xb, yb) if i == 3 else (xb, yb)

    return tf.data.Dataset.from_generator(batches, output_signature=(tf.TensorSpec(x_shape, tf.float32),
                                                                     tf.TensorSpec(y_shape, tf.int64)))


@pytest.mark.parametrize("bad, shapes, received", [
    (lambda x, y: (np.c_[x, x[:, :1]], y), ((16, None), (16,)), r"\[16,5\] is not compatible with expected shape "
                                                                 r"\[\?,4\]"),  # a fifth feature
    (lambda x, y: (x, y[:10]), ((None, 4), (None,)), r"same batch size in each component"),  # fewer labels
], ids=["another-width", "fewer-labels"])
def test_a_late_batch_tensorflow_cannot_run_is_our_error_naming_its_step(bad, shapes, received):
    """A batch that only a later step meets came out as TensorFlow's InvalidArgumentError from inside the graph,
    naming no step and no fix; the steps before it stay trained."""
    t = classifier(mlp(), batch_size=16)
    with pytest.raises(InputError, match=rf"The batch of step 3 .*{received}.*Expected .*Fix: ") as caught:
        t.fit(late_bad_batches(bad, *shapes))
    assert caught.value.__cause__ is None and "Graph execution error" not in str(caught.value), str(caught.value)
    assert int(t.global_step.numpy()) == 3
    with pytest.raises(InputError, match=r"Batch 3 of the data given to evaluate\(\) could not be run: .*Fix: "):
        t.evaluate(late_bad_batches(bad, *shapes))
