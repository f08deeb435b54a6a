"""The trainer, its loss scaling, data loading, checkpoints, logs and command line, with real TensorFlow."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import NEUTRAL_CWD

pytestmark = pytest.mark.tensorflow
tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
from amp_backends.data import DataUnavailableError, digits_as_mnist, load_mnist, read_mnist_npz, synthetic_mnist  # noqa: E402
from amp_backends.models import gan_discriminator, gan_generator, mnist_cnn  # noqa: E402
from amp_backends.request import LossScale  # noqa: E402
from amp_backends.errors import NonFiniteError  # noqa: E402
from amp_backends.training import (LossScaler, ThroughputLogger, Trainer, Update, classifier_updates,  # noqa: E402
                                   gan_updates, mnist_batch_fn, parse_profile_steps)

KERAS3 = int(str(getattr(tf.keras, "__version__", None) or "2").split(".")[0]) >= 3


def plan(**kw):
    return amp_backends.auto_configure(verbose=False, **kw)


# --------------------------------------------------------------------------- loss scaling
def test_dynamic_loss_scale_state_machine():
    s = LossScaler(LossScale.dynamic(initial=1024, growth_interval=3))
    assert float(s.scale(tf.constant(2.0))) == 2048.0
    assert [float(g) for g in s.unscale([tf.constant(2048.0)])] == [2.0]
    assert bool(s.all_finite([tf.constant([1.0, 2.0])])) and not bool(s.all_finite([tf.constant([1.0, np.inf])]))
    s.update(tf.constant(False))
    assert s.current == 512 and int(s.skipped.numpy()) == 1 and int(s.consecutive.numpy()) == 1
    for _ in range(2):
        s.update(tf.constant(True))
    assert s.current == 512 and int(s.good_steps.numpy()) == 2
    s.update(tf.constant(True))
    assert s.current == 1024 and int(s.good_steps.numpy()) == 0 and int(s.consecutive.numpy()) == 0
    for _ in range(20):
        s.update(tf.constant(False))
    assert s.current == 1.0  # never below min_scale


def test_fixed_and_none_loss_scale():
    f = LossScaler(LossScale.fixed(128))
    f.update(tf.constant(False))
    f.update(tf.constant(False))
    assert f.current == 128 and int(f.skipped.numpy()) == 2 and int(f.consecutive.numpy()) == 2
    n = LossScaler(LossScale.none())
    assert float(n.scale(tf.constant(3.0))) == 3.0 and n.current == 1.0


# --------------------------------------------------------------------------- models
def test_models_match_the_originals_and_output_float32():
    p = plan(policy="fp16", force=True)
    assert p.policy == "mixed_float16"
    m, g, d = mnist_cnn(), gan_generator(), gan_discriminator()
    assert (m.count_params(), g.count_params(), d.count_params()) == (1_199_882, 477_713, 245_169)
    assert m.layers[0].compute_dtype == "float16"
    assert m(tf.zeros((2, 28, 28, 1))).dtype == tf.float32
    assert d(g(tf.zeros((2, 100)))).dtype == tf.float32


# --------------------------------------------------------------------------- data
def write_npz(path, n=64, **override):
    arrays = dict(x_train=np.zeros((n, 28, 28), np.uint8), y_train=np.arange(n) % 10,
                  x_test=np.zeros((8, 28, 28), np.uint8), y_test=np.arange(8))
    arrays.update(override)
    np.savez(path, **arrays)
    return path


def test_mnist_loading_from_file_and_keras_cache(tmp_path, monkeypatch):
    (x, y), (xt, yt) = read_mnist_npz(write_npz(tmp_path / "m.npz"))
    assert x.shape == (64, 28, 28) and x.dtype == np.uint8 and y.dtype == np.int64 and xt.shape == (8, 28, 28)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "kh"))
    (tmp_path / "kh" / "datasets").mkdir(parents=True)
    write_npz(tmp_path / "kh" / "datasets" / "mnist.npz", n=32)
    assert load_mnist()[0][0].shape == (32, 28, 28)


def test_mnist_errors_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(DataUnavailableError, match="does not exist.*--synthetic"):
        load_mnist(tmp_path / "missing.npz")
    np.savez(tmp_path / "bad.npz", images=np.zeros(3))
    with pytest.raises(DataUnavailableError, match="expected arrays x_train, y_train, x_test, y_test"):
        load_mnist(tmp_path / "bad.npz")
    with pytest.raises(DataUnavailableError, match=r"shape \(N, 28, 28\)"):
        load_mnist(write_npz(tmp_path / "shape.npz", x_train=np.zeros((64, 32, 32), np.uint8)))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "empty"))

    def offline():
        raise OSError("Temporary failure in name resolution")

    monkeypatch.setattr(tf.keras.datasets.mnist, "load_data", offline)
    with pytest.raises(DataUnavailableError, match="download failed.*--data /path/to/mnist.npz.*--synthetic"):
        load_mnist()


# --------------------------------------------------------------------------- the trainer
def small_classifier(p, poison: "tf.Variable | None" = None, **kw):
    """The MNIST CNN in a trainer with batch 16; with ``poison``, its loss is inf while the flag is set."""
    m = mnist_cnn()
    opt = tf.keras.optimizers.Adam(1e-3)
    updates = classifier_updates(m, opt)
    if poison is not None:
        updates = [poisoned(u, poison) for u in updates]
    return m, opt, Trainer(updates, p, batch_size=16, checkpoint_objects={"model": m, "optimizer": opt},
                           batch_fn=mnist_batch_fn, progress=False, **kw)


def poisoned(update: Update, flag: tf.Variable) -> Update:
    """Multiply the loss by inf while ``flag`` is set: a non-finite gradient on demand."""
    def loss_fn(batch):
        loss = update.loss_fn(batch)
        return tf.cond(flag, lambda: loss * np.inf, lambda: loss)
    return Update(update.name, loss_fn, update.groups)


def test_nonfinite_steps_are_skipped_and_dynamic_recovers(tmp_path):
    p = plan(loss_scale="dynamic")
    (x, y), _ = synthetic_mnist(64, 8)
    flag = tf.Variable(True)
    m, _, t = small_classifier(p, poison=flag)
    before = [v.numpy().copy() for v in m.trainable_variables]
    r = t.fit(x, y, epochs=1, max_steps=2)
    assert r.skipped == {"model": 2} and r.loss_scales == {"model": 2.0**13}
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, m.trainable_variables))  # nothing applied
    flag.assign(False)
    r = t.fit(x, y, epochs=1)
    assert r.steps == 4 and r.skipped == {"model": 2}
    assert not all(np.array_equal(a, v.numpy()) for a, v in zip(before, m.trainable_variables))


def test_fixed_scale_stops_with_the_remedy_and_saves_finite_state(tmp_path):
    p = plan(loss_scale="fixed:1024")
    (x, y), _ = synthetic_mnist(128, 8)
    _, _, t = small_classifier(p, poison=tf.Variable(True), checkpoint_dir=str(tmp_path / "ck"),
                               max_consecutive_nonfinite=3)
    with pytest.raises(NonFiniteError, match=r"3 consecutive steps.*fixed loss scaling, scale 1024.*--loss-scale "
                                             r"fixed:16.*dynamic"):
        t.fit(x, y, epochs=1)
    assert t.store.latest.endswith("ckpt-3")


def test_nonfinite_weights_are_never_saved(tmp_path):
    p = plan()
    m, opt, t = small_classifier(p, checkpoint_dir=str(tmp_path / "ck"))
    assert t.save().endswith("ckpt-0")
    m.trainable_variables[0].assign(tf.fill(m.trainable_variables[0].shape, np.nan))
    with pytest.raises(NonFiniteError, match="NaN or Inf.*latest good checkpoint is .*ckpt-0"):
        t.save()
    assert t.store.latest.endswith("ckpt-0")


def test_several_variable_groups_and_optimizers_in_one_update():
    """As SparseOperationKit does: embedding and dense variables from one scaled loss, two optimizers."""
    p = plan(loss_scale="dynamic")
    emb = tf.keras.layers.Embedding(50, 8)
    dense = tf.keras.layers.Dense(1)
    emb.build((None,))
    dense.build((None, 8))
    o1, o2 = tf.keras.optimizers.SGD(0.1), tf.keras.optimizers.Adam(0.01)

    def loss_fn(batch):
        ids, target = batch
        return tf.reduce_mean((tf.cast(dense(emb(ids))[:, 0], tf.float32) - target) ** 2)

    upd = Update("sok", loss_fn, [(emb.trainable_variables, o1), (dense.trainable_variables, o2)])
    ids = np.arange(64) % 50
    target = np.ones(64, np.float32)
    t = Trainer([upd], p, batch_size=16, checkpoint_objects={"emb": emb, "dense": dense}, progress=False)
    e0, d0 = emb.embeddings.numpy().copy(), dense.kernel.numpy().copy()
    r = t.fit(ids, target, epochs=3)
    assert r.skipped == {"sok": 0} and r.steps == 12
    assert not np.array_equal(e0, emb.embeddings.numpy()) and not np.array_equal(d0, dense.kernel.numpy())
    assert int(o1.iterations.numpy()) == 12 and int(o2.iterations.numpy()) == 12


def test_gan_trains_with_two_optimizers_and_two_scales():
    p = plan(loss_scale="dynamic")
    (x, _), _ = synthetic_mnist(64, 8)
    g, d = gan_generator(), gan_discriminator()
    go, do = tf.keras.optimizers.Adam(1e-3), tf.keras.optimizers.RMSprop(1e-4)
    t = Trainer(gan_updates(g, d, go, do), p, batch_size=16, images_per_step=32,
                checkpoint_objects={"g": g, "d": d}, batch_fn=mnist_batch_fn, progress=False, steps_per_call=2)
    r = t.fit(x, None, epochs=1)
    assert set(r.last_losses) == {"generator", "discriminator"} and all(np.isfinite(list(r.last_losses.values())))
    assert set(r.loss_scales) == {"generator", "discriminator"}


@pytest.mark.parametrize("text,expected", [("20:30", (20, 30)), ("", None), (None, None)])
def test_profile_steps(text, expected):
    assert parse_profile_steps(text) == expected


@pytest.mark.parametrize("text", ["30:20", "a:b", "5"])
def test_bad_profile_steps(text):
    with pytest.raises(ValueError, match="START:STOP"):
        parse_profile_steps(text)


def test_keras_fit_callback_logs_the_tutorial_line_and_says_the_loss_is_the_epoch_mean(caplog):
    caplog.set_level("INFO", logger="amp_backends.train")
    m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    m.compile("sgd", "mse")
    cb = ThroughputLogger(batch_size=8)
    m.fit(np.ones((32, 4)), np.ones((32, 1)), batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    lines = [r.message for r in caplog.records if r.name == "amp_backends.train"]
    assert re.match(r"\(0, 0\), Loss \(epoch mean\): \d+\.\d{5}, step_time: \d+\.\d{5}, throughput: .* img/s\.", lines[0])
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


# --------------------------------------------------------------------------- fidelity
@pytest.mark.slow
def test_fp16_reaches_the_float32_accuracy_on_real_digits():
    """The MNIST CNN on scikit-learn's real handwritten digits: float32 vs forced mixed_float16 + dynamic scaling."""
    if "intel_extension_for_tensorflow" in sys.modules or _itex_loaded():
        pytest.skip("ITEX's CPU float16 kernels are ~10x slower than TF's: fidelity runs in the TF 2.21 session")
    from amp_backends.examples.mnist import evaluate

    (x, y), (xt, yt) = digits_as_mnist()
    accs = {}
    for policy in ("float32", "mixed_float16"):
        p = plan(policy=policy, force=True, loss_scale="dynamic" if policy == "mixed_float16" else None)
        tf.keras.utils.set_random_seed(1)
        m = mnist_cnn()
        opt = tf.keras.optimizers.Adam(1e-3)
        t = Trainer(classifier_updates(m, opt), p, batch_size=64, checkpoint_objects={"m": m}, batch_fn=mnist_batch_fn,
                    progress=False, steps_per_call=4, seed=1)
        t.fit(x, y, epochs=6)
        accs[policy] = evaluate(m, xt, yt)
    print(f"digits test accuracy: {accs}")
    assert accs["float32"] > 0.9, accs
    assert abs(accs["float32"] - accs["mixed_float16"]) <= 0.01, accs


@pytest.mark.slow
def test_gan_losses_stay_finite_under_fp16():
    if _itex_loaded():
        pytest.skip("ITEX's CPU float16 kernels are ~10x slower than TF's: this runs in the TF 2.21 session")
    p = plan(policy="fp16", force=True)
    (x, _), _ = digits_as_mnist()
    g, d = gan_generator(), gan_discriminator()
    go, do = tf.keras.optimizers.Adam(1e-3), tf.keras.optimizers.RMSprop(1e-4)
    t = Trainer(gan_updates(g, d, go, do), p, batch_size=64, images_per_step=128, checkpoint_objects={"g": g},
                batch_fn=mnist_batch_fn, progress=False, steps_per_call=4)
    r = t.fit(x, None, epochs=1, max_steps=12)
    assert all(np.isfinite(h["generator"]) and np.isfinite(h["discriminator"]) for h in r.history)
    assert all(np.isfinite(v.numpy()).all() for v in g.trainable_variables + d.trainable_variables)


def _itex_loaded() -> bool:
    from amp_backends.backends.intel import itex_status

    return itex_status().compatible


# --------------------------------------------------------------------------- the command line, end to end
def example(*args, logdir, timeout=300, popen=False):
    cmd = [sys.executable, "-m", "amp_backends.examples.mnist", "--logdir", str(logdir), "--no-progress", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMP_")} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    if popen:  # SIGINT as in a terminal, even where the tests run as a background job (which ignores it)
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=NEUTRAL_CWD,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=NEUTRAL_CWD)


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
    assert f"Resumed from {tmp_path / 'version_0' / 'checkpoints' / f'ckpt-{saved}'}: global step {saved}" in out.stderr + out.stdout
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
    m = re.search(r"mnist: stopped: Interrupted \(SIGINT\) at step (\d+): checkpoint saved to (\S+)\. Continue with --resume",
                  rest)
    assert m and "Traceback" not in rest, rest[-2000:]
    step, path = int(m.group(1)), m.group(2)
    assert path.endswith(f"ckpt-{step}") and tf.train.latest_checkpoint(str(tmp_path / "version_0" / "checkpoints")) == path
    out = example(*args[:-4], "--max-steps", str(step + 2), "--seed", "3", "--resume", logdir=tmp_path)
    assert out.returncode == 0 and f"global step {step}" in out.stdout + out.stderr, out.stderr[-2000:]
    assert [int(m.group(2)) for m in STEP_LINE.finditer(out.stderr + out.stdout)] == [step, step + 1]


@pytest.mark.slow
def test_the_same_command_gives_the_same_losses_and_a_new_run_directory(tmp_path):
    """Same --seed, same losses on the CPU; the second run gets version_1 and leaves version_0 as it was."""
    args = ["--synthetic", "--batch_size", "32", "--max-steps", "6", "--seed", "11"]
    first = example(*args, logdir=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    files = {p: p.read_bytes() for p in (tmp_path / "version_0" / "checkpoints").iterdir()}
    second = example(*args, logdir=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    losses = [[m.group(3) for m in STEP_LINE.finditer(o.stderr + o.stdout)] for o in (first, second)]
    assert len(losses[0]) == 6 and losses[0] == losses[1]
    assert f"Run directory: {tmp_path / 'version_1'} (new run" in second.stdout
    assert tf.train.latest_checkpoint(str(tmp_path / "version_1" / "checkpoints")).endswith("ckpt-6")
    assert all(p.read_bytes() == b for p, b in files.items())


def test_a_logdir_below_a_file_is_a_clear_error_before_training(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    out = example("--synthetic", "--max-steps", "1", logdir=tmp_path / "notes.txt" / "runs")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "is a file, not a directory" in out.stderr and "Traceback" not in out.stderr and "Loss" not in out.stderr


@pytest.mark.slow
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
