"""The Intel path: ITEX really loaded (TF 2.15 + ITEX 2.15.0.0 CPU, nox session 'intel'), and XPU plans.

Tests that need ITEX skip elsewhere with that reason; the others run in both environments.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from amp_backends.backends.intel import itex_status
from conftest import NEUTRAL_CWD, TESTS

pytestmark = [pytest.mark.intel, pytest.mark.tensorflow]

ITEX = itex_status()
needs_itex = pytest.mark.skipif(not ITEX.compatible, reason=f"needs ITEX matching TensorFlow ({ITEX.reason})")


def cpu_has_bf16() -> bool:
    from amp_backends.backends.cpu import probe_cpu

    return probe_cpu().native_bf16


def cpu_has_amx() -> bool:
    from amp_backends.backends.cpu import probe_cpu

    return probe_cpu().amx


def python(code: str, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AMP_")} | {"TF_CPP_MIN_LOG_LEVEL": "2"} | env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=full,
                          cwd=NEUTRAL_CWD)


@needs_itex
def test_report_under_itex_shows_itex_cpu_backend_no_xpu_and_float32():
    # no TF_CPP_MIN_LOG_LEVEL: the command quiets TensorFlow's and ITEX's start-up lines itself
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL" and not k.startswith("AMP_")}
    out = subprocess.run([sys.executable, "-m", "amp_backends.info", "--json"], capture_output=True, text=True,
                         timeout=300, cwd=NEUTRAL_CWD, env=env)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    sw = d["software"]
    (label, itex_row), = sw["backends"]["intel"]
    assert label == "ITEX" and itex_row.startswith(f"{ITEX.version}: ") and "end-of-life" in itex_row
    assert sw["keras"]["generation"] == 2 and sw["tensorflow"]["version"].startswith("2.15")
    # ITEX makes the report import TensorFlow (XPUs are listed through it), and says so
    assert sw["tensorflow"]["imported"] is True and sw["tensorflow"]["why"].startswith("auto: imported")
    intel = next(b for b in d["hardware"]["backends"] if b["backend"] == "intel")
    assert not intel["available"] and "lists no XPU device" in intel["reason"]
    assert intel["details"]["itex_native_backends"] == "cpu" and intel["facts"]["itex"]["compatible"] is True
    assert "XPU" not in d["hardware"]["tensorflow_device_types"]
    cpu = next(b for b in d["hardware"]["backends"] if b["backend"] == "cpu")
    assert cpu["facts"]["itex"]["compatible"] is True and d["plan"]["backend"] == "cpu"
    bf16 = d["plan"]["support"]["policies"]["mixed_bfloat16"]
    if cpu["cpu"]["native_bf16"]:
        assert d["plan"]["policy"] == "mixed_bfloat16" and bf16["level"] == "native"
    else:
        assert d["plan"]["policy"] == "float32" and bf16["level"] == "unsafe"
        why = next(r["why"] for r in d["plan"]["rejected"] if r["value"] == "mixed_bfloat16")
        assert "no bf16 instructions" in why and "ITEX" in why and "aborts" in why
    assert out.stderr == "", out.stderr


BF16_STEP = """
import tensorflow as tf
from amp_backends.models import mnist_cnn
m = mnist_cnn(); opt = tf.keras.optimizers.Adam(1e-3)
x = tf.random.uniform((8, 28, 28, 1)); y = tf.zeros((8,), tf.int64)
@tf.function
def step():
    with tf.GradientTape() as t:
        l = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, m(x, training=True)))
    g = t.gradient(l, m.trainable_variables); opt.apply_gradients(zip(g, m.trainable_variables)); return l
print("policy", tf.keras.mixed_precision.global_policy().name, "loss", float(step()), flush=True)
"""


@needs_itex
@pytest.mark.skipif(cpu_has_bf16(), reason="this CPU has bf16 instructions: ITEX does not abort on it")
def test_forced_bf16_under_itex_aborts_without_us_and_survives_with_us():
    # Without amp_backends: the user's own mixed_bfloat16 kills the process (SIGABRT from oneDNN).
    raw = python("import tensorflow as tf; tf.keras.mixed_precision.set_global_policy('mixed_bfloat16')\n" + BF16_STEP)
    assert raw.returncode in (-6, 134), (raw.returncode, raw.stdout, raw.stderr[-1500:])
    assert "could not create a primitive descriptor" in raw.stderr and "policy" not in raw.stdout

    # With amp_backends: the forced request is refused before any bf16 op, even with force; training runs.
    ours = python("import warnings, amp_backends\n"
                  "with warnings.catch_warnings(record=True) as w:\n"
                  "    warnings.simplefilter('always')\n"
                  "    plan = amp_backends.auto_configure(policy='bf16', force=True, verbose=False)\n"
                  "print('warning', [str(x.message) for x in w if x.category is amp_backends.AmpWarning], flush=True)\n"
                  + BF16_STEP)
    assert ours.returncode == 0, ours.stderr[-1500:]
    assert "unsafe" in ours.stdout and "aborts" in ours.stdout and "policy float32 loss" in ours.stdout

    # And strict mode raises a clear error instead (the process survives to handle it).
    strict = python("import amp_backends\nfrom amp_backends.errors import UnsupportedRequestError\n"
                    "try:\n    amp_backends.auto_configure(policy='bf16', strict=True)\n"
                    "except UnsupportedRequestError as e:\n    print('refused:', e)\n")
    assert strict.returncode == 0 and "refused: policy=mixed_bfloat16" in strict.stdout and "unsafe" in strict.stdout

    # From the environment, as a user of the example would.
    env = python("import amp_backends; print(amp_backends.auto_configure(verbose=False).policy)", AMP_POLICY="bf16")
    assert env.returncode == 0 and env.stdout.strip().endswith("float32")


@pytest.mark.parametrize("mode", ["none", "fixed:256", "dynamic"])
def test_trainer_trains_mnist_and_gan_with_each_loss_scaling_mode(mode):
    """Runs on Keras 3 (TF 2.21) and, in the 'intel' session, on Keras 2 with ITEX loaded."""
    import amp_backends
    import tensorflow as tf
    from amp_backends.data import synthetic_mnist
    from amp_backends.models import gan_discriminator, gan_generator, mnist_cnn
    from amp_backends.training import Trainer, classifier_updates, gan_updates, mnist_batch_fn

    plan = amp_backends.auto_configure(loss_scale=mode, verbose=False)
    assert plan.loss_scale.mode == mode.split(":")[0]
    (x, y), _ = synthetic_mnist(48, 8)
    m, opt = mnist_cnn(), tf.keras.optimizers.Adam(1e-3)
    r = Trainer(classifier_updates(m, opt), plan, batch_size=8, checkpoint_objects={"m": m}, batch_fn=mnist_batch_fn,
                progress=False, steps_per_call=2).fit(x, y, epochs=1, max_steps=4)
    assert r.steps == 4 and np.isfinite(r.last_losses["model"]) and r.skipped == {"model": 0}
    expected_scale = {"none": 1.0, "fixed:256": 256.0, "dynamic": 2.0**15}[mode]
    assert r.loss_scales == {"model": expected_scale}
    g, d = gan_generator(), gan_discriminator()
    go, do = tf.keras.optimizers.Adam(1e-3), tf.keras.optimizers.RMSprop(1e-4)
    r = Trainer(gan_updates(g, d, go, do), plan, batch_size=8, images_per_step=16, checkpoint_objects={"g": g},
                batch_fn=mnist_batch_fn, progress=False).fit(x, None, epochs=1, max_steps=2)
    assert r.steps == 2 and all(np.isfinite(v) for v in r.last_losses.values())


XPU_APPLY = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import intel_extension_for_tensorflow as itex
import tensorflow as tf
from amp_backends.apply import apply_plan
from amp_backends.planner import make_plan
from amp_backends.registry import default_registry
from amp_backends.request import build_request
from fakes import AMD_HERE, MAX1550, cpu_of, intel, machine

reg = default_registry()
hw = machine(intel(MAX1550), cpu_of(AMD_HERE))
plan = make_plan(hw, build_request(reg.names(), environ={}, graph_amp=True), reg)
notes = apply_plan(plan, reg)
cfg = itex.get_config()
out = dict(plan=[plan.backend, plan.policy, plan.graph_amp, plan.vendor_setting("ITEX_FP32_MATH_MODE"), plan.xla],
           notes=notes, amp=cfg.graph_options.auto_mixed_precision == itex.ON,
           dtype=cfg.graph_options.auto_mixed_precision_options.data_type == itex.BFLOAT16,
           math=os.environ.get("ITEX_FP32_MATH_MODE"), keras=tf.keras.mixed_precision.global_policy().name)
plain = make_plan(hw, build_request(reg.names(), environ={}), reg)
apply_plan(plain, reg)
out["plain_keras"] = tf.keras.mixed_precision.global_policy().name
print(json.dumps(out))
"""


@needs_itex
def test_xpu_plan_is_applied_through_itex_python_api():
    """A fake Data Center GPU Max plan with ITEX auto mixed precision, applied with ITEX's real API.

    In a subprocess: ITEX reads ITEX_FP32_MATH_MODE once, and TF32 math on this CPU would abort later tests.
    """
    env = {k: v for k, v in os.environ.items() if k != "ITEX_FP32_MATH_MODE"}  # a value set by hand wins over a plan
    out = subprocess.run([sys.executable, "-c", XPU_APPLY, str(TESTS)], capture_output=True, text=True,
                         timeout=300, cwd=NEUTRAL_CWD, env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["plan"] == ["intel", "float32", "bfloat16", "TF32", False]
    # ITEX's own configuration API confirms the graph rewrite; the math mode has no read-back API: ITEX reads the
    # variable when it builds kernels, so applying must have set it by then (its effect: test_bf32_math_mode_...)
    assert d["amp"] and d["dtype"] and d["math"] == "TF32" and d["keras"] == "float32"
    assert "ITEX auto mixed precision on (BFLOAT16)" in d["notes"]
    assert d["plain_keras"] == "mixed_bfloat16"


BF32_MATMUL = """
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import tensorflow as tf
from amp_backends.apply import apply_plan
from amp_backends.planner import make_plan
from amp_backends.registry import default_registry
from amp_backends.request import build_request
from fakes import SAPPHIRE_RAPIDS, cpu_of, machine

reg = default_registry()
if sys.argv[2] == "plan":
    plan = make_plan(machine(cpu_of(SAPPHIRE_RAPIDS, itex=True)), build_request(reg.names(), environ={}), reg)
    apply_plan(plan, reg)
rng = np.random.default_rng(0)
a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
ref = a.astype(np.float64) @ b.astype(np.float64)
matmul = tf.function(lambda x, y: tf.matmul(x, y))  # ITEX's math mode applies to graphs (steps), not eager ops
print(json.dumps(float(np.abs(matmul(a, b).numpy() - ref).max() / np.abs(ref).max())))
"""


@needs_itex
@pytest.mark.skipif(not cpu_has_amx(),
                    reason="ITEX's BF32 math mode changes float32 matmuls only on AMX CPUs; this CPU has no AMX")
def test_bf32_math_mode_really_runs_float32_matmuls_in_bf16():
    def error(mode):
        out = subprocess.run([sys.executable, "-c", BF32_MATMUL, str(TESTS), mode], capture_output=True,
                             text=True, timeout=300, cwd=NEUTRAL_CWD,
                             env={k: v for k, v in os.environ.items() if k != "ITEX_FP32_MATH_MODE"})
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert error("none") < 1e-5 < 1e-4 < error("plan")  # float32 accuracy, then bfloat16's (8-bit mantissa)


@needs_itex
@pytest.mark.skipif(cpu_has_bf16(), reason="this CPU has bf16 instructions: nothing to skip")
def test_bench_skips_the_configuration_that_would_abort(tmp_path):
    out = subprocess.run([sys.executable, "-m", "amp_backends.bench", "--models", "mnist",
                          "--configs", "fp32,bf16,bf16+XLA", "--epochs", "1", "--samples", "32", "--mnist-batch", "16",
                          "--no-fit", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=NEUTRAL_CWD,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["config"]: r for r in json.loads((tmp_path / "bench.json").read_text())["results"]}
    assert rows["fp32"]["img_per_s"] > 0
    for c in ("bf16", "bf16+XLA"):
        assert rows[c]["img_per_s"] is None
        assert rows[c]["error"].startswith("skipped, unsafe here") and "aborts" in rows[c]["error"]


def test_itex_auto_mixed_precision_left_in_the_environment_beside_a_mixed_policy_is_said_with_the_fix():
    """ITEX's guide switches its graph rewrite on with ITEX_AUTO_MIXED_PRECISION=1; left in a job script beside the
    plan's Keras mixed policy, the model was cast twice without a word."""
    from amp_backends.backends.intel.itex import amp_variable_beside

    said = amp_variable_beside("mixed_bfloat16", {"ITEX_AUTO_MIXED_PRECISION": "1",
                                                  "ITEX_AUTO_MIXED_PRECISION_DATA_TYPE": "BFLOAT16"})
    assert said and "turns float32 ops to BFLOAT16 beside the plan's Keras policy mixed_bfloat16" in said
    assert ("Fix: use one of the two, not both: unset ITEX_AUTO_MIXED_PRECISION (and "
            "ITEX_AUTO_MIXED_PRECISION_DATA_TYPE) to keep the plan's policy") in said
    assert amp_variable_beside("float32", {"ITEX_AUTO_MIXED_PRECISION": "1"}) is None  # ITEX's rewrite alone
    assert amp_variable_beside("mixed_bfloat16", {"ITEX_AUTO_MIXED_PRECISION": "0"}) is None
    assert amp_variable_beside("mixed_bfloat16", {}) is None


@needs_itex
def test_the_plan_warns_of_itex_auto_mixed_precision_left_on_where_itex_is_loaded(monkeypatch):
    """Where ITEX cannot run bfloat16 (no bf16 instructions: the plan falls back to float32), there is nothing to
    say: the warning is asserted absent there."""
    import warnings

    import amp_backends
    from helpers import applied_plan

    monkeypatch.setenv("ITEX_AUTO_MIXED_PRECISION", "1")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            plan = applied_plan("mixed_bfloat16", force=True)
        said = [w for w in seen if "ITEX_AUTO_MIXED_PRECISION=1 is set in the environment" in str(w.message)]
        assert len(said) == int(plan.policy.startswith("mixed_")), (plan.policy, [str(w.message) for w in seen])
    finally:
        monkeypatch.delenv("ITEX_AUTO_MIXED_PRECISION")
        amp_backends.auto_configure(verbose=False, policy="float32")


@pytest.mark.parametrize("set_to, tf32, reason", [
    ("FP32", False, "ITEX_FP32_MATH_MODE=FP32 is set in the environment and is kept: float32 matmuls run in FP32"),
    ("garbage", False, "ITEX_FP32_MATH_MODE=garbage is set in the environment, and ITEX reads only FP32, TF32, BF32"),
    ("bf32", True, "ITEX's BF32 math mode"),
    (None, True, "ITEX's BF32 math mode"),
])
def test_the_plan_says_the_itex_math_mode_the_user_set_which_is_kept(set_to, tf32, reason):
    """ITEX_FP32_MATH_MODE=FP32 set by the user was kept, but the plan, info and the check said tf32=on and BF32;
    a value ITEX does not read was accepted without a word."""
    from amp_backends.planner import make_plan
    from amp_backends.registry import default_registry
    from amp_backends.request import build_request
    from fakes import SAPPHIRE_RAPIDS, cpu_of, machine

    reg = default_registry()
    environ = {} if set_to is None else {"ITEX_FP32_MATH_MODE": set_to}
    hw = machine(cpu_of(SAPPHIRE_RAPIDS, itex=True, environ=environ))
    plan = make_plan(hw, build_request(reg.names(), environ={}), reg)
    assert plan.tf32 is tf32 and reason in plan.reasons["tf32"], plan.reasons["tf32"]
    assert (plan.vendor_setting("ITEX_FP32_MATH_MODE") == "BF32") is tf32


def test_a_later_plan_with_tf32_off_unsets_the_math_mode_an_earlier_plan_set_and_keeps_the_users(monkeypatch):
    """auto_configure() then auto_configure(tf32='off') in one process (a notebook) said tf32=off, and ITEX went on
    running float32 matmuls in BF32: the variable the first plan set stayed (ITEX reads it for each kernel it
    builds). The user's own value is never taken for the plan's, nor unset."""
    from amp_backends.backends.intel import itex
    from amp_backends.errors import AmpWarning

    monkeypatch.setattr(itex, "_SET_BY_PLAN", {})
    env: dict[str, str] = {}
    assert itex.apply_math_mode("BF32", env) == "ITEX_FP32_MATH_MODE=BF32" and env["ITEX_FP32_MATH_MODE"] == "BF32"
    assert "unset (tf32=off)" in itex.apply_math_mode(None, env) and "ITEX_FP32_MATH_MODE" not in env
    assert itex.apply_math_mode(None, env) is None
    env["ITEX_FP32_MATH_MODE"] = "FP32"  # the user's own: kept, either way
    assert "set by the user is kept (the plan would use BF32)" in itex.apply_math_mode("BF32", env)
    assert "set by the user is kept" in itex.apply_math_mode(None, env) and env["ITEX_FP32_MATH_MODE"] == "FP32"
    env["ITEX_FP32_MATH_MODE"] = "BF32"  # the user's, and the plan's too: still the user's
    assert "set by the user is kept" in itex.apply_math_mode("BF32", env) and not itex._SET_BY_PLAN
    with pytest.warns(AmpWarning, match=r"ITEX_FP32_MATH_MODE=BF32 set in the environment is kept: float32 matmuls "
                                        r"run in BF32, although the plan's tf32 is off\. Fix: unset"):
        itex.apply_math_mode(None, env)
    assert env["ITEX_FP32_MATH_MODE"] == "BF32"
