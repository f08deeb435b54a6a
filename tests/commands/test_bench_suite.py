"""The benchmark's worker processes and the GPU suite (``benchmarks/gpu_suite.py``, run from the checkout).

A crash or an overrun is stopped and reported, the rest goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from amp_backends.commands.bench.supervisor import JsonWorker, WorkerFailed, child_env
from conftest import NEUTRAL_CWD, REPO, TESTS
from warm_python import run_python

ANSWERING = ("import sys, json, time\n"
             "for line in sys.stdin:\n"
             "    req = json.loads(line)\n"
             "    if req['op'] == 'hang': time.sleep(600)\n"
             "    if req['op'] == 'die': sys.exit(3)\n"
             "    if req['op'] == 'quit': sys.exit(0)\n"
             "    print('some log line', flush=True)\n"
             "    print('@@json ' + json.dumps({'ok': True, 'echo': req}), flush=True)\n")


def test_a_json_worker_answers_and_is_stopped_when_it_overruns(tmp_path):
    with open(tmp_path / "log", "w") as log:
        w = JsonWorker([sys.executable, "-c", ANSWERING], log, "fake", env=child_env())
        assert w.request(30, op="ping", x=1) == {"ok": True, "echo": {"op": "ping", "x": 1}}
        t0 = time.time()
        with pytest.raises(WorkerFailed, match="no answer within 1 s"):
            w.request(1, op="hang")
        assert time.time() - t0 < 15 and not w.alive()
        w = JsonWorker([sys.executable, "-c", ANSWERING], log, "fake", env=child_env())
        with pytest.raises(WorkerFailed, match="exit code 3"):
            w.request(30, op="die")
        w.close()
    assert "[fake] some log line" in (tmp_path / "log").read_text()


def test_closing_asks_every_worker_to_quit_before_waiting_for_any(tmp_path):
    """Each zoo worker unloads TensorFlow as it ends: asked all at once, they end side by side."""
    from amp_backends.commands.bench.zoo_suite import ZooRun

    events = []

    class Worker:
        def __init__(self, name):
            self.name = name

        def close(self, wait=True):
            events.append(("wait" if wait else "ask", self.name))

    runner = ZooRun([], 1, 1, None, tmp_path, 60.0, 64, False)
    runner.workers = {"a": Worker("a"), "failed": None, "c": Worker("c")}
    runner.close()
    assert events == [("ask", "a"), ("ask", "c"), ("wait", "a"), ("wait", "c")]
    with open(tmp_path / "log", "w") as log:
        w = JsonWorker([sys.executable, "-c", ANSWERING], log, "fake", env=child_env())
        w.close(wait=False)
        assert w.asked_to_quit
        w.close()  # not asked again: waited for
        assert w.proc.returncode == 0


GPU_SUITE = REPO / "benchmarks" / "gpu_suite.py"


def _suite(args, env=None, timeout=600, warm_workers=False):
    """``python benchmarks/gpu_suite.py ARGS``; with ``warm_workers``, its workers (``python
    benchmarks/gpu_suite_experiments.py ...``) are forked from an interpreter that has imported TensorFlow
    (`warm_python.subprocess_module`): the suite and its workers run as they do, spared each worker's import."""
    if not GPU_SUITE.is_file():
        pytest.skip("benchmarks/gpu_suite.py runs from a checkout; these tests run outside one")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    if not warm_workers:
        return subprocess.run([sys.executable, str(GPU_SUITE), *args], capture_output=True, text=True,
                              timeout=timeout, cwd=NEUTRAL_CWD, env=env)
    code = (f"import sys; sys.path[:0] = [{str(TESTS)!r}, {str(GPU_SUITE.parent)!r}]; import warm_python, gpu_suite; "
            "gpu_suite.subprocess = warm_python.subprocess_module(); del sys.path[0]; sys.exit(gpu_suite.main())")
    return run_python(["-c", code, *args], timeout=timeout, cwd=NEUTRAL_CWD, env=env)


def test_the_gpu_suite_lists_its_experiments_and_refuses_unknown_ones(tmp_path):
    out = _suite(["--list"], timeout=120)
    assert out.returncode == 0 and "mnist_steps_per_call" in out.stdout and "profile" in out.stdout, out.stderr
    out = _suite(["--only", "warp", "--out", str(tmp_path)], timeout=120)
    assert out.returncode == 2 and "unknown experiment(s) ['warp']" in out.stderr and "loss_fetch" in out.stderr
    out = _suite(["--budget-s", "5", "--out", str(tmp_path)], timeout=120)
    assert out.returncode == 2 and "--budget-s takes at least 10 seconds. Received: 5." in out.stderr
    assert not any(tmp_path.iterdir())  # refused before any work


def test_the_installed_bench_command_points_to_the_gpu_suite_in_a_checkout(tmp_path):
    out = subprocess.run([sys.executable, "-m", "amp_backends.bench", "--gpu-suite", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=NEUTRAL_CWD)
    assert out.returncode == 2 and "python benchmarks/gpu_suite.py" in out.stderr, out.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.tensorflow
@pytest.mark.slow
def test_gpu_suite_smoke_a_crashed_worker_is_recorded_and_a_fresh_one_goes_on(tmp_path):
    out = _suite(["--tiny", "--only", "loss_fetch,keras_fit", "--out", str(tmp_path)],
                 env={"GPU_SUITE_FAULTS": "loss_fetch:crash"}, warm_workers=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    state = json.loads((tmp_path / "gpu_suite.json").read_text())
    exps = state["experiments"]
    assert exps["loss_fetch"]["status"] == "failed" and "SIGABRT" in exps["loss_fetch"]["error"]
    assert exps["keras_fit"]["status"] == "done" and any(r["img_per_s"] for r in exps["keras_fit"]["rows"])
    assert exps["bench"]["status"] == "not selected" and state["finished"] and state["software"]["tensorflow"]
    assert "| keras_fit |" in (tmp_path / "gpu_suite.md").read_text()
