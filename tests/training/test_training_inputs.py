"""What the trainer trains on: tf.data pipelines, several inputs, named features, per-example losses, bad data."""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest
from helpers import applied_plan, classification_data, mlp

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
from amp_backends.data import DataUnavailableError, read_mnist_npz  # noqa: E402
from amp_backends.errors import InputError  # noqa: E402
from amp_backends.training import Trainer, Update, classifier_updates, gan_updates  # noqa: E402


def trainer(model, **kw):
    opt = tf.keras.optimizers.SGD(0.1)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kw.setdefault("batch_size", 8)
    return Trainer(classifier_updates(model, opt, loss), applied_plan(), progress=False, **kw)


# --------------------------------------------------------------------------- tf.data
def test_a_batched_dataset_trains_with_several_steps_per_compiled_call():
    x, y = classification_data(64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=1).batch(8, drop_remainder=True)
    t = trainer(mlp(), steps_per_call=4)
    r = t.fit(ds, epochs=2)
    assert r.steps == 16 and r.epochs_completed == 2
    assert len(r.history) == 4  # 4 calls of 4 steps, the iterator consumed inside the compiled call
    assert all(np.isfinite(h["model"]) for h in r.history)


def test_a_dataset_batched_without_drop_remainder_is_rebatched_to_full_batches(caplog):
    caplog.set_level("INFO", logger="amp_backends.train")
    x, y = classification_data(60)
    r = trainer(mlp(), steps_per_call=3).fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=1)
    assert r.steps == 7  # 60 // 8: the partial last batch is dropped, not a new compiled shape
    assert "rebatched to 8 with drop_remainder=True" in caplog.text


def test_a_dataset_of_unknown_length_ends_its_epoch_with_the_data():
    x, y = classification_data(40)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(8, drop_remainder=True)
    assert int(ds.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    r = trainer(mlp(), steps_per_call=3).fit(ds, epochs=2)
    assert r.steps == 10 and r.epochs_completed == 2


@pytest.mark.parametrize("make,needle", [
    (lambda x, y: tf.data.Dataset.from_tensor_slices((x, y)),
     "not batched.*scalar.*dataset.batch\\(8, drop_remainder=True\\)"),
    (lambda x, y: tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True),
     "leading size 16.*batch_size is 8.*batch_size=16.*rebatch"),
    (lambda x, y: tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat(), "repeats forever.*steps_per_epoch"),
])
def test_datasets_the_trainer_cannot_use_are_refused_before_training(make, needle):
    x, y = classification_data(64)
    model = mlp()
    t = trainer(model)
    before = [v.numpy().copy() for v in model.trainable_variables]
    with pytest.raises(InputError, match=needle):
        t.fit(make(x, y))
    assert int(t.global_step.numpy()) == 0
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.trainable_variables, strict=True))


def test_a_repeated_dataset_trains_with_steps_per_epoch():
    x, y = classification_data(64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True).repeat()
    r = trainer(mlp(), steps_per_call=4).fit(ds, epochs=3, steps_per_epoch=5)
    assert r.steps == 15 and r.epochs_completed == 3


def test_resuming_a_stream_skips_the_batches_already_trained_on(tmp_path):
    """The position of a stream is the batches consumed in the epoch: a resumed run trains on the rest only."""
    x, y = classification_data(64)
    seen = tf.Variable(tf.zeros(64))

    def counting(model, opt):
        base = classifier_updates(model, opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))[0]

        def loss_fn(batch):
            ids = tf.cast(batch[0][:, 0], tf.int32)  # column 0 holds the sample's id
            seen.assign_add(tf.reduce_sum(tf.one_hot(ids, 64), axis=0))
            return base.loss_fn((batch[0], batch[1]))

        return [Update("model", loss_fn, base.groups)]

    x[:, 0] = np.arange(64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)
    m = mlp()
    o = tf.keras.optimizers.SGD(0.01)
    t = Trainer(counting(m, o), applied_plan(), batch_size=8, progress=False, checkpoint_dir=str(tmp_path),
                checkpoint_objects={"m": m, "o": o})
    t.fit(ds, epochs=1, max_steps=3)
    m2 = mlp()
    o2 = tf.keras.optimizers.SGD(0.01)
    t2 = Trainer(counting(m2, o2), applied_plan(), batch_size=8, progress=False, checkpoint_dir=str(tmp_path),
                 checkpoint_objects={"m": m2, "o": o2})
    r = t2.fit(ds, epochs=1, resume=True)
    assert r.steps == 8 and r.epochs_completed == 1
    assert seen.numpy().tolist() == [1.0] * 64  # every sample exactly once across the interruption


# --------------------------------------------------------------------------- several inputs, named features
def two_input_model():
    a, b = tf.keras.Input((3,), name="a"), tf.keras.Input((2,), name="b")
    h = tf.keras.layers.Concatenate()([tf.keras.layers.Dense(4)(a), b])
    return tf.keras.Model({"a": a, "b": b}, tf.keras.layers.Dense(3)(h))


def test_dict_features_train_from_resident_arrays():
    rng = np.random.default_rng(0)
    x = {"a": rng.normal(size=(32, 3)).astype("float32"), "b": rng.normal(size=(32, 2)).astype("float32")}
    y = rng.integers(0, 3, 32)
    r = trainer(two_input_model(), steps_per_call=2).fit(x, y, epochs=2)
    assert r.steps == 8 and np.isfinite(r.last_losses["model"])


def test_a_tuple_of_inputs_trains_from_resident_arrays():
    a, b = tf.keras.Input((3,)), tf.keras.Input((2,))
    model = tf.keras.Model([a, b], tf.keras.layers.Dense(3)(tf.keras.layers.Concatenate()([a, b])))
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(32, 3)).astype("float32"), rng.normal(size=(32, 2)).astype("float32"))
    r = trainer(model).fit(x, rng.integers(0, 3, 32), epochs=1)
    assert r.steps == 4


def test_arrays_of_different_lengths_are_refused_with_the_lengths():
    x = {"a": np.zeros((32, 3), "float32"), "b": np.zeros((30, 2), "float32")}
    with pytest.raises(InputError, match=r"x\['a'\]: 32, x\['b'\]: 30, y: 32"):
        trainer(two_input_model()).fit(x, np.zeros(32, int))


def test_strings_for_a_model_that_takes_numbers_are_refused_with_the_fix():
    """(Strings for a model that looks them up itself train: test_training_batches.)"""
    t = trainer(mlp())
    with pytest.raises(InputError, match="takes numbers.*x holds strings.*StringLookup"):
        t.fit(np.array([["a"] * 4] * 16), np.zeros(16, int))
    assert int(t.global_step.numpy()) == 0


def test_fractions_for_an_integer_input_are_refused_before_training():
    """Token ids scaled to 0..1 trained an Embedding on id 0 alone, without a word (Keras cuts them)."""
    model = tf.keras.Sequential([tf.keras.Input((5,), dtype="int32"), tf.keras.layers.Embedding(50, 4),
                                 tf.keras.layers.GlobalAveragePooling1D(), tf.keras.layers.Dense(3)])
    ids = np.random.default_rng(0).integers(0, 50, (32, 5))
    t = trainer(model)
    with pytest.raises(InputError, match=r"takes whole numbers \(int32.*x holds 1\d\d fractions \(float64.*Fix: "):
        t.fit(ids / 50.0, np.zeros(32, int))
    assert int(t.global_step.numpy()) == 0
    assert t.fit(ids.astype("float32"), np.zeros(32, int)).steps == 4  # whole numbers as floats: Keras casts them


# --------------------------------------------------------------------------- losses and labels
def test_a_per_example_loss_is_averaged_before_any_step(caplog):
    caplog.set_level("INFO", logger="amp_backends.train")
    model = mlp()
    opt = tf.keras.optimizers.SGD(0.1)
    sce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    upd = Update("model", lambda b: sce(b[1], model(b[0], training=True)), [(model.trainable_variables, opt)])
    x, y = classification_data(32)
    r = Trainer([upd], applied_plan(), batch_size=8, progress=False).fit(x, y, epochs=1)
    assert r.steps == 4 and np.isfinite(r.last_losses["model"]) and np.ndim(r.last_losses["model"]) == 0
    assert "per-example losses of shape (8,); the trainer uses their mean" in caplog.text


def test_a_loss_that_is_not_a_float_tensor_is_refused_before_any_step():
    model = mlp()
    opt = tf.keras.optimizers.SGD(0.1)
    upd = Update("model", lambda b: tf.argmax(model(b[0]), axis=-1), [(model.trainable_variables, opt)])
    before = [v.numpy().copy() for v in model.trainable_variables]
    t = Trainer([upd], applied_plan(), batch_size=8, progress=False)
    with pytest.raises(TypeError, match="update 'model' returned a int64 tensor.*floating-point"):
        t.fit(*classification_data(32), epochs=1)
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.trainable_variables, strict=True))


def test_a_file_name_given_as_data_is_told_to_be_loaded_first():
    """``fit("data.npz")``: the fix said np.asarray(...), which makes a 0-d array of the name."""
    t = trainer(mlp())
    with pytest.raises(InputError, match=r"x must be an array of numbers .*Received: .*Fix: load the arrays from the "
                                         r"file first \(np.load\('data.npz'\)"):
        t.fit("data.npz")
    with pytest.raises(InputError, match=r"Fix: give one row per sample: a text as a list of one, \[text\]\.$"):
        t.fit("the cat sat", np.zeros(1))
    with pytest.raises(InputError, match=r"Fix: convert it with np.asarray\(...\)\.$"):
        t.fit({1, 2, 3}, np.zeros(3))


def test_labels_outside_the_models_classes_fail_before_training():
    x, y = classification_data(32)
    y[5] = 12
    model = mlp()
    t = trainer(model)
    with pytest.raises(ValueError, match=r"class ids in 0..2 \(the model has 3 outputs\); 1 are outside "
                                         r"\(range found 0..12.*last layer 13 units"):
        t.fit(x, y)
    assert int(t.global_step.numpy()) == 0
    # one output unit (one class): the fix said "map them to 0..0", and "the model has 1 outputs"
    t = trainer(mlp(classes=1, activation="softmax"))
    with pytest.raises(ValueError, match=r"\(the model has 1 output: one class; for two classes on one sigmoid unit, "
                                         r"pass loss='binary_crossentropy'\); .*\. Fix: give the model's last layer "
                                         r"13 units\.$"):
        t.fit(x, y)


def test_nan_in_the_inputs_is_said_before_training_and_of_validation_data(caplog):
    """NaN features trained without a word: the steps of their batches were skipped as non-finite gradients (37 of
    40 in a run), the epochs' losses read nan, and all-NaN validation inputs gave a plausible val_loss. A model may
    replace them itself, so training goes on: the warning names the input and the first sample."""
    x, y = classification_data(32)
    x[9, 2] = np.nan
    with caplog.at_level("WARNING", logger="amp_backends"):
        assert trainer(mlp()).fit(x, y).steps == 4
    (said,) = [r.getMessage() for r in caplog.records if "NaN or Inf" in r.getMessage()]
    assert said.startswith("The inputs x hold 1 NaN or Inf value(s), the first in sample 9: a batch with one has a "
                           "NaN loss, unless the model replaces them itself") and "Fix: clean them" in said
    caplog.clear()
    clean, y = classification_data(32)
    features = {"a": np.zeros((32, 3), "float32"), "b": np.zeros((32, 2), "float32")}
    features["b"][4, 1] = np.inf
    with caplog.at_level("WARNING", logger="amp_backends"):
        trainer(mlp()).fit(clean, y, validation_data=(np.full_like(clean, np.nan), y))
        trainer(two_input_model()).fit(features, np.zeros(32, int))
    said = [r.getMessage() for r in caplog.records if "NaN or Inf" in r.getMessage()]
    assert [m.split(":")[0] for m in said] == ["The inputs x hold 128 NaN or Inf value(s), the first in sample 0",
                                               "The inputs x['b'] hold 1 NaN or Inf value(s), the first in sample 4"]


def test_one_hot_labels_with_a_sparse_loss_say_how_to_fix_it():
    x, y = classification_data(32)
    with pytest.raises(ValueError, match=r"look one-hot.*np.argmax"):
        trainer(mlp()).fit(x, np.eye(3)[y])


def test_labels_are_checked_on_the_first_batch_of_a_dataset():
    x, y = classification_data(32)
    y[:] = -1
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)
    with pytest.raises(ValueError, match="class ids in 0..2"):
        trainer(mlp()).fit(ds)


# --------------------------------------------------------------------------- MNIST files as people save them
def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_float_images_in_0_1_and_float_labels_are_read_as_the_digits_they_are(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (16, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, 16)
    path = _npz(tmp_path / "m.npz", x_train=pixels / 255.0, y_train=labels.astype("float32"),
                x_test=(pixels[:4] / 255.0).reshape(4, 784), y_test=np.eye(10)[labels[:4]])
    (x, y), (xt, yt) = read_mnist_npz(path)
    assert x.dtype == np.uint8 and np.array_equal(x, pixels)  # not blank images
    assert y.dtype == np.int64 and np.array_equal(y, labels)
    assert xt.shape == (4, 28, 28) and np.array_equal(xt, pixels[:4]) and np.array_equal(yt, labels[:4])


@pytest.mark.parametrize("override,needle", [
    (dict(x_train=np.full((8, 28, 28), -0.5)), r"values in \[-0.5, -0.5\].*Standardised"),
    (dict(y_train=np.full(8, 10)), r"class ids in 0..9; 8 are outside.*\[10, 10, 10\]"),
    (dict(y_train=np.full(8, 2.5)), r"must be whole class ids; 8 are not \(first: 2.5 at index 0\)"),
    (dict(x_train=np.full((8, 28, 28), np.nan)), "NaN or Inf"),
])
def test_mnist_files_that_cannot_be_digits_are_refused(tmp_path, override, needle):
    arrays = dict(x_train=np.zeros((8, 28, 28), np.uint8), y_train=np.zeros(8, int),
                  x_test=np.zeros((2, 28, 28), np.uint8), y_test=np.zeros(2, int)) | override
    with pytest.raises(DataUnavailableError, match=needle):
        read_mnist_npz(_npz(tmp_path / "m.npz", **arrays))


def test_fit_once_per_epoch_copies_the_same_arrays_to_the_device_once():
    x, y = classification_data(64)
    t = trainer(mlp())
    t.fit(x, y, epochs=1)
    source = t._last_input[1]
    t.fit(x, y, epochs=2)
    assert t._last_input[1] is source  # the same arrays: no new copy, no new checks
    t.fit(x.copy(), y, epochs=3)
    assert t._last_input[1] is not source


def test_a_repeated_dataset_is_one_stream_across_epochs_as_keras_reads_it():
    """With steps_per_epoch the next epoch continues the stream (batches 3, 4, 5), it does not restart it."""
    ids = np.repeat(np.arange(10), 4).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((np.stack([ids] * 4, 1), np.zeros(40, int))).batch(4, drop_remainder=True)
    seen = tf.Variable(tf.zeros(10))
    model = mlp()
    base = classifier_updates(model, tf.keras.optimizers.SGD(0.0), tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))[0]

    def loss_fn(batch):
        seen.assign_add(tf.one_hot(tf.cast(batch[0][0, 0], tf.int32), 10))
        return base.loss_fn(batch)

    t = Trainer([Update("model", loss_fn, base.groups)], applied_plan(), batch_size=4, progress=False, steps_per_call=2)
    r = t.fit(ds.repeat(), epochs=4, steps_per_epoch=3)
    assert r.steps == 12 and r.epochs_completed == 4
    assert seen.numpy().tolist() == [2, 2, 1, 1, 1, 1, 1, 1, 1, 1]  # 12 batches of 10, in order: a second pass begun


def test_steps_per_epoch_takes_a_positive_int_of_python_or_numpy_and_nothing_else():
    """``steps_per_epoch=True`` trained one step an epoch (a bool is an int to Python) and NumPy's integers were
    refused: now True is refused with the fix, NumPy's ints are ints."""
    from amp_backends.errors import InputError

    x, y = classification_data(32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True).repeat()
    t = trainer(mlp())
    for bad in (True, 0, 2.0, "3"):
        with pytest.raises(InputError, match=rf"steps_per_epoch must be a positive integer or None. Received: "
                                             rf"{bad!r}\. Fix: "):
            t.fit(ds, epochs=1, steps_per_epoch=bad)
    assert int(t.global_step.numpy()) == 0
    assert t.fit(ds, epochs=2, steps_per_epoch=np.int64(3)).steps == 6


def id_batches(batches, size, features=8):
    """``batches`` batches of ``size`` rows whose features all hold the batch's id (and labels 0)."""
    ids = np.repeat(np.arange(batches), size).astype("float32")
    return np.stack([ids] * features, 1), np.zeros(len(ids), int)


def recording(**kw):
    """A trainer whose loss records each step's batch id, in order (SGD(0): the weights stay); and a reader of them."""
    seen, count = tf.Variable(tf.fill([64], -1.0)), tf.Variable(0)
    base = classifier_updates(mlp(8), tf.keras.optimizers.SGD(0.0), tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))[0]

    def loss_fn(batch):
        seen.scatter_nd_update([[count]], [batch[0][0, 0]])
        count.assign_add(1)
        return base.loss_fn(batch)

    t = Trainer([Update("model", loss_fn, base.groups)], applied_plan(), progress=False, **kw)
    return t, lambda: seen.numpy()[:int(count.numpy())].astype(int).tolist()


def unknown_length(x, y, size):
    ds = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(size, drop_remainder=True)
    assert int(ds.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    return ds


@pytest.mark.parametrize("kind,steps_per_epoch,epochs,per_call", [("rebatched", 10, 3, 3), ("generator", 12, 2, 4)])
def test_steps_per_epoch_longer_than_a_pass_of_unknown_length_continues_the_stream(kind, steps_per_epoch, epochs,
                                                                                    per_call):
    """8 batches a pass, of unknown length: each pass that ends starts the next, epoch after epoch (the pass ends
    inside a call with 3 steps per call, at a call's end with 4), instead of calling the dataset empty."""
    x, y = id_batches(8, 32)
    if kind == "rebatched":  # batched without drop_remainder: rebatched to 32, its length unknown
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
        assert int(ds.rebatch(32, drop_remainder=True).cardinality()) == tf.data.UNKNOWN_CARDINALITY
    else:
        ds = tf.data.Dataset.from_generator(lambda: ((x[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)),
                                            output_signature=(tf.TensorSpec((32, 8), tf.float32),
                                                              tf.TensorSpec((32,), tf.int64)))
    t, seen = recording(batch_size=32, steps_per_call=per_call)
    r = t.fit(ds, epochs=epochs, steps_per_epoch=steps_per_epoch)
    assert r.steps == steps_per_epoch * epochs and r.epochs_completed == epochs
    assert seen() == [i % 8 for i in range(r.steps)]  # the stream's order across the passes' boundaries


def test_a_pass_that_ends_with_an_epoch_starts_the_next_one():
    """A known length (6 batches) ending exactly where an epoch of 3 does: the next epoch starts a pass."""
    x, y = id_batches(6, 4)
    t, seen = recording(batch_size=4, steps_per_call=3)
    r = t.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4, drop_remainder=True), epochs=3, steps_per_epoch=3)
    assert r.steps == 9 and seen() == [0, 1, 2, 3, 4, 5, 0, 1, 2]


def test_a_resumed_stream_of_unknown_length_counts_a_pass_and_goes_on_where_it_was(tmp_path, caplog):
    """The position (batch 10 of the stream) is past the end of a pass of 8: a pass is counted, the skip wraps."""
    x, y = id_batches(8, 4)
    t, _ = recording(batch_size=4, steps_per_call=3, checkpoint_dir=str(tmp_path))
    t.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4, drop_remainder=True), epochs=1, steps_per_epoch=10)
    caplog.set_level("INFO", logger="amp_backends.train")
    t2, seen = recording(batch_size=4, steps_per_call=3, checkpoint_dir=str(tmp_path))
    r = t2.fit(unknown_length(x, y, 4), epochs=2, steps_per_epoch=10, resume=True)  # the same batches, length unknown
    assert r.steps == 20 and r.epochs_completed == 2
    assert seen() == [2, 3, 4, 5, 6, 7, 0, 1, 2, 3]
    assert "past the end of a pass of 8 batches (counted): it goes on from batch 2" in caplog.text


def test_a_resumed_stream_whose_passes_shrink_is_not_called_empty(tmp_path):
    """Each pass of the generator 2 batches shorter: the resumed position cannot be found, and the error says why."""
    x, y = id_batches(8, 4)
    t, _ = recording(batch_size=4, steps_per_call=3, checkpoint_dir=str(tmp_path))
    t.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4, drop_remainder=True), epochs=1, steps_per_epoch=10)
    calls = iter(range(100))

    def shrinking():
        n = max(8 - 2 * next(calls), 1)
        return ((x[4 * i:4 * i + 4], y[4 * i:4 * i + 4]) for i in range(n))

    ds = tf.data.Dataset.from_generator(shrinking, output_signature=(tf.TensorSpec((4, 8), tf.float32),
                                                                     tf.TensorSpec((4,), tf.int64)))
    t2, _ = recording(batch_size=4, steps_per_call=3, checkpoint_dir=str(tmp_path))
    with pytest.raises(InputError, match=r"no batch of 4 after skipping \d+ of the \d+ batches of a pass: its passes "
                                         "differ.*Fix: make the pipeline give them, or train without resume"):
        t2.fit(ds, epochs=2, steps_per_epoch=10, resume=True)


def test_a_run_stopped_at_the_end_of_a_pass_of_unknown_length_goes_on_with_the_next_epoch():
    """Stopped after a pass's last batch, before its end was seen: the next fit skips to the end, the epoch ends."""
    x, y = id_batches(8, 4)
    t, seen = recording(batch_size=4, steps_per_call=4)
    t.fit(unknown_length(x, y, 4), epochs=2, max_steps=8)
    r = t.fit(unknown_length(x, y, 4), epochs=2)
    assert r.steps == 16 and r.epochs_completed == 2 and seen() == list(range(8)) * 2


def test_a_pass_that_yields_nothing_is_still_refused_as_empty():
    """A generator that reads a shared iterator: the pass after the first yields nothing."""
    x, y = id_batches(3, 4)
    shared = iter(range(3))
    ds = tf.data.Dataset.from_generator(lambda: ((x[4 * i:4 * i + 4], y[4 * i:4 * i + 4]) for i in shared),
                                        output_signature=(tf.TensorSpec((4, 8), tf.float32),
                                                          tf.TensorSpec((4,), tf.int64)))
    t, seen = recording(batch_size=4, steps_per_call=2)
    with pytest.raises(InputError, match="yielded no batch of 4: it is empty"):
        t.fit(ds, epochs=2, steps_per_epoch=3)
    assert seen()  # the first pass trained


def test_a_dataset_smaller_than_one_batch_is_refused():
    x, y = classification_data(5)
    with pytest.raises(InputError, match="yields no batch of 8.*fewer samples than one batch"):
        trainer(mlp()).fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True))


def test_a_dataset_of_dicts_is_told_how_to_map_it_for_a_classifier():
    x, y = classification_data(32)
    ds = tf.data.Dataset.from_tensor_slices({"image": x, "label": y}).batch(8, drop_remainder=True)
    with pytest.raises(ValueError, match=r"yields dicts \(keys \['image', 'label'\]\).*dataset.map"):
        trainer(mlp()).fit(ds)


def test_labels_as_a_list_of_numpy_scalars_train():
    x, y = classification_data(16)
    assert trainer(mlp()).fit(x, list(y), epochs=1).steps == 2


def test_an_update_given_no_model_or_no_optimizer_says_what_it_expects():
    """``classifier_updates(None, None)`` was "'NoneType' object has no attribute 'variables'", an optimizer's name
    an AttributeError at the first step: both are our errors, before any work."""
    model, opt = mlp(), tf.keras.optimizers.SGD()
    cases = [((None, opt), r"expected a Keras model \(keras.Model\). Received: None \(of type NoneType\). Fix: "),
             ((model, "adam"), r"expected a Keras optimizer, such as keras.optimizers.Adam\(1e-3\). Received: 'adam' "
                               r"\(of type str\). Fix: pass an optimizer object"),
             ((model, None), r"expected a Keras optimizer.*Received: None")]
    for args, needle in cases:
        with pytest.raises(amp_backends.errors.AmpConfigError, match=needle):
            classifier_updates(*args)
    from amp_backends.models import gan_discriminator, gan_generator

    with pytest.raises(amp_backends.errors.AmpConfigError, match=r"expected a Keras optimizer.*Received: 'rmsprop'"):
        gan_updates(gan_generator(), gan_discriminator(), opt, "rmsprop")


def test_an_optimizer_class_given_to_an_update_is_refused_before_the_first_step():
    """``classifier_updates(model, keras.optimizers.Adam)`` (the class, not called) passed, then fit failed inside
    Keras: "Adam.build() missing 1 required positional argument: 'var_list'"."""
    with pytest.raises(amp_backends.errors.AmpConfigError, match=r"expected a Keras optimizer.*Received: the class "
                                                                 r"Adam, not an optimizer made from it\. Fix: "):
        classifier_updates(mlp(), tf.keras.optimizers.Adam)


def test_an_unbuilt_model_is_refused_with_the_fix():
    model = tf.keras.Sequential([tf.keras.layers.Dense(3)])  # no Input: no variables yet
    with pytest.raises(amp_backends.errors.AmpConfigError, match="is not built: it has no variables.*keras.Input"):
        Trainer(classifier_updates(model, tf.keras.optimizers.SGD()), applied_plan(), batch_size=8)


    class Sub(tf.keras.Model):
        def __init__(self):
            super().__init__(name="sub")
            self.dense = tf.keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

    sub = Sub()
    sub.build((None, 8))  # Keras 3 marks it built; its Dense layer is not (the fix said to call build)
    said = r"'sub' is marked built, but it has no variables.*call it once on a batch \(model\(x\[:1\]\)\)"
    with contextlib.nullcontext() if sub.variables else pytest.raises(amp_backends.errors.AmpConfigError, match=said):
        classifier_updates(sub, tf.keras.optimizers.SGD())
    x = tf.Variable(1.0)
    with pytest.raises(amp_backends.errors.AmpConfigError, match="Update 'u' has no variables to train.*keras.Input"):
        Trainer([Update("u", lambda b: x * 0.0, [([], tf.keras.optimizers.SGD())])], applied_plan(), batch_size=8)


def test_an_optimizer_that_scales_losses_itself_is_refused():
    model = mlp()
    opt = applied_plan(loss_scale="dynamic").wrap_optimizer(tf.keras.optimizers.SGD())
    with pytest.raises(amp_backends.errors.AmpConfigError, match="scales losses itself.*scaled twice.*plain optimizer"):
        Trainer(classifier_updates(model, opt), applied_plan(), batch_size=8)


def test_one_optimizer_may_serve_two_groups():
    a, b = tf.keras.layers.Dense(4), tf.keras.layers.Dense(1)
    a.build((None, 4))
    b.build((None, 4))
    opt = tf.keras.optimizers.Adam(1e-2)
    upd = Update("u", lambda batch: tf.reduce_mean(tf.cast(b(a(batch[0])), tf.float32) ** 2),
                 [(a.trainable_variables, opt), (b.trainable_variables, opt)])
    r = Trainer([upd], applied_plan(), batch_size=8, progress=False).fit(np.ones((16, 4), np.float32), epochs=1)
    assert r.applied == {"u": 2}


def test_resume_without_a_checkpoint_dir_is_refused():
    with pytest.raises(amp_backends.errors.AmpConfigError, match="resume=True.*no checkpoint_dir"):
        trainer(mlp()).fit(*classification_data(16), resume=True)


# --------------------------------------------------------------------------- what a user gets wrong, said as ours
def test_trainer_arguments_of_the_wrong_kind_are_refused_at_construction_with_the_fix():
    """A policy name as the plan failed with ``AttributeError: 'str' object has no attribute 'loss_scale'``; one Update
    not in a list with ``'Update' object is not iterable``; ``seed="a"`` failed at the first ``fit`` on arrays
    (``can only concatenate str``) and ``seed=1.5`` or ``"a"`` trained a dataset in silence."""
    model = mlp()
    updates = classifier_updates(model, tf.keras.optimizers.SGD())
    plan = applied_plan()
    cases = [
        ((updates, "mixed_bfloat16"), {}, TypeError, r"takes an amp_backends Plan \(from amp_backends.auto_configure"
         r"\(\).*not a policy name. Received: 'mixed_bfloat16' \(of type str\). Fix: plan = "
         r"amp_backends.auto_configure\(policy='mixed_bfloat16'\)"),
        ((updates, None), {}, TypeError, r"takes an amp_backends Plan.*Received: None.*Fix: plan = "),
        ((updates[0], plan), {}, TypeError, r"non-empty list of Update. Received: Update\(name='model'.* \(of type "
         r"Update\). Fix: pass classifier_updates\(model, optimizer\)"),
        ((model, plan), {}, TypeError, r"updates must be a non-empty list of Update.*\(of type Sequential\)"),
        (([], plan), {}, TypeError, r"updates must be a non-empty list of Update. Received: \[\] \(of type list\)"),
        ((updates, plan), {"seed": "a"}, amp_backends.AmpConfigError,
         r"seed must be an integer >= 0 or None. Received: seed='a' \(of type str\). Fix: "),
        ((updates, plan), {"seed": 1.5}, amp_backends.AmpConfigError, r"seed must be an integer >= 0.*seed=1.5"),
        ((updates, plan), {"seed": -1}, amp_backends.AmpConfigError, r"seed must be an integer >= 0.*seed=-1"),
        ((updates, plan), {"seed": True}, amp_backends.AmpConfigError, r"seed must be an integer >= 0.*seed=True"),
        # images_per_step=0 counted as the batch size, and -8 gave a negative throughput, in silence
        ((updates, plan), {"images_per_step": 0}, amp_backends.AmpConfigError,
         r"images_per_step must be an integer >= 1 or None. Received: images_per_step=0 \(of type int\). Fix: "),
        ((updates, plan), {"images_per_step": -8}, amp_backends.AmpConfigError, r"images_per_step must be.*=-8"),
        ((updates, plan), {"images_per_step": 2.5}, amp_backends.AmpConfigError, r"images_per_step must be.*=2.5"),
    ]
    for args, kwargs, error, needle in cases:
        with pytest.raises(error, match=needle):
            Trainer(*args, batch_size=8, progress=False, **kwargs)
    assert Trainer(updates, plan, batch_size=8, progress=False, seed=np.int64(3)).seed == 3  # NumPy's ints are ints
    assert Trainer(updates, plan, batch_size=8, progress=False, images_per_step=np.int32(16)).images_per_step == 16


def test_fit_counts_that_are_not_positive_are_our_error_with_the_fix():
    x, y = classification_data(32)
    t = trainer(mlp())
    # epochs=None (an int is asked; only max_steps may be None) was a TypeError from the loop's comparison
    for kwargs in ({"epochs": 0}, {"epochs": -1}, {"epochs": "2"}, {"max_steps": -3}, {"epochs": None},
                   {"epochs": None, "max_steps": 3}):
        with pytest.raises(amp_backends.AmpConfigError, match="must be a positive integer.*Received.*Fix:"):
            t.fit(x, y, **kwargs)
    assert int(t.global_step.numpy()) == 0


def test_keras_fit_keywords_are_refused_with_what_does_their_work_and_the_fix_for_class_weight_trains():
    """Keras fit's keywords (batch_size, callbacks, class_weight...) given to Trainer.fit were Python's 'unexpected
    keyword argument', saying neither what the trainer takes instead nor how; a misspelt one, no nearest name."""
    x, y = classification_data(32)
    t = trainer(mlp())
    for kwargs, fix in (({"batch_size": 8}, r"Trainer\(updates, plan, batch_size=N\)"),
                        ({"callbacks": []}, r"observers=\[\.\.\.\]"), ({"verbose": 0}, "progress=False"),
                        ({"class_weight": {0: 1.0, 1: 2.0}}, r"a tf\.data dataset of \(x, y, weights\[y\]\)"),
                        ({"validation_split": 0.2}, r"validation_data=\(x_val, y_val\)"),
                        ({"epoch": 2}, "did you mean epochs="),
                        ({"batchsize": 8}, r"did you mean batch_size=\? \(give it to the Trainer")):
        name = next(iter(kwargs))
        with pytest.raises(amp_backends.AmpConfigError, match=rf"Trainer\.fit\(\) takes no {name}=.*Received: {name}="
                                                             rf".*Expected keywords: epochs, max_steps.*Fix: .*{fix}"):
            t.fit(x, y, **kwargs)
    with pytest.raises(amp_backends.AmpConfigError, match=r"Received: callbacks=\[<EarlyStopping>\]\. Expected"):
        t.fit(x, y, callbacks=[tf.keras.callbacks.EarlyStopping()])  # (its repr, cut off mid-text, said 'object at')
    with pytest.raises(amp_backends.AmpConfigError, match=r"Received: sample_weight=<ndarray of shape \(32,\)>\."):
        t.fit(x, y, sample_weight=np.ones(32))
    assert int(t.global_step.numpy()) == 0
    weights = np.array([1.0, 2.0, 0.5], "float32")  # the fix for class_weight={0: 1.0, 1: 2.0, 2: 0.5}
    weighted = tf.data.Dataset.from_tensor_slices((x, y, weights[y])).batch(8, drop_remainder=True)
    assert t.fit(weighted).steps == 4


def test_fit_and_keras_keywords_given_to_the_trainer_are_refused_saying_where_they_go():
    """Trainer(updates, plan, batch_size=32, epochs=2) (a Keras user's habit) was Python's 'unexpected keyword
    argument'; so was a misspelt keyword of its own."""
    updates = classifier_updates(mlp(), tf.keras.optimizers.SGD())
    plan = applied_plan()
    for kwargs, fix in (({"epochs": 2}, r"give it to fit\(\): trainer\.fit\(x, y, epochs=\.\.\.\)\."),
                        ({"validation_data": None}, r"give it to fit\(\): trainer\.fit\(x, y, validation_data="),
                        ({"callbacks": []}, r"observers=\[\.\.\.\].*patience= and keep_best="),
                        ({"checkpointdir": "runs"}, r"did you mean checkpoint_dir=\?$")):
        name = next(iter(kwargs))
        with pytest.raises(amp_backends.AmpConfigError, match=rf"Trainer\(\) takes no {name}=\. Received: {name}=.*"
                                                             rf"Fix: .*{fix}"):
            Trainer(updates, plan, batch_size=8, progress=False, **kwargs)


def test_batches_of_the_wrong_structure_are_an_input_error_that_says_what_they_held():
    x, y = classification_data(32)
    t = trainer(mlp())
    four = tf.data.Dataset.from_tensor_slices((x, y, y, y)).batch(8, drop_remainder=True)
    with pytest.raises(InputError, match=r"Received a tuple of 4 items\. Fix") as err:
        t.fit(four)
    assert "no labels" not in str(err.value)  # (it has labels: it has too many items)
    # what the user gave, not the trainer's own (x, None) batch: they said 'tuple of 2 item(s)' to fit((x, y, w))
    for given in ((x,), ((x, y, np.ones(32)),)):
        with pytest.raises(InputError, match=r"Received no labels: y is None \(arrays given as fit\(x\) alone; a "
                                             r"tuple given as x is the model's inputs\)\. Fix: fit\(x, y\)"):
            t.fit(*given)
    with pytest.raises(InputError, match=r"Received one \w+ per batch, no labels \(a dataset of the inputs alone\)"):
        t.fit(tf.data.Dataset.from_tensor_slices(x).batch(8, drop_remainder=True))
    named = tf.data.Dataset.from_tensor_slices({"x": x, "y": y}).batch(8, drop_remainder=True)
    with pytest.raises(InputError, match="the data yields dicts"):
        t.fit(named)


@pytest.mark.parametrize("labels, needle", [
    (np.array(["a", "b"] * 16), "must hold class ids"), (np.zeros((32, 2), "int64"), "one class id per sample")])
def test_labels_that_are_not_class_ids_are_refused_with_the_fix(labels, needle):
    x, _ = classification_data(32)
    with pytest.raises(InputError, match=f"{needle}.*Fix:"):
        trainer(mlp()).fit(x, labels)


def test_the_samples_a_full_batch_leaves_out_of_each_epoch_are_said(caplog):
    x, y = classification_data(64)
    with caplog.at_level("INFO", logger="amp_backends"):
        trainer(mlp(), batch_size=24).fit(x, y, epochs=1)
    assert "64 samples resident on" in caplog.text and "(16 left out of each epoch" in caplog.text


# --------------------------------------------------------------------------- the same arrays again
def test_a_second_fit_on_arrays_changed_in_place_trains_on_and_checks_the_new_values():
    """fit once per epoch reuses the arrays on the device only while their contents are the same."""
    x, y = classification_data(64)
    t = trainer(mlp())
    t.fit(x, y, epochs=1)
    kept = t._last_input
    t.fit(x, y, epochs=2)
    assert t._last_input is kept  # unchanged: neither copied nor checked again
    x[:] = 0.0
    t.fit(x, y, epochs=3)
    assert t._last_input is not kept  # new values: copied again
    np.testing.assert_array_equal(t._last_input[1].x.numpy(), x)
    y[:] = 99  # past the model's 3 classes: checked again, refused before a step runs
    with pytest.raises(InputError, match="99"):
        t.fit(x, y, epochs=4)


def test_validation_arrays_changed_in_place_are_checked_again():
    x, y = classification_data(64)
    vx, vy = classification_data(16)
    t = trainer(mlp())
    t.fit(x, y, epochs=1, validation_data=(vx, vy))
    vy[:] = 7
    with pytest.raises(InputError, match="7"):
        t.fit(x, y, epochs=2, validation_data=(vx, vy))


def test_a_list_of_python_rows_is_one_input_and_no_data_says_so():
    x, y = classification_data(16)
    r = trainer(mlp()).fit(x.tolist(), y.tolist(), epochs=1)  # 16 rows of 4 numbers: one input, not 16
    assert r.steps == 2
    with pytest.raises(InputError, match="has 0 samples.*Fix: pass data"):
        trainer(mlp()).fit(np.zeros((0, 4), np.float32), np.zeros(0, int), epochs=1)


def test_device_types_are_read_from_short_and_full_names_xpu_included():
    from amp_backends.training.step import device_type

    assert [device_type(d) for d in ("/GPU:0", "/XPU:1", "/job:localhost/replica:0/task:0/device:XPU:0",
                                     "/cpu:0")] == ["GPU", "XPU", "XPU", "CPU"]


# --------------------------------------------------------------------------- several inputs
def listed_inputs_model():
    a, b = tf.keras.Input((4,), name="a"), tf.keras.Input((7,), name="b")
    out = tf.keras.layers.Dense(3)(tf.keras.layers.Concatenate()([a, b]))
    return tf.keras.Model([a, b], out, name="two")


@pytest.mark.parametrize(("x", "match"), [
    (lambda xa, xb: [xb, xa], r"takes its input 'a' of shape \('batch', 4\); x\[0\] has rows of shape \(7,\)"),
    (lambda xa, xb: {"a": xb, "b": xa}, r"takes its input 'a' of shape \('batch', 4\); x\['a'\] has rows of shape"),
    (lambda xa, xb: xa, r"takes 2 inputs \(a, b\); x is one ndarray"),
    (lambda xa, xb: [xa], r"takes 2 inputs \(a, b\); x has 1"),
])
def test_several_inputs_in_the_wrong_order_or_number_are_our_error_in_fit_validation_and_predict(x, match):
    """They came as a Keras ValueError from inside the traced graph (input_spec), in fit, validation and predict."""
    xa, xb = np.zeros((16, 4), np.float32), np.zeros((16, 7), np.float32)
    y = np.zeros(16, int)
    with pytest.raises(InputError, match=match):
        trainer(listed_inputs_model()).fit(x(xa, xb), y, epochs=1)
    t = trainer(listed_inputs_model())
    with pytest.raises(InputError, match=match):
        t.fit([xa, xb], y, epochs=1, validation_data=(x(xa, xb), y))
    t.fit([xa, xb], y, epochs=1)
    with pytest.raises(InputError, match=match):
        t.predict(x(xa, xb))
    assert trainer(listed_inputs_model()).fit({"b": xb, "a": xa}, y, epochs=1).steps == 2  # by name: any order


def test_a_dict_for_a_model_of_one_input_is_our_error_before_the_first_step_unless_it_names_the_input():
    """It came as Keras's "structure of inputs doesn't match" from inside the compiled step, after the precision
    check had logged the fix at INFO; a functional model's input named as the key takes the dict (as Keras does)."""
    x, y = classification_data(16)
    match = (r"takes one input, '\w+' of shape \('batch', 4\); x is a dict without that name \(its keys: \['a'\]\)"
             r".*Fix: give x the array itself \(for a dataset: dataset.map\(lambda x, y: \(x\['a'\], y\)\)\)")
    for data in (({"a": x}, y), (tf.data.Dataset.from_tensor_slices(({"a": x}, y)).batch(8),)):
        t = trainer(mlp())
        with pytest.raises(InputError, match=match):
            t.fit(*data, epochs=1)
        assert int(t.global_step.numpy()) == 0
    with pytest.raises(InputError, match=match):  # validation data and predict alike
        t.fit(x, y, epochs=1, validation_data=({"a": x}, y))
    with pytest.raises(InputError, match=match):
        t.predict({"a": x})
    inp = tf.keras.Input((4,), name="a")
    t = trainer(tf.keras.Model(inp, tf.keras.layers.Dense(3)(inp)))
    assert t.fit({"a": x}, y, epochs=1, validation_data=({"a": x}, y)).steps == 2
    assert t.predict({"a": x}).shape == (16, 3)


@pytest.mark.parametrize(("w", "match"), [(np.ones((16, 2)), r"sample_weight has shape \(8, 2\). Expected one weight"),
                                          (-np.ones(16), "must be finite and not negative"),
                                          (np.full(16, np.nan), "must be finite and not negative")])
def test_sample_weights_of_another_shape_or_negative_are_refused_before_training(w, match):
    """A weight per class failed inside the graph (reshape); negative weights trained on, the loss scaled by 1e12."""
    x, y = classification_data(16)
    with pytest.raises(InputError, match=match):
        trainer(mlp()).fit(tf.data.Dataset.from_tensor_slices((x, y, w)).batch(8, drop_remainder=True), epochs=1)
    weights = np.r_[np.zeros(8), np.ones(8)]  # zero leaves a sample out: accepted
    assert trainer(mlp()).fit(tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(8), epochs=1).steps == 2


@pytest.mark.parametrize("loss", ["categorical_crossentropy",
                                  lambda: tf.keras.losses.CategoricalCrossentropy(from_logits=True)])
def test_class_ids_for_a_categorical_loss_are_refused_with_both_fixes(loss):
    """Class ids with categorical cross-entropy failed inside the graph ("target and output must have the same
    rank"); only one-hot labels for a sparse loss had our error."""
    x, y = classification_data(16)
    t = Trainer(classifier_updates(mlp(), tf.keras.optimizers.SGD(), loss if isinstance(loss, str) else loss()),
                applied_plan(), batch_size=8, progress=False)
    with pytest.raises(InputError, match=r"class ids \(shape \(16,\)\), but categorical cross-entropy takes one-hot "
                                         r"rows \(shape \(N, 3\)\). Fix: loss='sparse_categorical_crossentropy'"):
        t.fit(x, y, epochs=1)
    t.fit(x, np.eye(3, dtype="float32")[y], epochs=1)  # one-hot rows: accepted


@pytest.mark.parametrize("model_takes,rows,trains", [
    ((4,), (1, 4), False), ((1, 4), (4,), False),  # a 1 Keras does not add or drop: a TensorFlow error in the step
    ((4,), (4, 1), True), ((4, 1), (4,), True), ((28, 28, 1), (28, 28), True),  # a trailing 1: Keras adjusts it
])
def test_rows_that_differ_from_the_input_by_an_axis_of_1_are_judged_as_keras_adjusts_them(model_takes, rows, trains):
    """Rows of shape (1, 4) for keras.Input((4,)) passed the check (every 1 was ignored) and failed inside the
    compiled step with Keras's ValueError; Keras adjusts only a trailing axis of size 1."""
    model = tf.keras.Sequential([tf.keras.Input(model_takes), tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
    x, y = np.random.default_rng(0).random((16, *rows), np.float32), np.arange(16) % 3
    if trains:
        assert trainer(model, check_models=False).fit(x, y, epochs=1).steps == 2
    else:
        with pytest.raises(InputError, match=re.escape(f"takes inputs of shape {('batch', *model_takes)}; x has rows "
                                                       f"of shape {rows} (x: {x.shape}). Fix: reshape the data")):
            trainer(model, check_models=False).fit(x, y, epochs=1)


@pytest.mark.parametrize("loss,units,labels", [
    ("mse", 3, (16, 5)),  # "Dimensions must be equal, but are 5 and 3 for '{{node while/sub}}'"
    ("categorical_crossentropy", 3, (16, 4)),  # "target.shape=(16, 4), output.shape=(16, 3)" from Keras
    ("mse", 3, (16, 1)),  # broadcast against the 3 outputs: trained on without a word
])
@pytest.mark.parametrize("as_dataset", [False, True])
def test_labels_of_another_shape_than_the_output_are_refused_before_training(loss, units, labels, as_dataset):
    """Labels whose shape differs from the output's, for a loss comparing the two element by element, failed
    inside the compiled step (a graph error) or broadcast silently."""
    x, _ = classification_data(16)
    y = np.random.default_rng(0).random(labels).astype("float32")
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(units)], name="net")
    t = Trainer(classifier_updates(model, tf.keras.optimizers.SGD(), loss), applied_plan(), batch_size=8,
                progress=False)
    data = (tf.data.Dataset.from_tensor_slices((x, y)).batch(8),) if as_dataset else (x, y)
    with pytest.raises(InputError, match=rf"The labels y have shape \({'8' if as_dataset else '16'}, "
                                         rf"{labels[1]}\), \({labels[1]},\) per sample, where the model 'net' outputs "
                                         r"\(3,\) per sample.*Fix: give the labels the output's shape"):
        t.fit(*data, epochs=1)
    assert int(t.global_step.numpy()) == 0  # before any step


def test_labels_the_loss_squeezes_or_the_model_takes_are_accepted():
    x, _ = classification_data(16)
    y = np.random.default_rng(0).random((16,)).astype("float32")
    for units, labels in ((1, y), (1, y[:, None]), (3, np.stack([y] * 3, 1)), (3, (np.stack([y] * 3, 1),)),
                          (3, [np.stack([y] * 3, 1)])):  # one array, alone or in a tuple or list of one
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(units)])
        t = Trainer(classifier_updates(model, tf.keras.optimizers.SGD(), "mse"), applied_plan(), batch_size=8,
                    progress=False)
        assert t.fit(x, labels, epochs=1).steps == 2


def test_labels_of_several_arrays_for_one_output_are_refused_with_the_way_to_weigh_samples():
    """fit(x, (y, w)) on a model with one output failed in optree: "Expected an instance of tuple, got <tf.Tensor
    'while/sequential_1/dense_1/Softmax:0'..."."""
    x, y = classification_data(16)
    for labels in ((y, np.ones(16, "float32")), [y, y]):
        with pytest.raises(InputError, match=r"The labels y hold 2 arrays, where the model '\w+' has one output.*"
                                             r"from_tensor_slices\(\(x, y, sample_weight\)\)"):
            trainer(mlp()).fit(x, labels, epochs=1)


@pytest.mark.parametrize("loss", ["mse", None])
def test_a_model_whose_output_rank_is_unknown_still_trains(loss):
    """The labels' shape check read the output's shape for every model: one of unknown rank (a tf.py_function in a
    Lambda, on Keras 2) stopped with TensorFlow's "Cannot iterate over a shape with unknown rank" before training."""
    from amp_backends.keras_compat import keras_info

    if (keras_info(tf).generation or 2) >= 3:
        pytest.skip("Keras 3 builds such a Lambda only with its output_shape (the rank then known), and its own "
                    "losses need the rank of the py_function's output inside the step")
    x, y = classification_data(16)
    inp = tf.keras.Input((4,))
    out = tf.keras.layers.Lambda(lambda t: tf.py_function(lambda a: a * 1.0, [t], tf.float32))(
        tf.keras.layers.Dense(3)(inp))
    model = tf.keras.Model(inp, out)
    sparse = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    t = Trainer(classifier_updates(model, tf.keras.optimizers.SGD(0.1), loss or sparse), applied_plan(),
                batch_size=8, progress=False)
    assert t.fit(x, np.eye(3, dtype="float32")[y] if loss else y, epochs=1).steps == 2


def test_padded_timesteps_are_left_out_of_the_loss_as_keras_leaves_them():
    """A mask_zero tagger: the trainer's loss and evaluate() counted the padded timesteps, where Keras's fit and
    evaluate leave them out (1.6070 against 1.6124 on a held-out user's model, at a learning rate of 0)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 20, (16, 12))
    ids[:, 4:] = 0  # 8 of 12 timesteps padding
    tags = rng.integers(0, 5, (16, 12))
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((12,)), tf.keras.layers.Embedding(20, 8, mask_zero=True),
                                 tf.keras.layers.GRU(8, return_sequences=True),
                                 tf.keras.layers.Dense(5, activation="softmax")])
    model.compile(loss="sparse_categorical_crossentropy")
    keras_loss = model.evaluate(ids, tags, batch_size=16, verbose=0)
    t = Trainer(classifier_updates(model, tf.keras.optimizers.SGD(0.0),
                                   tf.keras.losses.SparseCategoricalCrossentropy()), applied_plan(), batch_size=16,
                progress=False)
    assert t.fit(ids, tags, epochs=1).last_losses["model"] == pytest.approx(keras_loss, rel=1e-4)  # one batch
    assert t.evaluate(ids, tags)["loss"] == pytest.approx(keras_loss, rel=1e-4)


def test_a_weight_per_sample_weighs_every_position_of_a_per_position_loss():
    """Sample weights (N,) with a tagger's loss per position (N, T) failed inside the step: a reshape of 16 weights
    to (16, 12). A weight of 0 now leaves the sample's every position out."""
    rng = np.random.default_rng(0)
    ids, tags = rng.integers(1, 20, (16, 12)), rng.integers(0, 5, (16, 12))
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((12,)), tf.keras.layers.Embedding(20, 8),
                                 tf.keras.layers.Dense(5, activation="softmax")])
    t = Trainer(classifier_updates(model, tf.keras.optimizers.SGD(0.0),
                                   tf.keras.losses.SparseCategoricalCrossentropy()), applied_plan(), batch_size=16,
                progress=False)
    weights = np.r_[np.ones(8), np.zeros(8)].astype("float32")
    first_half = float(tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(tags[:8], model(ids[:8]))))
    result = t.fit(tf.data.Dataset.from_tensor_slices((ids, tags, weights)).batch(16), epochs=1)
    assert result.last_losses["model"] == pytest.approx(first_half, rel=1e-5)


def test_a_weight_per_token_weighs_each_position_of_a_per_position_loss_as_keras_does():
    """Weights of the labels' shape (N, T), which Keras's fit takes for a language model, were refused: "Expected one
    weight per sample, shape (N,)". The trainer and its evaluate() take the weighted mean over the tokens."""
    rng = np.random.default_rng(0)
    ids, tags = rng.integers(1, 20, (16, 12)), rng.integers(0, 5, (16, 12))
    weights = (rng.random((16, 12)) * (rng.random((16, 12)) > 0.3)).astype("float32")  # (padding: 0)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((12,)), tf.keras.layers.Embedding(20, 8),
                                 tf.keras.layers.Dense(5, activation="softmax", dtype="float32")])
    t = Trainer(classifier_updates(model, tf.keras.optimizers.SGD(0.0),
                                   tf.keras.losses.SparseCategoricalCrossentropy()), applied_plan(), batch_size=16,
                progress=False)
    values = tf.keras.losses.sparse_categorical_crossentropy(tags, model(ids)).numpy()
    expected = float((values * weights).sum() / weights.sum())
    data = tf.data.Dataset.from_tensor_slices((ids, tags, weights)).batch(16)
    assert t.fit(data, epochs=1).last_losses["model"] == pytest.approx(expected, rel=1e-3)
    assert t.evaluate(data)["loss"] == pytest.approx(expected, rel=1e-4)
    with pytest.raises(amp_backends.errors.InputError, match=r"shape \(16, 3\). Expected one weight per sample, "
                                                            r"shape \(N,\), or one per label value, shape \(16, 12\)"):
        t.fit(tf.data.Dataset.from_tensor_slices((ids, tags, weights[:, :3])).batch(16), epochs=2)
