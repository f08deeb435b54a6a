"""Decision tables over fake hardware: every rule of the plan, no TensorFlow needed."""

from __future__ import annotations

import json

import pytest

from amp_backends.errors import UnsupportedRequestError
from amp_backends.assessment import NATIVE, UNSAFE
from amp_backends.request import LossScale

from conftest import REPO
from fakes import (A100, AMD_HERE, ARC_A770, FLEX170, CORTEX_A72, GRAVITON3, GRAVITON4, GTX1660TI, H100, ICELAKE,
                   IRIS_XE, MAX1550, P100, RTX4090, SAPPHIRE_RAPIDS, T4, V100, ZEN4, cpu_of, intel, machine, nvidia,
                   plan_of)

pytestmark = pytest.mark.intel


HERE = cpu_of(AMD_HERE)

# name, hardware, backend, policy, loss scale, tf32, xla, devices
TABLE = [
    ("P100", machine(nvidia(P100), HERE), "nvidia", "float32", "none", False, True, ("/GPU:0",)),
    ("V100", machine(nvidia(V100), HERE), "nvidia", "mixed_float16", "dynamic", False, True, ("/GPU:0",)),
    ("T4", machine(nvidia(T4), HERE), "nvidia", "mixed_float16", "dynamic", False, True, ("/GPU:0",)),
    ("GTX 1660 Ti", machine(nvidia(GTX1660TI), HERE), "nvidia", "float32", "none", False, True, ("/GPU:0",)),
    ("A100", machine(nvidia(A100), HERE), "nvidia", "mixed_float16", "dynamic", True, True, ("/GPU:0",)),
    ("RTX 4090", machine(nvidia(RTX4090), HERE), "nvidia", "mixed_float16", "dynamic", True, True, ("/GPU:0",)),
    ("H100", machine(nvidia(H100), HERE), "nvidia", "mixed_float16", "dynamic", True, True, ("/GPU:0",)),
    ("2x H100", machine(nvidia(H100, H100), HERE), "nvidia", "mixed_float16", "dynamic", True, True,
     ("/GPU:0", "/GPU:1")),
    ("A100 + V100 follows the weakest", machine(nvidia(A100, V100), HERE), "nvidia", "mixed_float16", "dynamic",
     False, True, ("/GPU:0", "/GPU:1")),
    ("Data Center GPU Max", machine(intel(MAX1550), cpu_of(SAPPHIRE_RAPIDS)), "intel", "mixed_bfloat16", "none",
     True, False, ("/XPU:0",)),
    ("Flex 170", machine(intel(FLEX170), HERE), "intel", "mixed_bfloat16", "none", False, False, ("/XPU:0",)),
    ("Arc A770", machine(intel(ARC_A770), HERE), "intel", "mixed_bfloat16", "none", False, False, ("/XPU:0",)),
    ("Iris Xe (no XMX)", machine(intel(IRIS_XE), HERE), "intel", "mixed_float16", "dynamic", False, False,
     ("/XPU:0",)),
    ("Sapphire Rapids (AMX)", machine(cpu_of(SAPPHIRE_RAPIDS)), "cpu", "mixed_bfloat16", "none", False, False,
     ("/CPU:0",)),
    ("Sapphire Rapids + ITEX: BF32", machine(cpu_of(SAPPHIRE_RAPIDS, itex=True)), "cpu", "mixed_bfloat16", "none",
     True, False, ("/CPU:0",)),
    ("Ice Lake (AVX-512, no bf16)", machine(cpu_of(ICELAKE)), "cpu", "float32", "none", False, False, ("/CPU:0",)),
    ("AMD EPYC Zen 1 (AVX2, oneDNN off by default)", machine(HERE), "cpu", "float32", "none", False, False,
     ("/CPU:0",)),
    ("AMD EPYC Zen 1 with ITEX", machine(cpu_of(AMD_HERE, itex=True)), "cpu", "float32", "none", False, False,
     ("/CPU:0",)),
    ("Arm with bf16 (Graviton3)", machine(cpu_of(GRAVITON3, arch="aarch64")), "cpu", "mixed_bfloat16", "none",
     False, False, ("/CPU:0",)),
    ("Arm without bf16", machine(cpu_of(CORTEX_A72, arch="aarch64")), "cpu", "float32", "none", False, False,
     ("/CPU:0",)),
    # bfloat16 only where oneDNN runs it: TensorFlow's default for the CPU, or TF_ENABLE_ONEDNN_OPTS
    ("Zen 4 (bf16, oneDNN on by default)", machine(cpu_of(ZEN4)), "cpu", "mixed_bfloat16", "none", False, False,
     ("/CPU:0",)),
    ("Zen 4, TF_ENABLE_ONEDNN_OPTS=0", machine(cpu_of(ZEN4, environ={"TF_ENABLE_ONEDNN_OPTS": "0"})),
     "cpu", "float32", "none", False, False, ("/CPU:0",)),
    ("Zen 4, TF_ENABLE_ONEDNN_OPTS=False", machine(cpu_of(ZEN4, environ={"TF_ENABLE_ONEDNN_OPTS": "False"})),
     "cpu", "float32", "none", False, False, ("/CPU:0",)),
    ("Zen 4, TF_ENABLE_ONEDNN_OPTS=yes (ignored by TF)",
     machine(cpu_of(ZEN4, environ={"TF_ENABLE_ONEDNN_OPTS": "yes"})),
     "cpu", "mixed_bfloat16", "none", False, False, ("/CPU:0",)),
    ("Sapphire Rapids, TF_ENABLE_ONEDNN_OPTS=0",
     machine(cpu_of(SAPPHIRE_RAPIDS, environ={"TF_ENABLE_ONEDNN_OPTS": "0"})),
     "cpu", "float32", "none", False, False, ("/CPU:0",)),
    ("Sapphire Rapids + ITEX, TF_ENABLE_ONEDNN_OPTS=0: ITEX's own oneDNN",
     machine(cpu_of(SAPPHIRE_RAPIDS, itex=True, environ={"TF_ENABLE_ONEDNN_OPTS": "0"})),
     "cpu", "mixed_bfloat16", "none", True, False, ("/CPU:0",)),
    ("Arm bf16, oneDNN off by default (Neoverse V2)", machine(cpu_of(GRAVITON4, arch="aarch64")),
     "cpu", "float32", "none", False, False, ("/CPU:0",)),
    ("Arm bf16, TF_ENABLE_ONEDNN_OPTS=1 (Neoverse V2)",
     machine(cpu_of(GRAVITON4, arch="aarch64", environ={"TF_ENABLE_ONEDNN_OPTS": "1"})),
     "cpu", "mixed_bfloat16", "none", False, False, ("/CPU:0",)),
    ("Apple silicon: no oneDNN build", machine(cpu_of(GRAVITON3, arch="arm64", system="darwin",
                                                      environ={"TF_ENABLE_ONEDNN_OPTS": "1"})),
     "cpu", "float32", "none", False, False, ("/CPU:0",)),
    ("H100 beats an Intel XPU and an AMX CPU", machine(nvidia(H100), intel(MAX1550), cpu_of(SAPPHIRE_RAPIDS)), "nvidia",
     "mixed_float16", "dynamic", True, True, ("/GPU:0",)),
    ("XPU beats the CPU", machine(intel(MAX1550), HERE), "intel", "mixed_bfloat16", "none", True, False, ("/XPU:0",)),
]


@pytest.mark.parametrize("name,hw,backend,policy,loss,tf32,xla,devices", TABLE, ids=[t[0] for t in TABLE])
def test_decision_table(registry, name, hw, backend, policy, loss, tf32, xla, devices):
    p = plan_of(hw, registry)
    got = (p.backend, p.policy, p.loss_scale.mode, p.tf32, p.xla, p.devices)
    assert got == (backend, policy, loss, tf32, xla, devices)
    assert p.warnings == ()
    assert set(p.reasons) >= {"policy", "loss_scale", "tf32", "xla"}
    assert all(p.reasons.values())
    # every rejected policy says why it lost
    rejected = {r.value for r in p.rejected if r.setting == "policy"}
    assert rejected == {"float32", "mixed_float16", "mixed_bfloat16"} - {policy}
    assert all(r.why for r in p.rejected)


def test_this_cpu_reason_names_missing_bf16(registry):
    p = plan_of(machine(HERE), registry)
    bf16 = next(r for r in p.rejected if r.value == "mixed_bfloat16")
    assert "no bf16 instructions" in bf16.why and "avx512_bf16" in bf16.why


def test_itex_math_mode_is_a_vendor_setting(registry):
    math = "ITEX_FP32_MATH_MODE"
    xpu = plan_of(machine(intel(MAX1550), HERE), registry)
    assert xpu.vendor_setting(math) == "TF32" and "XMX" in xpu.vendor_settings[0].why
    assert plan_of(machine(cpu_of(SAPPHIRE_RAPIDS, itex=True)), registry).vendor_setting(math) == "BF32"
    assert plan_of(machine(cpu_of(SAPPHIRE_RAPIDS)), registry).vendor_settings == ()
    assert plan_of(machine(intel(MAX1550), HERE), registry, tf32="off").vendor_settings == ()
    assert plan_of(machine(nvidia(H100), HERE), registry).vendor_settings == ()
    # the generic plan has no vendor fields; the report and the log show the backend's settings
    assert not hasattr(xpu, "math_mode") and not hasattr(xpu, "itex_amp")
    assert xpu.to_dict()["vendor_settings"][0]["name"] == math and "ITEX_FP32_MATH_MODE=TF32" in xpu.summary()


def test_the_plan_carries_its_support_table(registry):
    p = plan_of(machine(cpu_of(AMD_HERE, itex=True)), registry)
    assert p.assessment is not None and p.assessment.backend == "cpu"
    assert p.assessment.policies["mixed_bfloat16"].level == UNSAFE
    assert p.to_dict()["support"]["policies"]["float32"]["level"] == NATIVE


def test_other_backends_are_reported(registry):
    p = plan_of(machine(nvidia(H100), intel(MAX1550), HERE), registry)
    status = {b.name: (b.available, b.selected) for b in p.backends}
    assert status == {"nvidia": (True, True), "intel": (True, False), "cpu": (True, False)}


def test_mixed_gpus_note(registry):
    p = plan_of(machine(nvidia(A100, V100), HERE), registry)
    assert any("weakest" in n for n in p.notes)
    assert "weakest" in p.reasons["policy"]


def test_cpu_only_tensorflow_build_falls_back_to_cpu(registry):
    p = plan_of(machine(nvidia(H100), HERE, tf_device_types=frozenset({"CPU"})), registry)
    assert p.backend == "cpu" and p.policy == "float32"
    nv = next(b for b in p.backends if b.name == "nvidia")
    assert not nv.available and "TensorFlow lists no GPU" in nv.reason


# --- overrides: honoured, downgraded, strict, force --------------------------------------------------

def test_bf16_on_v100_is_downgraded_with_reason(registry):
    with_v100 = machine(nvidia(V100), HERE)
    p = plan_of(with_v100, registry, policy="bf16")
    assert p.policy == "mixed_float16" and p.loss_scale.mode == "dynamic"
    assert len(p.warnings) == 1 and "policy=mixed_bfloat16" in p.warnings[0] and "CC >= 8.0" in p.warnings[0]
    with pytest.raises(UnsupportedRequestError, match="policy=mixed_bfloat16.*CC >= 8.0"):
        plan_of(with_v100, registry, policy="bf16", strict=True)
    forced = plan_of(with_v100, registry, policy="bf16", force=True)
    assert forced.policy == "mixed_bfloat16" and forced.loss_scale.mode == "none" and "force" in forced.warnings[0]


def test_fp16_on_this_cpu(registry):
    here = machine(HERE)
    p = plan_of(here, registry, policy="mixed_float16")
    assert p.policy == "float32" and "downgraded" in p.warnings[0]
    with pytest.raises(UnsupportedRequestError, match="slow"):
        plan_of(here, registry, policy="mixed_float16", strict=True)
    forced = plan_of(here, registry, policy="fp16", force=True)
    assert forced.policy == "mixed_float16" and forced.loss_scale.mode == "dynamic"


def test_a_refused_choice_of_autotune_says_how_to_take_it_back(registry):
    """A cached autotune choice the hardware cannot honour under strict said "Fix: unset autotune" (the chooser's name
    read as a variable's)."""
    from amp_backends.override_sources import keywords_chosen_by

    here = machine(HERE)
    with keywords_chosen_by("autotune", {"policy": "mixed_float16"}, "let autotune time the candidates again"):
        with pytest.raises(UnsupportedRequestError) as refused:
            plan_of(here, registry, policy="mixed_float16", strict=True)
    assert "policy=mixed_float16 (from autotune) is slow" in str(refused.value)
    assert "Fix: let autotune time the candidates again, or" in str(refused.value) and "unset" not in str(refused.value)


def test_a_refusal_says_its_fix_in_the_words_the_override_was_given_in(registry):
    """A command's options are named as flags (was ``(from argument)`` and ``force=True``), a variable as itself, a
    keyword as the Python API's; the plan's sources say the same."""
    from amp_backends.override_sources import keywords_as_options

    here = machine(HERE)
    with keywords_as_options({"policy": "mixed_float16", "strict": True}):
        with pytest.raises(UnsupportedRequestError) as flags:
            plan_of(here, registry, policy="mixed_float16", strict=True)
        p = plan_of(here, registry, policy="mixed_float16")
    assert "policy=mixed_float16 (from --policy) is slow" in str(flags.value)
    assert ("Fix: leave --policy out, or pass --force instead of --strict to run it anyway, or leave --strict out to"
            in str(flags.value))  # (force with strict is refused: they contradict)
    assert "(from --policy)" in p.warnings[0] and p.request.sources == {"policy": "--policy"}
    with pytest.raises(UnsupportedRequestError) as env:
        plan_of(here, registry, environ={"AMP_POLICY": "fp16", "AMP_STRICT": "1"})
    assert "(from AMP_POLICY)" in str(env.value) and ("Fix: unset AMP_POLICY, or set AMP_FORCE=1 instead of "
                                                      "AMP_STRICT to run it anyway, or unset AMP_STRICT to"
                                                      in str(env.value))
    with pytest.raises(UnsupportedRequestError) as keyword:
        plan_of(here, registry, policy="mixed_float16", strict=True)
    assert "(from argument)" in str(keyword.value) and "Fix: remove the override, or pass force=True instead of " \
        "strict=True to run it anyway, or turn strict off to" in str(keyword.value)


def test_bf16_with_itex_on_this_cpu_is_refused_even_with_force(registry):
    here = machine(cpu_of(AMD_HERE, itex=True))
    for kwargs in ({}, {"force": True}):
        p = plan_of(here, registry, policy="bf16", **kwargs)
        assert p.policy == "float32"
        assert "unsafe" in p.warnings[0] and "aborts" in p.warnings[0]
    with pytest.raises(UnsupportedRequestError, match="unsafe"):
        plan_of(here, registry, policy="bf16", strict=True)


def test_fp16_without_tensor_cores_is_honoured_with_warning(registry):
    p = plan_of(machine(nvidia(P100), HERE), registry, policy="fp16")
    assert p.policy == "mixed_float16" and "little or no speed-up" in p.warnings[0]


def test_loss_scale_json_carries_only_what_its_mode_uses(registry):
    h100 = machine(nvidia(H100), HERE)
    assert plan_of(h100, registry, loss_scale="none").to_dict()["loss_scale"] == {"mode": "none"}
    assert plan_of(machine(HERE), registry).to_dict()["loss_scale"] == {"mode": "none"}
    assert plan_of(h100, registry).to_dict()["loss_scale"] == {"mode": "dynamic", "initial": 2.0**15,
                                                            "growth_interval": 2000}


def test_tf32_on_a_cpu_reason_agrees_with_the_downgrade(registry):
    p = plan_of(machine(HERE), registry, environ={"AMP_TF32": "on"})
    assert p.tf32 is False and "downgraded" in p.warnings[0] and "AMP_TF32" in p.warnings[0]
    assert p.reasons["tf32"].startswith("off: the requested on (AMP_TF32) was downgraded")
    assert "as requested" not in p.reasons["tf32"]


def test_tf32_overrides(registry):
    v100 = machine(nvidia(V100), HERE)
    p = plan_of(v100, registry, tf32="on")
    assert p.tf32 is False and "tf32=on" in p.warnings[0]
    with pytest.raises(UnsupportedRequestError):
        plan_of(v100, registry, tf32=True, strict=True)
    a100 = plan_of(machine(nvidia(A100), HERE), registry, tf32="off")
    assert a100.tf32 is False and a100.warnings == () and "as requested" in a100.reasons["tf32"]


def test_xla_overrides(registry):
    assert plan_of(machine(nvidia(H100), HERE), registry, xla="off").xla is False
    on_cpu = plan_of(machine(HERE), registry, xla="on")
    assert on_cpu.xla is True and "little or no speed-up" in on_cpu.warnings[0]
    on_xpu = plan_of(machine(intel(MAX1550), HERE), registry, xla=True)
    assert on_xpu.xla is False and "not supported" in on_xpu.warnings[0]


def test_loss_scale_overrides(registry):
    h100 = machine(nvidia(H100), HERE)
    fixed = plan_of(h100, registry, loss_scale="fixed:1024")
    assert fixed.loss_scale == LossScale.fixed(1024) and fixed.warnings == ()
    none = plan_of(h100, registry, loss_scale="none")
    assert none.loss_scale.mode == "none" and "flush to zero" in none.warnings[0]
    pointless = plan_of(machine(HERE), registry, loss_scale="dynamic")
    assert pointless.loss_scale.mode == "dynamic" and "not needed" in pointless.warnings[0]


def test_backend_overrides(registry):
    h100 = machine(nvidia(H100), HERE)
    on_cpu = plan_of(h100, registry, backend="cpu")
    assert on_cpu.backend == "cpu" and on_cpu.policy == "float32" and on_cpu.devices == ("/CPU:0",)
    missing = plan_of(h100, registry, backend="intel")
    assert missing.backend == "nvidia" and "backend=intel" in missing.warnings[0]
    with pytest.raises(UnsupportedRequestError, match="backend=intel.*not available"):
        plan_of(h100, registry, backend="intel", strict=True)


def test_graph_amp_on_intel_xpus_is_itex_amp(registry):
    p = plan_of(machine(intel(MAX1550), HERE), registry, graph_amp="on")
    assert p.graph_amp == "bfloat16" and p.policy == "float32" and p.loss_scale.mode == "none"
    assert p.vendor_setting("itex_auto_mixed_precision") == "BFLOAT16"
    xe = plan_of(machine(intel(IRIS_XE), HERE), registry, graph_amp=True)
    assert xe.graph_amp == "float16" and xe.loss_scale.mode == "dynamic"
    assert xe.vendor_setting("itex_auto_mixed_precision") == "FLOAT16"
    not_intel = plan_of(machine(nvidia(H100), HERE), registry, graph_amp=True)
    assert not_intel.graph_amp is None and not_intel.vendor_settings == () and "graph_amp=on" in not_intel.warnings[0]


def test_sources_are_named_in_warnings(registry):
    p = plan_of(machine(nvidia(V100), HERE), registry, environ={"AMP_POLICY": "bf16"})
    assert "from AMP_POLICY" in p.warnings[0]


def test_plan_is_printable_and_json(registry):
    import json

    p = plan_of(machine(nvidia(H100), HERE), registry, loss_scale=512)
    d = json.loads(p.to_json())
    assert d["policy"] == "mixed_float16" and d["loss_scale"] == {"mode": "fixed", "scale": 512.0}
    assert d["overrides"] == {"loss_scale": "fixed:512"}
    assert "policy: " in str(p) and p.summary().startswith("amp_backends plan: backend=nvidia")
    assert p.compute_dtype == "float16" and d["fp8"] is False and d["steps_per_execution"] == 1
    assert {k: v for k, v in p.compile_kwargs().items() if k != "auto_scale_loss"} == {
        "jit_compile": True, "steps_per_execution": 1}


def test_training_key_covers_every_setting_that_changes_training(registry):
    xpu = machine(intel(MAX1550), HERE)
    base = plan_of(xpu, registry)
    assert base.training_key() == plan_of(xpu, registry).training_key()
    for other in (plan_of(xpu, registry, tf32="off"),  # no math mode: a vendor setting differs
                  plan_of(xpu, registry, graph_amp="on"), plan_of(xpu, registry, loss_scale="dynamic"),
                  plan_of(xpu, registry, policy="fp16")):
        assert other.training_key() != base.training_key()
    assert "ITEX_FP32_MATH_MODE=TF32" in base.training_key()


# --- oneDNN: bfloat16 only where it runs, and reasons quoting committed figures ---------------------------------

def test_onednn_switched_off_gives_float32_with_the_reason(registry):
    p = plan_of(machine(cpu_of(ZEN4, environ={"TF_ENABLE_ONEDNN_OPTS": "0"})), registry)
    assert p.policy == "float32" and p.warnings == ()
    why = p.reasons["policy"]
    assert "TF_ENABLE_ONEDNN_OPTS=0: without oneDNN, TensorFlow runs bfloat16 in Eigen" in why
    assert "slower than float32" in why and "results/cpu-policy-zen4.json" in why
    bf16 = next(r for r in p.rejected if r.value == "mixed_bfloat16")
    assert bf16.why.startswith("TF_ENABLE_ONEDNN_OPTS=0") and "before importing TensorFlow" in bf16.why
    forced = plan_of(machine(cpu_of(ZEN4, environ={"TF_ENABLE_ONEDNN_OPTS": "0"})), registry, policy="bf16")
    assert forced.policy == "float32" and "Eigen" in forced.warnings[0]


def test_too_late_to_change_onednn_once_tensorflow_is_imported(registry):
    from dataclasses import replace

    from amp_backends.backends.cpu.onednn import onednn_state

    for spec, arch, env in ((ZEN4, "x86_64", {"TF_ENABLE_ONEDNN_OPTS": "0"}), (GRAVITON4, "aarch64", {})):
        probe = cpu_of(spec, arch=arch, environ=env)
        imported = onednn_state(probe.cpu, env, system="linux", imported_answer=False)
        p = plan_of(machine(replace(probe, facts=replace(probe.facts, onednn=imported))), registry)
        assert p.policy == "float32" and "TensorFlow is already imported in this process" in p.reasons["policy"]
        assert "TensorFlow is already imported" not in plan_of(machine(probe), registry).reasons["policy"]


def test_bf16_reason_names_oneDNN_and_this_machines_figures(registry):
    p = plan_of(machine(cpu_of(ZEN4)), registry)
    assert "TensorFlow runs oneDNN" in p.reasons["policy"] and "avx512_bf16" in p.reasons["policy"]
    assert "AMD EPYC Zen 4" in p.reasons["policy"] and "results/cpu-policy-zen4.json" in p.reasons["policy"]
    fp16 = next(r for r in p.rejected if r.value == "mixed_float16")
    assert "results/cpu-policy-zen4.json" in fp16.why and "Zen 1" not in fp16.why  # this bf16 CPU's run, not Zen 1's


def test_a_cpu_without_bf16_quotes_the_zen1_run_and_leaves_onednn_as_tensorflow_does(registry):
    p = plan_of(machine(HERE), registry)
    assert "results/cpu-policy-zen1.json" in p.reasons["xla"]
    assert "oneDNN stays off, as TensorFlow's default has it" in p.reasons["policy"]
    assert "no CPU without AVX-512 was measured" in p.reasons["policy"]
    assert p.vendor_settings == ()


def _quoted_figures(text):
    """(file, configuration, figure) for every figure a reason quotes, and the text with those quotes taken out."""
    import re

    found = []
    pattern = re.compile(r"results/(?P<file>[\w./-]+\.json): (?P<figs>[^;)]*?)(?=\)|;|\. |$)")
    for m in pattern.finditer(text):
        for item in m.group("figs").split(", "):
            config, _, figure = re.sub(r" (img|samples|TFLOP)/s$", "", item).rpartition(" ")
            found.append((m.group("file"), config, figure))
    stripped = re.sub(r"measured on [^:]*?results/[\w./-]+\.json: [^;)]*?(?=\)|;|\. |$)", "", text)
    return found, stripped


def _every_cpu_reason(registry):
    cpus = [cpu_of(ZEN4), cpu_of(ZEN4, environ={"TF_ENABLE_ONEDNN_OPTS": "0"}), cpu_of(AMD_HERE),
            cpu_of(AMD_HERE, itex=True), cpu_of(SAPPHIRE_RAPIDS), cpu_of(SAPPHIRE_RAPIDS, itex=True), cpu_of(ICELAKE),
            cpu_of(GRAVITON3, arch="aarch64"), cpu_of(GRAVITON4, arch="aarch64"), cpu_of(CORTEX_A72, arch="aarch64")]
    for probe in cpus:
        a = registry.get("cpu").assess(probe, machine(probe))
        yield from (s.why for s in a.policies.values())
        yield from (a.xla.why, a.tf32.why, a.fp8.why, a.steps_per_execution_why, a.float32_layers_why)
        yield from (k.why for k in a.float32_layers)


def test_every_figure_in_a_cpu_reason_is_in_a_committed_results_file(registry):
    import json
    import re

    from amp_backends.backends.cpu.measured import RESULTS_DIR

    repo_results = REPO / "results"
    quoted = 0
    for why in _every_cpu_reason(registry):
        assert "is missing from this installation" not in why, why
        figures, rest = _quoted_figures(why)
        for file, config, figure in figures:
            doc = json.loads((RESULTS_DIR / file).read_text(encoding="utf-8"))
            assert f"{doc['results'][config]['median']:.0f}" == figure, (file, config, figure)
            if repo_results.is_dir():  # a checkout: the shipped copy is the committed one
                shipped = (RESULTS_DIR / file).read_text(encoding="utf-8")
                assert (repo_results / file).read_text(encoding="utf-8") == shipped
            quoted += 1
        # a figure: three digits or more, not part of a name (AVX-512, avx512_bf16) or a version
        assert not re.search(r"(?<![\w.-])\d{3,}(?![\w.])", rest), f"a figure outside a quoted results file: {rest}"
    assert quoted > 10


def _committed_gpu_figure(file, config):
    """The figure a GPU results file holds for ``config``, read from the file as the benchmark wrote it."""
    import json

    from amp_backends.evidence import RESULTS_DIR

    doc = json.loads((RESULTS_DIR / file).read_text(encoding="utf-8"))
    if "experiments" in doc and config.startswith("fit at "):  # the GPU suite's Keras fit at N steps per call
        steps = config.split()[2]
        return next(r["img_per_s"] for r in doc["experiments"]["keras_fit"]["rows"]
                    if r["label"].endswith(f"steps_per_execution={steps}")
                    or (steps == "1" and r["label"].endswith("compile(**plan.compile_kwargs())")))
    if "experiments" in doc:  # the GPU suite: the tutorials' loops, img/s
        return next(r["img_per_s"] for r in doc["experiments"]["bench"]["rows"] if r["label"] == config)
    return doc["peak_gflops"][config.removesuffix(" matmul")] / 1000  # the zoo's matmul peak, TFLOP/s


@pytest.mark.parametrize("gpu", [P100, V100, T4, GTX1660TI, A100, RTX4090, H100], ids=lambda g: g[0])
def test_every_figure_in_an_nvidia_reason_is_in_a_committed_results_file(registry, gpu):
    import re

    probe = nvidia(gpu)
    a = registry.get("nvidia").assess(probe, machine(probe, HERE))
    reasons = [s.why for s in a.policies.values()] + [s.short for s in a.policies.values()]
    reasons += [a.xla.why, a.xla.short, a.tf32.why, a.tf32.short, a.fp8.why, a.steps_per_execution_why]
    quoted = 0
    for why in reasons:
        assert "is missing from this installation" not in why, why
        figures, rest = _quoted_figures(why)
        for file, config, figure in figures:
            assert file.startswith(("gpu-suite-", "zoo-")), file
            assert f"{_committed_gpu_figure(file, config):.0f}" == figure, (file, config, figure)
            quoted += 1
        rest = rest.replace(gpu[0], "the GPU")  # its name may hold digits (GTX 1660 Ti)
        assert not re.search(r"(?<![\w.-])\d{3,}(?![\w.])", rest), f"a figure outside a quoted results file: {rest}"
    if gpu[1] >= (8, 0):  # float16 against bfloat16, XLA's gains, TF32 against float32: all measured
        assert quoted >= 11 and "H200" in a.xla.why and "H200" in a.tf32.why
        for support in (a.xla, a.tf32, a.policies["mixed_float16"], a.policies["mixed_bfloat16"]):
            assert support.evidence and all(e.file.startswith("results/") for e in support.evidence), support


def test_results_files_say_how_they_were_made():
    import json

    from amp_backends.backends.cpu.measured import FIT_STEPS, LAYERS, RESULTS_DIR, WITH_BF16, WITH_FP16, WITHOUT_BF16

    for file in (WITH_BF16, WITHOUT_BF16, WITH_FP16, FIT_STEPS, LAYERS):
        doc = json.loads((RESULTS_DIR / file).read_text(encoding="utf-8"))
        assert doc["machine_kind"] and doc["command"].startswith("python benchmarks/") and doc["date"]
        assert doc["versions"]["tensorflow"] and doc["results"]
        assert all(isinstance(r["median"], (int, float)) for r in doc["results"].values())


def test_the_results_the_reasons_quote_ship_in_the_wheel():
    import fnmatch

    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

    from amp_backends.backends.cpu.measured import FIT_STEPS, LAYERS, WITH_BF16, WITH_FP16, WITHOUT_BF16

    pyproject = REPO / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("no pyproject.toml beside the tests (an installed copy): the files are checked where they load")
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert config["package-dir"]["amp_backends.results"] == "results" and "amp_backends.results" in config["packages"]
    patterns = config["package-data"]["amp_backends.results"]
    from amp_backends.backends.nvidia.measured import EXPERIMENTS, GPU_SUITE, MATMUL_PEAK

    for file in (WITH_BF16, WITHOUT_BF16, WITH_FP16, FIT_STEPS, LAYERS, GPU_SUITE, EXPERIMENTS, MATMUL_PEAK):
        assert any(fnmatch.fnmatch(file, p) for p in patterns), file


def test_float16_on_a_cpu_whose_onednn_takes_it_is_emulated_and_a_request_for_it_downgraded(registry):
    """An AVX512-FP16 Xeon with oneDNN on: TensorFlow sends float16 to oneDNN, which trains it in reference kernels."""
    from amp_backends.backends.cpu.measured import WITH_FP16

    spr = machine(cpu_of(SAPPHIRE_RAPIDS))
    p = plan_of(spr, registry)
    fp16 = next(r for r in p.rejected if r.value == "mixed_float16")
    assert "reference kernels" in fp16.why and f"results/{WITH_FP16}" in fp16.why, fp16.why
    asked = plan_of(spr, registry, policy="mixed_float16")
    assert asked.policy == "mixed_bfloat16" and any("downgraded" in w and "reference kernels" in w
                                                    for w in asked.warnings), asked.warnings
    with pytest.raises(UnsupportedRequestError):
        plan_of(spr, registry, policy="mixed_float16", strict=True)
    # with oneDNN off the same CPU runs float16 in Eigen: not this rule
    off = plan_of(machine(cpu_of(SAPPHIRE_RAPIDS, environ={"TF_ENABLE_ONEDNN_OPTS": "0"})), registry)
    assert "reference kernels" not in next(r for r in off.rejected if r.value == "mixed_float16").why
    # a CPU without fp16 instructions keeps float16 in Eigen: not this rule either
    assert "reference kernels" not in next(r for r in plan_of(machine(cpu_of(ZEN4)), registry).rejected
                                           if r.value == "mixed_float16").why


def test_float16_under_itex_on_a_cpu_with_fp16_instructions_is_unsafe_even_forced(registry):
    """ITEX 2.15 on an AVX512-FP16 Xeon sends float16 to its oneDNN ops; its max-pooling gradient has no float16
    kernel, so float16 training fails: refused, and force cannot enable it."""
    spr_itex = machine(cpu_of(SAPPHIRE_RAPIDS, itex=True))
    forced = plan_of(spr_itex, registry, policy="mixed_float16", force=True)
    assert forced.policy == "mixed_bfloat16" and any("is unsafe here and was downgraded" in w for w in forced.warnings)
    with pytest.raises(UnsupportedRequestError, match="is unsafe on backend 'cpu'"):
        plan_of(spr_itex, registry, policy="mixed_float16", strict=True)
    fp16 = next(r for r in forced.rejected if r.value == "mixed_float16")
    assert "_ITEXMaxPoolGrad" in fp16.why
    # ITEX on a CPU without fp16 instructions keeps float16 out of its oneDNN ops: not this rule
    assert "_ITEXMaxPoolGrad" not in next(r for r in plan_of(machine(cpu_of(ZEN4, itex=True)), registry).rejected
                                          if r.value == "mixed_float16").why


# --------------------------------------------------------------------------- what a CPU user would pick instead
def _peers(probe, zentf=None):
    from amp_backends.backends.cpu import rules
    from amp_backends.backends.cpu.backend import CpuFacts, onednn_of

    itex = isinstance(probe.facts, CpuFacts) and probe.facts.itex_loaded
    return {p.name: p for p in rules.peers(probe.cpu, onednn_of(probe, probe.cpu), itex, zentf)}


def test_a_bf16_cpu_with_onednn_on_is_measured_against_eigen_and_tensorflows_own_bf16_rewrite():
    peers = _peers(cpu_of(ZEN4))
    assert set(peers) == {"fp32 oneDNN-off", "fp32 grappler-bf16"}
    assert peers["fp32 oneDNN-off"].env == (("TF_ENABLE_ONEDNN_OPTS", "0"),)
    assert peers["fp32 grappler-bf16"].rewrite == "auto_mixed_precision_onednn_bfloat16"
    assert all("," not in name for name in peers)  # the zoo's --configs is comma-separated


def test_a_cpu_where_tensorflow_leaves_onednn_off_is_measured_with_onednn_on_and_no_bf16_rewrite():
    peers = _peers(HERE)  # AVX2 only, as a Zen 1 or Zen 3
    assert set(peers) == {"fp32 oneDNN-on"} and peers["fp32 oneDNN-on"].env == (("TF_ENABLE_ONEDNN_OPTS", "1"),)


def test_zendnn_is_a_peer_on_an_amd_cpu_where_zentf_is_installed_and_nowhere_else():
    zen4 = _peers(cpu_of(ZEN4), zentf="2.21.0.0")
    assert zen4["fp32 ZenDNN"].env == (("TF_ENABLE_ZENDNN_OPTS", "1"), ("TF_ENABLE_ONEDNN_OPTS", "0"))
    assert ("TF_ZENDNN_PLUGIN_BF16", "1") in zen4["ZenDNN bf16-AMP"].env
    assert "fp32 ZenDNN" in _peers(HERE, zentf="2.21.0.0") and "ZenDNN bf16-AMP" not in _peers(HERE, zentf="2.21.0.0")
    assert not any("ZenDNN" in n for n in _peers(cpu_of(SAPPHIRE_RAPIDS), zentf="2.21.0.0"))  # an Intel CPU
    assert not any("ZenDNN" in n for n in _peers(cpu_of(ZEN4)))  # not installed


def test_under_itex_the_cpu_backends_peer_is_itexs_bfloat16_rewrite_where_the_cpu_has_bf16():
    itex = _peers(cpu_of(SAPPHIRE_RAPIDS, itex=True))
    assert list(itex) == ["ITEX AMP bf16"]
    assert dict(itex["ITEX AMP bf16"].env) == {"ITEX_AUTO_MIXED_PRECISION": "1",
                                               "ITEX_AUTO_MIXED_PRECISION_DATA_TYPE": "BFLOAT16"}
    assert _peers(cpu_of(ICELAKE, itex=True)) == {}  # no bf16 instructions: ITEX aborts on a bfloat16 matmul


def test_a_gpu_suite_file_without_nvml_facts_still_names_its_gpu_and_the_command_that_runs_the_suite_now():
    import json

    from amp_backends.evidence import RESULTS_DIR
    from amp_backends.backends.nvidia import measured

    doc = json.loads((RESULTS_DIR / measured.GPU_SUITE).read_text(encoding="utf-8"))
    doc["device"]["nvml"] = "unavailable: NVML could not start"  # what the suite writes where NVML fails
    results = measured._suite(measured.GPU_SUITE, doc)
    assert results.machine_kind == "unknown GPU" and results.has("mnist: fp16 dynamic+XLA")
    # recorded as the bench command's old option; quoted as the command that runs the suite now
    assert "benchmarks/gpu_suite.py" in measured.suite().run() and "--gpu-suite" not in measured.suite().run()


def test_the_gpu_plan_keeps_one_step_per_fit_call_and_quotes_what_more_steps_measured(registry, monkeypatch):
    from amp_backends.backends.nvidia import measured

    a = registry.get("nvidia").assess(nvidia(H100), machine(nvidia(H100)))
    fit, one, many = measured.fit_calls(), "fit at 1 step per call", "fit at 58 steps per call"
    assert a.steps_per_execution == 1 and fit is not None and fit.has(one, many)
    assert f"{fit.times(many, one)} as fast at 58" in a.steps_per_execution_why
    assert [e.file for e in a.steps_per_execution_evidence] == [f"results/{measured.EXPERIMENTS}"]
    # a file that lost its keras_fit rows (or a broken install without it): the reason says nothing was measured
    monkeypatch.setattr(measured, "EXPERIMENTS", "gpu-suite-missing/gpu_suite.json")
    a = registry.get("nvidia").assess(nvidia(H100), machine(nvidia(H100)))
    assert a.steps_per_execution == 1 and a.steps_per_execution_evidence == ()
    assert "no GPU measurement of fit with more steps per call is committed" in a.steps_per_execution_why



# ------------------------------------------------------------------ peers and policy figures from this CPU's kind
def _catalogue_cpu(name, **changes):
    """A catalogue CPU's hardware, its entry changed (the name the probe gives a CPU comes from these fields)."""
    from dataclasses import replace

    from amp_backends.devices import device_hardware, find_device

    return device_hardware(replace(find_device(name), **changes))


# the AMX Xeon of results/zoo-xeon-amx and results/cpu-policy-xeon-amx.json, as its KVM guest reports it
XEON_AMX_KVM = {"device_name": "Intel(R) Xeon(R) Processor", "family": 6, "model_number": 0xA7, "logical_cores": 2}


def _zoo_medians(file):
    from amp_backends.evidence import RESULTS_DIR

    doc = json.loads((RESULTS_DIR / file).read_text())
    return {m["model"]: {n: c["samples_per_s"]["median"] for n, c in m["configs"].items()} for m in doc["models"]}


def test_the_plan_names_each_peer_measured_on_this_cpu_kind_as_rejected_with_the_committed_figures(registry):
    p = plan_of(_catalogue_cpu("sapphire-rapids", **XEON_AMX_KVM), registry)
    assert p.policy == "mixed_bfloat16"
    peers = {r.value: r.why for r in p.rejected if r.setting == "peer"}
    assert set(peers) == {"fp32 oneDNN-off", "fp32 grappler-bf16"}, peers
    medians = _zoo_medians("zoo-xeon-amx/peers/zoo.json")
    for name, why in peers.items():
        assert "results/zoo-xeon-amx/peers/zoo.json" in why and "Sapphire Rapids or later, AMX" in why
        for model, configs in medians.items():  # every figure quoted is the committed file's
            assert (f"{model}: {configs[name]:.0f} samples/s, the plan {configs['auto plan, trainer']:.0f} with the "
                    f"trainer and {configs['auto plan, fit']:.0f} with Keras fit") in why, why
        assert "slower than the plan's better run (the trainer or Keras fit) on every model measured" in why
    assert not any("measured faster" in w for w in p.warnings)


def test_a_rejected_peer_carries_the_measurements_it_quotes_into_the_plans_json(registry):
    """The figures a peer's rejection quotes are the plan's data too: file, machine and run beside each value."""
    p = plan_of(_catalogue_cpu("sapphire-rapids", **XEON_AMX_KVM), registry)
    medians = _zoo_medians("zoo-xeon-amx/peers/zoo.json")
    rejected = {r["value"]: r for r in json.loads(p.to_json())["rejected"] if r["setting"] == "peer"}
    assert set(rejected) == {"fp32 oneDNN-off", "fp32 grappler-bf16"}
    for name, r in rejected.items():
        assert r["evidence"], r
        assert {e["file"] for e in r["evidence"]} == {"results/zoo-xeon-amx/peers/zoo.json"}
        assert all("Sapphire Rapids or later, AMX" in e["machine"] for e in r["evidence"])
        quoted = json.dumps(r["evidence"])
        for configs in medians.values():
            assert f"{configs[name]:.0f}" in quoted or str(configs[name]) in quoted, (name, quoted)
    # a rejected policy carries the support table's evidence where it has some, and none is made up
    assert all("evidence" not in r or r["evidence"] for r in json.loads(p.to_json())["rejected"])


def test_a_cpu_kind_without_committed_peer_runs_says_so_and_how_to_measure_them(registry):
    p = plan_of(_catalogue_cpu("zen5"), registry)
    peers = {r.value: r.why for r in p.rejected if r.setting == "peer"}
    assert "fp32 grappler-bf16" in peers and "fp32 oneDNN-off" in peers
    assert all("not measured on a CPU like this one" in w and "--configs peers" in w for w in peers.values()), peers


def test_a_peer_that_beats_the_plan_in_every_repetition_is_a_warning_and_one_close_call_is_not(monkeypatch, registry):
    from amp_backends.backends.cpu import measured, rules
    from amp_backends.evidence import Results

    def zoo(peer_reps, loss_ok):
        reps = {"auto plan, trainer": (100.0, 102.0, 98.0), "auto plan, fit": (90.0, 91.0, 89.0), "fp32 oneDNN-on":
                peer_reps}
        medians = {n: sorted(r)[1] for n, r in reps.items()}
        source = Results("zoo-x/zoo.json", "Test CPU", "2.21.0", "python -m amp_backends.bench --zoo", "2026-11-27",
                         medians)
        return (measured.ZooModel("mnist_cnn", reps, {n: loss_ok or n != "fp32 oneDNN-on" for n in reps}, source),)

    hw = _catalogue_cpu("zen3")
    cases = (((120.0, 115.0, 111.0), True, True, "faster than the plan by over 5% in every repetition of every"),
             ((120.0, 115.0, 111.0), False, False, "but its loss left float32's run-to-run spread on mnist_cnn"),
             ((120.0, 104.0, 111.0), True, False, "within the noise"),
             ((50.0, 51.0, 49.0), True, False, "slower than the plan's better run (the trainer or Keras fit) on every"))
    for reps, loss_ok, won, says in cases:
        monkeypatch.setattr(rules, "zoo_results", lambda name, reps=reps, ok=loss_ok: zoo(reps, ok))
        p = plan_of(hw, registry)
        rejected = [r.why for r in p.rejected if r.value == "fp32 oneDNN-on"]
        warned = [w for w in p.warnings if w.startswith("fp32 oneDNN-on was measured faster")]
        assert (len(warned), len(rejected)) == ((1, 0) if won else (0, 1)), (reps, p.warnings, p.rejected)
        assert says in (warned + rejected)[0], (reps, loss_ok, warned + rejected)


def test_the_policy_reason_quotes_this_cpu_kinds_own_file_where_one_is_committed(registry):
    xeon = plan_of(_catalogue_cpu("sapphire-rapids", **XEON_AMX_KVM), registry)
    zen5 = plan_of(_catalogue_cpu("zen5"), registry)
    assert "results/cpu-policy-xeon-amx.json" in xeon.decision("policy").detail
    assert "results/cpu-policy-zen4.json" in zen5.decision("policy").detail  # no file of its own: the nearest kind


def test_a_plan_that_runs_the_graph_rewrite_does_not_reject_it_as_a_peer(registry):
    xeon = _catalogue_cpu("sapphire-rapids", **XEON_AMX_KVM)
    rewriting = plan_of(xeon, registry, graph_amp="on")
    assert rewriting.graph_amp == "bfloat16"
    assert {r.value for r in rewriting.rejected if r.setting == "peer"} == {"fp32 oneDNN-off"}
    assert "fp32 grappler-bf16" in {r.value for r in plan_of(xeon, registry).rejected if r.setting == "peer"}


def test_a_zoo_run_planned_for_a_gpu_is_not_its_host_cpus_evidence():
    import json

    from amp_backends.backends.cpu.measured import _cpu_name, zoo_results
    from amp_backends.evidence import RESULTS_DIR

    host = json.loads((RESULTS_DIR / "zoo-h200/mnist-cnn/zoo.json").read_text())["environment"]["cpu"]
    assert _cpu_name(host) and zoo_results(_cpu_name(host)) == ()  # the H200 run's plan is the GPU's
    assert {m.model for m in zoo_results("Intel Xeon Processor (Sapphire Rapids or later, AMX)")} == {
        "mnist_cnn", "two_heads"}
