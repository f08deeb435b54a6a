"""The suite's own shape: the ``intel`` marker decides what the TensorFlow 2.15 + Keras 2 + ITEX session runs.

That session (nox ``intel``) runs ``-m intel``: the tests of what the stack changes (probes, plan, apply, the
Keras 2 paths, ITEX, the trainer's loss scaling, checkpoints and resume, the precision check), not the whole
suite a second time. A test module that touches those paths must say where it stands, so that a new one is
not silently left out of that session: marked ``intel`` as a whole (``pytestmark``), marked in part with the
reason the rest is left out (``PARTLY``), or left out with the reason (``LEFT_OUT``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.intel  # (no TensorFlow: a second of the 'intel' session, which it describes)

TESTS = Path(__file__).resolve().parent

# Names whose use means a module runs code that differs under Keras 2 / ITEX.
TOUCHES = {
    # the Keras 2 / Keras 3 layer, and tests that branch on the Keras generation
    "keras_compat", "keras_info", "KerasInfo", "KERAS3",
    # ITEX
    "itex_status", "ItexStatus", "IntelBackend", "intel_extension_for_tensorflow",
    # applying a plan (the Keras policy, the plan's optimizer and compile arguments), also through the tests' own
    # helper (tests/helpers.py)
    "auto_configure", "configure_for_device", "apply_plan", "wrap_optimizer", "compile_kwargs", "applied_plan",
    # the trainer's loss scaling, checkpoints and resume
    "LossScaler", "LossScale", "loss_scale", "checkpoint_dir", "resume",
    # the precision check and the per-layer preparation
    "check_model", "prepare_model", "model_check",
}
# Text that says a test was written with the other stack in mind (a skip reason, a version it branches on), or
# drives those paths through the command line.
SAYS = re.compile(r"Keras 2|ITEX|\b2\.15\b|--resume|--loss-scale")

PARTLY = {
    "test_bench.py": "the loops' chart is drawn there (that session has matplotlib); the tutorials' loops scale losses "
                     "through keras_compat (tested on Keras 2 in test_keras_compat), and the benchmark's refusal of a "
                     "configuration that would abort ITEX is test_intel's",
    "test_reference_models.py": "the heavy models' training steps (mobilenet_v3, resnet50, efficientnet) take 10-40 s "
                                "each to compile under TF 2.15 and take the light models' Keras 2 paths; the check "
                                "under an H100 plan reads the same Keras 2 graph as under this machine's plan; float8 "
                                "and the keras_hub models skip there",
    "test_bench_zoo.py": "the zoo benchmark's runs are subprocesses (minutes under ITEX); its models, their Keras 2 "
                         "build and the GAN's Keras 2 fit run there",
    "test_training_paths.py": "the example's default relative logdir is a command-line subprocess, like "
                              "test_training_cli's",
    "test_audit_real.py": "one audit under ITEX's oneDNN (the plan's kernels really run in it); the others start more "
                          "audited subprocesses of the same code",
    "test_training_cli.py": "one run of the example under Keras 2 (its TensorBoard scalars, the profiler); the others "
                            "start the command again (20-30 s each with ITEX) for kill, Ctrl-C, seeds and the GAN, "
                            "whose Keras 2 parts are test_training_checkpoints', test_training_numerics' and "
                            "test_intel's",
    "test_distribute.py": "MirroredStrategy's shared loss scale runs under Keras 2; the multi-worker runs are process "
                          "clusters (minutes under ITEX) whose Keras 2 parts, loss scaling and resume, are tested in "
                          "process",
}
LEFT_OUT = {
    "test_docs.py": "the documentation's examples are written for the primary stack (TensorFlow 2.21, Keras 3): "
                    "float8, the Keras 3 fit keywords, keras_hub; its generated tables read no Keras",
    "test_api.py": "the package's names and their types: the same on every stack (the errors' builtin bases and the "
                   "backend authors' module read no Keras)",
    "test_schemas.py": "validates JSON against the shipped schemas: the outputs' fields do not change with Keras 2 "
                       "(the reports themselves run under the intel session in test_report and test_intel)",
    "test_audit_onednn.py": "parses recorded oneDNN logs (ITEX's format among them): no TensorFlow runs",
    "test_model_check_transformers.py": "keras_hub needs Keras 3: the module skips under Keras 2",
    "test_model_outputs.py": "a subclassed model keeps the shapes it was built with from Keras 3 on: the module "
                             "skips under Keras 2 (a functional model's outputs: test_layer_plan's, marked intel)",
    "test_report.py": "the report with ITEX loaded is test_intel's; the rest renders fake hardware or starts the same "
                      "command again",
    "test_training_fidelity.py": "skips under ITEX (its CPU float16 kernels are ~10x slower): runs in the TF 2.21 "
                                 "session",
}


def names_in(tree: ast.AST) -> set[str]:
    """The identifiers a module uses: names, attributes, keywords, imported modules and names."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
        elif isinstance(node, ast.alias):
            found.update(node.name.split("."))
            if node.asname:
                found.add(node.asname)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update(node.module.split("."))
    return found


def touches(tree: ast.AST) -> list[str]:
    """Why a module touches what Keras 2 / ITEX changes: the names and texts that say so (empty: it does not)."""
    why = sorted(names_in(tree) & TOUCHES)
    texts = {m.group(0) for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
             for m in SAYS.finditer(node.value)}
    return why + sorted(texts)


def is_intel_mark(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "intel" and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark")


def marking(tree: ast.Module) -> str:
    """'whole' (``pytestmark`` has ``intel``), 'part' (some tests have it) or 'none'."""
    module_level = [n for n in tree.body if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)]
    if any(is_intel_mark(n) for a in module_level for n in ast.walk(a.value)):
        return "whole"
    return "part" if any(is_intel_mark(n) for n in ast.walk(tree)) else "none"


def modules() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(TESTS.rglob("test_*.py"))}


def test_the_rules_see_what_they_must():
    tree = ast.parse("from amp_backends import keras_compat as kc\npytestmark = [pytest.mark.tensorflow]\n"
                     "@pytest.mark.intel\ndef test_x():\n    t.fit(x, resume=True)\n")
    assert touches(tree) == ["keras_compat", "resume"] and marking(tree) == "part"
    assert marking(ast.parse("pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]")) == "whole"
    assert touches(ast.parse("pytest.skip('needs Keras 3; this tf.keras is Keras 2')")) == ["Keras 2"]
    assert touches(ast.parse("import numpy as np\nx = np.ones(3)")) == []


def test_every_module_touching_keras_2_or_itex_says_where_it_stands():
    undecided, wrong = [], []
    for name, tree in modules().items():
        why, mark = touches(tree), marking(tree)
        if mark == "whole":
            continue
        if mark == "part" and name not in PARTLY:
            wrong.append(f"{name}: some tests are marked intel; say in PARTLY why the others are left out")
        elif mark == "none" and why and name not in LEFT_OUT:
            undecided.append(f"{name} (uses {', '.join(why)})")
    assert not wrong, "\n".join(wrong)
    assert not undecided, (
        "these test modules touch what TensorFlow 2.15 + Keras 2 + ITEX changes but the 'intel' session (-m intel) "
        "would not run them: mark them (pytestmark = [..., pytest.mark.intel]) or their relevant tests "
        "(@pytest.mark.intel, and a reason in PARTLY), or give the reason in LEFT_OUT:\n" + "\n".join(undecided))


def test_the_reasons_are_not_stale():
    found = modules()
    for name in PARTLY:
        assert name in found and marking(found[name]) == "part", f"{name}: in PARTLY but {marking(found[name])}"
    for name in LEFT_OUT:
        assert name in found and marking(found[name]) == "none", f"{name}: in LEFT_OUT but marked intel"


def test_both_test_sessions_report_their_slowest_tests_and_the_intel_one_runs_the_marker():
    source = (TESTS.parent / "noxfile.py").read_text(encoding="utf-8")
    sessions = {m.group(1): m.group(2) for m in re.finditer(r"\ndef (\w+)\(session.*?\n((?:    .*\n|\n)+)", source)}
    assert "--durations=25" in sessions["tests"] and "--durations=25" in sessions["intel"]
    assert re.search(r'"-m",\s*"intel"', sessions["intel"]) and '"-m"' not in sessions["tests"]
