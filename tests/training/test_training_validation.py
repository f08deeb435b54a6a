"""Validation and metrics in the trainer: every sample counted, the numbers Keras would give, a per-epoch history,
the best checkpoint, early stopping, validation between epochs, TensorBoard's val/ scalars — and all of it resumed
exactly; learning-rate schedules resume exactly; wrong arguments refused before any step; two workers read one
number (two replicas in one process: tests/training/test_distribute.py's MirroredStrategy run)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from warm_python import popen_python
from conftest import NEUTRAL_CWD, SCRIPTS
from helpers import applied_plan, mlp

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
from amp_backends.errors import AmpConfigError, InputError  # noqa: E402
from amp_backends.training import Trainer, classifier_updates, gan_updates  # noqa: E402



def data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int64") + (x[:, 2] > 1).astype("int64")


def trainer(m=None, lr=0.01, **kw):
    amp_backends.seed_everything(0)
    m = m or mlp(6, hidden=16, activation="softmax")
    kw.setdefault("progress", False)
    kw.setdefault("batch_size", 16)
    return Trainer(classifier_updates(m, tf.keras.optimizers.Adam(lr)), applied_plan(), seed=0, check_models=False,
                   **kw), m


def test_validation_counts_every_sample_and_matches_a_hand_computation():
    amp_backends.seed_everything(0)
    t, m = trainer(metrics=["accuracy", tf.keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")])
    x, y = data(96)
    xv, yv = data(37, seed=1)  # 2 full batches of 16 and a last one of 5
    result = t.fit(x, y, epochs=2, validation_data=(xv, yv))
    probs = m(xv, training=False).numpy()
    by_hand = {"val_loss": float(np.mean(-np.log(probs[np.arange(37), yv]))),
               "val_accuracy": float(np.mean(probs.argmax(-1) == yv)),
               "val_top2": float(np.mean((np.argsort(-probs, -1)[:, :2] == yv[:, None]).any(-1)))}
    last = result.epochs[-1]
    assert [e["epoch"] for e in result.epochs] == [0, 1] and [e["step"] for e in result.epochs] == [6, 12]
    for k, v in by_hand.items():
        assert last[k] == pytest.approx(v, abs=1e-5), k
    assert {"loss", "accuracy", "top2"} <= set(last)  # the epoch's training loss and metrics beside
    assert [v["step"] for v in result.validations] == [6, 12]
    # evaluate(): the same numbers, on arrays and on a dataset batched with a partial last batch (nothing dropped)
    assert t.evaluate(xv, yv) == pytest.approx({k[4:]: v for k, v in by_hand.items()}, abs=1e-5)
    ds = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(10)
    assert t.evaluate(ds) == pytest.approx({k[4:]: v for k, v in by_hand.items()}, abs=1e-5)
    np.testing.assert_allclose(t.predict(xv), probs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t.predict(ds), probs, rtol=1e-5, atol=1e-6)


def test_a_models_own_losses_are_trained_and_evaluated_as_keras_fit_and_evaluate_add_them(caplog):
    """Weight regularizers and an ``add_loss`` layer: one full-batch SGD step and the evaluation give Keras's numbers
    (the trainer left ``model.losses`` out: no weight decay, and a validation loss below Keras's)."""
    applied_plan()

    def build():
        tf.keras.utils.set_random_seed(3)
        inputs = tf.keras.Input((6,))
        h = tf.keras.layers.Dense(16, "relu", kernel_regularizer=tf.keras.regularizers.L2(0.5))(inputs)
        h = tf.keras.layers.ActivityRegularization(l1=0.01)(h)
        return tf.keras.Model(inputs, tf.keras.layers.Dense(3, "softmax", bias_regularizer="l2")(h))

    x, y = data(32)
    xv, yv = data(20, seed=1)
    keras_model, ours = build(), build()
    keras_model.compile(tf.keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    keras_loss = keras_model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0).history["loss"][0]
    t = Trainer(classifier_updates(ours, tf.keras.optimizers.SGD(0.1)), applied_plan(), batch_size=32, seed=0,
                progress=False, check_models=False)
    result = t.fit(x, y, epochs=1)
    assert keras_loss > 1.5  # the regularization: cross-entropy alone is about log(3)
    assert result.epochs[0]["loss"] == pytest.approx(keras_loss, rel=1e-5)
    for a, b in zip(ours.get_weights(), keras_model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert t.evaluate(xv, yv)["loss"] == pytest.approx(keras_model.evaluate(xv, yv, verbose=0), rel=1e-5)
    assert "AutoGraph could not transform" not in caplog.text  # (the library's own code is not converted)


def test_wrong_validation_data_is_said_to_be_the_validation_datas_and_no_model_change_is_advised():
    """A validation set of the wrong width said "x has rows of shape (8,) ... Fix: ... (or build the model with
    keras.Input(shape=(8,)))", as if the training data were wrong; its labels' errors named no validation_data."""
    t, _ = trainer()
    x, y = data(64)
    with pytest.raises(InputError, match=r"^In the data given to validation_data: The model .* takes inputs of shape "
                                         r"\('batch', 6\); x has rows of shape \(3,\).*meant for such rows"):
        t.fit(x, y, validation_data=(x[:20, :3], y[:20]))
    with pytest.raises(InputError, match=r"^In the data given to validation_data: The labels y"):
        t.fit(x, y, validation_data=(x[:20], y[:20] + 10))
    with pytest.raises(InputError, match=r"^In the data given to validation_data: Every input and label array"):
        t.fit(x, y, validation_data=(x[:20], y[:15]))
    with pytest.raises(InputError, match=r"^In the data given to evaluate\(\): The labels y"):
        t.evaluate(x[:20], y[:20] + 10)


def test_sample_weights_weigh_the_validation_loss():
    t, m = trainer(metrics=["accuracy"])
    xv, yv = data(20, seed=2)
    w = np.linspace(0.0, 2.0, 20).astype("float32")
    probs = m(xv, training=False).numpy()
    got = t.evaluate(tf.data.Dataset.from_tensor_slices((xv, yv, w)).batch(8))
    per = -np.log(probs[np.arange(20), yv])
    assert got["loss"] == pytest.approx(float((per * w).sum() / w.sum()), rel=1e-5)
    assert got["accuracy"] == pytest.approx(float(((probs.argmax(-1) == yv) * w).sum() / w.sum()), rel=1e-5)


def run_history(tmp_path, name, stops, epochs=4):
    """Train ``epochs`` epochs in one fit or in pieces ending at ``stops`` (global steps), each piece a new process-
    like Trainer resuming from the checkpoints; returns the last result."""
    x, y = data(80)
    xv, yv = data(30, seed=1)
    result = None
    for i, stop in enumerate([*stops, None]):
        amp_backends.seed_everything(0)
        t, _ = trainer(mlp(6, hidden=16, dropout=0.3, activation="softmax"), metrics=["accuracy"],
                       keep_best="val_accuracy", patience=10, checkpoint_dir=str(tmp_path / name))
        result = t.fit(x, y, epochs=epochs, max_steps=stop, validation_data=(xv, yv), resume=i > 0)
    return result


def test_history_best_and_epoch_values_resume_exactly_mid_epoch(tmp_path):
    whole = run_history(tmp_path, "whole", [])
    pieces = run_history(tmp_path, "pieces", [7, 12])  # 5 steps per epoch: stops inside epochs 1 and 2
    assert len(whole.epochs) == len(pieces.epochs) == 4
    for a, b in zip(whole.epochs, pieces.epochs, strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)  # the epoch's mean loss and accuracy, across the resume too
    assert [v["step"] for v in pieces.validations] == [5, 10, 15, 20]
    assert pieces.best["value"] == pytest.approx(whole.best["value"]) and pieces.best["step"] == whole.best["step"]
    best = Path(pieces.best["path"])
    assert best.parent == tmp_path / "pieces" / "best" and Path(f"{best}.index").exists()
    assert len(list(best.parent.glob("ckpt-*.index"))) == 1  # one best checkpoint kept, beside the latest ones
    assert (tmp_path / "pieces" / "checkpoint").exists()


def test_best_checkpoint_restores_the_best_weights(tmp_path):
    t, m = trainer(metrics=["accuracy"], keep_best="val_loss", checkpoint_dir=str(tmp_path / "run"))
    x, y = data(64)
    xv, yv = data(30, seed=1)
    result = t.fit(x, y, epochs=3, validation_data=(xv, yv))
    best = result.best
    assert best["monitor"] == "val_loss" and best["mode"] == "min"
    assert best["value"] == pytest.approx(min(e["val_loss"] for e in result.epochs))
    assert t.restore_best() == best["path"]
    assert t.evaluate(xv, yv)["loss"] == pytest.approx(best["value"], rel=1e-5)
    assert int(t.global_step.numpy()) == best["step"]  # everything the checkpoint holds: the position too


def test_a_damaged_best_checkpoint_is_our_error_and_a_killed_best_save_is_cleared(tmp_path, caplog):
    """A truncated best checkpoint ended a finished run in TensorFlow's IndexError ("Read less bytes than
    requested"); a best save killed mid-way left its ckpt-N_temp in best/ for good."""
    from amp_backends.errors import CheckpointError

    t, _ = trainer(metrics=["accuracy"], keep_best="val_loss", checkpoint_dir=str(tmp_path / "run"))
    x, y = data(64)
    xv, yv = data(30, seed=1)
    path = t.fit(x, y, epochs=2, validation_data=(xv, yv)).best["path"]
    for blob in (tmp_path / "run" / "best").glob("*.data-*"):
        blob.write_bytes(blob.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"No intact checkpoint in .*best.*Fix: resume from the run's own "
                                              r"checkpoints, beside these"):
        t.restore_best()
    unfinished = tmp_path / "run" / "best" / f"{Path(path).name}0_temp"
    unfinished.mkdir()
    (unfinished / "part-00000-of-00001.data-00000-of-00001.tempstate1").write_bytes(b"x" * 10)
    caplog.set_level("INFO", logger="amp_backends.train")
    t2, _ = trainer(metrics=["accuracy"], keep_best="val_loss", checkpoint_dir=str(tmp_path / "run"))
    t2.fit(x, y, epochs=3, validation_data=(xv, yv), resume=True)
    assert not unfinished.exists() and "Removed what unfinished checkpoint saves" in caplog.text


def test_a_new_trainer_on_a_finished_runs_folder_restores_its_best_checkpoint(tmp_path):
    """Lightning's ckpt_path="best" in another script: a new Trainer used to say it kept no best checkpoint (build
    it with keep_best and checkpoint_dir, which it had been)."""
    t, m = trainer(keep_best="val_loss", checkpoint_dir=str(tmp_path / "run"))
    xv, yv = data(30, seed=1)
    best = t.fit(*data(64), epochs=3, validation_data=(xv, yv)).best
    for v in m.trainable_variables:
        v.assign(tf.zeros_like(v))
    fresh, _ = trainer(m, keep_best="val_loss", checkpoint_dir=str(tmp_path / "run"))
    assert fresh.restore_best() == best["path"]
    assert fresh.evaluate(xv, yv)["loss"] == pytest.approx(best["value"], rel=1e-5)
    with pytest.raises(AmpConfigError, match="holds none yet"):
        trainer(keep_best="val_loss", checkpoint_dir=str(tmp_path / "other"))[0].restore_best()


def test_early_stopping_stops_says_why_and_a_resumed_run_knows(tmp_path, caplog):
    x, y = data(64)
    xv, yv = data(30, seed=1)
    t, _ = trainer(lr=0.0, patience=2, checkpoint_dir=str(tmp_path / "run"))  # nothing changes: no improvement
    with caplog.at_level("WARNING", logger="amp_backends.train"):
        result = t.fit(x, y, epochs=10, validation_data=(xv, yv))
    assert result.steps == 3 * 4 and len(result.epochs) == 3
    assert "patience=2" in result.stopped_early and "val_loss" in result.stopped_early
    assert any("Stopping early at step 12" in r.message for r in caplog.records)
    again, _ = trainer(lr=0.0, patience=2, checkpoint_dir=str(tmp_path / "run"))
    caplog.clear()
    with caplog.at_level("WARNING", logger="amp_backends.train"):
        assert again.fit(x, y, epochs=10, validation_data=(xv, yv), resume=True).steps == 12  # stopped, knows it
    assert any("This run stopped early" in r.message and "larger patience" in r.message for r in caplog.records)
    more, _ = trainer(lr=0.0, patience=3, checkpoint_dir=str(tmp_path / "run"))
    assert more.fit(x, y, epochs=10, validation_data=(xv, yv), resume=True).steps == 16  # more patience: one more


def test_validation_every_steps_runs_at_the_end_of_the_call_that_reaches_it():
    t, _ = trainer(metrics=["accuracy"], steps_per_call=2)
    x, y = data(96)  # 6 steps per epoch
    xv, yv = data(20, seed=1)
    result = t.fit(x, y, epochs=2, validation_data=(xv, yv), validation_every="5 steps")
    assert [v["step"] for v in result.validations] == [6, 10]
    assert all("val_loss" not in e for e in result.epochs)  # the epochs' own records: training values only


def test_each_compiled_evaluation_traces_once_for_any_number_of_rows():
    """Validation traced its call again for the partial last batch, and again for data of another length: every
    trainer's evaluations share TensorFlow's count of traces, which warned of tf.function retracing."""
    t, _ = trainer()
    x, y = data(64)
    xv, yv = data(37, seed=1)  # batches of 16, 16 and 5
    t.fit(x, y, epochs=2, validation_data=(xv, yv), validation_every="3 steps")
    t.evaluate(*data(50, seed=2))  # other arrays: 50 rows, a last batch of 2
    for batch in (16, 10):  # a dataset's partial last batches
        t.evaluate(tf.data.Dataset.from_tensor_slices((xv, yv)).batch(batch))
    t.predict(xv)
    traces = {k: f.experimental_get_tracing_count() for k, f in t.validation.evaluator._calls.items()}
    assert traces == {"arrays": 1, "dataset": 1, "predict": 1}


def test_tensorboard_gets_val_and_epoch_scalars(tmp_path):
    t, _ = trainer(metrics=["accuracy"], logdir=str(tmp_path / "tb"))
    x, y = data(64)
    t.fit(x, y, epochs=2, validation_data=data(20, seed=1))
    tags: dict[str, list[int]] = {}
    for f in (tmp_path / "tb" / "train").iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(f)):
            for v in event.summary.value:
                tags.setdefault(v.tag, []).append(event.step)
    assert tags["val/loss"] == [4, 8] and tags["val/accuracy"] == [4, 8]
    assert tags["epoch/loss"] == [4, 8] and tags["epoch/accuracy"] == [4, 8]


def test_learning_rate_schedule_resumes_exactly(tmp_path):
    def run(stops):
        for i, stop in enumerate([*stops, None]):
            amp_backends.seed_everything(0)
            m = mlp(6, hidden=16, activation="softmax")
            lr = tf.keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=3, decay_rate=0.5)
            opt = tf.keras.optimizers.SGD(lr)
            t = Trainer(classifier_updates(m, opt), applied_plan(), batch_size=16, seed=0, progress=False,
                        check_models=False, checkpoint_dir=str(tmp_path / str(len(stops))))
            t.fit(*data(64), epochs=3, max_steps=stop, resume=i > 0)
        return [v.numpy() for v in m.trainable_variables], float(opt.learning_rate.numpy()), int(opt.iterations)

    (whole, lr_whole, n_whole), (pieces, lr_pieces, n_pieces) = run([]), run([5])
    assert n_whole == n_pieces == 12
    # (Keras 3 reports the rate of the next step, Keras 2 that of the last one)
    assert lr_pieces == lr_whole and lr_whole in (pytest.approx(0.05 * 0.5 ** (12 / 3)),
                                                  pytest.approx(0.05 * 0.5 ** (11 / 3)))
    for a, b in zip(whole, pieces, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kwargs, fit_kwargs, needle", [
    ({"keep_best": "val_accuracy"}, {}, "no checkpoint_dir"),
    ({"keep_best": "val_accuracy", "checkpoint_dir": "ck"}, {"validation_data": data(8)}, "'val_accuracy', which"),
    ({"patience": 2}, {}, "no validation_data"),
    ({"patience": 0}, {}, "patience must be an integer >= 1"),
    ({"mode": "up"}, {}, "mode must be 'auto', 'min' or 'max'"),
    ({"metrics": ["acuracy"]}, {}, "Unknown metric 'acuracy'"),
    ({"metrics": "accuracy"}, {}, "metrics must be a list"),
    ({}, {"validation_every": "3 weeks"}, "'2 epochs' or '500 steps'"),
    ({}, {"validation_every": "3 steps"}, "validation_every='3 steps' says when to validate, and this fit has no "
                                          "validation_data: nothing would be validated. Fix: pass validation_data"),
    ({}, {"validation_every": 2}, "validation_every=2 says when to validate, and this fit has no validation_data"),
    ({}, {"validation_data": (np.zeros((4, 6), "float32"),)}, "validation_data must be (x_val, y_val)"),
    ({}, {"validation_data": (np.zeros((4, 6), "float32"), np.array([0, 1, 2, 7]))}, "class ids"),
    ({"batch_size": 20.0}, {}, "batch_size must be an integer >= 1"),
    ({"steps_per_call": 0}, {}, "steps_per_call must be an integer >= 1"),
    ({"min_delta": -1}, {}, "min_delta must be a number >= 0"),
    ({"monitor": ""}, {}, "monitor must be the name of a logged value"),
    ({"keep_best": ""}, {}, "keep_best must be the name of a logged value"),
])
def test_wrong_arguments_are_refused_before_any_step(tmp_path, monkeypatch, kwargs, fit_kwargs, needle):
    """Each says what was expected, what was received and the fix (batch_size=20.0, metrics='accuracy' and others
    said no fix)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises((AmpConfigError, InputError, TypeError, ValueError)) as err:
        t, _ = trainer(**kwargs)
        t.fit(*data(32), epochs=1, **fit_kwargs)
        raise AssertionError("not refused")
    assert needle in str(err.value) and "Fix: " in str(err.value), str(err.value)
    assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").glob("ckpt-*"))


def test_a_bad_label_in_a_later_validation_batch_is_named():
    t, _ = trainer()
    xv, yv = data(40, seed=1)
    yv[35] = 9  # in the third batch of 16: the check before training sees the first batch of a dataset only
    with pytest.raises(InputError, match="Batch 2 of the data given to validation_data holds labels"):
        t.fit(*data(32), epochs=1, validation_data=tf.data.Dataset.from_tensor_slices((xv, yv)).batch(16))


def test_updates_without_a_model_to_evaluate_say_so():
    g = tf.keras.Sequential([tf.keras.Input((100,)), tf.keras.layers.Dense(784), tf.keras.layers.Reshape((28, 28, 1))])
    d = tf.keras.Sequential([tf.keras.Input((28, 28, 1)), tf.keras.layers.Flatten(), tf.keras.layers.Dense(1)])
    updates = gan_updates(g, d, tf.keras.optimizers.Adam(), tf.keras.optimizers.Adam())
    with pytest.raises(AmpConfigError, match="Update.evaluation is not set"):
        Trainer(updates, applied_plan(), batch_size=8, metrics=["accuracy"])
    t = Trainer(updates, applied_plan(), batch_size=8, progress=False, check_models=False)
    with pytest.raises(AmpConfigError, match="the GAN's updates have no labels"):
        t.evaluate(np.zeros((8, 28, 28, 1), "float32"), np.zeros(8))
    result = t.fit(np.zeros((16, 28, 28, 1), "float32"), epochs=1)  # its per-epoch history: each update's loss
    assert set(result.epochs[0]) == {"epoch", "step", "loss/generator", "loss/discriminator"}


@pytest.mark.slow
def test_two_workers_read_the_same_numbers_as_one_device(tmp_path):
    """MultiWorkerMirroredStrategy, two processes: validation and evaluate() are reduced across the workers — every
    worker reads the same numbers, those of the whole validation set on one device; training metrics too. They
    agree on the best value and save its checkpoint together (the chief's files kept)."""
    from test_distribute import env, finish, free_ports, tf_config

    ports = free_ports(2)
    checkpoints = tmp_path / "checkpoints"
    procs = [popen_python([SCRIPTS / "validation_workers.py", checkpoints], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=NEUTRAL_CWD, env=env(TF_CONFIG=tf_config(ports, i)))
             for i in (0, 1)]
    outs = finish(procs)
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outs]
    # (the result line by its mark: TensorFlow's gRPC may log after it as the cluster shuts down)
    a, b = (json.loads(next(line for line in reversed(o.splitlines()) if line.startswith("RESULT "))[7:])
            for o in outs)
    assert a["last_epoch"] == b["last_epoch"] and a["evaluate"] == b["evaluate"]
    assert a["train_accuracy"] == b["train_accuracy"] and 0.2 < a["train_accuracy"] <= 1  # counted in every replica
    for d in (a, b):
        assert d["evaluate"] == pytest.approx(d["one_device"], abs=1e-5)
        assert d["last_epoch"] == pytest.approx(d["one_device"], abs=1e-5)
    assert a["best"] == b["best"] and a["best"]["monitor"] == "val_accuracy"
    best = checkpoints / "best"
    assert [p.name for p in best.glob("ckpt-*.index")] == [Path(a["best"]["path"]).name + ".index"]
    assert not list(best.glob(".worker-*")) and not list(checkpoints.glob(".worker-*"))


def test_an_epoch_that_max_steps_ends_is_recorded_and_validated():
    t, _ = trainer(metrics=["accuracy"])
    x, y = data(64)  # 4 steps per epoch
    result = t.fit(x, y, epochs=5, max_steps=8, validation_data=data(20, seed=1))
    assert result.steps == 8 and result.epochs_completed == 2
    assert [(e["epoch"], e["step"], "val_accuracy" in e) for e in result.epochs] == [(0, 4, True), (1, 8, True)]
    assert t.fit(x, y, epochs=5, max_steps=10).steps == 10  # and the next call goes on from epoch 2


def test_a_metric_object_trains_and_validation_has_its_own_copy():
    top2 = tf.keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")
    t, _ = trainer(metrics=[top2])
    xv, yv = data(20, seed=1)
    t.fit(*data(64), epochs=1, validation_data=(xv, yv))
    assert t.validation.train_metrics == [top2] and t.validation.val_metrics[0] is not top2
    before = [float(v.numpy()) for v in top2.variables]
    t.evaluate(xv, yv)
    assert [float(v.numpy()) for v in top2.variables] == before  # validation never counts in the training metric


@pytest.mark.parametrize("case", ["sparse function", "one-hot", "binary by name, labels (N,)"])
def test_accuracy_follows_the_shapes_as_keras_compile_decides(case):
    x, y = data(40, seed=3)
    if case == "binary by name, labels (N,)":
        y = (y > 0).astype("int64")
        m = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(1, activation="sigmoid")])
        loss = "binary_crossentropy"
    else:
        m = mlp(6, hidden=16, activation="softmax")
        loss = (lambda a, b: tf.keras.losses.sparse_categorical_crossentropy(a, b)) if case == "sparse function" \
            else tf.keras.losses.CategoricalCrossentropy()
        y = y if case == "sparse function" else np.eye(3, dtype="float32")[y]
    t = Trainer(classifier_updates(m, tf.keras.optimizers.Adam(0.01), loss), applied_plan(), batch_size=8,
                progress=False, check_models=False, metrics=["accuracy"])
    t.fit(x, y, epochs=1)  # trains: a (N,) label against a (N, 1) sigmoid is brought to its rank, as Keras does
    probs = t.predict(x)
    labels = y.argmax(-1) if y.ndim == 2 else y
    hand = np.mean((probs[:, 0] > 0.5) == labels) if probs.shape[-1] == 1 else np.mean(probs.argmax(-1) == labels)
    assert t.evaluate(x, y)["accuracy"] == pytest.approx(hand, abs=1e-6)


def test_validation_data_that_never_ends_or_starts_badly_is_refused_before_any_step():
    t, m = trainer()
    w0 = [v.numpy().copy() for v in m.trainable_variables]
    xv, yv = data(32, seed=1)
    with pytest.raises(InputError, match="repeats forever"):
        t.fit(*data(32), epochs=1, validation_data=tf.data.Dataset.from_tensor_slices((xv, yv)).batch(8).repeat())
    # not batched: what training says of such a dataset, without dropping samples (every one is validated)
    unbatched = tf.data.Dataset.from_tensor_slices((xv, yv))
    said = r"The dataset is not batched: its element\[1\] is a scalar, one sample per element. Expected batches of 16."
    with pytest.raises(InputError, match=said + r" Fix: batch it: dataset.batch\(16, drop_remainder=True\) \(the"):
        t.fit(unbatched, epochs=1)
    with pytest.raises(InputError, match=said + r" Fix: batch it: dataset.batch\(16\) \(the trainer takes a dataset"):
        t.fit(*data(32), epochs=1, validation_data=unbatched)
    with pytest.raises(InputError, match=said):
        t.evaluate(unbatched)
    yv[3] = 7  # in the first batch
    with pytest.raises(InputError, match="class ids"):
        t.fit(*data(32), epochs=1, validation_data=tf.data.Dataset.from_tensor_slices((xv, yv)).batch(8))
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(w0, m.trainable_variables, strict=True))


def test_validation_arrays_the_model_cannot_take_are_refused_before_the_first_step():
    """They used to train a whole epoch, then stop with Keras's traceback from inside the evaluation graph."""
    t, m = trainer()
    w0 = [v.numpy().copy() for v in m.trainable_variables]
    xv, yv = data(32, seed=1)
    with pytest.raises(InputError, match=r"takes inputs of shape \('batch', 6\); x has rows of shape \(4,\)"):
        t.fit(*data(32), epochs=1, validation_data=(xv[:, :4], yv))
    assert int(t.global_step.numpy()) == 0
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(w0, m.trainable_variables, strict=True))


def test_metrics_by_name_for_a_model_of_several_outputs_are_refused_with_the_fix():
    inp = tf.keras.Input((6,))
    m = tf.keras.Model(inp, {"a": tf.keras.layers.Dense(3, activation="softmax")(inp),
                             "b": tf.keras.layers.Dense(1)(inp)})
    updates = classifier_updates(m, tf.keras.optimizers.Adam(),
                                 lambda y, p: tf.keras.losses.sparse_categorical_crossentropy(y["a"], p["a"]))
    with pytest.raises(AmpConfigError, match="has 2 outputs, and the metrics \\['accuracy'\\]"):
        Trainer(updates, applied_plan(), batch_size=8, metrics=["accuracy"])


# ------------------------------------------------------------------ the layer plan in force before fit
def _bf16_run(first):
    """A classifier under a forced bfloat16 plan (the layer plan keeps its head in float32), with ``first`` called
    before fit; its validation losses, and after fit: evaluate, predict, Keras's own predict and the model's own
    compiled call on the validation data."""
    import warnings

    with warnings.catch_warnings():  # forced where this CPU has no bf16 instructions: the logic, not the speed
        warnings.simplefilter("ignore")
        p = amp_backends.auto_configure(verbose=False, policy="mixed_bfloat16", force=True)
    amp_backends.seed_everything(0)
    # built under mixed_bfloat16: the head computes in bfloat16 until the layer plan applies
    m = mlp(6, hidden=16, activation="softmax")
    t = Trainer(classifier_updates(m, tf.keras.optimizers.Adam(0.01)), p, batch_size=16, seed=0, check_models=False,
                progress=False, metrics=["accuracy"])
    x, y = data(96)
    xv, yv = data(37, seed=1)
    if first == "evaluate":
        t.evaluate(xv, yv)
    elif first == "predict":
        t.predict(xv)
    elif first == "keras predict":
        m.predict(xv, verbose=0)  # Keras's own, compiled before the trainer's first step
    head = m.layers[-1].compute_dtype  # before fit
    result = t.fit(x, y, epochs=2, validation_data=(xv, yv))
    probs = tf.function(lambda a: m(a, training=False))(xv).numpy()  # the model's own, compiled now
    own = float(np.mean(-np.log(probs.astype("float64")[np.arange(37), yv])))
    return {"head": head, "val_loss": [v["val_loss"] for v in result.validations], "evaluate": t.evaluate(xv, yv),
            "predict": t.predict(xv), "keras": m.predict(xv, verbose=0), "own": own, "probs": probs,
            "head_after": m.layers[-1].compute_dtype}


@pytest.mark.parametrize("first", ["evaluate", "predict", "keras predict"])
def test_what_runs_before_fit_computes_under_the_layer_plan_and_every_later_number_agrees(first):
    """An evaluate() or predict() before fit used to compile under the policies of the model as built (the head in
    bfloat16) and keep those functions; Keras's own predict too. Every number must be what a run without it gives,
    and the model's own."""
    plain, run = _bf16_run(None), _bf16_run(first)
    # the trainer's evaluate/predict apply the layer plan before they compute (Keras's own predict is not the trainer)
    assert run["head"] == ("bfloat16" if first == "keras predict" else "float32") and run["head_after"] == "float32"
    np.testing.assert_allclose(run["val_loss"], plain["val_loss"], rtol=1e-6)
    assert run["evaluate"]["loss"] == pytest.approx(run["own"], rel=1e-5)
    np.testing.assert_allclose(run["predict"], run["probs"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(run["keras"], run["probs"], rtol=1e-5, atol=1e-7)  # Keras's own predict, after fit
