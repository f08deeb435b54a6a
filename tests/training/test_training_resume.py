"""Resuming under changed settings is explicit: loss scaling follows the plan and says so, another seed is
refused, a run already past max_steps or epochs says what to pass, one run at a time in a checkpoint folder,
and a run that fails before it writes anything leaves no folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from warm_python import run_python, popen_python
from conftest import NEUTRAL_CWD
from helpers import applied_plan, classification_data, mlp

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
from amp_backends.errors import CheckpointError, CheckpointMismatchError, InputError  # noqa: E402
from amp_backends.training import Trainer, classifier_updates  # noqa: E402


def trainer(directory, the_plan=None, logdir=None, opt=None, **kw):
    model = mlp(hidden=None)
    opt = opt or tf.keras.optimizers.SGD(0.1)
    return Trainer(classifier_updates(model, opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
                   the_plan or applied_plan(), batch_size=8, checkpoint_objects={"model": model, "optimizer": opt},
                   checkpoint_dir=str(directory), logdir=logdir, progress=False, check_models=False, **kw)


# --------------------------------------------------------------------------- the optimizer
def test_a_resume_with_another_optimizer_is_refused_and_another_learning_rate_is_said(tmp_path, caplog):
    """A resume with SGD where Adam wrote the checkpoint was accepted (the SGD took Adam's learning rate, TensorFlow
    warned of unmatched values); a resume with Adam(0.05) silently trained on at the checkpoint's 0.001."""
    x, y = classification_data(16)
    assert trainer(tmp_path, opt=tf.keras.optimizers.Adam(1e-3)).fit(x, y, epochs=1).steps == 2
    with pytest.raises(CheckpointMismatchError, match=r"other models or optimizers.*'optimizer' is Adam in the "
                                                      r"checkpoint, SGD here.*Fix: resume with the same"):
        trainer(tmp_path, opt=tf.keras.optimizers.SGD(0.1)).fit(x, y, epochs=2, resume=True)
    again = trainer(tmp_path, opt=tf.keras.optimizers.Adam(0.05))
    with caplog.at_level("WARNING", logger="amp_backends"):
        assert again.fit(x, y, epochs=2, resume=True).steps == 4  # (the run's global step)
    assert any("trains on at the checkpoint's learning rate 0.001, restored with its state; it was given 0.05"
               in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    caplog.clear()
    with caplog.at_level("WARNING", logger="amp_backends"):  # the same rate: nothing to say
        trainer(tmp_path, opt=tf.keras.optimizers.Adam(1e-3)).fit(x, y, epochs=3, resume=True)
    assert not [r for r in caplog.records if "learning rate" in r.getMessage()]


# --------------------------------------------------------------------------- loss scaling
@pytest.mark.filterwarnings("ignore:loss_scale=dynamic with float32")
def test_a_run_without_loss_scaling_resumed_under_dynamic_scaling_starts_at_the_plans_scale(tmp_path, caplog):
    """As a bfloat16 run prepared on a CPU, continued under float16 on a GPU: not at scale 1 for 2000 steps."""
    caplog.set_level("INFO", logger="amp_backends.train")
    trainer(tmp_path).fit(*classification_data(32), max_steps=2)
    t = trainer(tmp_path, applied_plan(loss_scale="dynamic"))
    r = t.fit(*classification_data(32), max_steps=3, resume=True)
    assert t.scalers["model"].current == 2.0**15 and r.steps == 3
    assert ("The checkpoint was written without loss scaling; this plan's loss scaling is dynamic (initial 32768, "
            "growth every 2000 steps): 'model' starts at scale 32768, as a new run does, not at the restored 1."
            in caplog.text)


@pytest.mark.filterwarnings("ignore:loss_scale=dynamic with float32")
def test_a_dynamic_scale_resumed_under_no_scaling_is_dropped_and_the_same_scaling_continues(tmp_path, caplog):
    caplog.set_level("INFO", logger="amp_backends.train")
    first = trainer(tmp_path, applied_plan(loss_scale="dynamic"))
    first.fit(*classification_data(32), max_steps=2)
    first.scalers["model"].scale_var.assign(1024.0)  # as after overflows halved it
    first.save()
    again = trainer(tmp_path, applied_plan(loss_scale="dynamic"))
    again.fit(*classification_data(32), max_steps=3, resume=True)
    assert again.scalers["model"].current == 1024.0 and "loss scaling;" not in caplog.text  # the same: continued
    plain = trainer(tmp_path)
    plain.fit(*classification_data(32), max_steps=4, resume=True)
    assert plain.scalers["model"].current == 1.0
    assert ("The checkpoint was written with dynamic loss scaling; this plan scales no losses: the restored scale 1024 "
            "of 'model' is dropped." in caplog.text)


# --------------------------------------------------------------------------- seed
def test_a_resume_given_other_data_says_so_and_where_it_goes_on(tmp_path, caplog):
    """A resume with arrays of another length went on at the saved sample of the new data without a word."""
    trainer(tmp_path).fit(*classification_data(32), max_steps=3)
    caplog.set_level("WARNING", logger="amp_backends.train")
    trainer(tmp_path).fit(*classification_data(32), epochs=10, max_steps=4, resume=True)
    assert "samples; this fit is given" not in caplog.text  # the same data: nothing to say
    trainer(tmp_path).fit(*classification_data(48), epochs=10, max_steps=5, resume=True)
    assert ("The checkpoint's run trained on 32 samples; this fit is given 48: it goes on at sample 0 of epoch 1 of "
            "these, in their own order") in caplog.text, caplog.text
    trainer(tmp_path).fit(*classification_data(64), epochs=10, max_steps=10, resume=True)  # to sample 48 of epoch 1
    trainer(tmp_path).fit(*classification_data(40), epochs=10, max_steps=11, resume=True)
    assert ("this fit is given 40: it goes on with epoch 2 (it stood at sample 48, past their end)") in caplog.text


def test_resuming_with_another_seed_is_refused_naming_both_and_the_fix(tmp_path):
    trainer(tmp_path, seed=0).fit(*classification_data(32), max_steps=2)
    with pytest.raises(CheckpointMismatchError) as err:
        trainer(tmp_path, seed=7).fit(*classification_data(32), max_steps=3, resume=True)
    text = str(err.value)
    assert "written by a run with seed 0; this trainer's seed is 7" in text
    assert "Fix: resume with seed=0 (on the command line: leave --seed out" in text
    assert trainer(tmp_path, seed=0).fit(*classification_data(32), max_steps=3, resume=True).steps == 3


def test_the_examples_follow_a_resumed_runs_seed_and_refuse_another(tmp_path):
    from amp_backends.examples.run import RunOptions, choose_run

    trainer(tmp_path / "version_0" / "checkpoints", seed=3).fit(*classification_data(32), max_steps=1)
    opts, run = choose_run(RunOptions(logdir=str(tmp_path), resume=True), None)
    assert opts.seed == 3 and run.resumed and run.path == tmp_path / "version_0"
    assert choose_run(RunOptions(logdir=str(tmp_path), resume=True, seed=3), None)[0].seed == 3
    with pytest.raises(CheckpointError, match=r"--seed 7: the run in .* was started with seed 3.*Fix: drop --seed"):
        choose_run(RunOptions(logdir=str(tmp_path), resume=True, seed=7), None)
    fresh, new = choose_run(RunOptions(logdir=str(tmp_path)), None)
    assert fresh.seed == 0 and new.path.name == "version_1" and new.path.is_dir()  # reserved, still empty


# --------------------------------------------------------------------------- nothing left to train
def test_a_run_already_past_max_steps_or_epochs_trains_nothing_and_says_what_to_pass(tmp_path, caplog):
    caplog.set_level("WARNING", logger="amp_backends.train")
    trainer(tmp_path).fit(*classification_data(32), epochs=5, max_steps=8)  # 4 steps an epoch: 2 epochs
    r = trainer(tmp_path).fit(*classification_data(32), epochs=5, max_steps=4, resume=True)
    assert r.steps == 8 and not r.history
    assert r.summary().endswith("last losses none (no step ran)")  # it read "last losses ," with nothing after
    assert ("Nothing to train: the run is already at global step 8, past max_steps=4 (--max-steps: the steps of the "
            "whole run, resumed ones included). Fix: to train further, pass a max_steps above 8, such as 16."
            in caplog.text)
    caplog.clear()
    trainer(tmp_path).fit(*classification_data(32), epochs=2, resume=True)
    assert "the run has already completed 2 epochs, and epochs=2 (--epochs)" in caplog.text
    assert "pass epochs above 2, such as 3" in caplog.text
    caplog.clear()
    assert trainer(tmp_path).fit(*classification_data(32), epochs=5, max_steps=10, resume=True).steps == 10
    assert "Nothing" not in caplog.text


# --------------------------------------------------------------------------- one run at a time
HOLD = ("import sys, time; from amp_backends.training.runs import holding\n"
        "with holding(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)")


def hold_in_another_process(folder):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True,
                            cwd=NEUTRAL_CWD)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("resume", [True, False])
def test_a_second_run_in_a_checkpoint_folder_is_refused_until_the_first_ends_even_killed(tmp_path, resume):
    if resume:
        trainer(tmp_path).fit(*classification_data(32), max_steps=2)
    holder = hold_in_another_process(tmp_path)
    try:
        with pytest.raises(CheckpointError) as err:
            trainer(tmp_path).fit(*classification_data(32), max_steps=3, resume=resume)
        text = str(err.value)
        assert f"Another run is training in {str(tmp_path)!r} now (process {holder.pid} on " in text
        assert "Fix: wait for that run to end (or stop it)" in text and "another --logdir" in text
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    # the OS released the lock
    assert trainer(tmp_path).fit(*classification_data(32), max_steps=3, resume=resume).steps == 3


def test_the_same_process_trains_one_folder_run_after_run(tmp_path):
    first = trainer(tmp_path)
    first.fit(*classification_data(32), max_steps=2)
    assert trainer(tmp_path).fit(*classification_data(32), max_steps=3, resume=True).steps == 3
    # the first trainer holds nothing between its fits
    assert first.fit(*classification_data(32), max_steps=4).steps == 4


# --------------------------------------------------------------------------- no folder left by a failed start
def test_a_run_that_fails_before_its_first_step_leaves_no_folder(tmp_path):
    run = tmp_path / "runs" / "version_0"
    t = trainer(run / "checkpoints", logdir=str(run))
    assert not (tmp_path / "runs").exists()
    with pytest.raises(InputError, match="fewer than one batch"):
        t.fit(*classification_data(4), max_steps=1)
    assert not (tmp_path / "runs").exists()

    with pytest.raises(Exception, match="broken at its first step"):
        broken_trainer(run / "checkpoints", logdir=str(run)).fit(*classification_data(32), max_steps=1)
    assert not (tmp_path / "runs").exists()
    trainer(run / "checkpoints", logdir=str(run)).fit(*classification_data(32), max_steps=1)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "train"]


def broken_trainer(directory, logdir=None):
    class Broken(tf.keras.layers.Layer):
        def call(self, x):
            raise ValueError("broken at its first step")

    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3), Broken()])
    return Trainer(classifier_updates(model, tf.keras.optimizers.SGD(0.1)), applied_plan(), batch_size=8,
                   checkpoint_dir=str(directory), logdir=logdir, progress=False, check_models=False)


def test_a_folder_that_existed_stays_as_it_was(tmp_path):
    (tmp_path / "mine").mkdir()
    with pytest.raises(Exception, match="broken at its first step"):
        broken_trainer(tmp_path / "mine").fit(*classification_data(32), max_steps=1)
    assert (tmp_path / "mine").is_dir() and list((tmp_path / "mine").iterdir()) == []
    trainer(tmp_path / "mine").fit(*classification_data(32), max_steps=1)
    with pytest.raises(CheckpointError, match="holds the checkpoints of an earlier run"):
        trainer(tmp_path / "mine").fit(*classification_data(32), max_steps=1)
    assert (tmp_path / "mine" / "ckpt-1.index").exists()


# --------------------------------------------------------------------------- the examples' command line
def cli(*args, logdir, env=None):
    """``amp-backends train mnist`` in this process (errors found before training: fast)."""
    from typer.testing import CliRunner

    from amp_backends.commands.cli import get_app

    result = CliRunner().invoke(get_app(), ["train", "mnist", "--logdir", str(logdir), "--no-progress", *args],
                                env=env)
    return result.exit_code, result.output


def bad_inputs(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "cut.npz").write_bytes(b"PK\x03\x04 the first bytes of a download")
    np.savez(tmp_path / "other.npz", images=np.zeros(3))
    return {
        "batch over the data": (["--digits", "--batch_size", "5000"], None,
                                "The data has 1295 samples, fewer than one batch of 5000. Fix: lower batch_size to "
                                "at most 1295, or train on more data. (On this command line: batch_size is "
                                "--batch_size.)"),
        "unknown layer": (["--synthetic", "--max-steps", "1", "--float32-layers", "NoSuchLayer"], None,
                          "no layer class is named 'NoSuchLayer' (nor anything like it)"),
        "layer typo in the environment": (["--synthetic", "--max-steps", "1"], {"AMP_FLOAT32_LAYERS": "Conv2d"},
                                          "'Conv2d' (did you mean Conv2D?)"),
        "data is a folder": (["--data", str(tmp_path / "folder")], None, "which is a directory, not a file"),
        "data is damaged": (["--data", str(tmp_path / "cut.npz")], None, "cut.npz' is damaged"),
        "data of other arrays": (["--data", str(tmp_path / "other.npz")], None,
                                 "found images (missing x_train, y_train, x_test, y_test). Fix: save the four arrays"),
    }


@pytest.mark.parametrize("case", ["batch over the data", "unknown layer", "layer typo in the environment",
                                  "data is a folder", "data is damaged", "data of other arrays"])
def test_bad_input_is_the_librarys_error_exit_2_and_leaves_no_run_folder(tmp_path, case):
    args, env, expected = bad_inputs(tmp_path)[case]
    code, output = cli(*args, logdir=tmp_path / "runs", env=env)
    assert code == 2, output[-2000:]
    assert "mnist: error: " in output and expected in " ".join(output.split()), output[-2000:]
    assert "Traceback" not in output and "Loss:" not in output
    assert not (tmp_path / "runs").exists()
    if case.startswith("data"):  # a --data file is read before a run is announced
        assert "Run directory" not in output, output[-2000:]


def example(*args, logdir, env=None, popen=False, timeout=300):
    cmd = [sys.executable, "-m", "amp_backends.examples.mnist", "--logdir", str(logdir), "--no-progress", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMP_")} | {"TF_CPP_MIN_LOG_LEVEL": "2"} | dict(
        env or {})
    if popen:
        return popen_python(cmd[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=NEUTRAL_CWD)
    out = run_python(cmd[1:], env=env, timeout=timeout, cwd=NEUTRAL_CWD)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.slow
def test_resuming_under_changed_settings_is_said_or_refused(tmp_path):
    """Seed 3 in bfloat16 (this CPU's plan) -> --seed 7 refused -> float16 resumes at 32768 with the run's seed ->
    --max-steps below the run's step trains nothing, says what to pass, exit 0."""
    base = ["--synthetic", "--batch_size", "16"]
    code, out = example(*base, "--seed", "3", "--max-steps", "2", logdir=tmp_path)
    assert code == 0, out[-2000:]
    code, out = example(*base, "--seed", "7", "--max-steps", "4", "--resume", logdir=tmp_path)
    assert code == 2 and "Loss:" not in out, out[-2000:]
    assert (f"mnist: error: --seed 7: the run in {str(tmp_path / 'version_0')!r} was started with seed 3" in out
            and "Fix: drop --seed (a resumed run keeps its own)" in out)
    fp16 = {"AMP_POLICY": "mixed_float16", "AMP_FORCE": "1"}
    if amp_backends.plan_for(policy="mixed_float16", force=True).policy != "mixed_float16":
        # float16 is unsafe here even forced (ITEX on a CPU with fp16 instructions): the same change of loss scaling
        # under this machine's own policy
        fp16 = {"AMP_LOSS_SCALE": "dynamic"}
    code, out = example(*base, "--max-steps", "3", "--resume", logdir=tmp_path, env=fp16)
    assert code == 0, out[-2000:]
    assert f"Run directory: {tmp_path / 'version_0'} (resumed, its seed 3;" in out
    assert "The checkpoint was written without loss scaling; this plan's loss scaling is dynamic" in out
    assert "'model' starts at scale 32768, as a new run does, not at the restored 1." in out
    code, out = example(*base, "--max-steps", "2", "--resume", logdir=tmp_path)
    assert code == 0, out[-2000:]
    assert "The checkpoint was written with dynamic loss scaling; this plan scales no losses" in out
    assert ("WARNING - Nothing to train: the run is already at global step 3, past max_steps=2 (--max-steps: "
            "the steps of the whole run, resumed ones included). Fix: to train further, pass a max_steps above 3"
            in out) and "Loss:" not in out


@pytest.mark.slow
def test_two_resumes_of_one_run_at_once_the_second_is_refused_and_a_killed_first_leaves_no_lock(tmp_path):
    base = ["--synthetic", "--batch_size", "16", "--checkpoint-every", "2"]
    assert example(*base, "--max-steps", "2", logdir=tmp_path)[0] == 0
    first = example(*base, "--max-steps", "100000", "--epochs", "1000", "--resume", logdir=tmp_path, popen=True)
    try:
        for line in first.stdout:  # training: it holds the run
            if "Loss:" in line:
                break
        first.send_signal(signal.SIGSTOP)  # stopped, it holds the run as before, but leaves the cores to the second
        code, out = example(*base, "--max-steps", "3", "--resume", logdir=tmp_path)
        assert code == 2 and "Loss:" not in out, out[-2000:]
        folder = tmp_path / "version_0" / "checkpoints"
        assert f"mnist: error: Another run is training in {str(folder)!r} now (process {first.pid} on " in out
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    saved = int(tf.train.latest_checkpoint(str(tmp_path / "version_0" / "checkpoints")).rsplit("-", 1)[1])
    code, out = example(*base, "--max-steps", str(saved + 1), "--resume", logdir=tmp_path)
    assert code == 0 and f"global step {saved}" in out, out[-2000:]


def test_resume_where_there_is_nothing_to_resume_starts_afresh_with_a_warning(tmp_path, caplog):
    """A run that always passes resume=True starts this way; so does a typo in checkpoint_dir: said as a warning
    (it was an info line), the run trains from step 0."""
    x, y = classification_data(16)
    t = Trainer(classifier_updates(mlp(), tf.keras.optimizers.SGD(0.1)), applied_plan(), batch_size=8,
                progress=False, checkpoint_dir=str(tmp_path / "typo"))
    with caplog.at_level("INFO", logger="amp_backends"):
        assert t.fit(x, y, epochs=1, resume=True).steps == 2
    (record,) = [r for r in caplog.records if "Nothing to resume" in r.getMessage()]
    assert record.levelname == "WARNING" and "typo" in record.getMessage()
