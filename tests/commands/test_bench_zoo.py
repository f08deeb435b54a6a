"""The model zoo: its models build cheaply under any policy, and the zoo benchmark runs end to end (tiny sizes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from amp_backends import zoo
from conftest import NEUTRAL_CWD, TESTS
from schema_check import assert_valid
from warm_python import run_python


def _run(args, timeout=600, warm_workers=False):
    """``python -m amp_backends.bench ARGS``; with ``warm_workers``, its workers (one per configuration, each a
    ``python -m ...zoo_worker``) are forked from an interpreter that has imported TensorFlow
    (`warm_python.subprocess_module`): the command and its workers run as they do, spared each worker's import."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if not warm_workers:
        return subprocess.run([sys.executable, "-m", "amp_backends.bench", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=NEUTRAL_CWD, env=env)
    code = (f"import runpy, sys; sys.path.insert(0, {str(TESTS)!r}); import warm_python; "
            "from amp_backends.commands.bench import supervisor; "
            "supervisor.subprocess = warm_python.subprocess_module(); "
            "del sys.path[0]; runpy.run_module('amp_backends.bench', run_name='__main__', alter_sys=True)")
    return run_python(["-c", code, *args], timeout=timeout, cwd=NEUTRAL_CWD, env=env)


def test_importing_the_zoo_imports_no_framework():
    code = ("import sys, amp_backends.zoo as z; print(len(z.ZOO), sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('tensorflow', 'keras', 'keras_hub')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(" ", 1)[1].strip() == "[]" and int(out.stdout.split()[0]) >= 9


@pytest.mark.intel
def test_a_model_needing_keras_hub_says_why_it_cannot_be_built(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "keras_hub" else real(name, *a))
    assert "keras_hub is not installed" in zoo.unavailable(zoo.get("bert"))
    assert zoo.unavailable(zoo.get("mnist_cnn")) is None
    with pytest.raises(KeyError, match="Known: mnist_cnn"):
        zoo.get("resnet")


@pytest.mark.tensorflow
@pytest.mark.intel
@pytest.mark.parametrize("name", [n for n in zoo.ZOO if n not in ("resnet50", "efficientnet")])
def test_each_zoo_model_builds_and_gives_a_finite_float32_loss(name, zoo_models):
    import numpy as np
    import tensorflow as tf

    entry = zoo_models.entry(name)
    # built under mixed_float16, which runs on every CPU (bf16 aborts ITEX on CPUs without bf16); inference only:
    # the session's shared build (the reference models' precision check under an H100 plan reads the same)
    model = zoo_models.shared(name, "mixed_float16")
    x, y = entry.data(4, 0)
    assert len(tf.nest.flatten(x)[0]) == 4
    loss = entry.evaluate(model, x, y)
    assert np.isfinite(loss), loss
    if not entry.gan:  # outputs in float32 under a mixed policy
        assert all(t.dtype == tf.float32 for t in tf.nest.flatten(model(x, training=False)))


def test_zoo_bad_input_is_refused_before_any_work(tmp_path):
    out = _run(["--zoo", "--models", "resnet", "--out", str(tmp_path)], timeout=120)
    assert out.returncode == 2 and "--zoo --models takes mnist_cnn" in out.stderr
    out = _run(["--zoo", "--configs", "fp8", "--out", str(tmp_path / "zoo")], timeout=120)
    assert out.returncode == 2 and "unknown zoo configuration" in out.stderr and "baseline" in out.stderr
    assert "Fix: pass some of those to --configs" in out.stderr  # (there was no fix)
    assert not (tmp_path / "zoo").exists()  # (an empty results folder was left behind)
    out = _run(["--zoo", "--gpu-suite", "--out", str(tmp_path)], timeout=120)
    assert out.returncode == 2 and "benchmarks/gpu_suite.py" in out.stderr


def tf_lists_a_gpu() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


@pytest.mark.tensorflow
@pytest.mark.slow
def test_zoo_smoke(tmp_path):
    """One model, the baseline, one manual configuration, the peers, fit and the trainer under the plan: every figure
    lands."""
    out = _run(["--zoo", "--models", "mnist_cnn", "--configs", "baseline,fp32,auto,peers", "--reps", "2",
                "--steps", "2", "--batch", "8", "--out", str(tmp_path / "rel" / ".." / "zoo")], warm_workers=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "zoo" / "zoo.json").read_text())
    assert_valid("zoo", report)
    assert report["environment"]["tensorflow"] and report["command"].endswith("zoo") and report["date"]
    assert report["peak_gflops"]["float32"] > 0
    (m,) = report["models"]
    assert m["flops_per_sample"] > 1e6 and m["best_manual"] in {"fp32"} | {c["name"] for c in
                                                                         report["settings"]["configs"]
                                                                         if c["kind"] == "peer"}
    peers = {c["name"] for c in report["settings"]["configs"] if c["kind"] == "peer"}
    assert peers & {"fp32 oneDNN-off", "fp32 oneDNN-on"}  # every x86 CPU: oneDNN the other way round
    assert set(m["configs"]) == {"float32 fit (defaults)", "float32 fit (defaults), seed 1", "fp32", "auto plan, fit",
                                 "auto plan, trainer"} | peers
    policies = {c["name"]: c["policy"] for c in report["settings"]["configs"]}
    assert policies["fp32"] == "float32" and policies["auto plan, trainer"] == report["plan_policy"]
    for name, c in m["configs"].items():
        assert c["policy"] == policies[name], (name, c)  # each worker's model was built under its own policy
        assert c["samples_per_s"]["median"] > 0 and len(c["samples_per_s"]["reps"]) == 2, (name, c)
        assert c["loss"] > 0 and c["x_baseline"] > 0 and c["share_of_peak"] > 0, (name, c)
        assert c["predict_samples_per_s"]["median"] > 0 and len(c["predict_samples_per_s"]["reps"]) == 2, (name, c)
        if not tf_lists_a_gpu():  # TensorFlow's TF32 flag is on by default, but no CPU has TF32 to use
            assert c["tf32"] is False, (name, c)
    assert m["configs"]["float32 fit (defaults)"]["loss_vs_baseline"] == 0
    # the float32 run-to-run spread: the baseline from other initial weights, and each loss judged against it
    spread = m["float32_loss_spread"]
    seed1 = m["configs"]["float32 fit (defaults), seed 1"]
    assert spread == pytest.approx(abs(seed1["loss_vs_baseline"])) and spread > 0
    assert m["configs"]["fp32"]["loss_within_spread"] is True  # the same float32 steps as the baseline
    for c in m["configs"].values():
        assert c["loss_within_spread"] == (abs(c["loss_vs_baseline"]) <= spread)
    md = (tmp_path / "zoo" / "zoo.md").read_text()
    assert "| mnist_cnn |" in md and "x best manual" in out.stdout
    assert re.search(r"Written to \S+zoo: zoo.json, zoo.md", out.stdout), out.stdout[-1000:]
    assert "float32 run-to-run spread of the training loss" in md and "loss parity" in md and "predict/s" in md


@pytest.mark.tensorflow
@pytest.mark.intel
def test_the_gan_trains_under_keras_fit_and_logs_both_losses():
    import tensorflow as tf

    entry = zoo.get("gan")
    x, y = entry.data(16, 0)
    assert y is None
    model = entry.build()
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3))
    before = [w.numpy().copy() for w in model.discriminator.trainable_weights[:1]]
    logs = model.fit(x, batch_size=8, epochs=1, verbose=0).history
    assert logs["d_loss"][0] > 0 and logs["g_loss"][0] > 0, logs
    assert not (model.discriminator.trainable_weights[0].numpy() == before[0]).all()


def test_a_configuration_not_asked_for_is_not_said_to_have_failed():
    """``--configs auto``: the float32 baseline, not run, was "failed" in zoo.md and on the console."""
    from amp_backends.commands.bench.output import zoo_rows

    ran = {"samples_per_s": {"median": 336.0}}
    report = {"models": [{"model": "mnist_cnn", "batch": 32, "best_manual": None,
                          "configs": {"auto plan, fit": ran, "auto plan, trainer": {"error": "boom"}}}]}
    (row,) = zoo_rows(report)
    assert row[2:6] == ("-", "-", "336", "failed"), row


def test_a_peak_that_rounds_to_zero_or_failed_gives_no_share_instead_of_stopping_the_report():
    """A matmul peak of 0.0 (a machine so slow that it rounds to nothing) or an error string: no share of the peak,
    the rest of the summary as usual (it used to divide by zero after the whole run, leaving no zoo.md)."""
    from amp_backends.commands.bench.zoo_suite import BASELINE, summarize

    for peaks in ({"float32": 0.0}, {"error": "the worker failed"}, {"float32": 10.0}):
        cfg = {"kind": "baseline", "compute_dtype": "float32", "samples_per_s": {"median": 100.0}, "loss": 1.0}
        report = {"peak_gflops": peaks, "models": [{"flops_per_sample": 1e6, "configs": {BASELINE.name: cfg}}]}
        summarize(report)
        (c,) = report["models"][0]["configs"].values()
        assert c["x_baseline"] == 1.0 and c["loss_vs_baseline"] == 0
        assert c["share_of_peak"] == (pytest.approx(0.01) if peaks.get("float32") else None), peaks


@pytest.mark.parametrize("gpu, preset, expected", [(True, None, "true"), (True, "false", "false"),
                                                   (False, None, None)])
def test_zoo_workers_sharing_a_gpu_grow_their_memory(tmp_path, monkeypatch, gpu, preset, expected):
    """The zoo's workers run side by side: on a GPU each allocates memory as it needs it (TensorFlow's default gave
    the first to allocate the whole card, and on an H200 the others failed with out of memory); a value the user
    set stays, and a CPU run is left as it was."""
    from amp_backends.commands.bench import zoo_suite

    seen = {}
    monkeypatch.setattr(zoo_suite, "JsonWorker", lambda cmd, log, name, env: seen.setdefault(name, env))
    if preset is None:
        monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
    else:
        monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", preset)
    configs = [zoo_suite.BASELINE, zoo_suite.BASELINE_SEED1]
    runner = zoo_suite.ZooRun(configs, 1, 1, None, tmp_path, 10.0, 8, gpu)
    for cfg in configs:
        runner.spawn(cfg)
    runner.log.close()
    assert [seen[c.name].get("TF_FORCE_GPU_ALLOW_GROWTH") for c in configs] == [expected, expected]


@pytest.mark.parametrize("gpu", [True, False])
def test_the_float32_peak_is_measured_with_tf32_off_and_tf32s_own_on_a_gpu(tmp_path, gpu):
    """A run without a manual float32 configuration measured its float32 peak in the baseline's worker, where
    TensorFlow's default runs float32 matmuls in TF32: on an H200 it reported 376 TFLOP/s as float32 (50 with TF32
    off, in a run that had one). The float32 peak is now asked with TF32 off, and on a GPU TF32's beside it."""
    from amp_backends.commands.bench import zoo_suite

    configs = [zoo_suite.BASELINE, zoo_suite.BASELINE_SEED1, zoo_suite.ZooConfig("auto plan, fit", "auto_fit")]
    runner = zoo_suite.ZooRun(configs, 1, 1, None, tmp_path, 10.0, 8, gpu)
    runner.log.close()
    asked = []

    def ask(cfg, **req):
        asked.append((cfg.name, req["dtypes"], req.get("tf32", False)))
        return {"ok": True, "float32": 400.0 if req.get("tf32") else 50.0, "float16": 800.0}

    runner.ask = ask
    peaks = runner.peaks(["float16", "float32"])
    assert asked[0] == ("float32 fit (defaults)", ["float16", "float32"], False)
    if gpu:
        assert asked[1:] == [("float32 fit (defaults)", ["float32"], True)]
        assert peaks == {"float32": 50.0, "float16": 800.0, "tf32": 400.0}
    else:
        assert asked[1:] == [] and peaks == {"float32": 50.0, "float16": 800.0}


def test_a_configuration_that_ran_float32_in_tf32_is_held_against_the_tf32_peak():
    from amp_backends.commands.bench.zoo_suite import BASELINE, summarize

    def cfg(tf32):
        return {"kind": "baseline", "compute_dtype": "float32", "samples_per_s": {"median": 100.0}, "loss": 1.0,
                **({} if tf32 is None else {"tf32": tf32})}

    for peaks, tf32, share in (({"float32": 10.0, "tf32": 100.0}, True, 0.001),
                               ({"float32": 10.0, "tf32": 100.0}, False, 0.01),
                               ({"float32": 10.0}, True, 0.01)):  # a CPU: no TF32 peak
        report = {"peak_gflops": peaks, "models": [{"flops_per_sample": 1e6, "configs": {BASELINE.name: cfg(tf32)}}]}
        summarize(report)
        (c,) = report["models"][0]["configs"].values()
        assert c["share_of_peak"] == pytest.approx(share), (peaks, tf32)


@pytest.mark.tensorflow
def test_the_workers_peak_sets_tf32_for_its_measurement_and_puts_the_setting_back():
    import tensorflow as tf

    from amp_backends.commands.bench.zoo_worker import ZooWorker

    worker = ZooWorker.__new__(ZooWorker)
    worker.tf = tf
    seen = []
    worker._peaks = lambda dtypes, n, repeats: seen.append(
        tf.config.experimental.tensor_float_32_execution_enabled()) or {}
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    for tf32 in (False, True):
        worker.peak(["float32"], 4, 1, tf32=tf32)
        assert tf.config.experimental.tensor_float_32_execution_enabled() == before
    assert seen == [False, True]
