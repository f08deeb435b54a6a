"""The plan's face: decisions as data, a short str(plan), plain lines off a terminal, machines named by the probe."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from argparse import Namespace

import pytest
from warm_python import run_python
from conftest import NEUTRAL_CWD, REPO
from fakes import ZEN4, cpu_of, machine

import amp_backends
from amp_backends.backends.cpu import parse_cpuinfo
from amp_backends.backends.cpu.measured import RESULTS_DIR, WITH_BF16
from amp_backends.configure import plan_for
from amp_backends.hardware import CpuInfo

BOXES = set("│┃┏┓┗┛┡┩━─┼╇╋┌┐└┘")
LONG = "a_dense_layer_whose_name_is_long_enough_to_wrap_in_any_table_column"
LONG_OUT = "the_output_layer_whose_name_is_long_enough_to_wrap_in_any_table_too"


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# ------------------------------------------------------------------------------------ machines named by the probe
@pytest.mark.parametrize("vendor, family, model, stepping, name", [
    ("AMD", 26, 2, 1, "Zen 5"),  # this project's CPU: /proc/cpuinfo says family 26, model 2
    ("AuthenticAMD", 0x1A, 0x11, None, "Zen 5"), ("AMD", 0x1A, 0x44, None, "Zen 5"), ("AMD", 0x1A, 0x50, None, "Zen 6"),
    ("AMD", 0x19, 0x11, None, "Zen 4"), ("AMD", 0x19, 0x61, None, "Zen 4"), ("AMD", 0x19, 0xA0, None, "Zen 4"),
    ("AMD", 0x19, 0x01, None, "Zen 3"), ("AMD", 0x19, 0x21, None, "Zen 3"), ("AMD", 0x17, 0x01, None, "Zen"),
    ("AMD", 0x17, 0x08, None, "Zen+"), ("AMD", 0x17, 0x18, None, "Zen+"), ("AMD", 0x17, 0x31, None, "Zen 2"),
    ("AMD", 0x17, 0x71, None, "Zen 2"), ("Intel", 6, 0x8F, 8, "Sapphire Rapids"),
    ("Intel", 6, 0xCF, 2, "Emerald Rapids"), ("GenuineIntel", 6, 0x6A, 6, "Ice Lake-X"),
    ("Intel", 6, 0x55, 4, "Skylake-X"), ("Intel", 6, 0x55, 7, "Cascade Lake"), ("Intel", 6, 0x55, 11, "Cooper Lake"),
    ("Intel", 6, 0xAD, 1, "Granite Rapids"),
    ("AMD", 0x1A, None, None, None), ("AMD", 0x15, 0x02, None, None), ("Intel", 6, 0x01, None, None),
    ("Intel", 19, 0x01, None, None), ("ARM", None, None, None, None),
])
def test_the_microarchitecture_is_named_from_family_and_model(vendor, family, model, stepping, name):
    from amp_backends.microarch import microarchitecture

    assert microarchitecture(vendor, family, model, stepping) == name


def test_a_virtual_machines_made_up_model_number_gives_way_to_its_amx_flags():
    """A KVM guest reported family 6, model 0xA7 (Rocket Lake, a desktop core without AMX) with AMX and AVX512-FP16."""
    from amp_backends.hardware import CpuInfo
    from amp_backends.microarch import microarchitecture

    amx = frozenset({"avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8"})
    assert microarchitecture("Intel", 6, 0xA7, 1, amx) == "Sapphire Rapids or later, AMX"
    assert microarchitecture("Intel", 6, 0xA7, 1, amx | {"amx_fp16"}).startswith("Granite Rapids or later")
    assert microarchitecture("Intel", 6, 0x8F, 8, amx) == "Sapphire Rapids"  # the table agrees with the flags
    assert microarchitecture("Intel", 6, 0xA7, 1, frozenset({"avx512f"})) == "Rocket Lake"
    cpu = CpuInfo("Intel", "Intel(R) Xeon(R) Processor", "x86_64", 2, amx, 6, 0xA7, 1)
    assert cpu.name == "Intel Xeon Processor (Sapphire Rapids or later, AMX)"  # without the trademark signs


CPUINFO_HERE = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu avx2 fma avx512f avx512_bf16 avx512_vnni avx_vnni
processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
stepping\t: 1
"""


def test_the_probe_reads_family_model_and_stepping_and_names_the_cpu():
    cpu = parse_cpuinfo(CPUINFO_HERE)
    assert (cpu.vendor, cpu.model, cpu.family, cpu.model_number, cpu.stepping) == ("AMD", "AMD EPYC", 26, 2, 1)
    assert cpu.microarchitecture == "Zen 5" and cpu.name == "AMD EPYC (Zen 5)"
    assert cpu.to_dict()["microarchitecture"] == "Zen 5" and cpu.to_dict()["family"] == 26
    unknown = CpuInfo("AMD", "AMD EPYC", "x86_64", 2, family=26, model_number=0xF0)
    assert unknown.microarchitecture is None and unknown.name == "AMD EPYC (family 26, model 240)"
    assert CpuInfo("ARM", "Neoverse-V1", "aarch64", 4).name == "ARM Neoverse-V1"


def test_this_machines_cpu_is_named_as_its_probe_reads_it():
    from amp_backends.backends.cpu import probe_cpu

    cpu = probe_cpu()
    if cpu.microarchitecture is None:
        pytest.skip(f"no microarchitecture is known for this CPU ({cpu.vendor}, family {cpu.family}, model "
                    f"{cpu.model_number})")
    assert cpu.microarchitecture in cpu.name
    assert cpu.microarchitecture in str(plan_for(environ={}, backend="cpu")).splitlines()[0]


def load_benchmark(name: str):
    path = REPO / "benchmarks" / f"{name}.py"
    if not path.exists():
        pytest.skip("the benchmarks are not part of this installation")
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_results_file_records_the_machine_as_the_probe_names_it():
    import datetime

    from amp_backends.backends.cpu import probe_cpu
    from amp_backends.backends.cpu.measured import recorded_machine

    bench = load_benchmark("cpu_policy")
    doc = bench.document("b", "cpu_policy.py", [], datetime.datetime.now(datetime.timezone.utc), Namespace(note=""),
                         "img/s", {})
    cpu = probe_cpu()
    assert doc["machine_kind"] == cpu.name
    assert doc["machine"]["family"] == cpu.family and doc["machine"]["model"] == cpu.model_number
    assert doc["machine"]["microarchitecture"] == cpu.microarchitecture
    # a file without a machine_kind is named from the family and model it records
    assert recorded_machine({"machine": {"cpu": "AMD EPYC", "vendor": "AMD", "family": 26, "model": 2}}) == \
        "AMD EPYC (Zen 5)"


def test_a_reason_quotes_the_machine_as_its_results_file_records_it():
    recorded = json.loads((RESULTS_DIR / WITH_BF16).read_text(encoding="utf-8"))["machine_kind"]
    plan = plan_for(machine(cpu_of(ZEN4)), environ={})
    (evidence,) = plan.decision("policy").evidence
    assert evidence.machine == recorded and evidence.file == f"results/{WITH_BF16}"
    assert f"measured on {recorded}, " in plan.reasons["policy"]


# ------------------------------------------------------------------------------------------- decisions as data
def test_each_setting_is_a_decision_with_its_value_reason_and_evidence():
    plan = plan_for(machine(cpu_of(ZEN4)), environ={})
    settings = [d.setting for d in plan.decisions]
    assert settings == ["policy", "loss_scale", "tf32", "xla", "fp8", "steps_per_execution", "float32_layers"]
    assert dict(plan.reasons) == {d.setting: d.detail for d in plan.decisions}  # the old mapping, derived
    policy = plan.decision("policy")
    assert policy.value == plan.policy == "mixed_bfloat16" and len(policy.reason) < 100
    doc = json.loads((RESULTS_DIR / WITH_BF16).read_text(encoding="utf-8"))
    for evidence in (e for d in plan.decisions for e in d.evidence):  # every figure is the file's
        results = json.loads((RESULTS_DIR / evidence.file.removeprefix("results/")).read_text(encoding="utf-8"))
        assert evidence.machine == results["machine_kind"]
        assert all(results["results"][config]["median"] == value for config, value in evidence.figures)
    assert dict(policy.evidence[0].figures) == {c: doc["results"][c]["median"] for c in ("mixed_bfloat16", "float32")}
    assert {e.file for e in plan.decision("float32_layers").evidence} == {"results/cpu-layers-zen4.json"}
    assert plan.decision("xla").value == "off" and plan.decision("xla").evidence
    data = plan.to_dict()
    assert data["reasons"] == dict(plan.reasons)
    assert data["decisions"][0]["evidence"][0]["figures"]["float32"] == doc["results"]["float32"]["median"]


# ---------------------------------------------------------------------------------------------- a short face
def assert_short(text: str, plan) -> None:
    lines = text.splitlines()
    assert len(lines) <= 12, text
    assert max(len(line) for line in lines) <= 120, text
    assert f"TensorFlow {plan.tensorflow}" in lines[0] and f"Keras {plan.keras}" in lines[0]
    assert plan.devices[0] in lines[0] and (not plan.device_names or plan.device_names[0] in lines[0])
    for d in plan.decisions:
        assert f"  {d.setting}: {d.value}" in text


@pytest.mark.parametrize("device", amp_backends.known_devices())
def test_a_catalogued_devices_plan_prints_in_a_dozen_short_lines(device):
    plan = plan_for(device=device, environ={})
    assert plan.tensorflow and plan.keras
    assert_short(str(plan), plan)
    assert "results/" not in str(plan) or "measured on" not in str(plan)  # the evidence is explain()'s
    assert str(plan) != plan.explain() and all(d.detail in plan.explain() for d in plan.decisions)


@pytest.mark.parametrize("overrides", [{}, {"policy": "float32"}, {"tf32": "on", "xla": "on", "fp8": "on"}])
def test_this_machines_plan_prints_in_a_dozen_short_lines(overrides):
    plan = plan_for(environ={}, **overrides)
    assert_short(str(plan), plan)


def test_the_float32_layers_line_says_the_kinds_kept_or_a_models_own_layers():
    plan = plan_for(machine(cpu_of(ZEN4)), environ={})
    line = next(x for x in str(plan).splitlines() if x.startswith("  float32_layers: "))
    assert "DepthwiseConv2D" in line and "LSTM" in line and len(line) <= 120
    here = plan.brief(model_float32=[])
    assert "float32_layers: none in this model" in here and "LSTM" not in here and "Depthwise" not in here
    some = plan.brief(model_float32=["net/dw_strided", "net/lstm"])
    assert "float32_layers: 2 of this model's layers: net/dw_strided, net/lstm" in some


def test_the_steps_line_says_the_trainers_steps_per_call_where_it_is_another():
    """train mnist --steps-per-call 3 printed 'steps_per_execution: 1 - one training step per compiled call', then
    '3 steps per compiled call'."""
    plan = plan_for(machine(cpu_of(ZEN4)), environ={})
    steps = [x for x in plan.brief(steps_per_call=3).splitlines() if x.startswith("  steps_per_execution: ")]
    assert steps == ["  steps_per_execution: 3 - steps per compiled call, as asked (Keras fit's stays 1)"]
    assert plan.brief(steps_per_call=1) == plan.brief() == str(plan)
    assert all(len(x) <= 120 for x in plan.brief(steps_per_call=3).splitlines())


@pytest.mark.slow
def test_the_mnist_main_job_names_no_layer_kind_the_model_lacks_and_validates_every_epoch(tmp_path):
    out = run_python(["-m", "amp_backends.examples.mnist", "--digits", "--epochs", "2", "--lr", "0.001",
                      "--log-every", "10", "--logdir", tmp_path], timeout=300, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr[-2000:]
    # the held-out digits validate every epoch; the best checkpoint by validation accuracy is kept
    epochs = re.findall(r"Epoch (\d) \(global step \d+\): loss: [\d.]+, accuracy: [\d.]+, val_loss: [\d.]+, "
                        r"val_accuracy: ([\d.]+)\.", out.stdout + out.stderr)
    assert [e for e, _ in epochs] == ["0", "1"], out.stderr[-3000:]
    best = list((tmp_path / "version_0" / "checkpoints" / "best").glob("ckpt-*.index"))
    assert len(best) == 1
    # the test images are scored with the best checkpoint's weights (chosen on the held-out tenth of the training set)
    tested = re.search(r"test accuracy: ([\d.]+) \(359 test images, the best checkpoint's, step (\d+)\)", out.stdout)
    assert tested and best[0].name == f"ckpt-{tested.group(2)}.index" and float(tested.group(1)) > 0.5, out.stdout
    assert "LSTM" not in out.stdout and "Depthwise" not in out.stdout, out.stdout  # the MNIST CNN has neither
    plan = [line for line in out.stdout.splitlines() if line.startswith(("amp_backends plan", "  "))]
    assert plan[0].startswith("amp_backends plan") and "TensorFlow " in plan[0] and "Keras " in plan[0], out.stdout
    assert any(line.startswith("  float32_layers: none in this model") for line in plan), out.stdout
    assert any(line.startswith("  policy: ") for line in plan)
    assert len(plan) <= 12 and max(len(line) for line in plan) <= 120, out.stdout


# ------------------------------------------------------------------------------------- plain lines off a terminal
def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "amp_backends", *args], capture_output=True, text=True, timeout=300,
                          cwd=NEUTRAL_CWD, env={**os.environ, "COLUMNS": "80"})


def test_info_piped_prints_one_whole_line_a_row():
    out = cli("info", "--no-tensorflow", "--device", "zen4")
    assert out.returncode == 0, out.stderr
    lines = lines_of(out.stdout)
    assert not BOXES & set(out.stdout), out.stdout
    assert "cpu model: AMD EPYC (Zen 4)" in lines
    assert any(line.startswith("float32_layers: DepthwiseConv2D, DepthwiseConv1D, SeparableConv2D") and
               line.rstrip().endswith("slower in bfloat16") for line in lines), out.stdout
    assert any(line.startswith("policy: mixed_bfloat16 - ") and "results/" not in line for line in lines)
    why = cli("info", "--no-tensorflow", "--device", "zen4", "--why")
    assert why.returncode == 0, why.stderr
    policy = next(line for line in lines_of(why.stdout) if line.startswith("policy: mixed_bfloat16 - "))
    assert f"results/{WITH_BF16}" in policy  # the whole reason, its measurement included, on one line
    assert any(line.startswith("rejected policy: mixed_float16 - ") for line in lines_of(why.stdout))


USER_MODEL = f"""
import tensorflow as tf

def build():
    inputs = tf.keras.Input((20,))
    x = tf.keras.layers.Dense(60, name="{LONG}")(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(10, dtype="float32", name="{LONG_OUT}")(x), name="net")
"""


@pytest.mark.tensorflow
def test_check_piped_prints_one_line_a_finding_with_the_layer_path_whole(tmp_path):
    (tmp_path / "long_names.py").write_text(textwrap.dedent(USER_MODEL))
    out = run_python(["-m", "amp_backends", "check", "long_names:build", "--device", "h100", "--batch-size", "64"],
                     timeout=300, cwd=tmp_path, env={**os.environ, "COLUMNS": "80"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert not BOXES & set(out.stdout), out.stdout
    found = [line for line in lines_of(out.stdout) if f"net/{LONG}" in line]  # grep finds the layer
    assert found and all(line.split(": ")[0] in ("error", "warning", "info") for line in found), out.stdout
    assert all(". Fix: " in line for line in found)


@pytest.mark.tensorflow
@pytest.mark.slow
def test_audit_piped_prints_whole_lines(tmp_path):
    (tmp_path / "long_names.py").write_text(textwrap.dedent(USER_MODEL))
    out = subprocess.run([sys.executable, "-m", "amp_backends", "audit", "long_names:build", "--batch-size", "8",
                          "--steps", "1"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "COLUMNS": "80", "PYTHONPATH": os.pathsep.join(
                             filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))})
    assert out.returncode == 0, out.stderr[-2000:]
    assert not BOXES & set(out.stdout), out.stdout
    lines = lines_of(out.stdout)
    assert lines[0].startswith("Audit of 'net'"), out.stdout
    if any(line.startswith("ran outside oneDNN") for line in lines):
        # TensorFlow ran Eigen's kernels (a CPU where it leaves oneDNN off, or TF_ENABLE_ONEDNN_OPTS=0): the audit
        # says so on one line, with the reason, and lists no kernels it cannot see
        (outside,) = [line for line in lines if line.startswith("ran outside oneDNN")]
        assert outside.startswith("ran outside oneDNN (Eigen): ") and "TF_ENABLE_ONEDNN_OPTS" in outside, out.stdout
        assert not any(line.startswith("kernels ") for line in lines), out.stdout
    else:
        assert any(line.startswith("kernels ") for line in lines), out.stdout
    if "float32 island" in out.stdout:  # the output layer, a float32 island under a low-precision plan
        assert any(line.startswith(f"float32 island: net/{LONG_OUT} ") for line in lines), out.stdout


def test_bench_tables_piped_print_one_whole_line_a_row(capsys):
    from amp_backends.commands.bench.output import loops_table, zoo_table

    model = "a_model_whose_name_is_long_enough_to_wrap_in_a_table_0123456789"
    env = {"devices": ["AMD EPYC (Zen 5)"], "cpu": "AMD EPYC (Zen 5), 2 logical cores"}
    loops_table({"settings": {"epochs_timed": 2}, "environment": env, "results": [
        {"model": model, "config": "bf16 (tutorial loop, mixed_bfloat16 policy)", "img_per_s": 3215.0,
         "ratio_to_best_manual": 1.0, "error": None, "detail": "the tutorials' loop as written, timed per epoch"},
        {"model": model, "config": "auto plan, trainer", "img_per_s": 6000.0, "ratio_to_best_manual": 1.87,
         "error": None, "detail": ""}]})
    zoo_table({"environment": env, "models": [{"model": model, "skipped": "needs keras_hub, which is not installed"}]})
    text = capsys.readouterr().out
    assert not BOXES & set(text), text
    rows = [line for line in lines_of(text) if model in line]
    assert len(rows) == 3, text
    assert "bf16 (tutorial loop, mixed_bfloat16 policy): 3,215 img/s" in rows[0]
    assert "needs keras_hub, which is not installed" in rows[2]


def test_on_a_terminal_the_commands_keep_their_tables():
    from rich.console import Console

    from amp_backends.commands.capability_report import collect, render_text

    buffer = io.StringIO()
    render_text(collect(use_tensorflow=False, device="zen4"), Console(file=buffer, force_terminal=True, width=120,
                                                                      color_system=None))
    assert BOXES & set(buffer.getvalue()) and "float32_layers" in buffer.getvalue()


def test_an_audited_run_names_the_program_in_its_errors():
    """With --audit the loop setting the kernel libraries' variables reused the program's name: errors began
    'ONEDNN_VERBOSE: error:'."""
    out = subprocess.run([sys.executable, "-m", "amp_backends.examples.mnist", "--audit", "--synthetic", "--digits"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.lstrip().startswith("mnist: error:"), out.stderr[-600:]


def test_a_reason_cut_to_fit_a_line_ends_after_a_whole_word():
    """``info --device h100`` ended a reason "callbacks after ev...": the first clause was cut mid-word."""
    from amp_backends.assessment import first_clause

    text = "Keras's default of one step per compiled call, which keeps per-batch callbacks after every batch: fit"
    cut = first_clause(text, 90)
    assert cut == "Keras's default of one step per compiled call, which keeps per-batch callbacks after..."
    assert len(cut) <= 90 and first_clause("short: rest") == "short"
