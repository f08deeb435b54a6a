"""A tiny smoke run of the benchmark on the CPU: every configuration kind runs and the outputs are written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import EIGEN_FLOAT16, NEUTRAL_CWD, float16_reaches_onednn
from schema_check import assert_valid

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]


def test_bench_smoke(tmp_path):
    cmd = [sys.executable, "-m", "amp_backends.bench", "--models", "mnist,gan",
           "--configs", "fp32,fp32+XLA,fp16 dynamic", "--epochs", "1", "--samples", "32",
           "--mnist-batch", "16", "--gan-batch", "16", "--out", str(tmp_path)]
    # where oneDNN would train the fp16 loop in its reference kernels, the smoke run takes Eigen's (conftest)
    eigen = EIGEN_FLOAT16 if float16_reaches_onednn() else {}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=NEUTRAL_CWD,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **eigen})
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert_valid("bench", report)
    env = report["environment"]
    assert env["tensorflow"] and report["command"].endswith("--out " + str(tmp_path))
    # the planned backend's own devices and details, whatever the vendor (the CPU lists itself)
    assert env["backend"] == env["plan"]["backend"] and env["devices"] and isinstance(env["backend_details"], dict)
    rows = {(r["model"], r["config"]): r for r in report["results"]}
    for model in ("mnist", "gan"):
        for config in ("fp32", "fp32+XLA", "fp16 dynamic", "auto plan (trainer)", "auto plan, loss scaling off"):
            r = rows[(model, config)]
            if (model, config) == ("gan", "fp32+XLA") and report["environment"]["tensorflow"].startswith("2.15"):
                # TF 2.15's XLA CPU backend has no kernel for UpSampling2D's gradient: reported, and the run goes on
                assert "ResizeNearestNeighborGrad" in r["error"] and r["img_per_s"] is None
                continue
            assert r["error"] is None and r["img_per_s"] > 0 and r["ratio_to_best_manual"] > 0, r
    assert any(c.startswith("Keras fit") for m, c in rows if m == "mnist")
    assert max(r["ratio_to_best_manual"] or 0 for r in report["results"] if r["kind"] == "manual") == pytest.approx(1.0)
    assert (tmp_path / "bench.png").stat().st_size > 10_000
    assert "x best manual" in out.stdout


def test_bench_rejects_bad_input(tmp_path):
    out = subprocess.run([sys.executable, "-m", "amp_backends.bench", "--models", "resnet", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=NEUTRAL_CWD)
    assert out.returncode == 2 and "--models takes mnist and/or gan" in out.stderr
    out = subprocess.run([sys.executable, "-m", "amp_backends.bench", "--configs", "fp8", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=NEUTRAL_CWD)
    assert out.returncode == 2 and "unknown configuration" in out.stderr


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
    monkeypatch.setattr(sys, "argv", ["/x/site-packages/amp_backends/__main__.py", "bench", "--zoo"])
    assert run_header()["command"].split(" ", 1)[1] == "-m amp_backends bench --zoo"  # runs as recorded
    monkeypatch.setattr(sys, "argv", ["/x/site-packages/amp_backends/bench.py", "--zoo"])
    assert run_header()["command"].split(" ", 1)[1] == "-m amp_backends.bench --zoo"
