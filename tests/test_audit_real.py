"""Real audits of the MNIST CNN, each in its own child process (a few seconds each), and the command."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]
MNIST = "amp_backends.models:mnist_cnn"


def cpu_has_bf16() -> bool:
    from amp_backends.backends.cpu import probe_cpu

    return probe_cpu().native_bf16


def keras3() -> bool:
    import tensorflow as tf

    return str(getattr(tf.keras, "__version__", "2")).startswith("3")


@pytest.mark.intel
def test_the_auto_plan_runs_its_convolutions_in_bf16_kernels_with_the_output_layer_a_float32_island(monkeypatch):
    if not cpu_has_bf16():
        pytest.skip("this CPU has no bf16 instructions: the auto plan is float32 here, nothing runs in bf16 kernels")
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    from amp_backends.audit import audit

    d = audit(MNIST, batch_size=32, steps=2).to_dict()
    assert d["plan"]["compute_dtype"] == "bfloat16" and d["outside_onednn"] is None
    conv = d["by_kind"]["convolution"]
    assert conv["dtypes"].get("bfloat16", 0) > 0.5
    assert max(conv["units"], key=conv["units"].get) in ("AVX512-BF16", "AMX")
    assert d["time_share_by_dtype"]["bfloat16"] > 0.5
    assert any(i["layers"] == ["mnist_cnn/dense_1"] for i in d["float32_islands"])
    assert not [w for w in d["warnings"] if "convolution" in w["what"]]


def test_under_policy_float32_no_time_is_in_reduced_precision(monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    from amp_backends.audit import audit

    d = audit(MNIST, batch_size=32, steps=1, policy="float32").to_dict()
    assert d["plan"]["policy"] == "float32"
    if d["outside_onednn"]:  # a CPU where TensorFlow leaves oneDNN off (Zen 1): nothing is claimed
        assert d["time_share_by_dtype"] == {}
    else:
        assert set(d["time_share_by_dtype"]) == {"float32"}
    assert d["float32_islands"] == [] and not [w for w in d["warnings"] if "bfloat16" in w["what"]]


def test_with_onednn_opts_off_the_kernels_ran_outside_onednn(monkeypatch):
    if not keras3():
        # checked on TF 2.15.1 + ITEX 2.15.0.0 (Zen 4): with it set to 0, ITEX still runs its oneDNN convolutions
        pytest.skip("TF_ENABLE_ONEDNN_OPTS does not turn ITEX's oneDNN kernels off under TF 2.15 + ITEX")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    from amp_backends.audit import audit

    d = audit(MNIST, batch_size=8, steps=1, policy="float32").to_dict()
    assert "ran outside oneDNN (Eigen)" in d["outside_onednn"] and d["time_share_by_dtype"] == {}


def test_the_command_prints_json_and_refuses_bad_targets():
    from typer.testing import CliRunner

    from amp_backends.commands.audit import audit_command
    from amp_backends.commands.typer_app import make_app

    app = make_app()
    app.command()(audit_command)
    runner = CliRunner()
    result = runner.invoke(app, [MNIST, "--batch-size", "16", "--steps", "1", "--policy", "float32", "--json"],
                           env={**os.environ})
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout[result.stdout.index("{"):])
    assert d["model"] == "mnist_cnn" and "time_share_by_dtype" in d
    bad = runner.invoke(app, ["mymodels.py"])
    assert bad.exit_code == 2 and "expected MODULE:FACTORY" in bad.output
    bad = runner.invoke(app, [MNIST, "--policy", "mixed_float64"])
    assert bad.exit_code == 2 and "mixed_float64" in bad.output


OBSERVED_TRAINING = """
import json
import numpy as np
import tensorflow as tf
import amp_backends
from amp_backends.models import mnist_cnn

plan = amp_backends.auto_configure(policy="float32", verbose=False)
model = mnist_cnn()
trainer = amp_backends.Trainer(amp_backends.classifier_updates(model, tf.keras.optimizers.SGD(0.01)), plan,
                               batch_size=16, log_every=100, progress=False, check_models=False, audit=(2, 4))
print("BEFORE FIT", flush=True)
trainer.fit(np.random.rand(96, 28, 28, 1).astype("float32"), np.random.randint(0, 10, 96), max_steps=5)
print("AFTER FIT", flush=True)
result = trainer.audit.result
print("AUDIT_JSON " + json.dumps(result.to_dict() if result else None))
"""


def test_the_trainer_observer_audits_its_window_when_onednn_verbose_was_set_at_start(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "observed.py"
    script.write_text(OBSERVED_TRAINING)
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    # oneDNN's records during fit are taken off standard output (kept for the window, dropped elsewhere);
    # what Python prints around and during fit still comes through
    during = out.stdout.split("BEFORE FIT", 1)[1].split("AFTER FIT", 1)[0]
    assert "onednn_verbose" not in during and "AFTER FIT" in out.stdout
    line = next(line for line in out.stdout.splitlines() if line.startswith("AUDIT_JSON "))
    d = json.loads(line[len("AUDIT_JSON "):])
    assert d is not None and d["steps"] == 2 and d["plan"]["policy"] == "float32"
    if not d["outside_onednn"]:
        assert set(d["time_share_by_dtype"]) == {"float32"} and "convolution" in d["by_kind"]
