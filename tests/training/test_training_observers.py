"""What watches training: the profile window's steps, the Keras fit callback's tutorial line."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from itertools import count

import numpy as np
import pytest

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from helpers import applied_plan  # noqa: E402

from amp_backends.errors import AmpConfigError  # noqa: E402
from amp_backends.training import ThroughputLogger, Trainer, classifier_updates, parse_profile_steps  # noqa: E402


@pytest.mark.parametrize("text,expected", [("20:30", (20, 30)), ("", None), (None, None)])
def test_profile_steps(text, expected):
    assert parse_profile_steps(text) == expected


@pytest.mark.parametrize("text", ["30:20", "a:b", "5"])
def test_bad_profile_steps(text):
    with pytest.raises(ValueError, match=f"START:STOP.*Received: {text!r}. Fix: "):
        parse_profile_steps(text)


@pytest.mark.parametrize("steps, expected", [((20, 30), (20, 30)), ([0, 1], (0, 1)), (np.array([2, 4]), (2, 4)),
                                             (None, None)])
def test_the_trainers_profile_steps_are_read_by_the_same_parser(steps, expected):
    assert parse_profile_steps(steps, "profile_steps") == expected


@pytest.mark.parametrize("steps", [(5, 2), (2,), "a", (1.5, 3), (-1, 4), (1, 2, 3), 7])
def test_the_trainer_refuses_a_profile_window_the_command_line_refuses_with_the_same_message(steps, tmp_path):
    """``profile_steps=(5, 2)``, ``(2,)`` or ``"a"`` were accepted in silence (no trace written), while
    ``--profile-steps 5:2`` was refused."""
    with pytest.raises(AmpConfigError) as parsed:
        parse_profile_steps(steps, "profile_steps")
    m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    with pytest.raises(AmpConfigError) as refused:
        Trainer(classifier_updates(m, tf.keras.optimizers.SGD()), applied_plan(), batch_size=8, progress=False,
                logdir=str(tmp_path), profile_steps=steps)
    assert str(refused.value) == str(parsed.value)
    assert re.match(r"profile_steps must be \(START, STOP\).*, such as \(20, 30\)\. Received: .*\. Fix: ",
                    str(refused.value))


def test_a_profile_window_without_a_logdir_is_refused():
    """``profile_steps=(2, 4)`` without ``logdir`` was accepted and never traced (the trace goes into logdir)."""
    m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    with pytest.raises(AmpConfigError, match=r"profile_steps=\(2, 4\) records a profile into logdir, and logdir is "
                                             r"None\. Fix: pass logdir="):
        Trainer(classifier_updates(m, tf.keras.optimizers.SGD()), applied_plan(), batch_size=8, progress=False,
                profile_steps=(2, 4))


def test_keras_fit_callback_logs_the_tutorial_line_and_says_the_loss_is_the_epoch_mean(caplog):
    caplog.set_level("INFO", logger="amp_backends.train")
    m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    m.compile("sgd", "mse")
    cb = ThroughputLogger(batch_size=8)
    m.fit(np.ones((32, 4)), np.ones((32, 1)), batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    lines = [r.message for r in caplog.records if r.name == "amp_backends.train"]
    assert re.match(r"\(0, 0\), Loss \(epoch mean\): \d+\.\d{5}, step_time: \d+\.\d{5}, throughput: .* img/s\.",
                    lines[0])
    assert len(cb.throughputs) == 4


def test_keras_fit_callback_counts_every_step_of_an_execution(caplog):
    """With steps_per_execution=4 Keras calls back once per 4 steps: the line covers 4 steps, step_time is per step."""
    caplog.set_level("INFO", logger="amp_backends.train")
    m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    m.compile("sgd", "mse", steps_per_execution=4)
    cb = ThroughputLogger(batch_size=8)
    m.fit(np.ones((64, 4)), np.ones((64, 1)), batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    lines = [r.message for r in caplog.records if r.name == "amp_backends.train" and "Loss" in r.message]
    assert [line.split(")")[0] for line in lines] == ["(0, 3", "(0, 7"]
    assert len(cb.throughputs) == 2


def test_keras_fit_callback_names_the_last_short_execution_of_an_epoch_by_its_real_steps(caplog, monkeypatch):
    """10 steps an epoch, 4 per execution: the last call runs 2 steps, which Keras reports as ending at step 11 (the
    line said "(0, 11)" and divided the call's time by 4 steps, doubling its throughput)."""
    caplog.set_level("INFO", logger="amp_backends.train")
    m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    m.compile("sgd", "mse", steps_per_execution=4)
    cb = ThroughputLogger(batch_size=8)
    times = iter([0.0, 4.0, 10.0, 14.0, 20.0, 22.0])  # begin/end of each call: 4 s, 4 s, 2 s (1 s a step each)
    import types

    import amp_backends.training.observers as observers

    monkeypatch.setattr(observers, "time", types.SimpleNamespace(perf_counter=lambda: next(times)))
    m.fit(np.ones((80, 4)), np.ones((80, 1)), batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    lines = [r.message for r in caplog.records if r.name == "amp_backends.train" and "Loss" in r.message]
    assert [line.split(")")[0] for line in lines] == ["(0, 3", "(0, 7", "(0, 9"]
    assert cb.throughputs == [8.0, 8.0, 8.0]  # 8 samples a second in every call, the short one too


@pytest.fixture(scope="module")
def quiet_program():
    """What a program that configured no logging prints after ``auto_configure(verbose=False)``: a trainer's fit,
    then Keras fit with a `ThroughputLogger` (one process for both: logging's set-up is the process's)."""
    from conftest import NEUTRAL_CWD

    code = ("import numpy as np, tensorflow as tf, amp_backends\n"
            "plan = amp_backends.auto_configure(verbose=False)\n"
            "m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2, activation='softmax')])\n"
            "x = np.random.rand(32, 4).astype('float32'); y = (x[:, 0] > .5).astype('int64')\n"
            "amp_backends.Trainer(amp_backends.classifier_updates(m, tf.keras.optimizers.Adam()), plan, batch_size=16,"
            " progress=False, check_models=False).fit(x, y, epochs=2)\n"
            "m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])\n"
            "m.compile('sgd', 'mse')\n"
            "m.fit(np.ones((32, 4)), np.ones((32, 1)), batch_size=8, epochs=1, verbose=0,\n"
            "      callbacks=[amp_backends.ThroughputLogger(8)])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stderr


def test_the_trainers_lines_show_in_a_program_that_configured_no_logging_after_a_quiet_auto_configure(
        quiet_program):
    """``auto_configure(verbose=False)`` quiets the plan's summary; the trainer's lines (docs/training.md's "What
    you see") used to vanish with it: no handler was installed for them."""
    assert "Epoch 1 (global step 4)" in quiet_program and "Loss:" in quiet_program, quiet_program[-2000:]
    assert "amp_backends plan:" not in quiet_program  # (the summary verbose=False quiets)


def test_the_trainer_with_audit_trains_epochs_with_validation_and_saves_its_checkpoint(tmp_path, monkeypatch):
    """``Trainer(audit=True)`` crashed at the end of the first epoch: its audit observer had only some of the hooks
    the trainer calls (no ``after_evaluation``, called with each epoch's values), so nothing was saved. Every
    observer the trainer holds has every hook of `Observer`."""
    from helpers import applied_plan, classification_data, mlp

    from amp_backends.training import Observer, Trainer, classifier_updates

    monkeypatch.delenv("ONEDNN_VERBOSE", raising=False)  # (no tap on this process's standard output: it only warns)
    monkeypatch.delenv("DNNL_VERBOSE", raising=False)
    model, opt = mlp(), tf.keras.optimizers.SGD(0.1)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    trainer = Trainer(classifier_updates(model, opt, loss), applied_plan(), batch_size=8, progress=False, audit=True,
                      check_models=False, checkpoint_dir=str(tmp_path), checkpoint_objects={"m": model, "opt": opt})
    x, y = classification_data(32)
    result = trainer.fit(x, y, epochs=2, validation_data=(x, y))
    assert trainer.audit is not None and trainer.audit in trainer.observers
    hooks = {n for n in vars(Observer) if not n.startswith("_")}  # (the audit's observer imports no trainer)
    assert all(not (hooks - set(dir(o))) for o in trainer.observers), [(o, hooks - set(dir(o)))
                                                                        for o in trainer.observers]
    assert (result.steps, result.epochs_completed) == (8, 2)
    assert [sorted(e) for e in result.epochs] == [["epoch", "loss", "step", "val_loss"]] * 2, result.epochs
    saved = tf.train.get_checkpoint_state(str(tmp_path))
    assert saved is not None and saved.model_checkpoint_path.endswith("ckpt-8")


def one_second_a_call(monkeypatch):
    import amp_backends.training.observers as observers

    clock = count()
    monkeypatch.setattr(observers, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))


def test_keras_fit_callback_counts_the_samples_a_step_held_not_the_batch_size_it_was_given(monkeypatch):
    """``ThroughputLogger(1000)`` on 100 samples counted 1000 a step: ten times the throughput; an epoch's last, short
    batch counted a full one."""
    one_second_a_call(monkeypatch)
    m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    m.compile("sgd", "mse")
    cb = ThroughputLogger(batch_size=1000)
    m.fit(np.ones((100, 4)), np.ones((100, 1)), batch_size=1000, epochs=2, verbose=0, callbacks=[cb])
    assert cb.throughputs == [100.0, 100.0]  # one step of 100 samples an epoch, one second each
    cb = ThroughputLogger(batch_size=8, images_per_step=16)  # (two samples counted per sample: a GAN's)
    m.fit(np.ones((20, 4)), np.ones((20, 1)), batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    assert cb.throughputs == [16.0, 16.0, 8.0]


def test_keras_fit_callback_lines_show_in_a_program_that_configured_no_logging_after_a_quiet_auto_configure(
        quiet_program):
    """A callback the program added says its lines whatever ``auto_configure``'s ``verbose``: they vanished with
    ``verbose=False``, which left the package's logger without a handler (the trainer's lines showed)."""
    assert "(0, 3), Loss (epoch mean): " in quiet_program, quiet_program[-2000:]
    assert "Summary: median throughput" in quiet_program
    assert "amp_backends plan:" not in quiet_program


def test_an_epoch_whose_every_step_was_skipped_says_so_not_nan(caplog):
    """An epoch of one step skipped by the dynamic loss scale (normal at its first step) was logged "loss: nan",
    where the step's own line showed its finite loss."""
    from amp_backends.training.observers import LogLine

    caplog.set_level("INFO", logger="amp_backends.train")
    LogLine().after_evaluation(0, 1, {"loss": float("nan"), "val_loss": float("nan"), "accuracy": 0.5})
    assert ("Epoch 0 (global step 1): loss: n/a (every step of the epoch was skipped), val_loss: nan, "
            "accuracy: 0.50000.") in caplog.text


def test_a_diverged_loss_is_logged_in_powers_of_ten(caplog):
    """A loss of 3.9e30 was logged as 3868106656245182229072687661056.00000; small ones keep the tutorials' form."""
    from amp_backends.training.observers import LogLine

    with caplog.at_level("INFO", logger="amp_backends"):
        LogLine().after_evaluation(0, 20, {"loss": 3.868e30, "accuracy": 0.1})
    assert "Epoch 0 (global step 20): loss: 3.86800e+30, accuracy: 0.10000." in caplog.text, caplog.text
