"""graph_amp: the backend rewrites the float32 graph to low precision itself, instead of a Keras dtype policy.

Each backend says what its rewrite is (the assessment's ``graph_amp`` Support) and applies it: ITEX's auto mixed
precision on Intel XPUs, TensorFlow's grappler bfloat16 rewrite for oneDNN on CPUs with bf16 instructions, none
on NVIDIA GPUs (the Keras policy is the supported path there). ``itex_amp`` is its old name, for one release.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest

from amp_backends.assessment import NATIVE, UNSUPPORTED, Assessment, Support
from amp_backends.evidence import RESULTS_DIR
from amp_backends.backends.cpu.rules import GRAPPLER_BF16
from amp_backends.errors import UnsupportedRequestError
from amp_backends.request import build_request

from fakes import (AMD_HERE, GRAVITON3, H100, MAX1550, SAPPHIRE_RAPIDS, ZEN4, cpu_of, intel, machine, nvidia,
                   plan_of)

pytestmark = pytest.mark.intel

ZOO = "zoo-xeon-amx/peers/zoo.json"
# the AMX Xeon of results/zoo-xeon-amx, as its KVM guest reports it (the CPU the committed zoo run names)
XEON_AMX_KVM = {"device_name": "Intel(R) Xeon(R) Processor", "family": 6, "model_number": 0xA7, "logical_cores": 2}


def xeon_amx():
    from amp_backends.devices import device_hardware, find_device

    return device_hardware(replace(find_device("sapphire-rapids"), **XEON_AMX_KVM))


# ------------------------------------------------------------------------------------------------ each backend
def test_cpu_with_bf16_and_onednn_rewrites_the_float32_graph_with_grappler(registry):
    p = plan_of(machine(cpu_of(SAPPHIRE_RAPIDS)), registry, graph_amp="on")
    assert (p.policy, p.graph_amp, p.compute_dtype, p.loss_scale.mode) == ("float32", "bfloat16", "float32", "none")
    assert p.float32_layers == () and p.warnings == ()
    assert [(s.name, s.value) for s in p.vendor_settings] == [(GRAPPLER_BF16, "on")]
    assert GRAPPLER_BF16 in p.decision("graph_amp").detail and "grappler" in p.decision("graph_amp").detail
    assert p.assessment.graph_amp.level == NATIVE and p.assessment.graph_amp_dtypes == ("bfloat16",)
    # a float32 policy asked for: the rewrite still targets the CPU's best native type
    assert plan_of(machine(cpu_of(ZEN4)), registry, graph_amp="on", policy="float32").graph_amp == "bfloat16"
    # not asked for: the plan is the Keras policy's, as ever
    default = plan_of(machine(cpu_of(SAPPHIRE_RAPIDS)), registry)
    assert default.policy == "mixed_bfloat16" and default.graph_amp is None and default.vendor_settings == ()


def test_the_cpu_rewrite_quotes_the_committed_zoo_run_of_its_cpu_kind(registry):
    p = plan_of(xeon_amx(), registry, graph_amp="on")
    detail, support = p.decision("graph_amp").detail, p.assessment.graph_amp
    doc = json.loads((RESULTS_DIR / ZOO).read_text())
    assert f"results/{ZOO}" in detail and "Sapphire Rapids or later, AMX" in detail
    for model in doc["models"]:  # every figure quoted is the committed file's
        figures = {n: c["samples_per_s"]["median"] for n, c in model["configs"].items()}
        quoted = (f"fp32 grappler-bf16 {figures['fp32 grappler-bf16']:.0f} samples/s, fp32 {figures['fp32']:.0f}, "
                  f"bf16 {figures['bf16']:.0f}")
        assert f"{model['model']}: measured on" in detail and quoted in detail, (model["model"], detail)
        ratio = figures["fp32 grappler-bf16"] / figures["fp32"]
        assert f"~{ratio:.1f}x float32's speed on {model['model']}" in support.short
    assert {e.file for e in p.decision("graph_amp").evidence} == {f"results/{ZOO}"}
    assert len(p.decision("graph_amp").evidence) == len(doc["models"])


def test_a_cpu_kind_without_a_zoo_run_says_it_was_not_measured(registry):
    support = plan_of(machine(cpu_of(ZEN4)), registry, graph_amp="on").assessment.graph_amp
    assert support.level == NATIVE and "not measured on a CPU like this one" in support.why
    assert "--configs peers" in support.why and support.evidence == ()


@pytest.mark.parametrize("cpu,why", [
    (cpu_of(AMD_HERE), "no bf16 instructions"),
    (cpu_of(ZEN4, environ={"TF_ENABLE_ONEDNN_OPTS": "0"}), "oneDNN is off"),
    (cpu_of(SAPPHIRE_RAPIDS, itex=True), "ITEX is loaded"),  # as before: ITEX's own AMP is the Intel XPUs' setting
])
def test_elsewhere_the_cpu_says_why_it_has_no_rewrite_and_keeps_the_keras_policy(registry, cpu, why):
    auto = plan_of(machine(cpu), registry)
    p = plan_of(machine(cpu), registry, graph_amp="on")
    assert p.assessment.graph_amp.level == UNSUPPORTED and why in p.assessment.graph_amp.why
    assert p.graph_amp is None and (p.policy, p.vendor_settings) == (auto.policy, auto.vendor_settings)
    assert len(p.warnings) == 1 and p.warnings[0].startswith("graph_amp=on (from argument) is not supported here")
    assert why in p.warnings[0]
    with pytest.raises(UnsupportedRequestError, match="graph_amp=on"):
        plan_of(machine(cpu), registry, graph_amp="on", strict=True)


def test_a_policy_the_rewrite_cannot_target_keeps_the_keras_policy_and_says_so(registry):
    # float16 is functional on this Arm CPU: honoured when asked for, but the CPU's rewrite makes bfloat16 only
    p = plan_of(machine(cpu_of(GRAVITON3, arch="aarch64")), registry, graph_amp="on", policy="fp16")
    assert p.policy == "mixed_float16" and p.graph_amp is None and p.vendor_settings == ()
    assert any(w.startswith("graph_amp=on (from argument) ignored: the backend's graph rewrite targets bfloat16, "
                            "not the policy's float16") for w in p.warnings), p.warnings
    with pytest.raises(UnsupportedRequestError, match=r"graph_amp=on \(from argument\) cannot be honoured.*Fix"):
        plan_of(machine(cpu_of(GRAVITON3, arch="aarch64")), registry, graph_amp="on", policy="fp16", strict=True)


def test_nvidia_offers_no_rewrite_the_keras_policy_is_the_supported_path(registry):
    h100 = machine(nvidia(H100), cpu_of(AMD_HERE))
    p = plan_of(h100, registry, graph_amp="on")
    assert p.graph_amp is None and p.policy == "mixed_float16" and p.vendor_settings == ()
    assert p.assessment.graph_amp.level == UNSUPPORTED
    assert "Keras mixed_float16 policy" in p.warnings[0] and "supported path" in p.warnings[0]
    assert p.decisions == plan_of(h100, registry).decisions


def test_intel_xpus_rewrite_with_itex_as_before(registry):
    p = plan_of(machine(intel(MAX1550), cpu_of(AMD_HERE)), registry, graph_amp="on")
    assert (p.policy, p.graph_amp, p.vendor_setting("itex_auto_mixed_precision")) == ("float32", "bfloat16",
                                                                                       "BFLOAT16")
    assert "ITEX's Advanced Auto Mixed Precision" in p.decision("graph_amp").detail


def test_a_backend_that_declares_no_rewrite_gets_the_neutral_default_and_bad_types_break_the_contract():
    support = Support(NATIVE, "fine")
    a = Assessment("x", ("/X:0",), {p: support for p in ("float32", "mixed_float16", "mixed_bfloat16")},
                   ("float32",), support, support, False)
    assert a.graph_amp.level == UNSUPPORTED and "ITEX" not in a.graph_amp.why and a.contract_errors() == []
    assert any("graph_amp_dtypes" in e for e in replace(a, graph_amp_dtypes=("float8",)).contract_errors())
    assert any("graph_amp_dtypes" in e for e in replace(a, graph_amp_dtypes=()).contract_errors())


# ------------------------------------------------------------------------------------- the option, old name too
def test_the_option_from_keyword_and_environment():
    names = ("nvidia", "intel", "cpu")
    assert build_request(names, environ={}, graph_amp="on").graph_amp is True
    env = build_request(names, environ={"AMP_GRAPH_AMP": "on"})
    assert env.graph_amp is True and env.sources == {"graph_amp": "AMP_GRAPH_AMP"}
    assert env.overrides() == {"graph_amp": "on"} and env.to_dict()["graph_amp"] is True
    assert build_request(names, environ={}).graph_amp is False


def test_itex_amp_still_works_for_one_release_with_a_warning_naming_graph_amp():
    names = ("nvidia", "intel", "cpu")
    with pytest.warns(DeprecationWarning, match="itex_amp is deprecated: use graph_amp"):
        old = build_request(names, environ={}, itex_amp="on")
    assert old == build_request(names, environ={}, graph_amp="on") and old.sources == {"graph_amp": "argument"}
    with pytest.warns(FutureWarning, match="AMP_ITEX_AMP is deprecated: use AMP_GRAPH_AMP"):
        env = build_request(names, environ={"AMP_ITEX_AMP": "1"})
    assert env.graph_amp is True and env.sources == {"graph_amp": "AMP_ITEX_AMP"}
    with pytest.warns(DeprecationWarning):  # the new name, given the same way, wins
        assert build_request(names, environ={}, graph_amp="off", itex_amp="on").graph_amp is False
    with pytest.warns(DeprecationWarning):  # a keyword beats a variable, whatever its name
        assert build_request(names, environ={"AMP_GRAPH_AMP": "off"}, itex_amp="on").graph_amp is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_request(names, environ={}, graph_amp="on")  # the new name warns nothing


def test_plan_for_with_the_old_keyword_plans_as_the_new_one(registry):
    import amp_backends

    with pytest.warns(DeprecationWarning, match="use graph_amp") as caught:
        old = amp_backends.plan_for(device="max1550", itex_amp="on")
    assert caught[0].filename == __file__  # the warning points at the caller
    new = amp_backends.plan_for(device="max1550", graph_amp="on")
    assert old.to_dict() == new.to_dict() and old.graph_amp == "bfloat16"


def test_the_report_names_the_old_variable_in_force_and_plans_with_it():
    from amp_backends.commands.capability_report import collect

    with pytest.warns(FutureWarning, match="use AMP_GRAPH_AMP"):
        d = collect(use_tensorflow=False, environ={"AMP_ITEX_AMP": "on"}, device="max1550").data
    assert d["overrides"] == {"AMP_ITEX_AMP": "on"} and d["plan"]["overrides"] == {"graph_amp": "on"}
    assert d["plan"]["graph_amp"] == "bfloat16"


def test_the_old_command_line_flag_is_hidden_and_still_taken():
    from typer.testing import CliRunner

    from amp_backends.commands.typer_app import make_app, with_overrides

    seen = {}

    @with_overrides()
    def show(overrides=None) -> None:
        seen.update(overrides)

    app = make_app()
    app.command()(show)
    with pytest.warns(FutureWarning, match="--itex-amp is deprecated: use --graph-amp"):
        result = CliRunner().invoke(app, ["--itex-amp", "on"])
    assert result.exit_code == 0, result.output
    assert seen == {"graph_amp": "on"}
    help_text = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "--graph-amp" in help_text and "--itex-amp" not in help_text


# ---------------------------------------------------------------------------------------- applied, for real
@pytest.mark.tensorflow
def test_applied_here_the_rewrite_runs_a_float32_models_matmul_in_bfloat16():
    tf = pytest.importorskip("tensorflow")
    import numpy as np

    import amp_backends
    from amp_backends import keras_compat

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = amp_backends.auto_configure(graph_amp="on", verbose=False)
    options = tf.config.optimizer.get_experimental_options()
    if p.backend != "cpu" or p.assessment.graph_amp.level != NATIVE:
        assert p.graph_amp is None and not options.get(GRAPPLER_BF16)
        assert any("graph_amp=on" in str(w.message) for w in caught)
        pytest.skip(f"no graph rewrite on this machine's {p.backend} plan: {p.assessment.graph_amp.why}")
    assert (p.policy, p.graph_amp, keras_compat.global_policy_name(tf)) == ("float32", "bfloat16", "float32")
    assert options.get(GRAPPLER_BF16) is True

    keras = tf.keras
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype("float32")
    layer = keras.layers.Dense(128, use_bias=False)
    layer.build((None, 256))
    kernel = layer.kernel.numpy()
    exact = x.astype("float64") @ kernel.astype("float64")
    graph = tf.function(lambda t: layer(t))(tf.constant(x)).numpy()
    assert graph.dtype == np.float32 and layer.kernel.dtype == "float32"  # float32 in, float32 out and kept
    error = np.abs(graph - exact).max() / np.abs(exact).max()
    assert 1e-4 < error < 3e-2, error  # bfloat16's 8-bit mantissa, not float32's 24 (~1e-7)

    again = amp_backends.auto_configure(verbose=False)  # a plan without the rewrite turns it off again
    assert again.graph_amp is None and not tf.config.optimizer.get_experimental_options().get(GRAPPLER_BF16)


@pytest.mark.tensorflow
def test_the_suite_restores_the_grappler_rewrite_a_test_leaves_on():
    tf = pytest.importorskip("tensorflow")
    from conftest import global_state_kept

    before = bool(tf.config.optimizer.get_experimental_options().get(GRAPPLER_BF16))
    with pytest.MonkeyPatch.context() as patch, global_state_kept(patch):
        tf.config.optimizer.set_experimental_options({GRAPPLER_BF16: not before})
    assert bool(tf.config.optimizer.get_experimental_options().get(GRAPPLER_BF16)) is before


@pytest.mark.tensorflow
@pytest.mark.parametrize("users", [True, False])
def test_a_plan_puts_the_rewrite_back_as_it_found_it_and_never_turns_off_the_users(users):
    tf = pytest.importorskip("tensorflow")
    from amp_backends.backends.cpu.backend import grappler_rewrite

    options = tf.config.optimizer.get_experimental_options
    tf.config.optimizer.set_experimental_options({GRAPPLER_BF16: users})  # the user's choice, before any plan
    grappler_rewrite(tf, GRAPPLER_BF16, True)
    assert options().get(GRAPPLER_BF16) is True
    grappler_rewrite(tf, GRAPPLER_BF16, True)  # a second plan with the rewrite: nothing to remember twice
    grappler_rewrite(tf, GRAPPLER_BF16, False)  # a plan without it: as the user had it
    assert bool(options().get(GRAPPLER_BF16)) is users
    grappler_rewrite(tf, GRAPPLER_BF16, False)  # and a plan without it leaves the user's alone
    assert bool(options().get(GRAPPLER_BF16)) is users
