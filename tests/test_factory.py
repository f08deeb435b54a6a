"""MODULE:FACTORY: one parser and loader for ``check``, ``audit`` and the audit's child, one error for a bad one."""

from __future__ import annotations

import textwrap

import pytest

from amp_backends.errors import AmpError, FactoryError
from amp_backends.factory import factory_spec, load_factory, parse_factory

BAD = ["mymodels.py", "pkg/mod.py:build", "pkg.mod:build:extra", "pkg.mod:", ":build", "pkg.mod:build()", "", 42]


def top_level_factory():
    return "built"


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "user_factories.py").write_text(textwrap.dedent("""
        def good():
            return "model"
        def needs_args(width, depth=2):
            return "model"
        WIDTH = 3
    """))
    (tmp_path / "does_not_import.py").write_text("import no_such_module_anywhere\n")
    (tmp_path / "does_not_parse.py").write_text("def good(:\n    pass\n")
    (tmp_path / "raises_on_import.py").write_text("import json\nCONFIG = json.loads('{bad')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_well_formed_spec_is_split_into_module_and_function():
    assert parse_factory("pkg.mod:build") == ("pkg.mod", "build")
    assert parse_factory("  amp_backends.models:mnist_cnn \n") == ("amp_backends.models", "mnist_cnn")


@pytest.mark.parametrize("spec", BAD)
def test_a_malformed_spec_is_one_error_with_the_form_the_value_and_the_fix(spec):
    with pytest.raises(FactoryError) as caught:
        parse_factory(spec)
    message = str(caught.value)
    assert message.startswith("expected MODULE:FACTORY") and f"Received: {spec!r}" in message and "Fix:" in message
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, AmpError)


@pytest.mark.parametrize("spec", BAD[:4])
def test_check_audit_and_the_childs_loader_refuse_a_bad_spec_with_the_same_message(spec):
    """The audit (before its child starts) and the check's loader say exactly what the parser says."""
    from amp_backends import audit

    with pytest.raises(FactoryError) as parsed:
        parse_factory(spec)
    with pytest.raises(FactoryError) as audited:
        audit(spec)
    with pytest.raises(FactoryError) as loaded:
        load_factory(spec)
    assert str(audited.value) == str(loaded.value) == str(parsed.value)


def test_the_check_command_reports_the_loaders_error(user_module):
    import typer
    from typer.testing import CliRunner

    from amp_backends.commands.check_command import check_command

    app = typer.Typer()
    app.command()(check_command)
    result = CliRunner().invoke(app, ["pkg/mod.py:build"])
    assert result.exit_code == 2
    with pytest.raises(FactoryError) as parsed:
        parse_factory("pkg/mod.py:build")
    assert " ".join(str(parsed.value).split()[:8]) in " ".join(result.output.split())


def test_load_factory_imports_the_module_from_the_current_directory(user_module):
    assert load_factory("user_factories:good")() == "model"
    assert load_factory(top_level_factory) is top_level_factory


@pytest.mark.parametrize("spec, message", [
    # found, its own import failing: the fix said to run from the directory that holds it
    ("does_not_import:good", "importing it raised ModuleNotFoundError: No module named 'no_such_module_anywhere'. "
                             "Fix: the error in the module's own code ("),
    ("does_not_parse:good", "raised SyntaxError: invalid syntax (does_not_parse.py, line 1). Fix: the error in the "
                            "module's own code ("),
    ("raises_on_import:good", "raised JSONDecodeError: Expecting property name enclosed in double quotes: line 1 "
                              "column 2 (char 1). Fix: the error in the module's own code ("),
    ("no_such_module_xyz:good", "expected an importable module 'no_such_module_xyz' (MODULE:FACTORY "
                                "'no_such_module_xyz:good'), but importing it raised ModuleNotFoundError: No module "
                                "named 'no_such_module_xyz'. Fix: run from the directory that holds it"),
    ("user_factories:missing", "Functions defined there: good"),
    ("user_factories:WIDTH", "it is 3 (of type int)"),
    # it was the factory's own TypeError (missing 1 required positional argument) and "the error in the factory"
    ("user_factories:needs_args", "to build a model with no arguments, but it takes width. Fix: give them defaults"),
    # it was "No module named 'user_factories.py'" and "check that python -c 'import user_factories.py' works"
    ("user_factories.py:good", "a file's name. Fix: user_factories:good (without .py)"),
])
def test_load_factory_says_what_went_wrong(user_module, spec, message):
    with pytest.raises(FactoryError, match="Fix:") as caught:
        load_factory(spec)
    assert message in str(caught.value)
    if "own code" in message:  # the module's own line (not json's, for the line calling json.loads)
        line = {"does_not_import": 1, "does_not_parse": 1, "raises_on_import": 2}[spec.partition(":")[0]]
        assert f"{spec.partition(':')[0]}.py, line {line}): it was found" in str(caught.value)


def test_the_audits_child_loads_through_the_same_loader(user_module):
    from amp_backends.auditing import child

    assert child.load_factory("user_factories:good")() == "model"
    with pytest.raises(FactoryError, match="Functions defined there: good"):
        child.load_factory("user_factories:missing")


def test_a_factory_function_is_named_for_another_process_or_refused():
    assert factory_spec(top_level_factory) == f"{__name__}:top_level_factory"
    assert factory_spec(" pkg.mod:build ") == "pkg.mod:build"
    def nested():
        return "built"

    for unimportable in (lambda: None, nested):
        with pytest.raises(FactoryError, match="top-level function of an importable module"):
            factory_spec(unimportable)
