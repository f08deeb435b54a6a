"""tf.distribute and faults: MirroredStrategy over 2 logical CPUs, MultiWorkerMirroredStrategy with 2 worker
processes on 127.0.0.1, killed workers, torn checkpoints, bad cluster configuration. Every run is bounded."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from warm_python import run_python, popen_python

from amp_backends.errors import ClusterConfigError
from amp_backends.training.distribute import check_port_free, parse_tf_config
from conftest import NEUTRAL_CWD, SCRIPTS, tensorflow_blocked

pytestmark = pytest.mark.tensorflow
STEP = re.compile(r"- INFO - \((\d+), (\d+)\), Loss: ")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def tf_config(ports, index):
    return json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def env(**extra):
    base = {k: v for k, v in os.environ.items() if not k.startswith("AMP_") and k != "TF_CONFIG"}
    return base | {"TF_CPP_MIN_LOG_LEVEL": "2"} | extra


def worker(ports, index, logdir, *args, extra_env=None):
    cmd = [sys.executable, "-m", "amp_backends.examples.mnist", "--synthetic", "--no-progress", "--logdir", str(logdir),
           "--distribute", "multiworker", "--cluster-timeout", "20", *args]
    return popen_python(cmd[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=NEUTRAL_CWD,
                        env=env(TF_CONFIG=tf_config(ports, index), **(extra_env or {})))


def finish(procs, timeout=240):
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("a worker did not finish in time") from None
        outs.append(out)
    return outs


# --------------------------------------------------------------------------- configuration errors
@pytest.mark.parametrize("text,needle", [
    ("{not json", "TF_CONFIG must be JSON"),
    ('{"cluster": {}}', "needs a 'cluster' object and a 'task' object"),
    ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}}', "jobs for MultiWorkerMirroredStrategy"),
    ('{"cluster": {"worker": ["localhost"]}, "task": {"type": "worker", "index": 0}}', "expected 'host:port'"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}', "task type must be one of"),
    ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 2}}', "integer in 0..1"),
])
def test_tf_config_validation(text, needle):
    with pytest.raises(ClusterConfigError, match=re.escape(needle)) as raised:
        parse_tf_config(text)
    assert "Fix: set TF_CONFIG on every worker, such as {" in str(raised.value)  # (there was none)
    assert str(raised.value).endswith("each worker its own task index), or unset it (unset TF_CONFIG) to train in "
                                      "one process."), str(raised.value)


def test_a_model_made_outside_the_strategys_scope_is_our_error_with_the_fix():
    """strategy= given a model and optimizer made outside strategy.scope(): TensorFlow's RuntimeError "Mixing
    different tf.distribute.Strategy objects", from inside the trainer."""
    import tensorflow as tf

    import amp_backends
    from amp_backends.errors import AmpConfigError
    from amp_backends.training import Trainer, classifier_updates

    plan = amp_backends.auto_configure(policy="float32", verbose=False)
    strategy = tf.distribute.MirroredStrategy(["/CPU:0"])
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(3, activation="softmax")])
    with pytest.raises(AmpConfigError, match=r"made outside its scope\. Fix: make the models and optimizers inside "
                                             r"`with strategy.scope\(\):`"):
        Trainer(classifier_updates(model, tf.keras.optimizers.Adam()), plan, batch_size=8, strategy=strategy)
    with strategy.scope():  # made inside: it trains
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(3, activation="softmax")])
        optimizer = tf.keras.optimizers.Adam()
    trainer = Trainer(classifier_updates(model, optimizer), plan, batch_size=8, strategy=strategy, progress=False)
    assert trainer.fit(np.zeros((16, 8), "float32"), np.zeros(16, "int64"), max_steps=1).steps == 1


def test_port_in_use_is_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ClusterConfigError, match=f"127.0.0.1:{port}.*cannot be bound.*free port"):
            check_port_free(f"127.0.0.1:{port}")


def run_cli(extra_env, *args, timeout=120):
    """The example under a cluster configuration; ``timeout`` only keeps a hanging run from hanging the suite."""
    cmd = [sys.executable, "-m", "amp_backends.examples.mnist", "--synthetic", "--no-progress", "--max-steps", "2",
           *args]
    return run_python(cmd[1:], timeout=timeout, cwd=NEUTRAL_CWD, env=env(**extra_env))


def test_malformed_tf_config_fails_fast_and_clearly(tmp_path):
    broken = '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": '
    out = run_cli({"TF_CONFIG": broken, **tensorflow_blocked(tmp_path.parent)}, "--logdir", str(tmp_path))
    assert out.returncode == 2 and "mnist: error: TF_CONFIG must be JSON" in out.stderr
    assert "Traceback" not in out.stderr


def test_busy_port_fails_fast_and_clearly(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        ports = [s.getsockname()[1], free_ports(1)[0]]
        out = run_cli({"TF_CONFIG": tf_config(ports, 0), **tensorflow_blocked(tmp_path.parent)}, "--logdir",
                      str(tmp_path))
    assert out.returncode == 2 and "cannot be bound" in out.stderr and "Traceback" not in out.stderr
    assert "Loss" not in out.stderr + out.stdout  # refused before TensorFlow formed a cluster or trained


def test_missing_peer_times_out_with_the_documented_message(tmp_path):
    ports = free_ports(2)
    out = run_cli({"TF_CONFIG": tf_config(ports, 0)}, "--logdir", str(tmp_path), "--cluster-timeout", "2")
    # it stopped by itself (the watchdog's kill), saying why, without training or writing a checkpoint
    assert out.returncode in (-9, 137), (out.returncode, out.stderr[-1500:])
    assert f"the cluster did not form within 2 s (no answer from 127.0.0.1:{ports[1]})" in out.stderr
    assert "Loss" not in out.stderr + out.stdout and not list(tmp_path.rglob("ckpt-*"))


# --------------------------------------------------------------------------- MirroredStrategy
@pytest.mark.intel
def test_mirrored_two_replicas_skip_together():
    out = run_python([SCRIPTS / "mirrored_run.py"], timeout=300, cwd=NEUTRAL_CWD, env=env())
    assert out.returncode == 0, out.stderr[-2000:]
    xla, d, validation = (json.loads(line) for line in out.stdout.strip().splitlines()[-3:])
    # XLA with replicas on one CPU: no per-replica compilation (it cannot reach replica 1's variables), training runs;
    # a batch with inf in one replica is skipped everywhere and leaves no trace in BatchNormalization's statistics
    assert xla == {"xla_replica_jit": False, "xla_steps": 2, "bn_skipped": 2, "bn_finite": True}
    assert d["replicas"] == 2
    # only replica 1 saw inf, yet the step was skipped everywhere and the one shared scale halved once
    assert d["skipped_after_first"] == 1 and d["scale_after_first"] == 2.0**14 and d["unchanged_after_poisoned_step"]
    assert d["steps"] == 4 and d["skipped"] == 1 and d["optimizer_iterations"] == 3
    assert d["finite"] and d["changed_after"]
    # an Embedding's gradient reaches the optimizer in each replica as IndexedSlices, never densified
    assert d["sparse_gradients"] and d["only_looked_up_rows_changed"]
    # validation batches split across the replicas (the last gives replica 1 few rows or none), metrics and loss
    # reduced: the numbers of one device, from arrays and from a dataset, in the epoch's row and from evaluate()
    for key in ("arrays", "dataset", "last_epoch"):
        assert validation[key] == pytest.approx(validation["one_device"], abs=1e-5), key
    assert 0.2 < validation["train_accuracy"] <= 1  # the training batches counted in both replicas


# --------------------------------------------------------------------------- MultiWorkerMirroredStrategy
# (two workers training one run, only the chief logging and keeping checkpoints: test_launchers.tf_config_losses)
@pytest.mark.slow
def test_plan_mismatch_between_workers_is_reported(tmp_path):
    ports = free_ports(2)
    procs = [worker(ports, 0, tmp_path, "--batch_size", "16", "--max-steps", "1"),
             worker(ports, 1, tmp_path, "--batch_size", "16", "--max-steps", "1",
                    extra_env={"AMP_LOSS_SCALE": "fixed:8"})]
    outs = finish(procs)
    for out in outs:
        assert "The workers' plans differ" in out and "same overrides" in out
    assert "loss_scale=fixed:8" in outs[1] and "loss_scale=none" in outs[0]


@pytest.mark.slow
def test_killed_worker_then_resume_from_the_last_checkpoint(tmp_path):
    ports = free_ports(2)
    args = ["--batch_size", "16", "--checkpoint-every", "5", "--seed", "4"]
    procs = [worker(ports, i, tmp_path, *args, "--max-steps", "1000") for i in (0, 1)]
    last = -1
    deadline = time.time() + 180
    for line in procs[0].stdout:
        m = STEP.search(line)
        if m and int(m.group(2)) >= 13:
            last = int(m.group(2))
            break
        assert time.time() < deadline
    procs[1].send_signal(signal.SIGKILL)
    rest = procs[0].communicate(timeout=120)[0]  # (the timeout only keeps a hang from hanging the suite)
    # the survivor stopped by itself with the library's error (exit 4), naming the fix, without a traceback
    assert procs[0].returncode == 4, rest[-2000:]
    assert "a collective with the other workers failed" in rest and "--resume" in rest and "Traceback" not in rest
    procs[1].wait()
    import tensorflow as tf

    saved = int(tf.train.latest_checkpoint(str(tmp_path / "version_0" / "checkpoints")).rsplit("-", 1)[1])
    logged = max([last] + [int(m.group(2)) for m in STEP.finditer(rest)])
    assert saved % 5 == 0 and logged + 1 - saved <= 5  # steps lost: at most the checkpoint interval
    ports = free_ports(2)
    procs = [worker(ports, i, tmp_path, *args, "--max-steps", str(saved + 3), "--resume") for i in (0, 1)]
    chief, _ = finish(procs)
    assert [p.returncode for p in procs] == [0, 0], chief[-2000:]
    assert re.search(rf"Resumed from .*ckpt-{saved}: global step {saved}, epoch 0, step in epoch {saved}, loss scales "
                     rf"model=1, optimizer iterations model\[0\]={saved}", chief), chief[-3000:]
    assert [int(m.group(2)) for m in STEP.finditer(chief)] == [saved, saved + 1, saved + 2]


# --------------------------------------------------------------------------- torn checkpoints
@pytest.mark.slow
def test_kill_during_checkpoint_writes_never_corrupts_the_latest(tmp_path):
    import tensorflow as tf

    from amp_backends.models import mnist_cnn

    rng = random.Random(7)
    for _ in range(3):
        proc = popen_python([SCRIPTS / "ckpt_saver.py", tmp_path], stdout=subprocess.PIPE, text=True, cwd=NEUTRAL_CWD,
                            env=env())
        assert proc.stdout.readline().startswith("saved")
        time.sleep(rng.uniform(0.05, 0.6))  # somewhere inside a later save
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        latest = tf.train.latest_checkpoint(str(tmp_path))
        model, step = mnist_cnn(), tf.Variable(0, dtype=tf.int64)
        tf.train.Checkpoint(model=model, step=step).restore(latest).assert_existing_objects_matched()
        n = int(step.numpy())
        assert latest.endswith(f"ckpt-{n}") and n >= 1
        assert all(np.all(v.numpy() == n) for v in model.trainable_variables)  # complete, not torn


# --------------------------------------------------------------------------- preemption: SIGTERM to one worker
@pytest.mark.slow
def test_sigterm_to_the_chief_or_another_worker_saves_all_at_one_step_and_resume_repeats_nothing(tmp_path):
    """The Trainer under MultiWorkerMirroredStrategy: the chief gets a SIGTERM, the resumed run's other worker gets
    one, a third run finishes. Each stop is one step on every worker, saved; the three runs' per-step losses, put
    together, are the uninterrupted run's: no step twice, none missing (see preempt_run.py)."""
    ports = free_ports(2)
    procs = [popen_python([SCRIPTS / "preempt_run.py", tmp_path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, cwd=NEUTRAL_CWD, env=env(TF_CONFIG=tf_config(ports, i))) for i in (0, 1)]
    outs = finish(procs)
    assert [p.returncode for p in procs] == [0, 0], (outs[0][-3000:], outs[1][-3000:])
    chief, other = (json.loads(out.strip().splitlines()[-1]) for out in outs)
    checkpoints = tmp_path / "run"
    for i, who, stop in ((0, "worker-0", 9), (1, "worker-1", 18)):  # run i: (exit code, step, path, message)
        for w in (chief, other):
            code, step, path, message = w["runs"][i]["ended"]
            # every worker stopped after the same call (3 steps a call: the one where the signal came), saved there
            assert (code, step, path) == (143, stop, str(checkpoints / f"ckpt-{stop}")), message
            assert message == (f"Interrupted (SIGTERM to {who}) at step {stop}: checkpoint saved to {path} (every "
                               "worker stopped at this step). Continue with --resume on every worker.")
    assert chief["runs"][2]["ended"] is None
    expected = [tuple(s) for s in chief["whole"]["losses"]]
    assert [s for s, _ in expected] == list(range(24))
    for w in (chief, other):
        pieces = [tuple(s) for run in w["runs"] for s in run["losses"]]
        assert [s for s, _ in pieces] == list(range(24))  # none twice, none missing
        assert pieces == expected  # the same losses, exactly


STOPPED = re.compile(r"mnist: stopped: Interrupted \(SIGTERM to worker-1\) at step (\d+): checkpoint saved to (\S+) "
                     r"\(every worker stopped at this step\)\. Continue with --resume on every worker\.")


@pytest.mark.slow
def test_sigterm_to_a_worker_of_the_command_ends_both_with_143_after_saving_the_step_they_stopped_at(tmp_path):
    """The command line, the signal from outside at any moment: both workers stop after the same call, the chief has
    logged every step before it and the checkpoint holds it (resuming is counted step by step above)."""
    ports = free_ports(2)
    procs = [worker(ports, i, tmp_path, "--batch_size", "16", "--steps-per-call", "3", "--checkpoint-every", "5",
                    "--max-steps", "60") for i in (0, 1)]
    lines, deadline = [], time.time() + 240
    for line in procs[0].stdout:  # to its end: the chief ends by itself once the other worker has its SIGTERM
        lines.append(line)
        m = STEP.search(line)
        if m and int(m.group(2)) == 4:
            procs[1].send_signal(signal.SIGTERM)  # a worker, not the chief
        assert time.time() < deadline, "the run did not end in time"
    outs = ["".join(lines), finish(procs[1:], timeout=120)[0]]
    procs[0].wait(timeout=60)
    assert [p.returncode for p in procs] == [143, 143], (outs[0][-2000:], outs[1][-2000:])
    stops = [STOPPED.search(out) for out in outs]
    assert all(stops) and stops[0].groups() == stops[1].groups(), (outs[0][-2000:], outs[1][-2000:])
    assert "Traceback" not in outs[0] + outs[1]
    step, path = int(stops[0].group(1)), stops[0].group(2)
    assert step % 3 == 0 and step < 60, step  # at a call boundary, before the end
    assert [int(m.group(2)) for m in STEP.finditer(outs[0])] == list(range(step))
    import tensorflow as tf

    assert path == str(tmp_path / "version_0" / "checkpoints" / f"ckpt-{step}")
    assert tf.train.latest_checkpoint(str(tmp_path / "version_0" / "checkpoints")) == path


def test_an_unknown_strategy_is_refused_with_the_fix():
    """``--distribute foo`` said the strategies and what was received, but no fix (every other error gives one)."""
    from amp_backends.errors import AmpConfigError
    from amp_backends.training.distribute import check_cluster

    with pytest.raises(AmpConfigError, match=r"--distribute must be one of auto, none, mirrored, multiworker\. "
                                             r"Received: 'foo'\. Fix: --distribute auto \("):
        check_cluster("foo", {})
