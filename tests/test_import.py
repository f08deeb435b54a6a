"""Importing the package is cheap and imports no TensorFlow; the backends come from entry points."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from conftest import NEUTRAL_CWD

pytestmark = pytest.mark.intel

REPO = Path(__file__).resolve().parents[1]


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_loads_no_tensorflow_and_no_nvml():
    mods = run("import sys, amp_backends; print(sorted(m for m in sys.modules if m.split('.')[0] in "
               "('tensorflow', 'keras', 'pynvml', 'intel_extension_for_tensorflow', 'numpy', 'rich', 'typer')))")
    assert mods == "[]"


def test_import_loads_nothing_but_the_face():
    """Importing the package does no work: of the package, only the face and its version are loaded (beside them
    the old module paths the face forwards for a release, ``amp_backends.audit``, ``timing``, ``measurement`` and
    ``policy_choice``: bare module objects it made, no file of the package)."""
    code = ("import sys, amp_backends; print(sorted(m for m in sys.modules if m.startswith('amp_backends')), "
            "[getattr(sys.modules[f'amp_backends.{m}'], '__file__', None) "
            "for m in ('audit', 'timing', 'measurement', 'policy_choice')])")
    mods = run(code)
    assert mods == ("['amp_backends', 'amp_backends.audit', 'amp_backends.measurement', 'amp_backends.policy_choice', "
                    "'amp_backends.timing', 'amp_backends.version'] [None, None, None, None]")


def test_import_reads_no_environment_and_writes_nothing(tmp_path):
    code = ("import os; os.environ['AMP_POLICY']='bogus'; import amp_backends; "
            "print(sorted(os.listdir('.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_backends_are_registered_through_entry_points(registry):
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="amp_backends.backends")}
    assert eps == {
        "nvidia": "amp_backends.backends.nvidia:NvidiaBackend",
        "intel": "amp_backends.backends.intel:IntelBackend",
        "cpu": "amp_backends.backends.cpu:CpuBackend",
    }
    assert registry.names() == ("nvidia", "intel", "cpu") and registry.load_errors == {}


def test_install_layout():
    """The backends/ folder is installed as amp_backends.backends: as a copy (pip install .) or in place (-e)."""
    import amp_backends.backends.nvidia as nv

    import amp_backends

    in_repo = Path(nv.__file__).resolve().is_relative_to(REPO / "backends")
    expected = os.environ.get("AMP_EXPECT_INSTALL")
    if expected == "editable":
        assert in_repo and Path(amp_backends.__file__).resolve().is_relative_to(REPO / "amp_backends")
    elif expected == "wheel":
        assert not in_repo and "site-packages" in nv.__file__
        assert Path(nv.__file__).parent.parent.parent == Path(amp_backends.__file__).parent.parent / "amp_backends"
    else:
        pytest.skip("AMP_EXPECT_INSTALL not set (nox sets it to 'wheel' or 'editable')")


def test_a_broken_third_party_backend_is_reported_not_fatal(monkeypatch):
    from amp_backends.registry import BackendRegistry

    class EP:
        name = "rocm"
        value = "nowhere:Rocm"

        def load(self):
            raise ImportError("No module named 'nowhere'")

    real = metadata.entry_points

    def fake(group=None):
        return list(real(group=group)) + [EP()]

    monkeypatch.setattr(metadata, "entry_points", fake)
    reg = BackendRegistry.from_entry_points()
    assert reg.names() == ("nvidia", "intel", "cpu")
    assert "No module named 'nowhere'" in reg.load_errors["rocm"]


def test_a_backend_named_otherwise_than_its_entry_point_is_refused_and_takes_no_shipped_backends_place(monkeypatch):
    from amp_backends.backends.cpu import CpuBackend
    from amp_backends.registry import BackendRegistry

    class Impostor(CpuBackend):  # a third party's backend that calls itself "cpu"
        priority = 500

    class Acme(CpuBackend):
        name, priority = "acme2", 50

    class EP:
        def __init__(self, name, obj):
            self.name, self.value, self.obj = name, f"vendor_pkg:{obj.__name__}", obj

        def load(self):
            return self.obj

    real = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points",
                        lambda group=None: [EP("rocm", Impostor), *real(group=group), EP("acme", Acme)])
    reg = BackendRegistry.from_entry_points()
    assert reg.names() == ("nvidia", "intel", "cpu") and isinstance(reg.get("cpu"), CpuBackend)
    assert "loads a backend named 'cpu'" in reg.load_errors["rocm"], reg.load_errors
    assert "give its entry point and its backend one name" in reg.load_errors["acme"], reg.load_errors
    assert set(reg.load_errors) == {"rocm", "acme"}
    # renamed as told, and listed before the shipped ones: still not in the shipped backend's place
    monkeypatch.setattr(metadata, "entry_points", lambda group=None: [EP("cpu", Impostor), *real(group=group)])
    reg = BackendRegistry.from_entry_points()
    assert isinstance(reg.get("cpu"), CpuBackend) and "already registered" in reg.load_errors["cpu"], reg.load_errors


def test_a_new_backend_is_one_registration():
    from amp_backends.assessment import NATIVE, UNSUPPORTED, Assessment, Support
    from amp_backends.hardware import BackendProbe, Hardware
    from amp_backends.planner import make_plan
    from amp_backends.registry import Backend, BackendRegistry
    from amp_backends.request import build_request

    class Metal(Backend):
        name, priority = "metal", 250

        def probe(self, *, use_tensorflow=False):
            return BackendProbe("metal", True, "M3 Max")

        def assess(self, probe, hardware):
            s = Support(NATIVE, "fake")
            return Assessment("metal", ("/GPU:0",), {"float32": s, "mixed_float16": s, "mixed_bfloat16": s},
                              ("mixed_float16", "float32", "mixed_bfloat16"), Support(UNSUPPORTED, "no"), s, True)

    from amp_backends.backends.cpu import CpuBackend

    reg = BackendRegistry([CpuBackend(), Metal()])
    assert reg.names() == ("metal", "cpu")
    hw = Hardware((Metal().probe(), CpuBackend().probe()))
    assert make_plan(hw, build_request(reg.names(), environ={}), reg).backend == "metal"


def test_checkout_root_imports_like_an_install():
    """Run from the repository root, the checkout shadows the installed package; it must still work."""
    out = subprocess.run([sys.executable, "-c", "import amp_backends.backends.cpu as c, amp_backends.registry as r; "
                          "print(c.__file__); print(r.default_registry().names())"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    path, names = out.stdout.split("\n")[:2]
    assert Path(path).resolve().is_relative_to(REPO / "backends") and names == "('nvidia', 'intel', 'cpu')"


def test_every_package_of_the_source_tree_is_installed():
    """pyproject.toml lists packages explicitly (backends/ is mapped): a new folder must be listed too."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for prefix, root in config["package-dir"].items():
        for init in (REPO / root).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / root).parts
            if prefix == "amp_backends" and parts[:1] == ("backends",):
                continue
            found.add(".".join((prefix, *parts)))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_the_face_exports_prepare_model_and_its_version():
    import amp_backends
    from amp_backends import plan, prepare, version

    assert amp_backends.prepare_model is prepare.prepare_model and "prepare_model" in dir(amp_backends)
    assert amp_backends.__version__ == version.__version__
    assert not hasattr(plan.Plan, "prepare_model")  # the plan is data: what it does to a model is prepare's


def test_a_source_checkout_imports_its_backends_without_the_repository_on_the_package_path():
    """In a source checkout the repository root was appended to ``amp_backends.__path__`` so that its
    ``backends/`` imported as ``amp_backends.backends``: every folder of the repository became a subpackage
    (``amp_backends.amp_backends``...) and ``pkgutil.walk_packages`` recursed until ``RecursionError``. Now that one
    name is found, the package's path is its own folder, and nothing loads before it is imported."""
    code = ("import importlib.util, pkgutil, sys, amp_backends; print(amp_backends.__path__); "
            "print('amp_backends.backends' in sys.modules); "
            "import amp_backends.backends.cpu as c; print(c.__file__); print(amp_backends.backends.__file__); "
            "print(importlib.util.find_spec('amp_backends.amp_backends')); "
            "names = [m.name for m in pkgutil.walk_packages(amp_backends.__path__, 'amp_backends.')]; "
            "print('amp_backends.training.trainer' in names, any('amp_backends.amp_backends' in n for n in names))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=NEUTRAL_CWD,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:6] == [str([str(REPO / "amp_backends")]), "False",
                                          str(REPO / "backends" / "cpu" / "__init__.py"),
                                          str(REPO / "backends" / "__init__.py"), "None", "True False"], out.stdout
