"""Storage that fails under a run: a full disk, a read-only file system, a save killed mid-way, TensorBoard.

The faults are real: a small tmpfs mounted for the test (root only; skipped elsewhere), filled or remounted
read-only while training runs, and a process killed while it writes a checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from warm_python import run_python
from conftest import NEUTRAL_CWD
from helpers import applied_plan, classification_data, mlp

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from amp_backends.errors import CheckpointError  # noqa: E402
from amp_backends.training import Observer, Trainer, classifier_updates  # noqa: E402


def trainer(checkpoint_dir=None, logdir=None, **kw):
    model = mlp()
    opt = tf.keras.optimizers.Adam(1e-2)
    updates = classifier_updates(model, opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return Trainer(updates, applied_plan(), batch_size=8, progress=False, logdir=logdir and str(logdir),
                   checkpoint_dir=checkpoint_dir and str(checkpoint_dir),
                   checkpoint_objects={"model": model, "optimizer": opt}, **kw)


# --------------------------------------------------------------------------- a small disk
def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@contextlib.contextmanager
def small_disk(path: Path, size: str):
    """A tmpfs of ``size`` at ``path`` for the block; skips where mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    can = is_root() and shutil.which("mount")
    mounted = _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)) if can else None
    if mounted is None or mounted.returncode:
        pytest.skip("needs a small disk: mounting a tmpfs takes root, mount(8) and a system that allows it "
                    f"({mounted.stderr.strip() if mounted else 'not root, or no mount command'})")
    try:
        yield path
    finally:
        if _run("umount", str(path)).returncode:
            _run("umount", "-l", str(path))  # a file TensorFlow still holds open


def fill(disk: Path) -> None:
    """Take every free byte of ``disk``."""
    st = os.statvfs(disk)
    fd = os.open(disk / "filler", os.O_CREAT | os.O_WRONLY)
    try:
        os.posix_fallocate(fd, 0, max(st.f_bavail * st.f_frsize, 1))
    except OSError:
        pass  # full already
    finally:
        os.close(fd)


class At(Observer):
    """Runs ``action`` after the call that ends at ``step``."""

    def __init__(self, step: int, action) -> None:
        self.step, self.action = step, action

    def after_call(self, record) -> None:
        if record.step == self.step:
            self.action()


def _written(temps) -> bool:
    """Whether an unfinished save has written any bytes yet (its ``_temp`` folder holds a file that is not empty)."""
    return any(f.is_file() and f.stat().st_size > 0 for t in temps for f in ([t] if t.is_file() else t.rglob("*")))


def leftovers(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if "_temp" in n or "tempstate" in n or n.startswith("checkpoint.tmp"))


# --------------------------------------------------------------------------- checkpoints
def test_a_save_on_a_full_disk_stops_with_a_checkpoint_error_and_keeps_the_previous_checkpoint(tmp_path, caplog):
    caplog.set_level("INFO", logger="amp_backends.train")
    with small_disk(tmp_path / "disk", "1m") as disk:
        folder = disk / "checkpoints"
        t = trainer(folder, checkpoint_every=2, observers=[At(3, lambda: fill(disk))])
        with pytest.raises(CheckpointError) as info:
            t.fit(*classification_data(), epochs=1)
        text = str(info.value)
        assert f"The checkpoint of step 4 could not be written to '{folder}': no space left on device" in text
        assert re.search(r"\(\d+ bytes free there, a checkpoint of this run needs about [\d.]+ KB\)", text), text
        assert "The latest checkpoint is still ckpt-2" in text and "partial files of this save were removed" in text
        assert re.search(r"Fix: free at least [\d.]+ KB on that disk, then run again with --resume", text), text
        assert leftovers(folder) == []
        assert tf.train.latest_checkpoint(str(folder)) == str(folder / "ckpt-2")
        os.remove(disk / "filler")
        resumed = trainer(folder)
        assert resumed.fit(*classification_data(), epochs=1, resume=True).steps == 8
        assert f"Resumed from {folder / 'ckpt-2'}: global step 2" in caplog.text
        assert tf.train.latest_checkpoint(str(folder)) == str(folder / "ckpt-8")


@pytest.mark.parametrize("fault", ["read-only file system", "no write permission"])
def test_a_save_that_cannot_write_stops_with_a_checkpoint_error(tmp_path, fault):
    if fault == "no write permission" and is_root():
        pytest.skip("root writes regardless of permissions (the read-only file system case covers root)")
    with contextlib.ExitStack() as stack:
        if fault == "read-only file system":
            disk = stack.enter_context(small_disk(tmp_path / "disk", "1m"))
            folder, reason = disk / "checkpoints", "the file system is read-only"
            lock = At(3, lambda: _run("mount", "-o", "remount,ro", str(disk)).check_returncode())
        else:
            folder, reason = tmp_path / "checkpoints", "permission denied"
            lock = At(3, lambda: folder.chmod(0o555))
            stack.callback(lambda: folder.chmod(0o755))
        t = trainer(folder, checkpoint_every=2, observers=[lock])
        with pytest.raises(CheckpointError, match=rf"step 4 could not be written to '{folder}': {reason} .*still "
                                                  r"ckpt-2.*Fix: make .* writable"):
            t.fit(*classification_data(), epochs=1)
        assert tf.train.latest_checkpoint(str(folder)) == str(folder / "ckpt-2") and leftovers(folder) == []


def test_a_disk_too_full_for_one_checkpoint_stops_before_training_and_leaves_no_event_file(tmp_path, caplog):
    caplog.set_level("WARNING", logger="amp_backends.train")
    steps = []
    with small_disk(tmp_path / "disk", "256k") as disk:
        fill(disk)
        t = trainer(disk / "checkpoints", logdir=disk, observers=[At(1, lambda: steps.append(1))])
        # (TensorBoard's writer starts with the first scalars: a run refused before its first step writes none)
        with pytest.raises(CheckpointError, match=r"has \d+ bytes free; a checkpoint of this run needs about "
                                                  r"[\d.]+ KB, so the next save would fail\. No checkpoint .*Fix: "
                                                  r"free at least"):
            t.fit(*classification_data(), epochs=1)
        assert steps == []  # refused before the first step
        assert not (disk / "train").exists()  # no empty event file left behind


def test_a_full_disk_for_tensorboard_alone_is_a_warning_and_training_goes_on(tmp_path, caplog):
    caplog.set_level("WARNING", logger="amp_backends.train")
    with small_disk(tmp_path / "disk", "256k") as disk:
        fill(disk)
        # checkpoints elsewhere
        result = trainer(tmp_path / "checkpoints", logdir=disk).fit(*classification_data(), epochs=1)
        assert result.steps == 8
        assert "TensorBoard scalars cannot be written to" in caplog.text and "No space left on device" in caplog.text
        assert not list((disk / "train").glob("events.out.tfevents*")) if (disk / "train").exists() else True


def test_unfinished_saves_of_a_killed_process_are_removed_when_the_run_resumes(tmp_path, caplog):
    caplog.set_level("INFO", logger="amp_backends.train")
    folder = tmp_path / "checkpoints"
    trainer(folder, checkpoint_every=2).fit(*classification_data(32), epochs=1)
    writer = ("import sys, tensorflow as tf\n"
              "big = tf.Variable(tf.zeros([64 * 2**20], tf.float32))\n"  # 256 MB: a save that takes a while
              "print('ready', flush=True)\n"
              "tf.train.Checkpoint(v=big).write(sys.argv[1])\n")
    for attempt in range(8):  # kill it while ckpt-6_temp is being written (a later kill finds the save done)
        proc = subprocess.Popen([sys.executable, "-c", writer, str(folder / f"ckpt-{6 + attempt}")], cwd=NEUTRAL_CWD,
                                stdout=subprocess.PIPE, text=True, env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"})
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.time() + 60
        while not _written(folder.glob("ckpt-*_temp*")) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.001)
        proc.kill()  # at once, with some of the save written: a save of 256 MB can end within milliseconds
        proc.wait(timeout=30)
        if list(folder.glob("ckpt-*_temp*")):
            break
    left = leftovers(folder)
    assert left, "no save was caught mid-way"
    resumed = trainer(folder)
    assert resumed.fit(*classification_data(32), epochs=2, resume=True).steps == 8
    assert leftovers(folder) == []
    assert re.search(rf"Removed what unfinished checkpoint saves of an interrupted run left in {folder} "
                     rf"\(freeing [\d.]+ [KMG]B\): {re.escape(', '.join(left))}", caplog.text), caplog.text
    assert tf.train.latest_checkpoint(str(folder)) == str(folder / "ckpt-8")


# --------------------------------------------------------------------------- TensorBoard
def test_tensorboard_and_profile_writes_that_fail_mid_run_are_warnings_and_training_goes_on(tmp_path, caplog):
    caplog.set_level("WARNING", logger="amp_backends.train")
    with small_disk(tmp_path / "disk", "256k") as disk:
        t = trainer(tmp_path / "checkpoints", logdir=disk, observers=[At(2, lambda: fill(disk))], profile_steps=(4, 6))
        result = t.fit(*classification_data(512), epochs=1)  # 64 calls: the event file outgrows its page
    assert result.steps == 64 and t.store.latest.endswith("ckpt-64")
    warnings = [r.message for r in caplog.records if r.levelname == "WARNING" and r.name == "amp_backends.train"]
    assert len(warnings) == 2, warnings
    assert all("No space left on device" in w and "training goes on without" in w for w in warnings)
    assert sum(f"TensorBoard scalars can no longer be written to {disk / 'train'}" in w for w in warnings) == 1
    assert sum(f"The profiler trace cannot be written to {disk}" in w for w in warnings) == 1


def test_a_best_checkpoint_that_cannot_be_written_names_the_runs_latest_checkpoint_to_resume_from(tmp_path):
    """The best checkpoint sits beside the run's own: when its save meets a full disk, what the run can resume from
    is the latest of the run's checkpoints (ckpt-6), not the previous best (ckpt-4)."""
    # 4 steps per epoch at batch 8: best checkpoints at 4 and 8, the run's own at 3 and 6
    x, y = classification_data(32)
    with small_disk(tmp_path / "disk", "256k") as disk:
        t = trainer(disk / "checkpoints", keep_best="val_loss", checkpoint_every=3,
                    observers=[At(7, lambda: fill(disk))])
        with pytest.raises(CheckpointError) as err:
            t.fit(x, y, epochs=3, validation_data=(x, y))
        message = str(err.value)
        assert f"could not be written to {str(disk / 'checkpoints' / 'best')!r}: no space left on device" in message
        assert "The latest checkpoint is still ckpt-6; training can continue from it." in message
        assert "then run again with --resume" in message
        assert leftovers(disk / "checkpoints" / "best") == []


def scalar_steps(logdir: Path, tag: str) -> list[tuple[int, float]]:
    """What TensorBoard shows of ``tag``: its event reader over every event file of the run, in order."""
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea

    acc = pea.EventAccumulator(str(logdir / "train"), size_guidance={pea.TENSORS: 0})
    acc.Reload()
    return [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]


class Losses(Observer):
    def __init__(self) -> None:
        self.by_step: dict[int, float] = {}

    def after_call(self, record) -> None:
        self.by_step[record.step] = float(record.losses[-1][0])


class Killed(Observer):
    """Ends the process's training abruptly before the call that starts at ``step`` (no final save)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def before_call(self, step: int, steps: int) -> None:
        if step == self.step:
            raise RuntimeError("killed")


def test_a_resumed_run_shows_each_step_once_in_tensorboard(tmp_path):
    """Killed at step 6 with its checkpoint at 4: the resumed run re-runs 5 and 6; TensorBoard shows its values."""
    pytest.importorskip("tensorboard")
    with pytest.raises(RuntimeError, match="killed"):
        trainer(tmp_path / "checkpoints", logdir=tmp_path, checkpoint_every=4, observers=[Killed(6)]).fit(
            *classification_data(), epochs=1)
    assert scalar_steps(tmp_path, "loss/model")[-1][0] == 6
    start = int(time.time())
    while int(time.time()) == start:  # event files are read in the order of their names: the second one later
        time.sleep(0.05)
    losses = Losses()
    trainer(tmp_path / "checkpoints", logdir=tmp_path, observers=[losses]).fit(*classification_data(), epochs=1,
                                                                               max_steps=8, resume=True)
    shown = scalar_steps(tmp_path, "loss/model")
    assert [s for s, _ in shown] == list(range(1, 9))
    assert {s: v for s, v in shown if s > 4} == pytest.approx(losses.by_step)
    assert len(list((tmp_path / "train").glob("events.out.tfevents.*"))) == 2


# --------------------------------------------------------------------------- the command line
def example(*args: str, logdir: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "amp_backends.examples.mnist", "--logdir", str(logdir), "--no-progress", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMP_")} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    return run_python(cmd[1:], env=env, timeout=300, cwd=NEUTRAL_CWD)


@pytest.mark.slow
def test_the_command_line_exits_2_on_a_full_disk_and_resumes_once_there_is_room(tmp_path):
    """The MNIST CNN's checkpoint is 14.4 MB: a 24 MB disk holds the first, not a second beside it."""
    args = ["--digits", "--checkpoint-every", "2", "--max-steps", "6", "--batch_size", "32"]
    with small_disk(tmp_path / "disk", "24m") as disk:
        out = example(*args, logdir=disk / "runs")
        folder = disk / "runs" / "version_0" / "checkpoints"
        assert out.returncode == 2, out.stderr[-3000:]
        assert "Traceback" not in out.stderr
        assert f"The checkpoint of step 4 could not be written to '{folder}': no space left on device" in out.stderr
        assert re.search(r"[\d.]+ MB free there, a checkpoint of this run needs about 14\.4 MB", out.stderr)
        assert leftovers(folder) == [] and tf.train.latest_checkpoint(str(folder)) == str(folder / "ckpt-2")
        _run("mount", "-o", "remount,size=64m", str(disk)).check_returncode()
        out = example(*args, "--resume", logdir=disk / "runs")
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"Resumed from {folder / 'ckpt-2'}: global step 2" in out.stderr
        assert tf.train.latest_checkpoint(str(folder)) == str(folder / "ckpt-6")
