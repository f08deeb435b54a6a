"""The capability report: collect() data, text and JSON output, and the command line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
from conftest import NEUTRAL_CWD

from amp_backends.commands.capability_report import SCHEMA_VERSION, collect, render_text, to_json
from amp_backends.probe import needs_tensorflow
from amp_backends.registry import default_registry
from amp_backends.tf_import import NOISE, collector_paused, quiet_tensorflow_logs


def cli(*args, env=None, timeout=180, module="amp_backends.info"):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AMP_") and k != "TF_CPP_MIN_LOG_LEVEL"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=NEUTRAL_CWD)


def run_python(code):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_collect_without_tensorflow_is_complete():
    rep = collect(use_tensorflow=False, environ={})
    d = rep.data
    assert d["schema_version"] == SCHEMA_VERSION == 2
    assert {b["backend"] for b in d["hardware"]["backends"]} == {"nvidia", "intel", "cpu"}
    assert set(d["backend_rows"]) == {"nvidia", "intel", "cpu"}
    assert d["plan"]["backend"] in ("nvidia", "intel", "cpu") and d["plan_error"] is None
    tf = d["software"]["tensorflow"]
    assert tf["imported"] is False and "--no-tensorflow" in tf["why"]
    assert set(d["software"]["backends"]) == {"nvidia", "intel", "cpu"}
    json.loads(to_json(rep))


def test_json_puts_the_plan_first_and_the_cpu_flags_last():
    text = to_json(collect(use_tensorflow=False, environ={}))
    assert list(json.loads(text))[:4] == ["schema_version", "amp_backends_version", "plan", "plan_error"]
    assert list(json.loads(text))[-1] == "hardware"
    assert text.index('"plan"') < text.index('"software"') < text.index('"hardware"') < text.index('"flags"')


def test_software_rows_come_from_the_backends():
    sw = collect(use_tensorflow=False, environ={}).data["software"]
    assert [label for label, _ in sw["backends"]["nvidia"]] == ["nvidia-ml-py"]
    assert [label for label, _ in sw["backends"]["intel"]] == ["ITEX"]
    assert "itex" not in sw and "nvidia_ml_py" not in sw
    # TensorFlow's build is read from its files, without importing it
    from amp_backends.software import tensorflow_build_info

    assert sw["tensorflow"]["is_cuda_build"] is bool(tensorflow_build_info()["is_cuda_build"])


def test_collect_reports_overrides_in_force():
    d = collect(use_tensorflow=False, environ={"AMP_XLA": "on"}).data
    assert d["overrides"] == {"AMP_XLA": "on"} and d["plan"]["overrides"] == {"xla": "on"}


def test_text_rendering_has_every_section():
    from rich.console import Console

    console = Console(record=True, width=200)
    render_text(collect(use_tensorflow=False, environ={"AMP_POLICY": "bf16"}), console)
    text = console.export_text()
    for needle in ("Hardware", "Software", "Plan", "policy", "loss_scale", "tf32", "xla",
                   "Overrides in force: AMP_POLICY=bf16", "device", "/CPU:0"):
        assert needle in text


def test_tensorflow_is_imported_only_when_the_plan_depends_on_it():
    from fakes import AMD_HERE, H100, cpu_of, machine, nvidia

    from amp_backends.hardware import BackendProbe

    reg = default_registry()
    assert not needs_tensorflow(machine(cpu_of(AMD_HERE)), reg)
    assert needs_tensorflow(machine(nvidia(H100), cpu_of(AMD_HERE)), reg)  # TensorFlow must confirm it sees the GPU
    itex_waiting = BackendProbe("intel", False, "not probed", needs_tensorflow=True)
    assert needs_tensorflow(machine(itex_waiting, cpu_of(AMD_HERE)), reg)


def test_info_here_imports_tensorflow_only_if_needed():
    # decided as a fresh process decides it (this one may have imported TensorFlow, which changes the probes)
    code = ("from amp_backends.probe import needs_tensorflow, probe_hardware; from amp_backends.registry import "
            "default_registry; print(needs_tensorflow(probe_hardware(), default_registry()))")
    check = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=NEUTRAL_CWD)
    needed = {"True": True, "False": False}[check.stdout.strip()]
    out = cli("--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    tf_info = d["software"]["tensorflow"]
    assert tf_info["imported"] is needed and tf_info["why"].startswith("auto: ")
    assert d["software"]["keras"]["generation"] in (2, 3) and tf_info["version"]
    if needed:
        assert "CPU" in d["hardware"]["tensorflow_device_types"]
    else:  # the common case on a CPU machine: no TensorFlow import (seconds of the report's time once)
        assert d["hardware"]["tensorflow_device_types"] is None
        code = ("import sys; from amp_backends.commands.capability_report import collect; collect(); "
                "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))")
        assert run_python(code) == "[]"
    assert out.stderr == ""


def test_info_plan_here_follows_the_cpu_rules():
    out = cli("--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    if d["plan"]["backend"] != "cpu":
        pytest.skip(f"this machine plans for {d['plan']['backend']}: the CPU rules do not apply")
    backend = next(b for b in d["hardware"]["backends"] if b["backend"] == "cpu")
    cpu, onednn = backend["cpu"], backend["details"]["oneDNN"]
    rejected = {r["value"]: r["why"] for r in d["plan"]["rejected"]}
    assert d["plan"]["devices"] == ["/CPU:0"]
    if cpu["native_bf16"] and onednn.startswith("on"):
        assert d["plan"]["policy"] == "mixed_bfloat16" and "bf16 instructions" in d["plan"]["reasons"]["policy"]
    elif cpu["native_bf16"]:  # bf16 instructions, but TensorFlow runs Eigen (TF_ENABLE_ONEDNN_OPTS=0, say)
        assert d["plan"]["policy"] == "float32" and "without oneDNN" in rejected["mixed_bfloat16"], rejected
    else:
        assert d["plan"]["policy"] == "float32" and "no bf16 instructions" in rejected["mixed_bfloat16"]
    # the layers kept in float32 are in the JSON and in the table, with their reason, whatever they are here
    assert isinstance(d["plan"]["float32_layers"], list) and d["plan"]["reasons"]["float32_layers"]
    table = cli()
    assert table.returncode == 0 and "float32_layers" in table.stdout


@pytest.mark.tensorflow
def test_info_with_tensorflow_lists_its_devices_without_start_up_noise():
    out = cli("--json", "--tensorflow")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["software"]["tensorflow"]["imported"] is True and "CPU" in d["hardware"]["tensorflow_device_types"]
    assert d["software"]["tensorflow"]["why"] == "imported as asked (--tensorflow)"
    # no "failed call to cuInit", absl's pre-initialisation warning or INFO lines: nothing at all here
    assert out.stderr == "", out.stderr


def test_the_noise_filter_drops_start_up_chatter_and_keeps_real_errors():
    import re

    noise = re.compile(NOISE, re.VERBOSE)
    chatter = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1795381695.313407    3532 port.cc:153] oneDNN custom operations are on.",
        "I0000 00:00:1795381695.314402    3532 cudart_stub.cc:31] Could not find cuda drivers on your machine",
        "E0000 00:00:1795381697.702614    3532 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
        "Failed call to cuInit: UNKNOWN ERROR (303)",
        "2026-11-22 21:12:48.972967: E external/local_xla/xla/stream_executor/cuda/cuda_dnn.cc:9261] Unable to "
        "register cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been registered",
        "2026-11-22 21:12:50.111532: I itex/core/wrapper/itex_cpu_wrapper.cc:60] Intel Extension for Tensorflow* "
        "AVX512 CPU backend is loaded.",
    ]
    real = ["E0000 00:00:1795381697.702614    3532 kernel.cc:12] could not create a primitive descriptor",
            "Traceback (most recent call last):", "terminate called after throwing an instance of 'dnnl::error'"]
    assert all(noise.search(line) for line in chatter)
    assert not any(noise.search(line) for line in real)


def test_the_import_pauses_the_collector_as_it_was_and_a_command_ends_with_its_objects_frozen():
    """Commands end without a last collection over TensorFlow's objects."""
    import gc

    for was in (True, False):
        (gc.enable if was else gc.disable)()
        try:
            with collector_paused():
                assert not gc.isenabled()
            assert gc.isenabled() is was  # a collector the program turned off stays off
        finally:
            gc.enable()
    # (exit handlers run last registered first: this one after the command's)
    code = ("import atexit, gc, sys\natexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
            "from amp_backends.commands.cli import main\nsys.argv = ['amp-backends', 'info', '--help']\nmain()")
    assert run_python(code).splitlines()[-1] == "frozen True"


def test_tensorflow_is_imported_with_the_collector_paused():
    import gc
    import importlib.abc
    import importlib.util

    from amp_backends.tf_import import import_tensorflow

    seen = {}

    class FakeTensorFlow(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            return importlib.util.spec_from_loader(name, self) if name == "tensorflow" else None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            seen["collector on"] = gc.isenabled()

    real, finder = sys.modules.pop("tensorflow", None), FakeTensorFlow()
    sys.meta_path.insert(0, finder)
    try:
        assert gc.isenabled() and import_tensorflow(quiet=False).__name__ == "tensorflow"
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("tensorflow", None)
        if real is not None:
            sys.modules["tensorflow"] = real
    assert seen == {"collector on": False} and gc.isenabled()


# A stand-in for TensorFlow whose import is interrupted by Ctrl-C: inside Python code that C runs (as pybind11
# runs it while TensorFlow imports), or twice in plain Python code.
CTRL_C_IN_C = """import ctypes
run = ctypes.pythonapi.PyRun_String
run.argtypes, run.restype = [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object], ctypes.py_object
run(b"import os, signal, time\\nos.kill(os.getpid(), signal.SIGINT)\\ntime.sleep(0.2)", 257, {}, {})
DONE = True
"""
CTRL_C_TWICE = """import os, signal, time
os.kill(os.getpid(), signal.SIGINT)
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.2)
DONE = True
"""


@pytest.mark.parametrize(("fake", "imported"), [(CTRL_C_IN_C, True), (CTRL_C_TWICE, False)], ids=["once", "twice"])
def test_ctrl_c_while_tensorflow_imports_stops_with_the_programs_exit_status(tmp_path, fake, imported):
    """A Ctrl-C that landed in Python code run from C during the import (pybind11's) ended a command that had said
    "stopped" and chosen exit status 130 by SIGINT all the same (CPython does so at exit, status -2): the first
    Ctrl-C now waits for the import's end; a second one stops it at once."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(fake)
    (tmp_path / "command.py").write_text(  # run with -m, as the commands are (-c exits before CPython's check)
        "import sys\nfrom amp_backends.tf_import import import_tensorflow\n"
        "try:\n    import_tensorflow(quiet=False)\nexcept KeyboardInterrupt:\n"
        "    print('stopped; imported:', getattr(sys.modules.get('tensorflow'), 'DONE', False))\n    sys.exit(130)\n")
    # (SIGINT as a terminal gives it, whatever this process inherited: a process started with it ignored passes that on)
    out = subprocess.run([sys.executable, "-m", "command"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (out.returncode, out.stdout.strip()) == (130, f"stopped; imported: {imported}"), out.stderr[-2000:]


def test_quieting_respects_a_level_the_user_chose():
    import logging

    absl = logging.getLogger("absl")
    saved = absl.level
    try:
        absl.setLevel(logging.NOTSET)
        env = {"TF_CPP_MIN_LOG_LEVEL": "0"}
        assert quiet_tensorflow_logs(env) is False and env == {"TF_CPP_MIN_LOG_LEVEL": "0"}
        assert absl.level == logging.NOTSET
        env = {}
        assert quiet_tensorflow_logs(env) is True and env == {"TF_CPP_MIN_LOG_LEVEL": "2"}
        assert absl.level == logging.ERROR  # absl's Python warnings too
    finally:
        absl.setLevel(saved)


def test_bogus_policy_is_a_clear_error():
    out = cli("--no-tensorflow", env={"AMP_POLICY": "bogus"})
    assert out.returncode == 2
    assert "AMP_POLICY must be one of auto, float32, mixed_float16, mixed_bfloat16" in out.stderr
    assert "Received: 'bogus'" in out.stderr and "Traceback" not in out.stderr


def test_bad_flag_value_is_a_clear_error_in_the_command_lines_words():
    """It was said in the Python API's words: "xla= must be one of ... Fix: pass xla='on', or leave xla out"."""
    out = cli("--no-tensorflow", "--xla", "sometimes")
    assert out.returncode == 2 and "--xla must be one of auto, on, off (or 1/0, true/false). Received: 'sometimes'. " \
        "Fix: pass --xla on, or leave --xla out to let amp_backends decide." in out.stderr
    out = cli("--no-tensorflow", "--float32-layers", "Conv2d")
    assert out.returncode == 2 and "--float32-layers must be auto, none or Keras layer class names" in out.stderr
    assert "(did you mean Conv2D?)" in out.stderr and "Fix: pass --float32-layers Conv2D, or leave" in out.stderr


def test_tf32_on_a_cpu_warning_and_reason_agree():
    out = cli("--json", "--no-tensorflow", "--backend", "cpu", env={"AMP_TF32": "on"})
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)["plan"]
    assert plan["tf32"] is False and any("tf32=on (from AMP_TF32)" in w and "downgraded" in w for w in plan["warnings"])
    assert "downgraded" in plan["reasons"]["tf32"] and "as requested" not in plan["reasons"]["tf32"]


def test_a_commands_warnings_are_plain_lines_without_the_librarys_file_and_line():
    """A command printed ``/.../amp_backends/request.py:398: AmpWarning: ...`` and the source line under it."""
    out = cli("--no-tensorflow", "--backend", "cpu", env={"AMP_POLCY": "bf16"})
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stderr.splitlines() if "AMP_POLCY" in line]
    assert said == ["warning: AMP_POLCY is set, but amp_backends reads no variable of that name, so it was ignored; "
                    "AMP_POLICY is the nearest one. Fix: rename it AMP_POLICY (or unset it)."], out.stderr
    assert ".py:" not in out.stderr and "AmpWarning" not in out.stderr, out.stderr


@pytest.mark.parametrize("module,args", [("amp_backends.info", []), ("amp_backends", ["bench"]), ("amp_backends", [])])
def test_help_is_complete_at_80_columns(module, args):
    out = cli(*args, "--help", module=module, env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "…" not in text and "<bool>" not in text and "<str>" not in text and "..." not in text.split("Commands:")[-1]
    assert max(len(line) for line in text.splitlines()) <= 80
    if module == "amp_backends.info":
        for var in ("AMP_BACKEND", "AMP_POLICY", "AMP_XLA", "AMP_TF32", "AMP_LOSS_SCALE", "AMP_GRAPH_AMP", "AMP_STRICT",
                    "AMP_FORCE"):
            assert f"${var}" in text
        flat = " ".join(text.split())
        assert "aliases fp32, fp16, bf16" in flat and "none (also off or 0: no scaling)" in flat


def test_console_script_subcommand():
    exe = os.path.join(os.path.dirname(sys.executable), "amp-backends")
    out = subprocess.run([exe, "info", "--json", "--no-tensorflow"], capture_output=True, text=True, timeout=120,
                         cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["schema_version"] == SCHEMA_VERSION


def test_the_plan_headline_is_the_summary_without_its_short_reason():
    from amp_backends.configure import plan_for

    plan = plan_for(environ={}, backend="cpu")
    assert plan.headline.startswith("amp_backends plan: backend=cpu") and " (" not in plan.headline
    assert plan.summary() == f"{plan.headline} ({plan.decision('policy').reason})"
    assert plan.explain().splitlines()[0] == plan.headline


def test_the_overrides_line_names_the_arguments_in_force_beside_the_variables():
    """It said "none (all automatic)" under `info --xla on`: only AMP_* variables were counted."""
    from rich.console import Console

    console = Console(record=True, width=200)
    render_text(collect(use_tensorflow=False, environ={"AMP_POLICY": "float32"}, xla="on"), console)
    assert "Overrides in force: AMP_POLICY=float32, xla=on (argument)" in console.export_text()
    console = Console(record=True, width=200)
    render_text(collect(use_tensorflow=False, environ={}), console)
    assert "Overrides in force: none (all automatic)" in console.export_text()
    from amp_backends.override_sources import keywords_as_options

    console = Console(record=True, width=200)
    with keywords_as_options({"xla": "on"}):  # `info --xla on`: the flag, as the plan's warnings name it
        render_text(collect(use_tensorflow=False, environ={}, xla="on"), console)
    assert "Overrides in force: xla=on (--xla)" in console.export_text()
    # a variable the flag or a keyword wins over is said so (the plan followed --policy; the line named AMP_POLICY)
    for given, said in (({"policy": "float32"}, "--policy"), ({}, "argument")):
        console = Console(record=True, width=200)
        with keywords_as_options(given):
            render_text(collect(use_tensorflow=False, environ={"AMP_POLICY": "fp16"}, policy="float32"), console)
        by = "an argument" if said == "argument" else said
        assert f"Overrides in force: AMP_POLICY=fp16 (overridden by {by}), policy=float32 ({said})\n" in \
            console.export_text()


def test_an_old_variable_in_force_is_not_listed_again_as_an_argument():
    from rich.console import Console

    console = Console(record=True, width=200)
    with pytest.warns(FutureWarning, match="use AMP_GRAPH_AMP"):
        report = collect(use_tensorflow=False, environ={"AMP_ITEX_AMP": "on"}, device="max1550")
    render_text(report, console)
    text = console.export_text()
    assert "Overrides in force: AMP_ITEX_AMP=on\n" in text and "(argument)" not in text


def test_a_plan_made_by_code_a_command_runs_keeps_the_python_words(monkeypatch):
    """Only the values the command line gave are named as flags: a model factory's own auto_configure(policy=...)
    while `check` runs is told in keywords."""
    from amp_backends import auto_configure
    from amp_backends.errors import AmpConfigError
    from amp_backends.override_sources import keywords_as_options

    with keywords_as_options({"policy": "half"}):
        with pytest.raises(AmpConfigError, match=r"^--policy must be .* Fix: pass --policy mixed_float16, or leave "):
            auto_configure(policy="half", apply=False, verbose=False)
        with pytest.raises(AmpConfigError, match=r"^policy= must be .* Fix: pass policy='mixed_bfloat16', or leave "):
            auto_configure(policy="mixed_bf16", apply=False, verbose=False)


def test_a_misspelt_backend_is_offered_the_nearest_one_not_always_cpu():
    from amp_backends.errors import AmpConfigError
    from amp_backends.request import parse_backend

    known = ("acme", "nvidia", "intel", "cpu")
    with pytest.raises(AmpConfigError, match=re.escape("Received: 'nvidai'. Fix: pass --backend nvidia, or leave")):
        parse_backend("nvidai", known, source="option")
    for other in ("rocm", "gpu", "xpu"):  # (gpu: not cpu, a guess of the opposite)
        with pytest.raises(AmpConfigError, match=re.escape(f"Received: '{other}'. Fix: export AMP_BACKEND=<one of")):
            parse_backend(other, known, source="env")


@pytest.mark.parametrize("value, fix", [("mixed_bf16", "pass --policy mixed_bfloat16, or"),
                                        ("mixed-float16", "pass --policy mixed_float16, or"),
                                        ("flaot32", "pass --policy float32, or"),
                                        ("mixed_bfloat61", "pass --policy mixed_bfloat16, or"),  # (digits swapped)
                                        ("bogus", "pass --policy <one of those>, or leave --policy out"),
                                        ("float64", "pass --policy <one of those>, or"),  # (no float16 guess)
                                        ("fp64", "pass --policy <one of those>, or")])
def test_a_misspelt_policy_is_offered_the_nearest_one_not_a_fixed_guess(value, fix):
    """The fix offers the policy the value is nearest to; with none near, no guess (a fixed mixed_float16 would be
    a policy that some machines refuse as slow)."""
    from amp_backends.errors import AmpConfigError
    from amp_backends.request import parse_policy

    with pytest.raises(AmpConfigError, match=re.escape(f"Received: {value!r}. Fix: {fix}")):
        parse_policy(value, source="option")


def test_a_backend_whose_own_rows_leave_out_its_status_is_said_not_available_first():
    """A backend that overrode report_rows without calling super() showed "fake NPUs: none" and no reason."""
    from amp_backends.backend_api import Backend, BackendProbe, BackendRegistry

    class Quiet(Backend):
        name, priority, tf_device_type = "quietnpu", 400, "NPU"

        def probe(self, *, use_tensorflow=False):
            return BackendProbe("quietnpu", False, "no NPU driver loaded")

        def assess(self, probe, hardware):
            raise AssertionError("not available: never assessed")

        def report_rows(self, probe):
            return [("fake NPUs", "none")]

    report = collect(use_tensorflow=False, registry=BackendRegistry([Quiet(), default_registry().get("cpu")]),
                     environ={})
    assert report.data["backend_rows"]["quietnpu"] == [["status", "not available: no NPU driver loaded"],
                                                       ["fake NPUs", "none"]]
    assert ["status", "available"] not in report.data["backend_rows"]["cpu"]  # (the CPU's own rows, as they were)


def test_a_command_whose_reader_closed_the_pipe_ends_as_unix_tools_do():
    """``amp-backends info | head -1`` exited 1 (rich's code for a closed pipe), and ``check ... | head`` then read
    as a check that found an error: it is 141 (128 + SIGPIPE), as a Unix tool killed by the signal."""
    code = ("import os, sys\nread, write = os.pipe()\nos.close(read)\nos.dup2(write, sys.stdout.fileno())\n"
            "from amp_backends.terminal import make_console\nconsole = make_console()\n"
            "for i in range(3):\n    console.print('row', i)\n")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=False, stderr=subprocess.PIPE, text=True,
                         timeout=60, cwd=NEUTRAL_CWD)
    assert ran.returncode == 141, (ran.returncode, ran.stderr[-2000:])
    assert "Traceback" not in ran.stderr
    echoed = ("import os, sys\nread, write = os.pipe()\nos.close(read)\nos.dup2(write, sys.stdout.fileno())\n"
              "import typer\nfrom amp_backends.commands.typer_app import make_app, run_app\napp = make_app()\n"
              "@app.command()\ndef json_out():\n    typer.echo('x' * 200000)\nrun_app(app)\n")  # (click's own path)
    ran = subprocess.run([sys.executable, "-c", echoed], stderr=subprocess.PIPE, text=True, timeout=60,
                         cwd=NEUTRAL_CWD)
    assert ran.returncode == 141, (ran.returncode, ran.stderr[-2000:])
