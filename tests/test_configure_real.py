"""Real auto_configure() with real TensorFlow on this machine."""

from __future__ import annotations

import warnings

import pytest

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]

tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
from amp_backends import keras_compat  # noqa: E402
from amp_backends.errors import AmpConfigError, AmpWarning, BackendError, UnsupportedRequestError  # noqa: E402


def machine_has_native_bf16() -> bool:
    from amp_backends.backends.cpu import probe_cpu

    return probe_cpu().native_bf16


def tensorflow_runs_onednn() -> bool:
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def test_auto_configure_applies_and_returns_the_plan(caplog):
    caplog.set_level("INFO", logger="amp_backends")
    tf.config.experimental.enable_tensor_float_32_execution(True)  # TensorFlow's default; the plan decides
    plan = amp_backends.auto_configure()
    assert plan.backend in ("nvidia", "intel", "cpu")
    assert keras_compat.global_policy_name(tf) == plan.policy
    assert tf.config.experimental.tensor_float_32_execution_enabled() is plan.tf32
    assert amp_backends.current_plan() is plan
    assert [r.message for r in caplog.records if r.name == "amp_backends"][0].startswith("amp_backends plan: backend=")


def test_auto_configure_follows_the_cpu_rules_here():
    plan = amp_backends.auto_configure(verbose=False)
    if plan.backend != "cpu":
        pytest.skip(f"this machine plans for {plan.backend}: the CPU rules do not apply")
    from amp_backends.backends.cpu import probe_cpu
    from amp_backends.backends.intel import itex_status

    # TF32 stands for ITEX's BF32 math mode on an AMX CPU with ITEX loaded (float32 matmuls on the AMX tiles)
    bf32 = itex_status().compatible and probe_cpu().amx
    assert (plan.loss_scale.mode, plan.xla, plan.tf32, plan.devices) == ("none", False, bf32, ("/CPU:0",))
    assert plan.vendor_setting("ITEX_FP32_MATH_MODE") == ("BF32" if bf32 else None)
    # bfloat16 only where the CPU has bf16 instructions and oneDNN runs it: TensorFlow's (TF_ENABLE_ONEDNN_OPTS, its
    # default), or ITEX's own kernels, which that variable does not switch off
    onednn = tensorflow_runs_onednn() or itex_status().compatible
    assert plan.policy == ("mixed_bfloat16" if machine_has_native_bf16() and onednn else "float32")
    assert keras_compat.global_policy_name(tf) == plan.policy


ONEDNN_OFF = """
import json, warnings
import amp_backends
from tensorflow.python.util import _pywrap_util_port
plan = amp_backends.auto_configure(verbose=False)
print(json.dumps({"backend": plan.backend, "policy": plan.policy, "why": plan.reasons["policy"],
                  "onednn": bool(_pywrap_util_port.IsMklEnabled())}))
"""


@pytest.mark.slow
def test_with_onednn_switched_off_the_cpu_plan_is_float32_and_says_why():
    """TF_ENABLE_ONEDNN_OPTS=0: TensorFlow runs bfloat16 in Eigen, many times slower than float32, so float32."""
    import json
    import os
    import subprocess
    import sys

    from conftest import NEUTRAL_CWD

    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0", TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", ONEDNN_OFF], check=False, capture_output=True, text=True, timeout=300,
                         env=env, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    if seen["backend"] != "cpu":
        pytest.skip(f"this machine plans for {seen['backend']}: the CPU rules do not apply")
    import importlib.util

    if importlib.util.find_spec("intel_extension_for_tensorflow") is not None:
        # ITEX runs its own oneDNN kernels, which TF_ENABLE_ONEDNN_OPTS does not switch off (the audit shows them)
        assert seen["onednn"] is False and seen["policy"] == ("mixed_bfloat16" if machine_has_native_bf16()
                                                              else "float32")
        return
    assert seen["onednn"] is False and seen["policy"] == "float32"
    if machine_has_native_bf16():  # on a CPU without bf16 instructions float32 needs no oneDNN argument
        assert "TF_ENABLE_ONEDNN_OPTS=0: without oneDNN, TensorFlow runs bfloat16 in Eigen" in seen["why"]


def test_auto_configure_is_idempotent():
    first = amp_backends.auto_configure(verbose=False)
    assert amp_backends.auto_configure(verbose=False) is first
    other = amp_backends.auto_configure(xla="on", verbose=False)
    assert other is not first and other.xla is True


def test_tiny_model_trains_under_the_plan():
    plan = amp_backends.auto_configure(verbose=False)
    keras = tf.keras
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1, dtype="float32")])
    model.compile(optimizer="adam", loss="mse", **plan.compile_kwargs())
    hist = model.fit(tf.random.normal((64, 4)), tf.random.normal((64, 1)), epochs=2, verbose=0)
    assert len(hist.history["loss"]) == 2 and all(v == v for v in hist.history["loss"])
    assert model.layers[0].compute_dtype == plan.compute_dtype


def test_forced_fp16_on_this_cpu():
    from amp_backends.backends.cpu import probe_cpu

    auto = amp_backends.auto_configure(verbose=False)
    if auto.backend != "cpu" or probe_cpu().native_fp16:
        pytest.skip(f"the plan uses {auto.backend}" if auto.backend != "cpu" else "this CPU has fp16 arithmetic")
    amp_backends.reset()
    with pytest.warns(AmpWarning, match="downgraded"):
        plan = amp_backends.auto_configure(policy="fp16", verbose=False)
    assert plan.policy == auto.policy != "mixed_float16" and keras_compat.global_policy_name(tf) == auto.policy
    with pytest.raises(UnsupportedRequestError):
        amp_backends.auto_configure(policy="fp16", strict=True, verbose=False)
    with pytest.warns(AmpWarning, match="force"):
        plan = amp_backends.auto_configure(policy="fp16", force=True, verbose=False)
    assert keras_compat.global_policy_name(tf) == "mixed_float16"
    layer = tf.keras.layers.Dense(2)
    layer.build((None, 3))
    assert layer.compute_dtype == "float16" and layer.variable_dtype == "float32"


def test_environment_overrides_and_errors(monkeypatch):
    # the variable must change something: XLA is off by default on a CPU and on by default on a GPU
    auto = amp_backends.auto_configure(verbose=False)
    amp_backends.reset()
    monkeypatch.setenv("AMP_XLA", "off" if auto.xla else "on")
    tf.config.optimizer.set_jit(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmpWarning)  # XLA on a CPU is honoured with a "little speed-up" warning
        plan = amp_backends.auto_configure(verbose=False)
    assert plan.xla is (not auto.xla) and plan.request.sources == {"xla": "AMP_XLA"}
    assert "as requested (AMP_XLA)" in plan.reasons["xla"]
    assert bool(tf.config.optimizer.get_jit()) is plan.xla  # XLA off turns TensorFlow's auto-clustering off
    monkeypatch.setenv("AMP_POLICY", "bogus")
    with pytest.raises(AmpConfigError, match="AMP_POLICY must be one of auto, float32"):
        amp_backends.auto_configure()


def test_reset_plans_again_and_a_registry_is_part_of_the_request():
    first = amp_backends.auto_configure(verbose=False)
    assert amp_backends.auto_configure(verbose=False) is first
    amp_backends.reset()
    assert amp_backends.current_plan() is None
    again = amp_backends.auto_configure(verbose=False)
    assert again is not first and again == first
    from amp_backends.backends.cpu import CpuBackend
    from amp_backends.registry import BackendRegistry

    cpu_only = amp_backends.auto_configure(verbose=False, registry=BackendRegistry([CpuBackend()]))
    assert cpu_only is not again and [b.name for b in cpu_only.backends] == ["cpu"]


def test_a_backend_failing_to_apply_raises_naming_it():
    from amp_backends.backends.cpu import CpuBackend
    from amp_backends.registry import BackendRegistry

    class Breaks(CpuBackend):
        def apply(self, plan, tf):
            raise RuntimeError("driver went away")

    with pytest.raises(BackendError,
                       match="backend 'cpu' failed to apply its settings .*RuntimeError: driver went away"):
        amp_backends.auto_configure(verbose=False, registry=BackendRegistry([Breaks()]))


def test_xla_off_turns_global_autoclustering_off():
    tf.config.optimizer.set_jit(True)
    plan = amp_backends.auto_configure(xla="off", verbose=False)
    assert plan.xla is False and not tf.config.optimizer.get_jit()
