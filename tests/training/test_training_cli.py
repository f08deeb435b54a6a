"""The examples' command line end to end: kill -9 and resume, Ctrl-C, same seed same losses, logs, errors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from warm_python import run_python, popen_python
from conftest import NEUTRAL_CWD, tensorflow_blocked

pytestmark = pytest.mark.tensorflow
tf = pytest.importorskip("tensorflow")

from test_distribute import finish  # noqa: E402


def example(*args, logdir, timeout=300, popen=False, extra_env=None):
    cmd = [sys.executable, "-m", "amp_backends.examples.mnist", "--logdir", str(logdir), "--no-progress", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMP_")} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    env |= extra_env or {}
    if popen:  # (the forked program takes SIGINT as a terminal's would: warm_python sets Python's own handler)
        return popen_python(cmd[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=NEUTRAL_CWD)
    return run_python(cmd[1:], env=env, timeout=timeout, cwd=NEUTRAL_CWD)


STEP_LINE = re.compile(r"- INFO - \((\d+), (\d+)\), Loss: ([\d.]+), step_time: [\d.]+, throughput: [\d.e+]+ img/s\.")


@pytest.mark.slow
def test_kill_minus_9_and_resume_continue_at_the_right_step(tmp_path):
    args = ["--synthetic", "--batch_size", "32", "--checkpoint-every", "5", "--max-steps", "400", "--seed", "3"]
    proc = example(*args, logdir=tmp_path, popen=True)
    last = -1
    deadline = time.time() + 240
    for line in proc.stdout:
        m = STEP_LINE.search(line)
        if m:
            last = int(m.group(2))
            if last >= 17:
                break
        assert time.time() < deadline, "the run did not reach step 17"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    ckpts = tf.train.get_checkpoint_state(str(tmp_path / "version_0" / "checkpoints"))
    saved = int(ckpts.model_checkpoint_path.rsplit("-", 1)[1])
    assert saved % 5 == 0 and last + 1 - saved <= 5  # lost at most the checkpoint interval
    out = example(*args[:-4], "--max-steps", str(saved + 3), "--seed", "3", "--resume", logdir=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    checkpoint = tmp_path / "version_0" / "checkpoints" / f"ckpt-{saved}"
    assert f"Resumed from {checkpoint}: global step {saved}" in out.stderr + out.stdout
    steps = [int(m.group(2)) for m in STEP_LINE.finditer(out.stderr + out.stdout)]
    assert steps == [saved, saved + 1, saved + 2]


@pytest.mark.slow
def test_ctrl_c_stops_with_a_checkpoint_exit_130_and_resume_continues(tmp_path):
    args = ["--synthetic", "--batch_size", "32", "--max-steps", "400", "--seed", "3"]
    proc = example(*args, logdir=tmp_path, popen=True)
    deadline = time.time() + 240
    for line in proc.stdout:
        m = STEP_LINE.search(line)
        if m and int(m.group(2)) >= 4:
            break
        assert time.time() < deadline, "the run did not reach step 4"
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, rest[-2000:]
    m = re.search(r"mnist: stopped: Interrupted \(SIGINT\) at step (\d+): checkpoint saved to (\S+)\. "
                  r"Continue with --resume", rest)
    assert m and "Traceback" not in rest, rest[-2000:]
    step, path = int(m.group(1)), m.group(2)
    assert path.endswith(f"ckpt-{step}")
    assert tf.train.latest_checkpoint(str(tmp_path / "version_0" / "checkpoints")) == path
    out = example(*args[:-4], "--max-steps", str(step + 2), "--seed", "3", "--resume", logdir=tmp_path)
    assert out.returncode == 0 and f"global step {step}" in out.stdout + out.stderr, out.stderr[-2000:]
    assert [int(m.group(2)) for m in STEP_LINE.finditer(out.stderr + out.stdout)] == [step, step + 1]


def test_a_logdir_below_a_file_is_a_clear_error_before_training(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    out = example("--synthetic", "--max-steps", "1", logdir=tmp_path / "notes.txt" / "runs",
                  extra_env=tensorflow_blocked(tmp_path))  # refused before TensorFlow starts
    assert out.returncode == 2, out.stderr[-2000:]
    assert "is a file, not a directory" in out.stderr and "Traceback" not in out.stderr and "Loss" not in out.stderr


@pytest.mark.slow
@pytest.mark.intel
def test_tensorboard_scalars_and_profiler_trace_are_written(tmp_path):
    out = example("--synthetic", "--batch_size", "32", "--max-steps", "8", "--profile-steps", "4:6", "--log-every", "2",
                  logdir=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    assert "policy: " in text.split("Loss")[0]  # the plan is printed first
    assert len(STEP_LINE.findall(text)) == 4 and "Summary: 8 steps" in text
    run = tmp_path / "version_0"
    traces = list((run / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert traces, sorted(str(p) for p in tmp_path.rglob("*"))
    events = list((run / "train").glob("events.out.tfevents.*"))
    tags = set()
    for e in events:
        for ev in tf.compat.v1.train.summary_iterator(str(e)):
            tags |= {v.tag for v in ev.summary.value}
    assert {"loss/model", "loss_scale/model", "skipped_steps/model", "throughput_img_per_s"} <= tags
    assert (run / "checkpoints" / "checkpoint").exists()
    # --profile on a resumed run traces the steps after this fit's warm-up (its default window counted from step 0
    # lay before the resumed run's first step: no trace, and a warning)
    out = example("--synthetic", "--batch_size", "32", "--max-steps", "24", "--profile", "--resume", logdir=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 0 and "No profiler trace" not in text, text[-2000:]
    first, last = map(int, re.search(r"Profiler trace of steps (\d+):(\d+)", text).groups())
    assert 8 < first < last <= 24, text[-2000:]  # after the resumed fit's first (compiling) calls
    assert len(list((run / "plugins" / "profile").glob("*/*.xplane.pb"))) == len(traces) + 1


@pytest.mark.slow
def test_an_audited_run_trains_its_epoch_validates_and_saves(tmp_path):
    """``--audit`` crashed at the end of the first epoch (the audit's observer had no ``after_evaluation``, the hook
    the trainer calls with the epoch's values): exit 1, no checkpoint. The documented command, on the digits."""
    out = example("--digits", "--epochs", "1", "--batch_size", "256", "--audit", logdir=tmp_path, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "Traceback" not in text and "Epoch 0 (global step" in text and "val_accuracy" in text, text[-3000:]
    assert "Audit of 'mnist_cnn'" in text or "audit: " in text, text[-3000:]  # audited, or says why it cannot be
    saved = tf.train.get_checkpoint_state(str(tmp_path / "version_0" / "checkpoints"))
    assert saved is not None and saved.model_checkpoint_path


def test_offline_without_data_is_a_clear_error(tmp_path):
    env_home = tmp_path / "home"
    cmd = [sys.executable, "-m", "amp_backends.examples.mnist", "--logdir", str(tmp_path), "--max-steps", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMP_")} | {
        "KERAS_HOME": str(env_home), "TF_CPP_MIN_LOG_LEVEL": "2",
        # no network: point the download at a closed local port
        "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=NEUTRAL_CWD)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "mnist: error: MNIST is not in Keras's cache" in out.stderr and "--synthetic" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_console_script_trains_the_gan(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "amp-backends")
    out = subprocess.run([exe, "train", "gan", "--synthetic", "--batch_size", "16", "--max-steps", "2", "--no-progress",
                          "--logdir", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=NEUTRAL_CWD,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = re.findall(r"\(0, (\d)\), G Loss: [\d.]+, D Loss: [\d.]+, step_time: [\d.]+, throughput: [\d.e+]+ img/s\.",
                       out.stderr + out.stdout)
    assert lines == ["0", "1"]
    assert (tmp_path / "version_0" / "checkpoints" / "checkpoint").exists()


@pytest.mark.slow
def test_the_same_command_gives_the_same_losses_and_runs_started_together_each_get_their_own_version(tmp_path):
    """Same --seed, same losses on the CPU. Three runs started at once in an empty --logdir get version_0, version_1
    and version_2 (the next version is reserved by creating its folder), each with its own checkpoints. (That a
    later run leaves an earlier one's files as they were: test_training_checkpoints.)"""
    args = ["--synthetic", "--batch_size", "32", "--max-steps", "6", "--seed", "11"]
    one_thread = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}  # the same sums in every run
    procs = [example(*args, logdir=tmp_path, extra_env=one_thread, popen=True) for _ in range(3)]
    outs = finish(procs, timeout=300)
    assert [p.returncode for p in procs] == [0] * 3, "\n".join(o[-1500:] for o in outs)
    losses = [[m.group(3) for m in STEP_LINE.finditer(o)] for o in outs]
    assert len(losses[0]) == 6 and losses[0] == losses[1] == losses[2]
    dirs = sorted(re.search(r"Run directory: (\S+) \(new run", o).group(1) for o in outs)
    assert dirs == [str(tmp_path / f"version_{n}") for n in range(3)], outs
    for n in range(3):
        assert tf.train.latest_checkpoint(str(tmp_path / f"version_{n}" / "checkpoints")).endswith("ckpt-6")


def test_two_sources_of_data_are_refused_before_tensorflow_starts():
    """--digits --synthetic trained on --synthetic, saying nothing."""
    from amp_backends.errors import AmpConfigError
    from amp_backends.examples.run import RunOptions, preflight

    for given in ({"digits": True, "synthetic": True}, {"data": "mnist.npz", "digits": True}):
        with pytest.raises(AmpConfigError, match="one at most. Received: --.* and --.*Fix"):
            preflight(RunOptions(**given))
    preflight(RunOptions(digits=True))


def test_a_profile_window_that_is_no_window_is_refused_before_tensorflow_starts():
    """``--profile-steps 5:3`` was refused only once TensorFlow had started and the plan was made."""
    code = ("import sys\nfrom amp_backends.examples.run import RunOptions, preflight\n"
            "for steps in ('5:3', 'a:b', '-1:4', '2:6'):\n    try:\n"
            "        preflight(RunOptions(digits=True, profile_steps=steps))\n        print('accepted', steps)\n"
            "    except Exception as exc:\n        print(type(exc).__name__, exc)\nprint('tensorflow' in sys.modules)")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=NEUTRAL_CWD)
    out = ran.stdout.splitlines()
    assert len(out) == 5, (out, ran.stderr[-2000:])
    for line, given in zip(out[:3], ("'5:3'", "'a:b'", "'-1:4'"), strict=True):
        assert line.startswith("AmpConfigError --profile-steps must be START:STOP"), out
        assert f"Received: {given}" in line, out
    assert out[3:] == ["accepted 2:6", "False"], out


def test_a_profile_window_after_max_steps_is_refused_before_training():
    """``--max-steps 5 --profile-steps 20:30`` trained the five steps, then said no trace was written."""
    from amp_backends.errors import AmpConfigError
    from amp_backends.examples.run import RunOptions, preflight

    with pytest.raises(AmpConfigError, match=r"--profile-steps 20:30 starts at step 20, and --max-steps 5 ends the run "
                                             r"before it: nothing would be traced.*Fix: --profile-steps 0:5, or a "
                                             r"larger --max-steps"):
        preflight(RunOptions(digits=True, profile_steps="20:30", max_steps=5))
    preflight(RunOptions(digits=True, profile_steps="2:30", max_steps=5))  # (it starts inside the run: traced)


def test_a_resume_with_no_run_or_of_a_held_run_is_refused_before_tensorflow_starts(tmp_path):
    """Both were refused only once TensorFlow had started and the plan was made (seconds after the command)."""
    fcntl = pytest.importorskip("fcntl")
    code = ("import sys\nfrom amp_backends.examples.run import RunOptions, preflight\ntry:\n"
            "    preflight(RunOptions(resume=True, logdir=sys.argv[1]))\nexcept Exception as exc:\n"
            "    print(type(exc).__name__, exc)\nprint('tensorflow' in sys.modules)")

    def preflight_of_a_resume() -> str:
        return subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                              timeout=120, cwd=NEUTRAL_CWD).stdout

    out = preflight_of_a_resume()
    assert out.startswith("CheckpointError --resume: there is no run to resume") and out.endswith("\nFalse\n"), out
    folder = tmp_path / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "ckpt-2.index").write_bytes(b"")
    (folder / ".lock").write_text(f"{os.getpid()} here\n")
    held = os.open(folder / ".lock", os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a run training there holds it
        out = preflight_of_a_resume()
    finally:
        os.close(held)
    assert out.startswith(f"CheckpointError Another run is training in {str(folder)!r} now (process {os.getpid()} "
                          "on here holds") and out.endswith("\nFalse\n"), out
    assert preflight_of_a_resume() == "False\n"  # let go: the run can be resumed
    # a run training now that has saved no checkpoint yet: 'there is no run to resume. Fix: drop --resume', which
    # starts a second run beside it
    (folder / "ckpt-2.index").unlink()
    held = os.open(folder / ".lock", os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out = preflight_of_a_resume()
    finally:
        os.close(held)
    assert out.startswith(f"CheckpointError Another run is training in {str(folder)!r} now"), out


def test_ctrl_c_while_tensorflow_starts_stops_cleanly_and_says_nothing_was_trained(tmp_path):
    """Ctrl-C reaches the whole foreground group: the child that filters TensorFlow's start-up noise printed a
    KeyboardInterrupt traceback, and the run said "a second Ctrl-C" after the first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMP_", "TF_CPP_MIN_LOG_LEVEL"))}
    proc = subprocess.Popen([sys.executable, "-m", "amp_backends.examples.mnist", "--synthetic", "--logdir",
                             str(tmp_path), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=NEUTRAL_CWD, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.time() + 60
    while not (children.exists() and children.read_text().strip()):  # the filter runs while TensorFlow starts
        assert proc.poll() is None and time.time() < deadline, "TensorFlow's start-up filter never ran"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal sends it: to the parent and its filter
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:]
    assert "Traceback" not in out and "second Ctrl-C" not in out, out[-2000:]
    assert "before training began: nothing was trained or saved" in out or "Interrupted (SIGINT)" in out, out[-2000:]


def test_ctrl_c_after_training_says_the_run_is_trained_and_saved(tmp_path, monkeypatch):
    """Ctrl-C in the example's test evaluation, after training: the command said "interrupted before training
    began: nothing was trained or saved", and a user might delete a finished run."""
    from amp_backends.errors import TrainingInterrupted
    from amp_backends.examples.mnist import train_mnist
    from amp_backends.examples.run import RunOptions
    from amp_backends.training import Trainer

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "evaluate", interrupted)
    said = r"after training, in the test evaluation: the run's 4 steps are trained and checkpointed in .*checkpoints"
    with pytest.raises(TrainingInterrupted, match=said):
        train_mnist(RunOptions(digits=True, max_steps=4, batch_size=32, logdir=str(tmp_path), progress=False))
