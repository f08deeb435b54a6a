"""A tiny smoke run of the benchmark on the CPU: every configuration kind runs and the outputs are written; its chart
drawn (in nox's intel session, which installs matplotlib)."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from warm_python import run_python

from conftest import EIGEN_FLOAT16, NEUTRAL_CWD, float16_reaches_onednn
from schema_check import assert_valid

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def test_bench_smoke(tmp_path):
    cmd = [sys.executable, "-m", "amp_backends.bench", "--models", "mnist,gan",
           "--configs", "fp32,fp16 dynamic", "--epochs", "1", "--samples", "32",
           "--mnist-batch", "16", "--gan-batch", "16", "--out", str(tmp_path)]
    # where oneDNN would train the fp16 loop in its reference kernels, the smoke run takes Eigen's (conftest)
    eigen = EIGEN_FLOAT16 if float16_reaches_onednn() else {}
    out = run_python(cmd[1:], timeout=600, cwd=NEUTRAL_CWD, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **eigen})
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert_valid("bench", report)
    env = report["environment"]
    assert env["tensorflow"] and report["command"].endswith("--out " + str(tmp_path))
    # the planned backend's own devices and details, whatever the vendor (the CPU lists itself)
    assert env["backend"] == env["plan"]["backend"] and env["devices"] and isinstance(env["backend_details"], dict)
    rows = {(r["model"], r["config"]): r for r in report["results"]}
    for model in ("mnist", "gan"):
        # (an "+XLA" configuration is the same step under tf.function(jit_compile=True): its XLA compilation took
        # a third of this run on a 2-core CPU, and the trainer's XLA is tested in test_training_xla.py)
        for config in ("fp32", "fp16 dynamic", "auto plan (trainer)", "auto plan, loss scaling off"):
            r = rows[(model, config)]
            assert r["error"] is None and r["img_per_s"] > 0 and r["ratio_to_best_manual"] > 0, r
    assert any(c.startswith("Keras fit") for m, c in rows if m == "mnist")
    assert max(r["ratio_to_best_manual"] or 0 for r in report["results"] if r["kind"] == "manual") == pytest.approx(1.0)
    if HAS_MATPLOTLIB:
        assert (tmp_path / "bench.png").stat().st_size > 10_000
    else:  # (nox's tests session: test_the_chart_has_a_panel_per_model... draws it where matplotlib is)
        assert not (tmp_path / "bench.png").exists() and "matplotlib is not installed: no chart" in out.stderr
    assert "x best manual" in out.stdout
    assert f"Written to {tmp_path}: bench.json" in out.stdout  # where the results are (a second run: DIR-2)
    # piped, a line a configuration on stdout: the progress lines went there too, each configuration twice
    assert [line for line in out.stdout.splitlines() if "mnist fp32" in line] == [
        next(line for line in out.stdout.splitlines() if line.startswith("mnist fp32:"))]
    assert "  mnist fp32 " in out.stderr


@pytest.mark.intel
def test_the_chart_has_a_panel_per_model_and_a_bar_per_configuration(tmp_path, monkeypatch):
    """The loops' chart (``bench.png``), drawn from a report. It runs where matplotlib is installed: nox's intel
    session (the tests session leaves matplotlib out, as Keras 3 would import it in every process)."""
    if not HAS_MATPLOTLIB:
        pytest.skip("matplotlib is not installed here (nox's intel session has it and draws the chart)")
    import matplotlib.axes

    from amp_backends.commands.bench.output import loops_chart

    bars: list[list[str]] = []
    barh = matplotlib.axes.Axes.barh
    monkeypatch.setattr(matplotlib.axes.Axes, "barh",
                        lambda ax, y, *a, **k: bars.append(list(y)) or barh(ax, y, *a, **k))
    rows = [("mnist", "fp32", "manual", 1000.0), ("mnist", "Keras fit", "keras_fit", 1200.0),
            ("mnist", "auto plan (trainer)", "auto", 3000.0), ("mnist", "bf16", "manual", None),
            ("gan", "fp32", "manual", 500.0), ("gan", "auto plan (trainer)", "auto", 900.0)]
    report = {"date": "2026-11-28T00:00:00", "environment": {"devices": ["/CPU:0 (a CPU)"], "tensorflow": "2.x"},
              "results": [{"model": m, "config": c, "kind": k, "img_per_s": r} for m, c, k, r in rows]}
    loops_chart(report, tmp_path / "bench.png")
    png = (tmp_path / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    width, height = struct.unpack(">II", png[16:24])  # 110 dpi: 10 inches wide, 4.5 a model high
    assert (width, height) == (1100, 990), (width, height)
    # models in name order; a configuration with no figure has no bar
    assert bars == [["fp32", "auto plan (trainer)"], ["fp32", "Keras fit", "auto plan (trainer)"]], bars


def test_an_xla_configuration_trains_the_tutorials_step_compiled_by_xla(monkeypatch):
    """The smoke run above leaves "+XLA" out: here the MNIST step of "fp32+XLA", in this process."""
    from amp_backends.commands.bench import loops
    from amp_backends.data import synthetic_mnist

    asked = []
    step = loops._manual_step
    monkeypatch.setattr(loops, "_manual_step", lambda *a: asked.append(a[2]) or step(*a))
    (x, y), _ = synthetic_mnist(32, 8)
    config = next(c for c in loops.MANUAL if c[0] == "fp32+XLA")
    result = loops.bench_manual("mnist", config, x, y, batch=16, epochs=1, lr=1e-3)
    assert asked == [True] and result.error is None and result.img_per_s > 0, result


def test_bench_rejects_bad_input(tmp_path):
    out = subprocess.run([sys.executable, "-m", "amp_backends.bench", "--models", "resnet", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=NEUTRAL_CWD)
    assert out.returncode == 2 and "--models takes mnist and/or gan" in out.stderr
    out = subprocess.run([sys.executable, "-m", "amp_backends.bench", "--configs", "fp8", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=NEUTRAL_CWD)
    assert out.returncode == 2 and "unknown configuration" in out.stderr and "Fix: " in out.stderr
    # a variable the auto plan's rows read: it was said in each row of a run that went on and exited 0
    out = subprocess.run([sys.executable, "-m", "amp_backends.bench", "--models", "mnist", "--out", "b"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "AMP_POLICY": "fp64"})
    assert out.returncode == 2 and "AMP_POLICY must be one of" in out.stderr and "Fix: " in out.stderr, out.stderr
    assert not (tmp_path / "b").exists()
    # a request AMP_STRICT refuses on this machine: it timed, wrote each automatic row as failed and exited 0
    from amp_backends import plan_for
    from amp_backends.errors import UnsupportedRequestError

    try:
        plan_for(tf32="on", strict=True)
        return  # (this machine runs TF32: a GPU, or ITEX's BF32 on an AMX CPU; no CPU of this session does)
    except UnsupportedRequestError:
        pass
    out = subprocess.run([sys.executable, "-m", "amp_backends.bench", "--models", "mnist", "--out", "b"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "AMP_STRICT": "1", "AMP_TF32": "on"})
    assert out.returncode == 2 and "tf32=on (from AMP_TF32)" in out.stderr and "Fix: " in out.stderr, out.stderr
    assert not (tmp_path / "b").exists()


def test_options_of_the_other_mode_are_refused_not_ignored(tmp_path):
    """``bench --reps 2`` (a zoo option, without --zoo) started the full default run, --reps unused."""
    for args, said in ((["--reps", "2"], "--reps is for the model zoo (--zoo). Received: --reps without --zoo. Fix: "
                                         "add --zoo, or drop --reps."),
                       (["--zoo", "--epochs", "2"], "--epochs is for the tutorials' loops. Received: --epochs with "
                                                    "--zoo. Fix: drop --zoo, or drop --epochs.")):
        out = subprocess.run([sys.executable, "-m", "amp_backends.bench", *args, "--out", "b"], capture_output=True,
                             text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 2 and said in " ".join(out.stderr.split()), out.stderr
        assert not (tmp_path / "b").exists()


def test_samples_fewer_than_a_batch_are_refused_before_any_work(tmp_path):
    """--samples below the GAN's batch failed only after the MNIST CNN had been timed in full, with no bench.json."""
    out = subprocess.run([sys.executable, "-m", "amp_backends.bench", "--models", "mnist,gan", "--configs", "fp32",
                          "--no-fit", "--epochs", "1", "--samples", "64", "--mnist-batch", "16", "--gan-batch", "128",
                          "--out", "runs"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "--samples 64 is smaller than one gan batch of 128" in out.stderr and "Fix: " in out.stderr
    assert not (tmp_path / "runs").exists() and "img/s" not in out.stdout + out.stderr


def test_a_file_as_out_is_refused_before_any_work_and_an_earlier_run_is_not_overwritten(tmp_path, monkeypatch):
    """--out a file failed with FileExistsError after the whole run; a second run into one folder overwrote the
    first's bench.json."""
    from amp_backends.commands.bench.output import results_folder, run_header

    (tmp_path / "afile").write_text("x")
    out = subprocess.run([sys.executable, "-m", "amp_backends.bench", "--models", "mnist", "--out", "afile"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and "--out must be a folder" in out.stderr and "Fix: pass another --out" in out.stderr
    assert not list(tmp_path.glob("afile*/")), "nothing ran"
    first = results_folder(tmp_path / "runs", "bench.json")
    (first / "bench.json").write_text("{}")
    assert results_folder(tmp_path / "runs", "bench.json") == tmp_path / "runs-2"
    assert results_folder(tmp_path / "runs", "zoo.json") == first  # another suite's file: the same folder
    monkeypatch.chdir(first)  # --out . where a run was: ValueError "PosixPath('.') has an empty name"
    assert results_folder(Path("."), "bench.json") == tmp_path / "runs-2"
    monkeypatch.setattr(sys, "argv", ["/x/site-packages/amp_backends/__main__.py", "bench", "--zoo"])
    assert run_header()["command"].split(" ", 1)[1] == "-m amp_backends bench --zoo"  # runs as recorded
    monkeypatch.setattr(sys, "argv", ["/x/site-packages/amp_backends/bench.py", "--zoo"])
    assert run_header()["command"].split(" ", 1)[1] == "-m amp_backends.bench --zoo"


@pytest.fixture
def bench_cli(tmp_path, monkeypatch):
    """``amp-backends bench`` in this process, in ``tmp_path``; SIGTERM's handler given back after."""
    import signal

    import typer
    from typer.testing import CliRunner

    from amp_backends.commands import bench

    handler = signal.getsignal(signal.SIGTERM)
    monkeypatch.chdir(tmp_path)
    app = typer.Typer()
    app.command()(bench.main)
    yield lambda *args: CliRunner().invoke(app, list(args))
    signal.signal(signal.SIGTERM, handler)


def _stops():
    import signal

    from amp_backends.errors import TrainingInterrupted

    sigterm = TrainingInterrupted(signal.SIGTERM, 0, None, "stopped by SIGTERM")  # what SIGTERM raises in a bench
    return [(KeyboardInterrupt(), 130, "interrupted by Ctrl-C"), (sigterm, 143, "stopped by SIGTERM")]


@pytest.mark.parametrize("stop, status, said", _stops())
def test_a_bench_stopped_by_ctrl_c_or_sigterm_keeps_what_finished(bench_cli, tmp_path, monkeypatch, stop, status,
                                                                  said):
    """Ctrl-C during ``bench`` lost every configuration already timed (the results were written at the end only)
    and ended in a traceback: now they are written, marked ``interrupted``, and the run exits 130 (SIGTERM 143)."""
    from amp_backends.commands.bench import loops

    timed = []

    def manual(model, config, *args):
        timed.append(config[0])
        if len(timed) == 2:
            raise stop
        return loops.Result(model, config[0], "manual", 1000.0, [1000.0])

    monkeypatch.setattr(loops, "bench_manual", manual)
    result = bench_cli("--models", "mnist", "--configs", "fp32,TF32", "--samples", "64", "--mnist-batch", "16",
                       "--epochs", "1", "--no-fit", "--out", "runs")
    assert result.exit_code == status, result.output
    assert f"{said}; what finished before it is in runs/bench.json" in result.output
    report = json.loads((tmp_path / "runs" / "bench.json").read_text())
    assert_valid("bench", report)
    assert [r["config"] for r in report["results"]] == ["fp32"] and report["results"][0]["img_per_s"] == 1000.0
    assert report["interrupted"] == f"{said}: only what finished before it is here"


@pytest.mark.parametrize("stop, status, said", _stops())
def test_a_zoo_stopped_by_ctrl_c_or_sigterm_keeps_the_models_that_finished(bench_cli, tmp_path, monkeypatch, stop,
                                                                           status, said):
    from amp_backends.commands.bench.zoo_suite import ZooRun

    closed = []
    monkeypatch.setattr(ZooRun, "start_all", lambda self: None)
    monkeypatch.setattr(ZooRun, "peaks", lambda self, dtypes: {d: 100.0 for d in dtypes})
    monkeypatch.setattr(ZooRun, "close", lambda self: closed.append(self.log.close()))

    def model(self, name):
        if name != "mnist_cnn":
            raise stop
        return {"model": name, "title": "t", "skipped": "stand-in"}

    monkeypatch.setattr(ZooRun, "model", model)
    result = bench_cli("--zoo", "--models", "mnist_cnn,resnet50", "--configs", "baseline", "--out", "zoo")
    assert result.exit_code == status, result.output
    assert closed, "the workers are stopped"
    assert f"{said}; what finished before it is in zoo/zoo.json" in result.output
    report = json.loads((tmp_path / "zoo" / "zoo.json").read_text())
    assert_valid("zoo", report)
    assert [m["model"] for m in report["models"]] == ["mnist_cnn"] and said in report["interrupted"]
    assert said in (tmp_path / "zoo" / "zoo.md").read_text()


def test_a_failed_fit_or_auto_configuration_keeps_its_kind_and_name(bench_cli, tmp_path, monkeypatch):
    """A configuration that raised was written as kind ``manual`` under a name of its own ("auto plan" where the run
    that works writes "auto plan (trainer)"): a failed fit or auto plan read as a manual configuration, and the best
    manual ratio counted it. Now each keeps the kind and the name its run writes."""
    from amp_backends.commands.bench import loops

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this\nsecond line")

    monkeypatch.setattr(loops, "bench_manual", lambda model, config, *a: loops.Result(model, config[0], "manual",
                                                                                        1000.0, [1000.0]))
    monkeypatch.setattr(loops, "bench_fit", broken)
    monkeypatch.setattr(loops, "bench_auto", broken)
    result = bench_cli("--models", "mnist", "--configs", "fp32", "--samples", "64", "--mnist-batch", "16",
                       "--epochs", "1", "--out", "runs")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "runs" / "bench.json").read_text())
    assert_valid("bench", report)
    kinds = {r["config"]: (r["kind"], r["error"]) for r in report["results"]}
    assert kinds == {"fp32": ("manual", None),
                     "Keras fit": ("keras_fit", "RuntimeError: no kernel for this"),
                     "auto plan (trainer)": ("auto", "RuntimeError: no kernel for this"),
                     "auto plan, loss scaling off": ("auto", "RuntimeError: no kernel for this")}, kinds


def test_a_machine_that_could_not_be_read_is_said_so_in_the_results_title(bench_cli, tmp_path, monkeypatch):
    """Where the capability report raised (a strict plan this machine refuses, say), the table's title said
    "(None)" for the machine: it says the machine could not be read, and why."""
    from amp_backends.commands import capability_report
    from amp_backends.commands.bench import loops

    def refuse(*args, **kwargs):
        raise RuntimeError("no plan here")

    monkeypatch.setattr(capability_report, "collect", refuse)
    monkeypatch.setattr(loops, "bench_manual", lambda model, config, *a: loops.Result(model, config[0], "manual",
                                                                                        1000.0, [1000.0]))
    result = bench_cli("--models", "mnist", "--configs", "fp32", "--samples", "64", "--mnist-batch", "16",
                       "--epochs", "1", "--no-fit", "--out", "runs")
    assert result.exit_code == 0, result.output
    assert "(the machine could not be read: RuntimeError: no plan here)" in result.output, result.output
    assert "(None)" not in result.output
