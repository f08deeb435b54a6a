"""The public face: the names a training script uses (a deliberate list), every error under ``AmpError``, and
the backend author's names in ``amp_backends.backend_api``."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from conftest import NEUTRAL_CWD

import amp_backends
from amp_backends import backend_api, errors

REPO = Path(__file__).resolve().parents[1]

# Adding a name here is a decision: it becomes a promise to every training script.
TOP_LEVEL = [
    "LossScale",
    "LayerPlan",
    # the plan
    "Plan", "auto_configure", "configure_for_device", "current_plan", "known_devices", "plan_for", "reset",
    # a model under the plan, and what the calls return
    "Audit", "ModelCheck", "Preparation", "audit", "audit_trace", "check_model", "prepare_model",
    # training
    "LossScaler", "Observer", "ThroughputLogger", "TrainResult", "Trainer", "Update", "classifier_updates",
    "gan_updates", "seed_everything", "step_seed",
    # the base of every error, and the warning (every error class: amp_backends.errors)
    "AmpError", "AmpWarning",
    "__version__",
]
MOVED_TO_ERRORS = ["AmpConfigError", "BackendError", "CheckpointError", "CheckpointMismatchError", "ClusterConfigError",
                   "DataUnavailableError", "DistributedFailure", "FactoryError", "InputError", "ModelCallError",
                   "NonFiniteError", "TrainingInterrupted", "UnsupportedRequestError"]

BACKEND_AUTHORS = ["Accelerator", "Assessment", "Backend", "BackendProbe", "BackendRegistry", "CpuInfo", "DeviceFact",
                   "Float32Layer", "Hardware", "MatrixUnit", "Request", "Support", "VendorSetting", "build_request",
                   "default_registry", "make_plan", "probe_hardware",
                   # the kernel audit (Backend.kernel_audit)
                   "Capture", "KernelAudit", "KernelReading", "KernelRecord"]


def exception_classes(module) -> dict[str, type]:
    return {n: v for n, v in vars(module).items()
            if inspect.isclass(v) and issubclass(v, BaseException) and v.__module__ == module.__name__}


def test_the_top_level_names_are_the_listed_ones():
    assert sorted(amp_backends.__all__) == sorted(TOP_LEVEL)
    assert sorted(dir(amp_backends)) == sorted(TOP_LEVEL)
    assert len(TOP_LEVEL) <= 30  # a face a reader takes in at once


@pytest.mark.parametrize("name", MOVED_TO_ERRORS)
def test_an_error_reached_at_the_top_still_works_for_a_release_with_a_deprecation_warning(name):
    with pytest.warns(DeprecationWarning, match=rf"amp_backends\.{name} moved to amp_backends\.errors\.{name}"):
        cls = getattr(amp_backends, name)
    assert cls is getattr(errors, name) and name not in amp_backends.__all__


@pytest.mark.parametrize(("old", "new", "name"), [
    ("request", "override_sources", "keywords_as_options"), ("request", "override_sources", "keywords_chosen_by"),
    ("request", "override_sources", "undo_of"), ("keras_compat", "software", "uses_legacy_keras"),
    ("keras_compat", "software", "LEGACY_KERAS_VALUES")])
def test_a_name_that_moved_between_modules_still_works_for_a_release_with_a_deprecation_warning(old, new, name):
    import importlib

    old_module, new_module = (importlib.import_module(f"amp_backends.{m}") for m in (old, new))
    with pytest.warns(DeprecationWarning, match=rf"amp_backends\.{old}\.{name} moved to amp_backends\.{new}\.{name}"):
        value = getattr(old_module, name)
    assert value is getattr(new_module, name)
    with pytest.raises(AttributeError, match="has no attribute 'nothing_of_that_name'"):
        assert old_module.nothing_of_that_name is None  # (never reached: it raises)


@pytest.mark.tensorflow
def test_every_top_level_name_resolves():
    for name in TOP_LEVEL:
        assert getattr(amp_backends, name) is not None, name
    assert callable(amp_backends.audit) and amp_backends.Audit.__name__ == "Audit"
    assert amp_backends.ModelCheck.__name__ == "ModelCheck" and amp_backends.TrainResult.__name__ == "TrainResult"


# Every order in which a program may reach ``amp_backends.audit`` first: each must leave it the function.
IMPORT_ORDERS = {
    "the attribute": "import amp_backends\nfirst = amp_backends.audit\n",
    "from the face": "from amp_backends import audit as first\nimport amp_backends\n",
    "the package first": "import amp_backends.auditing\nimport amp_backends\nfirst = amp_backends.audit\n",
    "the old module path": "import amp_backends.audit\nimport amp_backends\nfirst = amp_backends.audit\n",
    "the old path, as": "import amp_backends.audit as first\nimport amp_backends\n",
    "a name from the old path": "from amp_backends.audit import audit as first\nimport amp_backends\n",
    "the observer from the old path": "from amp_backends.audit import AuditObserver\nimport amp_backends\n"
                                      "first = amp_backends.audit\n",
    "the trainer's observer": "import amp_backends.training.precision as p\nimport amp_backends\n"
                              "p.TrainedModels\nimport amp_backends.auditing.observer\nfirst = amp_backends.audit\n",
}


@pytest.mark.parametrize("order", list(IMPORT_ORDERS))
def test_audit_is_the_function_whichever_way_it_is_reached_first(order):
    """``amp_backends.audit`` is the function, never a module, in every import order; its package is
    ``amp_backends.auditing`` (it used to be a package that made itself callable)."""
    code = (IMPORT_ORDERS[order] + "import inspect, warnings\n"
            "from amp_backends.auditing import audit, AuditObserver\n"
            "assert first is audit is amp_backends.audit, (first, audit, amp_backends.audit)\n"
            "assert inspect.isfunction(audit) and audit.__module__ == 'amp_backends.auditing'\n"
            "from amp_backends import audit as again\n"
            "assert again is audit and amp_backends.auditing.audit is audit\n")
    done = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", code], capture_output=True,
                          text=True, timeout=120, cwd=NEUTRAL_CWD)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("name, new", [("audit", "amp_backends"), ("Audit", "amp_backends"),
                                       ("audit_trace", "amp_backends"), ("AuditObserver", "amp_backends.auditing")])
def test_the_old_audit_module_path_still_works_for_a_release_with_a_deprecation_warning(name, new):
    import importlib

    import amp_backends.auditing

    old = importlib.import_module("amp_backends.audit")
    said = rf"import {name} from {re.escape(new)} \(from {re.escape(new)} import {name}\)"
    with pytest.warns(DeprecationWarning, match=said):
        value = getattr(old, name)
    assert value is getattr(amp_backends.auditing, name)
    assert inspect.isfunction(amp_backends.audit)  # the attribute stays the function


def test_the_old_audit_module_path_warns_where_it_is_imported_and_names_nothing_else():
    code = ("import warnings\nwarnings.simplefilter('error')\n"
            "try:\n    from amp_backends.audit import audit, Audit, audit_trace, AuditObserver\n"
            "except DeprecationWarning as w:\n    print('warned:', w)\n"
            "warnings.simplefilter('ignore')\n"
            "from amp_backends.audit import audit, Audit, audit_trace, AuditObserver\n"
            "import amp_backends\nassert audit is amp_backends.audit and Audit is amp_backends.Audit\n"
            "try:\n    from amp_backends.audit import parse\nexcept ImportError as e:\n    print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=NEUTRAL_CWD)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "warned: the module path amp_backends.audit is deprecated: import audit from amp_backends" in done.stdout
    assert "refused: cannot import name 'parse'" in done.stdout


def test_the_old_check_module_path_still_works_for_a_release_with_a_deprecation_warning():
    """``amp_backends.model_check.check`` (now ``checker``), which the docs showed for
    ``shapes_with_sequence_length``: its names still import, first thing in a process too, each with a warning that
    names the new place; nothing else is served there, and no module file of the old name ships."""
    code = ("import warnings\nwarnings.simplefilter('error')\n"
            "try:\n    from amp_backends.model_check.check import shapes_with_sequence_length\n"
            "except DeprecationWarning as w:\n    print('warned:', w)\n"
            "warnings.simplefilter('ignore')\n"
            "from amp_backends.model_check.check import shapes_with_sequence_length, check_model, DEFAULT_TRACE_BATCH\n"
            "import amp_backends.model_check.check as old\n"
            "from amp_backends.model_check import checker, check\n"
            "import amp_backends.model_check as model_check\n"
            "assert shapes_with_sequence_length is model_check.shapes_with_sequence_length\n"
            "assert check_model is checker.check_model is model_check.check.check_model and old is check\n"
            "assert DEFAULT_TRACE_BATCH == checker.DEFAULT_TRACE_BATCH\n"
            "try:\n    from amp_backends.model_check.check import Rules\nexcept ImportError as e:\n"
            "    print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=NEUTRAL_CWD)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("warned: the module path amp_backends.model_check.check is deprecated: use "
            "amp_backends.model_check.shapes_with_sequence_length") in done.stdout
    assert "refused: cannot import name 'Rules'" in done.stdout
    assert not (REPO / "amp_backends" / "model_check" / "check.py").exists()


@pytest.mark.parametrize("old, name, new", [
    ("timing", "interleaved", "amp_backends.autotune.timing"),
    ("measurement", "Measurement", "amp_backends.autotune.layer_choice"),
    ("measurement", "cached", "amp_backends.autotune.layer_choice"),
    ("policy_choice", "measure", "amp_backends.autotune.layers"),
    ("policy_choice", "verdict_of", "amp_backends.autotune.layer_choice"),
    ("policy_choice", "worth_measuring", "amp_backends.layer_plan"),
])
def test_the_modules_moved_into_autotune_still_work_for_a_release_with_a_deprecation_warning(old, name, new):
    """``amp_backends.timing``, ``measurement`` and ``policy_choice`` (now in ``amp_backends.autotune``): their
    names still import, first thing in a process too, each with a warning that names the new place, and are the
    new modules' objects; nothing else is served there, and no module file of the old name ships."""
    code = ("import warnings\nwarnings.simplefilter('error')\n"
            f"try:\n    from amp_backends.{old} import {name}\n"
            "except DeprecationWarning as w:\n    print('warned:', w)\n"
            "warnings.simplefilter('ignore')\nimport importlib\n"
            f"from amp_backends.{old} import {name} as value\nimport amp_backends.{old} as by_path\n"
            f"from amp_backends import {old} as by_name\nimport amp_backends\n"
            f"assert value is getattr(importlib.import_module('{new}'), '{name}') is by_path.{name} is by_name.{name}\n"
            f"assert by_path is by_name is amp_backends.{old}\n"
            f"try:\n    from amp_backends.{old} import apply\nexcept ImportError as e:\n    print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=NEUTRAL_CWD)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (f"warned: the module path amp_backends.{old} is deprecated: import {name} from {new} (from {new} import "
            f"{name})") in done.stdout
    assert "refused: cannot import name 'apply'" in done.stdout
    assert not (REPO / "amp_backends" / f"{old}.py").exists()


def test_policy_choice_is_measurement_under_its_earlier_name_on_the_old_path():
    import amp_backends.policy_choice as old
    from amp_backends.autotune.layer_choice import Measurement

    with pytest.warns(DeprecationWarning, match="import Measurement from amp_backends.autotune.layer_choice"):
        assert old.PolicyChoice is Measurement


def test_every_error_the_library_defines_is_an_amp_error_listed_in_errors():
    classes = exception_classes(errors)
    assert {"AmpError", "FactoryError", "ClusterConfigError", "DistributedFailure", "DataUnavailableError",
            "CheckpointMismatchError"} <= set(classes)
    assert sorted(errors.__all__) == sorted(classes)
    for name, cls in classes.items():
        assert name in TOP_LEVEL or name in MOVED_TO_ERRORS, name
        if issubclass(cls, Warning):
            assert issubclass(cls, UserWarning)
        elif cls is errors.TrainingInterrupted:
            # a stop, not an error: ``except Exception`` (and ``except AmpError``) must never swallow Ctrl-C
            assert issubclass(cls, KeyboardInterrupt) and not issubclass(cls, Exception)
        else:
            assert issubclass(cls, errors.AmpError), f"{name} is not an AmpError"


@pytest.mark.parametrize("name, builtin", [
    ("AmpConfigError", ValueError), ("UnsupportedRequestError", ValueError), ("ClusterConfigError", ValueError),
    ("FactoryError", ValueError), ("InputError", ValueError), ("BackendError", RuntimeError),
    ("NonFiniteError", RuntimeError), ("DistributedFailure", RuntimeError), ("DataUnavailableError", RuntimeError),
    ("CheckpointError", RuntimeError), ("CheckpointMismatchError", RuntimeError),
])
def test_errors_keep_the_builtin_base_callers_catch(name, builtin):
    cls = getattr(errors, name)
    with pytest.raises(builtin):
        raise cls("message")
    with pytest.raises(amp_backends.AmpError):
        raise cls("message")


def test_no_module_defines_an_exception_outside_errors_py_that_users_can_get():
    """Exception classes elsewhere are private (``_Name``) or internal to the benchmark's processes."""
    internal = {"WorkerFailed", "TimeUp"}  # caught inside the benchmark's supervisor and GPU worker
    found = []
    for root in (REPO / "amp_backends", REPO / "backends"):
        for path in root.rglob("*.py"):
            if path.name == "errors.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and any(
                        isinstance(b, ast.Name) and b.id.endswith(("Error", "Exception", "Failure", "Interrupt"))
                        for b in node.bases):
                    if not node.name.startswith("_") and node.name not in internal:
                        found.append(f"{path.relative_to(REPO)}: {node.name}")
    assert not found, "define users' errors in amp_backends/errors.py, under AmpError: " + ", ".join(found)


def test_backend_authors_names_live_in_backend_api_not_at_the_top():
    for name in BACKEND_AUTHORS:
        assert name in backend_api.__all__ and getattr(backend_api, name) is not None, name
        assert name not in amp_backends.__all__, name
        with pytest.raises(AttributeError, match="import it from amp_backends.backend_api"):
            getattr(amp_backends, name)
    assert sorted(backend_api.__all__) == sorted(set(backend_api.__all__))
    with pytest.raises(AttributeError, match="has no attribute 'nothing_of_the_kind'$"):
        amp_backends.nothing_of_the_kind  # noqa: B018


def test_backend_api_offers_everything_the_builtin_backends_import_from_the_core():
    """A backend needs nothing but amp_backends.backend_api: what the built-in backends take from the core is in it."""
    needed = set()
    for path in (REPO / "backends").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("amp_backends.") \
                    and not node.module.startswith("amp_backends.backends"):
                needed |= {a.name for a in node.names}
    assert needed and needed <= set(backend_api.__all__), sorted(needed - set(backend_api.__all__))


def test_backend_api_imports_no_tensorflow():
    code = ("import sys, amp_backends.backend_api; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_public_functions_that_take_a_plan_say_so_in_their_types():
    from amp_backends import auditing as audit_module
    from amp_backends.auditing.observer import AuditObserver
    from amp_backends.model_check import checker as check_module
    from amp_backends import layer_plan
    from amp_backends.layer_plan import LayerPlan
    from amp_backends.plan import Plan

    for function in (check_module.check_model, audit_module.audit, audit_module.audit_trace, AuditObserver.__init__):
        hints = typing.get_type_hints(function, {**vars(sys.modules[function.__module__]), "Plan": Plan,
                                                 "Hardware": backend_api.Hardware, "LayerPlan": LayerPlan})
        assert hints["plan"] == Plan | None, function.__qualname__
    from amp_backends import prepare

    for function in (prepare.prepare_model, layer_plan.decide, layer_plan.apply):
        hints = typing.get_type_hints(function, {**vars(sys.modules[function.__module__]), "Plan": Plan})
        assert hints.get("plan", Plan) == Plan and "Any" not in str(hints.get("layer_plan", "")), function.__qualname__


# The public packages beside the face, each with its own ``__all__``
PUBLIC_PACKAGES = ("training", "backend_api", "errors", "model_check", "auditing", "autotune", "devices")


def _reference_objects() -> dict[str, object]:
    """Every object the API reference renders (``::: amp_backends.NAME`` in docs/reference/api.md: the face and the
    types it returns, takes or raises), by dotted name, every name of the face and every name in the ``__all__`` of
    a public package."""
    import importlib

    page = (REPO / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    objects: dict[str, object] = {f"amp_backends.{name}": getattr(amp_backends, name) for name in amp_backends.__all__}
    for package in PUBLIC_PACKAGES:
        module = importlib.import_module(f"amp_backends.{package}")
        objects.update({f"amp_backends.{package}.{name}": getattr(module, name) for name in module.__all__})
    for dotted in re.findall(r"^::: (amp_backends[\w.]*)$", page, re.M):
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for part in parts[i:]:
                obj = getattr(obj, part)
            objects[dotted] = obj
            break
    return objects


def test_the_reference_objects_are_the_face_and_the_types_it_renders():
    objects = _reference_objects()
    assert len(objects) > len(amp_backends.__all__) + 30 and "amp_backends.registry.Backend" in objects
    assert "amp_backends.backend_api.build_request" in objects and "amp_backends.training.Evaluation" in objects
    assert objects["amp_backends.plan.Decision"] is amp_backends.plan.Decision


def _public_callables():
    """``(qualified name, callable, docstring)`` for every object the API reference renders and each public method
    of its classes."""
    for name, obj in sorted(_reference_objects().items()):
        if name.rsplit(".", 1)[-1].startswith("__"):
            continue
        if inspect.isclass(obj):
            init = obj.__dict__.get("__init__")
            doc = (inspect.getdoc(obj) or "") + "\n" + (inspect.getdoc(init) or "" if init else "")
            yield name, (init or obj), doc
            fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
            for attr, value in vars(obj).items():  # (a dataclass field's default function is no method)
                if attr.startswith("_") or attr in fields or isinstance(value, property) or not callable(value):
                    continue
                function = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
                yield f"{name}.{attr}", function, inspect.getdoc(function) or ""
        elif callable(obj):
            yield name, obj, inspect.getdoc(obj) or ""


def _documented(doc: str) -> set[str]:
    """The names a Google-style docstring describes under ``Args:`` or ``Attributes:`` (``name:``, ``name (int):``,
    ``*args:``, ``**overrides:``)."""
    import re

    return {m.group(1) for m in re.finditer(r"^\s+\*{0,2}(\w+)(?: \([^)]*\))?:(?:\s|$)", doc, re.M)}


def test_every_public_callable_describes_each_of_its_parameters():
    undocumented = []
    for name, function, doc in _public_callables():
        try:
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError):  # a builtin slot
            continue
        described = _documented(doc)
        missing = [p for p in parameters if p not in ("self", "cls") and p not in described]
        if missing:
            undocumented.append(f"{name}: {', '.join(missing)}")
    assert not undocumented, ("describe these parameters in the docstring where the name is defined (Google style: "
                              "Args:, or Attributes: for a dataclass's fields):\n" + "\n".join(undocumented))


def test_the_docstring_check_reads_google_style_sections():
    doc = "Do it.\n\nArgs:\n    x: the input.\n    steps (int): how many.\n    **overrides: more.\n\nReturns:\n    y."
    assert _documented(doc) >= {"x", "steps", "overrides"} and "Do" not in _documented(doc)


def test_no_docstring_holds_sphinx_roles_the_api_reference_would_show_raw():
    """The API reference renders docstrings as Markdown (mkdocstrings, Google style): ``:class:`X``` shows as text."""
    import re

    role = re.compile(r":(?:class|func|meth|mod|attr|exc|data|obj):`")
    found = [f"{path.relative_to(REPO)}:{number}" for root in (REPO / "amp_backends", REPO / "backends")
             for path in root.rglob("*.py")
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if role.search(line)]
    assert not found, "write `Name` (or a Markdown link) instead of a Sphinx role: " + ", ".join(found[:20])



def test_every_public_method_and_property_the_reference_renders_has_a_docstring_of_its_own():
    """The API reference renders a member only with its own docstring (``show_if_no_docstring: false``): a public
    method or property without one would be missing from it (attributes are in their class's table)."""
    missing = []
    for name, obj in _reference_objects().items():
        if not inspect.isclass(obj):
            continue
        fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
        for member, value in vars(obj).items():
            if member in fields:  # (a field: in its class's attributes table)
                continue
            function = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            # (a Keras hook a callback overrides keeps Keras's documentation: inspect.getdoc finds it)
            doc = inspect.getdoc(function) or inspect.getdoc(getattr(obj, member, None)) or ""
            if not member.startswith("_") and inspect.isfunction(function) and not doc.strip():
                missing.append(f"{name}.{member}")
    assert not missing, f"give these a docstring: {missing}"


@pytest.mark.tensorflow
@pytest.mark.parametrize("name", [n for n, c in exception_classes(errors).items()  # those made from a message alone
                                  if issubclass(c, errors.AmpError) and not any("__init__" in vars(k) for k in c.__mro__
                                             if issubclass(k, errors.AmpError) and k is not errors.AmpError)])
def test_an_error_raised_in_traced_code_reaches_the_caller_as_itself_not_as_a_staging_error(name):
    """InputError raised while a tf.function traced (the GAN's loss on batches of no fixed size) came out as
    AutoGraph's StagingError: AutoGraph keeps an error's type only when it has Exception's own constructor."""
    tf = pytest.importorskip("tensorflow")
    error = getattr(errors, name)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def traced(x):
        if x.shape[0] is None:
            raise error("what was expected, what was received, the fix")
        return x

    with pytest.raises(error, match="what was expected, what was received, the fix"):
        traced.get_concrete_function()
