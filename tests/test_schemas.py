"""Each JSON output has one JSON Schema file, shipped in the package, and the outputs match it: the report
(``info --json``, ``Plan.to_dict``), the precision check, the audit, the benchmark's ``bench.json`` and ``zoo.json``.

The schemas name every field (``additionalProperties: false``): a field added to an output without its
schema fails here. The benchmarks' smoke runs (``test_bench.py``, ``test_bench_zoo.py``) and the real audit
(``test_audit_real.py``) validate what they write too.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from schema_check import NAMES, assert_valid, errors, schema

import amp_backends
from amp_backends.backend_api import BackendRegistry
from amp_backends.backends.cpu import CpuBackend
from amp_backends.commands.capability_report import collect

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", NAMES)
def test_each_schema_is_a_valid_json_schema_shipped_as_package_data(name):
    jsonschema.Draft202012Validator.check_schema(schema(name))
    assert schema(name)["title"] and schema(name)["additionalProperties"] is False
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "schemas/*.schema.json" in package_data["amp_backends"]


def test_the_schemas_folder_holds_exactly_one_schema_per_report():
    assert sorted(p.name for p in (REPO / "amp_backends" / "schemas").iterdir()) == [f"{n}.schema.json" for n in NAMES]


# -- the report and the plan ------------------------------------------------------------------------------
@pytest.mark.parametrize("device", [None, *amp_backends.known_devices()])
def test_the_report_of_this_machine_and_of_every_catalogue_device_matches_its_schema(device):
    report = collect(use_tensorflow=False, environ={}, device=device).data
    assert_valid("report", report)
    assert_valid("report", amp_backends.plan_for(device=device, environ={}).to_dict(), definition="plan")


@pytest.mark.parametrize("overrides", [
    {"loss_scale": "fixed:1024", "policy": "float32"},
    {"loss_scale": "dynamic", "policy": "mixed_float16", "force": True},
    {"fp8": True, "xla": True},
])
def test_the_report_under_overrides_matches_its_schema(overrides):
    assert_valid("report", collect(use_tensorflow=False, environ={}, device="h100", **overrides).data)


def test_a_report_without_a_plan_matches_its_schema():
    registry = BackendRegistry([CpuBackend()])
    registry.load_errors["rocm"] = "ImportError: No module named 'rocm_backend'"
    report = collect(registry=registry, use_tensorflow=False, environ={"AMP_BACKEND": "rocm"}).data
    assert report["plan"] is None and report["plan_error"]
    assert_valid("report", report)


def test_the_schema_refuses_an_undocumented_field_and_a_wrong_type():
    report = collect(use_tensorflow=False, environ={}, device="h100").data
    report["plan"]["new_setting"] = True
    report["software"]["tensorflow"]["imported"] = "no"
    problems = errors("report", report)
    assert any("plan" in p and "'new_setting' was unexpected" in p for p in problems), problems
    assert any(p.startswith("software/tensorflow/imported") for p in problems), problems


# -- the audit -------------------------------------------------------------------------------------------
# (each backend's audits are validated beside its recorded kernels: tests/backends/cpu/test_audit_onednn.py,
# tests/backends/nvidia/test_audit_nvidia.py)


# -- the check -------------------------------------------------------------------------------------------
def _check_of_a_small_model(plan):
    import tensorflow as tf

    from amp_backends.keras_compat import set_global_policy

    set_global_policy(plan.policy, tf)
    try:
        inputs = tf.keras.Input((30,))
        x = tf.keras.layers.Dense(63, activation="relu")(inputs)  # misaligned widths: findings with details
        outputs = tf.keras.layers.Dense(10, activation="softmax")(x)  # a head in the policy's dtype
        result = amp_backends.check_model(tf.keras.Model(inputs, outputs), plan=plan, batch_size=100)
    finally:
        set_global_policy("float32", tf)
    return result.to_dict()


@pytest.mark.tensorflow
def test_the_check_of_a_model_under_an_h100_plan_matches_its_schema():
    data = _check_of_a_small_model(amp_backends.plan_for(device="h100", environ={}))
    assert {f["code"] for f in data["findings"]} >= {"tensor-core-shape"} and data["fp8_layers"]
    assert_valid("check", data)


@pytest.mark.tensorflow
def test_the_check_of_a_model_under_a_cpu_plan_matches_its_schema(cpu_plan):
    data = _check_of_a_small_model(cpu_plan)
    # a float32 plan has nothing to say of this model; under bfloat16 its softmax head is a finding
    assert bool(data["findings"]) == (cpu_plan.policy != "float32"), data["findings"]
    assert data["fp8_layers"]
    assert_valid("check", data)


# -- the benchmarks --------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted((REPO / "results").glob("zoo-*/*/zoo.json")), ids=lambda p: p.parent.name)
def test_the_committed_zoo_results_match_their_schema(path):
    assert_valid("zoo", json.loads(path.read_text()))
