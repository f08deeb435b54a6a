"""The package's shape: imports run one way through the layers, no cycle, vendors in their folders, a light CLI.

The layers, bottom to top; a module imports modules of its own layer or of the layers below it, never
above. Every import counts: at module level, inside functions (lazy ones), under ``TYPE_CHECKING``.

    probe       the plain data the probes fill and the readers of the installed software; the timing harness
    plan        the overrides (request), the support table, the plan, the backends and their registry (and
                the kernel audit's side of their interface), the planner; and keras_compat, which the plan
                reads (Keras version, fit keywords)
    apply       auto_configure: TensorFlow and Keras set as the plan says; TensorFlow's quiet import
    model code  the user's model: the precision check, fp8, the trainer, autotune, data, the examples
    commands    the command line: commands/, and the ``python -m`` entry points that start it
    face        ``amp_backends/__init__.py``, the lazy public API: it may name any module; nothing
                inside the package imports it
"""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import amp_backends.backends
import pytest
from conftest import NEUTRAL_CWD

import amp_backends

FACE = "amp_backends"

# Module names below amp_backends; "x.*" is everything inside package x. A module takes the first match.
LAYERS: dict[str, tuple[str, ...]] = {
    "commands": ("commands", "commands.*", "__main__", "info", "bench", "examples.*.__main__"),
    "probe": ("errors", "version", "hardware", "software", "autotune.timing", "cache", "microarch", "terminal"),
    "plan": ("assessment", "evidence", "override_sources", "request", "loss_scale", "layer_names", "plan",
             "keras_compat", "registry", "kernel_audit", "probe", "planner", "devices", "backend_api", "backends",
             "backends.*"),
    "apply": ("apply", "configure", "seeds", "tf_import"),
    "model code": ("factory", "labels", "models", "data", "zoo", "model_check", "model_check.*", "fp8", "prepare",
                   "layer_plan", "model_inputs", "model_outputs", "training", "training.*", "autotune", "autotune.*",
                   "auditing", "auditing.*", "examples", "examples.*"),
}
ORDER = ("probe", "plan", "apply", "model code", "commands")

# File names more than one module may have: a package's, an entry point's. The same role in each vendor's folder
# (``backends/<vendor>/backend.py``, ``catalogue.py``...) may repeat too; nothing else does.
SHARED_FILE_NAMES = ("__init__.py", "__main__.py")
VENDOR_MODULE = re.compile(r"amp_backends\.backends\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+")


def package_modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the installed package: name -> (file, is_package), backends/ mapped as installed."""
    roots = {"amp_backends": Path(amp_backends.__file__).parent,
             "amp_backends.backends": Path(amp_backends.backends.__file__).parent}
    modules = {}
    for prefix, root in roots.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if prefix == "amp_backends" and parts[0] == "backends":
                continue  # a wheel keeps backends/ inside the package: read it through its own root
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            modules[".".join([prefix, *parts])] = (path, is_package)
    return modules


def imports(name: str, path: Path, is_package: bool, modules: dict) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in it (module level, functions, TYPE_CHECKING)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
        for target in targets:
            while target and target not in modules:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def lazy_targets() -> set[str]:
    """The modules the face loads by name on first use (``_LAZY``): its dependencies, as its imports are."""
    return {f"{FACE}{module}" for module in amp_backends._LAZY.values()}


def import_graph() -> dict[str, set[str]]:
    """Every module of the package, the face included, and the package's modules it imports."""
    modules = package_modules()
    graph = {name: imports(name, path, is_pkg, modules) for name, (path, is_pkg) in modules.items()}
    graph[FACE] |= lazy_targets()
    return graph


def layer_of(name: str) -> str:
    if name == FACE:
        return "face"
    short = name.removeprefix(FACE + ".")
    for layer, patterns in LAYERS.items():
        if any(fnmatch.fnmatchcase(short, p) for p in patterns):
            return layer
    raise AssertionError(f"{name} is in no layer: add it to LAYERS in tests/test_layout.py (and to "
                         "docs/reference/layout.md)")


def rank(layer: str) -> int:
    return len(ORDER) if layer == "face" else ORDER.index(layer)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_walk_sees_the_imports_it_must():
    graph = import_graph()
    assert "amp_backends.assessment" in graph["amp_backends.registry"]
    assert "amp_backends.registry" in graph["amp_backends.planner"]
    assert "amp_backends.plan" in graph["amp_backends.registry"]  # under TYPE_CHECKING: counted too
    assert "amp_backends.backends.intel.itex" in graph["amp_backends.backends.cpu.backend"]
    assert "amp_backends.tf_import" in graph["amp_backends.commands.capability_report"]  # in a function: counted too
    assert "amp_backends.version" in graph["amp_backends.commands.capability_report"]
    assert {"amp_backends.prepare", "amp_backends.training"} <= graph[FACE]  # the face's lazy names
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_every_lazy_name_of_the_face_is_defined_where_it_points():
    modules = package_modules()
    for name, module in amp_backends._LAZY.items():
        path, _ = modules[FACE + module]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        # re-exported: imported (a lazy package names them under TYPE_CHECKING too)
        defined |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert name in defined, f"amp_backends.{name} points at {FACE}{module}, which does not define it"


def test_the_walk_counts_an_import_of_the_face(tmp_path):
    code = "def f():\n    import amp_backends\n    from amp_backends import plan_for\n    from .. import Plan\n"
    path = tmp_path / "m.py"
    path.write_text(code)
    modules = package_modules()
    assert imports("amp_backends.model_check.m", path, False, modules) == {FACE}


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_is_in_one_layer():
    for name in import_graph():
        layer_of(name)


def test_imports_run_down_the_layers():
    """probe -> plan -> apply -> model code -> commands (-> the face): no import from a layer to one above it."""
    graph = import_graph()
    upward = sorted(f"{name} ({layer_of(name)}) imports {dep} ({layer_of(dep)})"
                    for name, deps in graph.items() for dep in deps if rank(layer_of(dep)) > rank(layer_of(name)))
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_nothing_inside_imports_the_face():
    importers = sorted(name for name, deps in import_graph().items() if FACE in deps)
    assert not importers, f"these modules import the package face {FACE!r}; import the modules they need: {importers}"


def test_the_plan_imports_no_model_code():
    deps = import_graph()["amp_backends.plan"]
    assert not {d for d in deps if rank(layer_of(d)) > rank("plan")}, deps


def test_the_core_imports_no_vendor_backend():
    """Vendor knowledge is reached through the backend interface (the registry), never by importing a backend."""
    found = sorted(f"{name} imports {dep}" for name, deps in import_graph().items()
                   if not name.startswith(FACE + ".backends") for dep in deps if dep.startswith(FACE + ".backends."))
    assert not found, "the core imports vendor backends; go through the registry:\n" + "\n".join(found)


def test_the_generic_device_types_carry_no_vendor_field():
    """A vendor's facts about a device (NVIDIA's compute capability) are `DeviceFact` values its backend states and
    reads; the core's device types hold no field for them and the core reads none of them."""
    from dataclasses import fields

    from amp_backends.hardware import Accelerator, KnownDevice

    for cls in (Accelerator, KnownDevice):
        names = {f.name for f in fields(cls)}
        assert "facts" in names and "compute_capability" not in names, cls
    read = sorted(f"{path}:{node.lineno}: .{node.attr}" for name, (path, _) in package_modules().items()
                  if not name.startswith(FACE + ".backends")
                  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                  if isinstance(node, ast.Attribute) and node.attr in ("compute_capability", "cc_str"))
    assert not read, "the core reads a vendor's device fact; ask its backend:\n" + "\n".join(read)


def test_no_vendor_names_in_core_decisions():
    vendor_test = re.compile(r"""\b(backend|name)\s*[!=]=\s*["'](nvidia|intel|cpu)["']""")
    for name, (path, _) in package_modules().items():
        if name.startswith("amp_backends.backends"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not vendor_test.search(line), f"{path}:{number}: vendor logic belongs in backends/: {line.strip()}"


# Words that name a vendor, its libraries or its profiler: in the audit's core they belong to prose only.
VENDOR_WORDS = re.compile(r"onednn|dnnl|mkldnn|nvidia|cuda|cublas|cudnn|cutlass|nvjet|xmma|xpu|itex|gpu|eigen|"
                          r"profiler|avx|amx|gemm_api", re.IGNORECASE)
# The audit's JSON field (schema_version 1) and its attribute keep their name.
VENDOR_WORDS_KEPT = {"outside_onednn"}
AUDIT_CORE = ("amp_backends.auditing", "amp_backends.auditing.*", "amp_backends.kernel_audit")


def vendor_tokens(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, token)`` for each name, attribute, argument, definition and space-free string in ``tree`` (its
    docstrings and messages aside: prose) that names a vendor, its libraries or its profiler."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            tokens = [node.value] if not re.search(r"\s", node.value) else []
        elif isinstance(node, ast.Name):
            tokens = [node.id]
        elif isinstance(node, ast.Attribute):
            tokens = [node.attr]
        elif isinstance(node, ast.arg):
            tokens = [node.arg]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            tokens = [node.name]
        elif isinstance(node, ast.alias):
            tokens = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            tokens = [node.module or ""]
        else:
            continue
        found += [(getattr(node, "lineno", 0), t) for t in tokens
                  if VENDOR_WORDS.search(t) and t not in VENDOR_WORDS_KEPT]
    return found


def test_the_audit_core_holds_no_vendor_parser():
    """What ran is read by the backends (``Backend.kernel_audit``: oneDNN's records in ``backends/cpu``, NVIDIA's
    kernels and traces in ``backends/nvidia``, the XPU's reason in ``backends/intel``); the audit's package and the
    interface name no vendor, library or profiler in their code, only in their prose."""
    sample = ast.parse('"""oneDNN prose."""\nPREFIX = "onednn_verbose"\nok = "ran outside oneDNN (Eigen)"\n'
                       'if "XPU" in name:\n    profiler.start()\n')
    assert vendor_tokens(sample) == [(2, "onednn_verbose"), (4, "XPU"), (5, "profiler")]
    found = [f"{path}:{line}: {token}" for name, (path, _) in sorted(package_modules().items())
             if any(fnmatch.fnmatchcase(name, p) for p in AUDIT_CORE)
             for line, token in vendor_tokens(ast.parse(path.read_text(encoding="utf-8")))]
    assert not found, "vendor knowledge in the audit's core; it belongs in the backend's kernel audit:\n" + "\n".join(
        found)


def test_the_command_line_module_imports_no_benchmark_examples_numpy_or_tensorflow():
    code = ("import sys, amp_backends.commands.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'tensorflow', 'keras') "
            "or m.startswith(('amp_backends.commands.bench', 'amp_backends.examples', 'amp_backends.training'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("package", ["training", "autotune"])
def test_a_lazy_package_lists_every_lazy_name_once(package):
    import importlib

    module = importlib.import_module(f"{FACE}.{package}")
    assert module.__all__ == sorted(module._LAZY)


def test_the_timing_harness_loads_nothing_above_the_probe_layer():
    """``amp_backends.autotune.timing`` is probe-layer code in a package of model code: the package's
    ``__init__`` loads its names on first use, so importing the harness loads no model code, NumPy or TensorFlow."""
    code = ("import sys, amp_backends.autotune.timing; print(sorted(m for m, v in list(sys.modules.items()) if "
            "m.split('.')[0] in ('amp_backends', 'numpy', 'tensorflow', 'keras') and getattr(v, '__file__', None)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(sorted([FACE, f"{FACE}.autotune", f"{FACE}.autotune.timing", f"{FACE}.errors",
                                             f"{FACE}.version"]))  # (the errors: of the probe layer too)


def test_the_layout_page_names_every_layer_and_module():
    """docs/reference/layout.md describes the layers and names every module and subpackage of the package."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "layout.md").read_text(encoding="utf-8")
    for layer in ORDER:
        assert f"- {layer}:" in page, f"docs/reference/layout.md has no '- {layer}:' item"
    missing = []
    for name, (_, is_package) in package_modules().items():
        parts = name.split(".")
        if len(parts) != 2 or parts[1] in ("backends",):
            continue  # top-level modules and subpackages; the vendors' folders are named as backends/<vendor>
        shown = f"{parts[1]}/" if is_package else f"{parts[1]}.py"
        if shown not in page:
            missing.append(shown)
    assert not missing, f"docs/reference/layout.md does not name these modules of amp_backends: {sorted(missing)}"


def shared_file_names(modules: dict[str, tuple[Path, bool]]) -> dict[str, list[str]]:
    """File name -> the modules that have it, for each name that repeats other than `SHARED_FILE_NAMES` and a name
    held only by modules of the vendors' folders (``amp_backends.backends.<vendor>.<name>``: one role per vendor)."""
    holders = defaultdict(list)
    for name, (path, _) in modules.items():
        holders[path.name].append(name)
    return {file: sorted(names) for file, names in sorted(holders.items())
            if len(names) > 1 and file not in SHARED_FILE_NAMES
            and not all(VENDOR_MODULE.fullmatch(name) for name in names)}


def test_no_two_modules_share_a_file_name():
    """Every shipped module (``amp_backends/`` and ``backends/``) has a file name of its own, so that a traceback, a
    search or an editor's tab names one module: only ``__init__.py``, ``__main__.py`` and the same role in parallel
    vendor folders (``backends/<vendor>/backend.py``, ``catalogue.py``, ``measured.py``) repeat."""
    sample = {name: (Path(*name.split(".")[1:]).with_suffix(".py"), False) for name in (
        "amp_backends.commands.report", "amp_backends.auditing.report", "amp_backends.model_check.rules",
        "amp_backends.backends.cpu.rules", "amp_backends.backends.cpu.backend", "amp_backends.backends.nvidia.backend",
        "amp_backends.zoo", "amp_backends.commands.bench.zoo_suite")}
    sample["amp_backends.examples.gan.__main__"] = (Path("examples/gan/__main__.py"), False)
    sample["amp_backends.examples.mnist.__main__"] = (Path("examples/mnist/__main__.py"), False)
    assert shared_file_names(sample) == {
        "report.py": ["amp_backends.auditing.report", "amp_backends.commands.report"],
        "rules.py": ["amp_backends.backends.cpu.rules", "amp_backends.model_check.rules"]}
    shared = shared_file_names(package_modules())
    assert not shared, ("modules that share a file name; rename them for what each is (and name them on "
                        "docs/reference/layout.md):\n" + "\n".join(f"{file}: {', '.join(names)}"
                                                                  for file, names in shared.items()))


def test_the_training_package_is_a_few_modules_of_one_concept_each():
    """``training/``: at most 14 modules (its ``__init__.py`` aside), none over 420 lines, each named on the layout
    page."""
    root = Path(amp_backends.__file__).parent / "training"
    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "layout.md").read_text(encoding="utf-8")
    modules = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in root.glob("*.py")}
    modules.pop("__init__.py")
    assert len(modules) <= 14, sorted(modules)
    assert not {n: lines for n, lines in modules.items() if lines > 420}, "split or shorten these training modules"
    assert not [n for n in modules if f"`{n}`" not in page], "docs/reference/layout.md names every training module"


def test_the_trainer_class_is_under_250_lines():
    """``Trainer`` reads as the loop and the hooks it calls: its pieces live in the training modules it imports."""
    path = Path(amp_backends.__file__).parent / "training" / "trainer.py"
    (cls,) = [n for n in ast.parse(path.read_text(encoding="utf-8")).body
              if isinstance(n, ast.ClassDef) and n.name == "Trainer"]
    assert cls.end_lineno is not None and cls.end_lineno - cls.lineno + 1 < 250, "move a concept out of Trainer"


def test_no_shipped_module_is_over_420_lines():
    """A module a reader can hold: every module of the installed package (the vendors' included) is at most 420
    lines; a longer one is split by concept, not trimmed of its documentation."""
    long = {name: n for name, (path, _) in package_modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 420}
    assert not long, f"split these modules by concept: {long}"


def test_the_core_raises_its_own_errors_not_bare_builtins():
    """The docs say every error raised on purpose is an `AmpError` (and the builtin it stands for): seven calls a
    user makes wrongly raised a bare ValueError or TypeError, which ``except amp_backends.AmpError`` missed."""
    roots = {Path(amp_backends.__file__).parent, Path(amp_backends.backends.__file__).parent}  # (a checkout: two)
    bare = [f"{path.relative_to(path.parents[1])}:{node.lineno}"
            for path in {p for root in roots for p in root.rglob("*.py")} if path.name != "errors.py"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
            and getattr(node.exc.func, "id", None) in ("ValueError", "TypeError", "Exception")]
    assert not bare, f"raise the errors of amp_backends.errors (AmpConfigError: a ValueError and a TypeError): {bare}"


def test_the_library_warns_through_one_function():
    """`amp_backends.errors.warn` names the user's line; ``warnings.warn`` with a fixed ``stacklevel`` named the
    library's own lines (``trainer.py:178``) wherever a call passed through one more frame than it counted."""
    roots = {Path(amp_backends.__file__).parent, Path(amp_backends.backends.__file__).parent}
    direct = [f"{path.relative_to(path.parents[1])}:{node.lineno}"
              for path in {p for root in roots for p in root.rglob("*.py")} if path.name != "errors.py"
              for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "warn"
              and getattr(node.func.value, "id", None) == "warnings"]
    assert not direct, f"warn with amp_backends.errors.warn(message, category): {direct}"
