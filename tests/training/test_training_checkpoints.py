"""Checkpoints never lose a run: fresh runs, truncated files, another model, another batch size, Ctrl-C, bad dirs."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from helpers import applied_plan, classification_data, mlp

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from amp_backends.errors import (  # noqa: E402
    CheckpointError,
    CheckpointMismatchError,
    TrainingInterrupted,
)
from amp_backends.training import (  # noqa: E402
    Observer,
    Trainer,
    Update,
    classifier_updates,
    run_directory,
)
from amp_backends.training.runs import propose_run_directory  # noqa: E402


def trainer(directory, model=None, batch_size=8, updates=None, **kw):
    model = model or mlp()
    opt = tf.keras.optimizers.Adam(1e-2)
    updates = updates or classifier_updates(model, opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, Trainer(updates, applied_plan(), batch_size=batch_size, checkpoint_dir=str(directory), progress=False,
                          checkpoint_objects={"model": model, "optimizer": opt}, **kw)


# --------------------------------------------------------------------------- fresh runs
def test_a_resume_of_another_model_or_with_other_checkpoint_objects_says_what_differs(tmp_path):
    """A model of other shapes resumed without checkpoint_objects was 'No intact checkpoint' (taken for damage); one
    resumed with checkpoint_objects a run without them wrote was told to resume 'with the same model code'."""
    x, y = classification_data(32)

    def fit(directory, hidden=8, named=False, resume=False):
        model, opt = mlp(hidden=hidden), tf.keras.optimizers.SGD(0.1)
        named_objects = {"model": model, "optimizer": opt} if named else None
        t = Trainer(classifier_updates(model, opt), applied_plan(), batch_size=8, progress=False, check_models=False,
                    checkpoint_dir=str(directory), checkpoint_objects=named_objects)
        return t.fit(x, y, max_steps=4 if resume else 2, resume=resume)

    fit(tmp_path / "wider")
    with pytest.raises(CheckpointMismatchError, match=r"does not match the models being trained .*incompatible tensor "
                                                      r"with shape.*8.*9.*Fix: resume with the same model code"):
        fit(tmp_path / "wider", hidden=9, resume=True)
    fit(tmp_path / "named")
    with pytest.raises(CheckpointMismatchError, match=r"the checkpoint's objects are named model_0_optimizer.*"
                                                      r"this run's model, optimizer.*checkpoint_objects= differs"):
        fit(tmp_path / "named", named=True, resume=True)
    assert fit(tmp_path / "named", resume=True).steps == 4


def test_a_fresh_run_over_another_runs_checkpoints_is_refused(tmp_path):
    _, t = trainer(tmp_path)
    t.fit(*classification_data(), epochs=1)
    before = sorted(p.name for p in tmp_path.iterdir())
    _, t2 = trainer(tmp_path)
    with pytest.raises(CheckpointError, match=r"holds the checkpoints of an earlier run \(latest: ckpt-8\)"
                                              r".*resume=True \(--resume\).*new --logdir"):
        t2.fit(*classification_data(), epochs=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing overwritten, no mixed index


def test_a_second_run_gets_its_own_directory_and_saves_its_own_final_state(tmp_path):
    """The same command twice: two runs side by side, each latest checkpoint holding that run's final weights."""
    for i in range(2):
        run = run_directory(tmp_path, resume=False)
        model, t = trainer(run.checkpoints, checkpoint_every=4)
        t.fit(*classification_data(32, seed=i), epochs=1)  # ends at step 4, the same step in both runs
        assert run.path.name == f"version_{i}" and t.store.latest.endswith("ckpt-4")
        restored = mlp()
        tf.train.Checkpoint(model=restored).read(t.store.latest).expect_partial()
        assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(restored.weights, model.weights, strict=True))
        if i == 0:
            first = {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file()}
    assert all(p.read_bytes() == b for p, b in first.items())  # the first run is untouched


def test_run_directories_are_versioned_and_resume_picks_the_newest(tmp_path):
    first = run_directory(tmp_path / "runs", resume=False)
    assert first.path == tmp_path / "runs" / "version_0" and not first.resumed
    assert first.path.is_dir()  # reserved at once: a run started beside it takes the next number
    _, t = trainer(first.checkpoints)
    t.fit(*classification_data(16), epochs=1)
    second = run_directory(tmp_path / "runs", resume=False)
    assert second.path.name == "version_1"
    assert run_directory(tmp_path / "runs", resume=True).path == first.path  # version_1 holds no checkpoint yet
    with pytest.raises(CheckpointError, match="no run to resume.*drop --resume"):
        propose_run_directory(tmp_path / "empty", resume=True)


def test_a_logdir_below_a_regular_file_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"'.*file' is a file, not a directory.*choose another --logdir"):
        run_directory(tmp_path / "file" / "runs", resume=False)
    with pytest.raises(ValueError, match="is a file, not a directory"):
        Trainer(classifier_updates(mlp(), tf.keras.optimizers.SGD()), applied_plan(), batch_size=8,
                logdir=str(tmp_path / "file" / "tb"))
    # an empty one trained in the current folder (the examples' --logdir '': version_N there, "tensorboard --logdir ")
    with pytest.raises(ValueError, match=r"--logdir must name a folder. Received ''. Fix: "):
        run_directory("", resume=False)


# --------------------------------------------------------------------------- resume
def test_a_truncated_latest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, caplog):
    caplog.set_level("WARNING", logger="amp_backends.train")
    _, t = trainer(tmp_path, checkpoint_every=2)
    t.fit(*classification_data(32), epochs=1)
    latest = Path(t.store.latest)
    assert latest.name == "ckpt-4"
    blob = Path(str(latest) + ".data-00000-of-00001")
    blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 3])  # a crash, a full disk, a bad copy
    _, t2 = trainer(tmp_path)
    assert t2.restore() == 2
    assert "ckpt-4 is unreadable" in caplog.text and "resumed from the newest intact one" in caplog.text
    r = t2.fit(*classification_data(32), epochs=1, resume=True)  # and training goes on from there
    assert r.steps == 4


@pytest.mark.parametrize("index", ["deleted", "emptied", "garbled"])
def test_a_damaged_checkpoint_index_hides_no_checkpoint(tmp_path, caplog, index):
    """The ``checkpoint`` index file gone or garbled: the resume started over and its saves replaced the intact
    checkpoints; emptied: TensorFlow's ValueError ("Invalid checkpoint state")."""
    caplog.set_level("INFO", logger="amp_backends.train")
    _, t = trainer(tmp_path, checkpoint_every=2)
    t.fit(*classification_data(32), epochs=1)
    {"deleted": lambda f: f.unlink(), "emptied": lambda f: f.write_text(""),
     "garbled": lambda f: f.write_text("garbage {{{")}[index](tmp_path / "checkpoint")
    _, t2 = trainer(tmp_path)
    assert t2.fit(*classification_data(32), epochs=2, resume=True).steps == 8
    assert f"Resumed from {tmp_path / 'ckpt-4'}: global step 4" in caplog.text  # (not started over)
    assert (tmp_path / "ckpt-4.index").exists()
    said = {"deleted": None, "emptied": "is empty", "garbled": "is damaged"}[index]
    if said:
        assert (tmp_path / "checkpoint.damaged").exists() and said in caplog.text, caplog.text


def test_no_intact_checkpoint_at_all_is_a_clear_error(tmp_path):
    _, t = trainer(tmp_path)
    t.fit(*classification_data(16), epochs=1)
    for blob in tmp_path.glob("*.data-*"):
        blob.write_bytes(b"")
    _, t2 = trainer(tmp_path)
    with pytest.raises(CheckpointError, match="No intact checkpoint.*ckpt-2.*start a new run"):
        t2.fit(*classification_data(16), epochs=1, resume=True)


def test_resuming_another_models_checkpoint_names_what_differs(tmp_path):
    _, t = trainer(tmp_path, model=mlp(hidden=8))
    t.fit(*classification_data(16), epochs=1)
    _, t2 = trainer(tmp_path, model=mlp(hidden=16))
    with pytest.raises(CheckpointMismatchError) as info:
        t2.fit(*classification_data(16), epochs=1, resume=True)
    text = str(info.value)
    assert "written for other models" in text and "shape (4, 8) float32" in text and "(4, 16) float32" in text
    assert len(text) < 1500  # a message, not a dump of every variable


def test_a_checkpoint_of_another_program_is_refused_clearly(tmp_path):
    other = tf.Variable(tf.zeros([3]))
    tf.train.CheckpointManager(tf.train.Checkpoint(thing=other), str(tmp_path), 3).save()
    _, t = trainer(tmp_path)
    with pytest.raises(CheckpointMismatchError, match="does not match the models being trained.*start a new run"):
        t.fit(*classification_data(16), epochs=1, resume=True)


def counting_trainer(directory, batch_size, seen):
    """A trainer whose loss adds 1 to ``seen[i]`` for each sample it reads (column 0 of x: the sample's id)."""
    model = mlp()
    base = classifier_updates(model, tf.keras.optimizers.SGD(1e-3),
                              tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))[0]

    def loss_fn(batch):
        seen.assign_add(tf.reduce_sum(tf.one_hot(tf.cast(batch[0][:, 0], tf.int32), seen.shape[0]), axis=0))
        return base.loss_fn(batch)

    return trainer(directory, model, batch_size, updates=[Update("model", loss_fn, base.groups)])[1]


def test_resuming_with_another_batch_size_keeps_the_position_in_samples(tmp_path, caplog):
    """16-sample batches for 3 steps, then 8-sample batches: every sample of the epoch is trained on exactly once."""
    caplog.set_level("INFO", logger="amp_backends.train")
    x, y = classification_data(96)
    x[:, 0] = np.arange(96)  # column 0: the sample's id
    seen = tf.Variable(tf.zeros(96))
    counting_trainer(tmp_path, 16, seen).fit(x, y, epochs=1, max_steps=3)
    r = counting_trainer(tmp_path, 8, seen).fit(x, y, epochs=1, resume=True)
    assert seen.numpy().tolist() == [1.0] * 96
    assert r.steps == 3 + 6 and "continues at sample 48 of epoch 0" in caplog.text
    assert "no sample is read twice or skipped" in caplog.text


def test_a_pipeline_resumed_with_larger_batches_says_how_many_samples_it_reads_again(tmp_path, caplog):
    """A tf.data run resumed with another batch size said "the position is kept in samples, so no sample is read
    twice or skipped", where it skips whole batches of the new size and reads some samples again."""
    caplog.set_level("INFO", logger="amp_backends.train")
    x, y = classification_data(128)
    x[:, 0] = np.arange(128)  # column 0: the sample's id
    seen = tf.Variable(tf.zeros(128))
    counting_trainer(tmp_path, 16, seen).fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1,
                                             max_steps=3)
    counting_trainer(tmp_path, 32, seen).fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=1,
                                             resume=True)
    twice = int((seen.numpy() == 2).sum())
    assert twice == 16 and int((seen.numpy() == 0).sum()) == 0  # samples 32-47: read at 16 and again at 32
    assert ("continues at sample 48 of epoch 0: the pipeline skips the first 1 batch of 32 of its pass, so 16 "
            "samples are read again.") in caplog.text
    assert "no sample is read twice" not in caplog.text


def test_checkpoint_objects_that_leave_out_an_optimizer_or_weights_are_said_before_training(tmp_path):
    """checkpoint_objects={"model": model} saved no optimizer: a resume restarted Adam's moments and step count
    (its iterations 0 again) without a word."""
    from amp_backends.errors import AmpWarning

    model, opt = mlp(), tf.keras.optimizers.Adam(1e-2)
    updates = classifier_updates(model, opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for objects, left in [({"model": model}, r"the optimizer \(Adam\)"),
                          ({"epoch": tf.Variable(0)}, r"the optimizer \(Adam\) and weights it trains")]:
        with pytest.warns(AmpWarning, match=rf"checkpoint_objects leaves out {left} of the update 'model'.*Fix: "):
            Trainer(updates, applied_plan(), batch_size=8, checkpoint_dir=str(tmp_path / "a"), progress=False,
                    checkpoint_objects=objects)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", AmpWarning)  # everything held: nothing to say (a container of both too)
        for objects in ({"model": model, "optimizer": opt}, {"all": tf.train.Checkpoint(m=model, o=opt)}):
            Trainer(updates, applied_plan(), batch_size=8, checkpoint_dir=str(tmp_path / "b"), progress=False,
                    checkpoint_objects=objects)


# --------------------------------------------------------------------------- Ctrl-C
class _CtrlC(Observer):
    def __init__(self, at: int) -> None:
        self.at = at

    def after_call(self, record) -> None:
        if record.step == self.at:
            os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture
def ctrl_c_enabled():
    """Ctrl-C as in a terminal, even where the tests run in the background (SIGINT ignored)."""
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, saved)


def test_ctrl_c_saves_a_checkpoint_says_where_and_resumes_from_it(tmp_path, ctrl_c_enabled):
    model, t = trainer(tmp_path, observers=[_CtrlC(at=3)])
    with pytest.raises(TrainingInterrupted) as info:
        t.fit(*classification_data(64), epochs=1)
    assert info.value.exit_code == 130 and info.value.step == 3
    assert info.value.checkpoint.endswith("ckpt-3") and "checkpoint saved to" in info.value.message
    assert isinstance(info.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is given back
    _, t2 = trainer(tmp_path)
    assert t2.fit(*classification_data(64), epochs=1, resume=True).steps == 8


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_program_that_does_not_catch_the_stop_ends_by_its_signal_after_its_exit_handlers(name):
    """A script of one's own stopped in fit() ended with status 1 (Python ends by the signal only for a
    KeyboardInterrupt that is no subclass): a scheduler that requeues on 130/143 took it for a failure."""
    import subprocess
    import sys

    code = ("import atexit, signal\nfrom amp_backends.errors import TrainingInterrupted\n"
            "atexit.register(lambda: print('exit handlers ran', flush=True))\n"
            f"raise TrainingInterrupted(signal.{name}, 3, None, 'Interrupted at step 3')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == -getattr(signal, name), (out.returncode, out.stderr)  # the shell's 130 / 143
    assert out.stdout == "exit handlers ran\n"
    assert out.stderr.rstrip().endswith("amp_backends.errors.TrainingInterrupted: Interrupted at step 3")


class _CtrlCAtStart(Observer):
    def on_fit_start(self, start_step, total_steps) -> None:  # after the layer plans and the precision check
        os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_while_fit_sets_up_stops_at_the_first_call_boundary_and_saves(tmp_path, ctrl_c_enabled):
    """Ctrl-C before the first call (while the precision check ran, or the observers started) was a bare
    KeyboardInterrupt from wherever it fell, with nothing said or saved; a resumed fit's set-up too."""
    _, t = trainer(tmp_path, observers=[_CtrlCAtStart()])
    with pytest.raises(TrainingInterrupted) as info:
        t.fit(*classification_data(64), epochs=1)
    assert info.value.step == 0 and info.value.checkpoint.endswith("ckpt-0"), info.value.message
    _, t2 = trainer(tmp_path, observers=[_CtrlC(at=3)])
    with pytest.raises(TrainingInterrupted):
        t2.fit(*classification_data(64), epochs=1, resume=True)
    _, t3 = trainer(tmp_path, observers=[_CtrlCAtStart()])
    with pytest.raises(TrainingInterrupted) as info:
        t3.fit(*classification_data(64), epochs=1, resume=True)
    assert info.value.step == 3 and info.value.checkpoint.endswith("ckpt-3"), info.value.message
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    _, t4 = trainer(tmp_path)
    assert t4.fit(*classification_data(64), epochs=1, resume=True).steps == 8


def test_ctrl_c_without_checkpointing_says_nothing_was_saved(ctrl_c_enabled):
    model = mlp()
    t = Trainer(classifier_updates(model, tf.keras.optimizers.SGD(), tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True)), applied_plan(), batch_size=8, progress=False, observers=[_CtrlC(at=1)])
    with pytest.raises(TrainingInterrupted, match="checkpointing is off, nothing was saved"):
        t.fit(*classification_data(64), epochs=1)


def test_an_ignored_sigint_stays_ignored():
    """Started with SIGINT ignored (nohup, a background job), training does not take it over."""
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _, t = trainer_without_checkpoints(observers=[_CtrlC(at=1)])
        assert t.fit(*classification_data(16), epochs=1).steps == 2  # the signal was ignored, as asked
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, saved)


def trainer_without_checkpoints(**kw):
    model = mlp()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return model, Trainer(classifier_updates(model, tf.keras.optimizers.SGD(), loss), applied_plan(), batch_size=8,
                          progress=False, **kw)


def test_a_stream_across_epochs_resumed_with_larger_batches_does_not_claim_what_it_reads(tmp_path, caplog):
    """With steps_per_epoch (one stream across epochs) the message claimed a count of samples read again, where
    the skip, counted in batches of the new size, leaves samples out instead."""
    caplog.set_level("INFO", logger="amp_backends.train")
    x, y = classification_data(128)
    stream = lambda n: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(n)  # noqa: E731
    trainer(tmp_path, batch_size=16)[1].fit(stream(16), epochs=2, steps_per_epoch=4, max_steps=5)
    trainer(tmp_path, batch_size=32)[1].fit(stream(32), epochs=2, steps_per_epoch=4, resume=True)
    assert ("continues at sample 16 of epoch 1: the pipeline skips the first 4 batches of 32 of its pass (one "
            "stream across epochs, counted in batches of the new size: samples may be read again or left "
            "out).") in caplog.text


def test_a_checkpoint_saved_as_an_epoch_ends_is_resumed_in_the_next_epoch_without_ending_that_one_again(tmp_path,
                                                                                                          caplog):
    """checkpoint_every landing on an epoch's last call saved the position before the epoch's end was recorded, and
    the fit's final save was skipped at that step: a resume logged "Epoch 1 (global step 16)" a second time."""
    import logging

    x, y = classification_data(64)  # batch 8: 8 steps an epoch
    _, t = trainer(tmp_path, steps_per_call=4, checkpoint_every=8)
    t.fit(x, y, epochs=2)
    caplog.set_level(logging.INFO, logger="amp_backends.train")
    _, t2 = trainer(tmp_path, steps_per_call=4, checkpoint_every=8)
    result = t2.fit(x, y, epochs=3, resume=True)
    assert "global step 16, epoch 2, step in epoch 0" in caplog.text, caplog.text
    ended = [r.message.split(":")[0] for r in caplog.records if r.message.startswith("Epoch ")]
    assert ended == ["Epoch 2 (global step 24)"], caplog.text
    assert result.steps == 24 and result.epochs_completed == 3


def test_a_failed_best_save_before_any_regular_checkpoint_names_the_best_one_kept(tmp_path):
    """A full disk at a best save before the run's first regular checkpoint said "No checkpoint of this run has been
    written yet", beside an intact best/ckpt-N."""
    from amp_backends.training.checkpoints import CheckpointStore

    step = tf.Variable(3, dtype=tf.int64)
    store = CheckpointStore({"w": tf.Variable([1.0, 2.0])}, tmp_path, step_counter=step)
    best = store.sibling("best")
    saved = best.save()
    step.assign(5)
    best.manager.save = lambda checkpoint_number: (_ for _ in ()).throw(OSError(28, "No space left on device"))
    with pytest.raises(CheckpointError, match=rf"No checkpoint of this run has been written yet but the best one, "
                                              rf"{saved}\."):
        best.save()
