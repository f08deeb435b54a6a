"""float8 training and Keras fit's steps per call in the plan: decision tables over fake hardware and Keras versions.

fp8 is native on NVIDIA GPUs of compute capability >= 8.9 with Keras >= 3.3 and XLA on; emulated on other
hardware or with XLA off (honoured only with force); unsupported on Keras 2 and Keras < 3.3 (never). It is
off by default everywhere until a measurement shows it faster. No TensorFlow needed.
"""

from __future__ import annotations

import json

import pytest

from amp_backends.assessment import EMULATED, NATIVE, UNSUPPORTED, Support
from amp_backends.errors import UnsupportedRequestError
from amp_backends.keras_compat import float8_training
from amp_backends.software import KerasInfo
from amp_backends.planner import fp8_support

from fakes import (A100, AMD_HERE, ARC_A770, H100, MAX1550, RTX4090, SAPPHIRE_RAPIDS, V100, cpu_of, intel, machine,
                   nvidia, plan_of)

pytestmark = pytest.mark.intel

KERAS_3_15 = KerasInfo("3.15.1", 3, "keras")
KERAS_3_2 = KerasInfo("3.2.1", 3, "keras")
KERAS_2 = KerasInfo("2.15.0", 2, "keras")
TF_KERAS = KerasInfo("2.21.0", 2, "tf-keras")
HERE = cpu_of(AMD_HERE)


# name, hardware, keras, overrides, fp8 on?, the word the reason must contain
ASKED = [
    ("H100", machine(nvidia(H100), HERE), KERAS_3_15, {}, True, "fp8 Tensor Cores"),
    ("RTX 4090", machine(nvidia(RTX4090), HERE), KERAS_3_15, {}, True, "fp8 Tensor Cores"),
    ("2x H100", machine(nvidia(H100, H100), HERE), KERAS_3_15, {}, True, "fp8 Tensor Cores"),
    ("H100 + A100 follows the weakest", machine(nvidia(H100, A100), HERE), KERAS_3_15, {}, False, "CC >= 8.9"),
    ("A100", machine(nvidia(A100), HERE), KERAS_3_15, {}, False, "no fp8 Tensor Cores"),
    ("V100", machine(nvidia(V100), HERE), KERAS_3_15, {}, False, "no fp8 Tensor Cores"),
    ("H100 with XLA off", machine(nvidia(H100), HERE), KERAS_3_15, {"xla": "off"}, False, "XLA is off"),
    ("H100 on Keras 2", machine(nvidia(H100), HERE), KERAS_2, {}, False, "Keras 2.15.0 cannot train in float8"),
    ("H100 on tf-keras", machine(nvidia(H100), HERE), TF_KERAS, {}, False, "Keras >= 3.3"),
    ("H100 on Keras 3.2", machine(nvidia(H100), HERE), KERAS_3_2, {}, False, "Keras >= 3.3"),
    ("H100, Keras unknown", machine(nvidia(H100), HERE), None, {}, False, "Keras version is unknown"),
    ("this AMD EPYC", machine(HERE), KERAS_3_15, {}, False, "CPUs have no fp8"),
    ("Sapphire Rapids (AMX)", machine(cpu_of(SAPPHIRE_RAPIDS)), KERAS_3_15, {}, False, "CPUs have no fp8"),
    ("Data Center GPU Max", machine(intel(MAX1550), HERE), KERAS_2, {}, False, "cannot train in float8"),
    ("Arc A770, hypothetically on Keras 3", machine(intel(ARC_A770), HERE), KERAS_3_15, {}, False,
     "no fp8 matrix path"),
]


@pytest.mark.parametrize("name,hw,keras,overrides,on,word", ASKED, ids=[a[0] for a in ASKED])
def test_fp8_is_off_by_default_and_on_only_where_native(registry, name, hw, keras, overrides, on, word):
    auto = plan_of(hw, registry, keras, **overrides)
    assert auto.fp8 is False and word in auto.reasons["fp8"]
    if on:
        assert "off by default until a measurement" in auto.reasons["fp8"]
    asked = plan_of(hw, registry, keras, fp8="on", **overrides)
    assert asked.fp8 is on and word in asked.reasons["fp8"]
    fp8_warnings = [w for w in asked.warnings if w.startswith("fp8=on")]
    assert bool(fp8_warnings) is not on  # a downgrade always says so
    if not on:
        assert "downgraded to fp8=off" in fp8_warnings[0] and word in fp8_warnings[0]


@pytest.mark.parametrize("hw,keras,overrides", [
    (machine(HERE), KERAS_3_15, {}),
    (machine(nvidia(A100), HERE), KERAS_3_15, {}),
    (machine(nvidia(H100), HERE), KERAS_3_15, {"xla": "off"}),
], ids=["CPU", "A100", "H100 without XLA"])
def test_force_runs_emulated_fp8_with_a_warning(registry, hw, keras, overrides):
    p = plan_of(hw, registry, keras, fp8="on", force=True, **overrides)
    assert p.fp8 is True and p.reasons["fp8"].startswith("on as requested")
    (w,) = [w for w in p.warnings if w.startswith("fp8=on")]
    assert "honoured because force is on, although it is slow here" in w


def test_force_cannot_enable_fp8_where_keras_has_none(registry):
    p = plan_of(machine(nvidia(H100), HERE), registry, KERAS_2, fp8="on", force=True)
    assert p.fp8 is False and "not supported" in next(w for w in p.warnings if w.startswith("fp8=on"))


@pytest.mark.parametrize("keras,kind", [(KERAS_3_15, "slow"), (KERAS_2, "not supported")])
def test_strict_refuses_fp8_it_cannot_honour(registry, keras, kind):
    with pytest.raises(UnsupportedRequestError) as err:
        plan_of(machine(nvidia(A100), HERE), registry, keras, fp8="on", strict=True)
    msg = str(err.value)
    assert f"fp8=on (from argument) is {kind} on backend 'nvidia'" in msg and "fp8=off" in msg and "Fix:" in msg


def test_fp8_off_is_always_honoured_and_asked_for_from_the_environment(registry):
    hw = machine(nvidia(H100), HERE)
    assert plan_of(hw, registry, KERAS_3_15, fp8="off").reasons["fp8"].startswith("off as requested")
    env = plan_of(hw, registry, KERAS_3_15, environ={"AMP_FP8": "on"})
    assert env.fp8 is True and "AMP_FP8" in env.reasons["fp8"] and env.request.overrides() == {"fp8": "on"}


def test_fp8_shows_in_the_summary_explanation_json_and_training_key(registry):
    hw = machine(nvidia(H100), HERE)
    off, on = plan_of(hw, registry, KERAS_3_15), plan_of(hw, registry, KERAS_3_15, fp8="on")
    assert "fp8=on" in on.summary() and "fp8" not in off.summary()
    assert "  fp8: off by default" in off.explain() and "  fp8: on as requested" in on.explain()
    d = json.loads(on.to_json())
    assert d["fp8"] is True and d["support"]["fp8"]["level"] == NATIVE
    assert d["support"]["matrix_units"]["float8"] == {"unit": "fp8 Tensor Cores", "alignment": 16}
    assert off.training_key() != on.training_key() and "fp8=True" in on.training_key()


@pytest.mark.parametrize("hardware,keras,xla,level", [
    (Support(NATIVE, "fp8 units"), KERAS_3_15, True, NATIVE),
    (Support(NATIVE, "fp8 units"), KERAS_3_15, False, EMULATED),
    (Support(NATIVE, "fp8 units"), KERAS_2, True, UNSUPPORTED),
    (Support(EMULATED, "none"), KERAS_3_15, True, EMULATED),
    (Support(EMULATED, "none"), None, True, UNSUPPORTED),
])
def test_fp8_support_is_a_pure_function_of_hardware_keras_and_xla(hardware, keras, xla, level):
    assert fp8_support(hardware, keras, xla).level == level


@pytest.mark.parametrize("version,able", [("3.3.0", True), ("3.15.1", True), ("4.0.0", True), ("3.2.1", False),
                                          ("2.15.0", False), ("dev", False), (None, False)])
def test_float8_training_needs_keras_3_3(version, able):
    assert float8_training(KerasInfo(version, None, "keras"))[0] is able


# -- steps_per_execution -------------------------------------------------------------------------------------

@pytest.mark.parametrize("hw,words", [
    (machine(HERE), "AMD EPYC Zen 4 (avx512_bf16, no AMX), TF 2.21.0, benchmarks/fit_steps_per_execution.py"),
    (machine(cpu_of(SAPPHIRE_RAPIDS)), "gained nothing"),
    (machine(nvidia(H100), HERE), "results/gpu-suite-h200-trainer/gpu_suite.json: fit at 1 step per call"),
    (machine(nvidia(V100), HERE), "pass steps_per_execution=N to compile() where no callback needs every batch"),
    (machine(intel(MAX1550), HERE), "not measured"),
], ids=["AMD EPYC", "Sapphire Rapids", "H100", "V100", "Intel Max"])
def test_steps_per_execution_comes_with_its_reason(registry, hw, words):
    p = plan_of(hw, registry, KERAS_3_15)
    assert p.steps_per_execution == 1 and p.compile_kwargs()["steps_per_execution"] == 1
    assert p.reasons["steps_per_execution"].startswith("1: ") and words in p.reasons["steps_per_execution"]
    d = json.loads(p.to_json())
    assert d["steps_per_execution"] == 1 and d["support"]["steps_per_execution"]["value"] == 1


def test_the_assessment_contract_covers_matrix_units_and_steps_per_execution():
    from amp_backends.assessment import Assessment, MatrixUnit

    native = Support(NATIVE, "x")
    base = dict(backend="b", devices=("/CPU:0",),
                policies={p: native for p in ("float32", "mixed_float16", "mixed_bfloat16")},
                preference=("float32",), tf32=native, xla=native, xla_default=False)
    assert Assessment(**base, matrix_units={"float8": MatrixUnit("u", 16)}).contract_errors() == []
    int8_units = Assessment(**base, matrix_units={"int8": MatrixUnit("u", 16)})
    assert "matrix units for 'int8'" in int8_units.contract_errors()[0]
    assert "steps_per_execution=0" in Assessment(**base, steps_per_execution=0).contract_errors()[0]
    default = Assessment(**base)
    assert default.fp8.level == EMULATED and default.matrix_units == {} and default.steps_per_execution == 1
