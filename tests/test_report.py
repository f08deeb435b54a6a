"""The capability report: collect() data, text and JSON output, and the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import NEUTRAL_CWD

from amp_backends.report import SCHEMA_VERSION, collect, render_text, to_json


def cli(*args, env=None, timeout=180):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AMP_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "amp_backends.info", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=NEUTRAL_CWD)


def test_collect_without_tensorflow_is_complete():
    rep = collect(use_tensorflow=False, environ={})
    d = rep.data
    assert d["schema_version"] == SCHEMA_VERSION
    assert {b["backend"] for b in d["hardware"]["backends"]} == {"nvidia", "intel", "cpu"}
    assert set(d["backend_rows"]) == {"nvidia", "intel", "cpu"}
    assert d["plan"]["backend"] in ("nvidia", "intel", "cpu") and d["plan_error"] is None
    assert d["software"]["tensorflow"]["imported"] is False
    json.loads(to_json(rep))


def test_collect_reports_overrides_in_force():
    d = collect(use_tensorflow=False, environ={"AMP_XLA": "on"}).data
    assert d["overrides"] == {"AMP_XLA": "on"} and d["plan"]["overrides"] == {"xla": "on"}


def test_text_rendering_has_every_section():
    from rich.console import Console

    console = Console(record=True, width=200)
    render_text(collect(use_tensorflow=False, environ={"AMP_POLICY": "bf16"}), console)
    text = console.export_text()
    for needle in ("Hardware", "Software", "Plan", "policy", "loss_scale", "tf32", "xla", "Overrides in force: AMP_POLICY=bf16"):
        assert needle in text


@pytest.mark.tensorflow
def test_info_json_here():
    out = cli("--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    tf_info = d["software"]["tensorflow"]
    assert tf_info["imported"] is True and tf_info["version"]
    assert d["software"]["keras"]["generation"] in (2, 3)
    assert "CPU" in d["hardware"]["tensorflow_device_types"]
    cpu = next(b for b in d["hardware"]["backends"] if b["backend"] == "cpu")
    if not cpu["cpu"]["native_bf16"] and d["plan"]["backend"] == "cpu":
        assert d["plan"]["policy"] == "float32"
        bf16 = next(r for r in d["plan"]["rejected"] if r["value"] == "mixed_bfloat16")
        assert "no bf16 instructions" in bf16["why"]


@pytest.mark.tensorflow
def test_info_text_here():
    out = cli()
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    for needle in ("Hardware", "native bf16", "TensorFlow", "Keras", "ITEX", "Plan", "float32", "Overrides in force"):
        assert needle in out.stdout


def test_bogus_policy_is_a_clear_error():
    out = cli("--no-tensorflow", env={"AMP_POLICY": "bogus"})
    assert out.returncode == 2
    assert "AMP_POLICY must be one of auto, float32, mixed_float16, mixed_bfloat16" in out.stderr
    assert "Received: 'bogus'" in out.stderr and "Traceback" not in out.stderr


def test_bad_flag_value_is_a_clear_error():
    out = cli("--no-tensorflow", "--xla", "sometimes")
    assert out.returncode == 2 and "xla= must be one of auto, on, off" in out.stderr


def test_console_script_subcommand():
    exe = os.path.join(os.path.dirname(sys.executable), "amp-backends")
    out = subprocess.run([exe, "info", "--json", "--no-tensorflow"], capture_output=True, text=True, timeout=120, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["schema_version"] == SCHEMA_VERSION
