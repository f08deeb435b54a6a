"""The package's shape: no import cycle, commands above the core, vendors in their folders, a light CLI."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import amp_backends
import amp_backends.backends

from conftest import NEUTRAL_CWD

FACADE = "amp_backends"  # the lazy public API re-exports everything; its imports are not dependencies


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
            if target and target != name and target != FACADE:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imports(name, path, is_pkg, modules) for name, (path, is_pkg) in modules.items() if name != FACADE}


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
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_commands_sit_on_top_of_the_core():
    entry_points = {"amp_backends.info", "amp_backends.bench", "amp_backends.__main__"}
    for name, deps in import_graph().items():
        is_command = name.startswith(("amp_backends.commands", "amp_backends.examples")) or name.endswith(".command")
        if is_command or name in entry_points:
            continue
        assert not {d for d in deps if d.startswith("amp_backends.commands")}, f"{name} imports a command module"


def test_no_vendor_names_in_core_decisions():
    vendor_test = re.compile(r"""\b(backend|name)\s*[!=]=\s*["'](nvidia|intel|cpu)["']""")
    for name, (path, _) in package_modules().items():
        if name.startswith("amp_backends.backends"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not vendor_test.search(line), f"{path}:{number}: vendor logic belongs in backends/: {line.strip()}"


def test_the_command_line_module_imports_no_benchmark_examples_numpy_or_tensorflow():
    code = ("import sys, amp_backends.commands.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'tensorflow', 'keras') "
            "or m.startswith(('amp_backends.commands.bench', 'amp_backends.examples', 'amp_backends.training'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
