"""Overrides: every option, valid and invalid, from keywords and from the environment."""

from __future__ import annotations

import pytest

from amp_backends.errors import AmpConfigError
from amp_backends.request import LossScale, build_request

pytestmark = pytest.mark.intel

NAMES = ("nvidia", "intel", "cpu")


def req(environ=None, **kw):
    return build_request(NAMES, environ=environ or {}, **kw)


@pytest.mark.parametrize("value,expected", [
    ("auto", "auto"), ("float32", "float32"), ("fp32", "float32"), ("mixed_float16", "mixed_float16"),
    ("fp16", "mixed_float16"), ("FLOAT16", "mixed_float16"), ("bf16", "mixed_bfloat16"),
    (" mixed_bfloat16 ", "mixed_bfloat16"),
])
def test_policy_values(value, expected):
    assert req(policy=value).policy == expected
    assert req({"AMP_POLICY": value}).policy == expected


@pytest.mark.parametrize("name", ["xla", "tf32", "fp8"])
@pytest.mark.parametrize("value,expected", [("on", True), ("1", True), ("true", True), ("off", False), ("0", False),
                                            ("no", False), ("auto", None), (True, True), (False, False),
                                            # documented "1/0" (auto_configure's Args): an int 1 was a TypeError
                                            (1, True), (0, False)])
def test_switch_values(name, value, expected):
    assert getattr(req(**{name: value}), name) is expected


@pytest.mark.parametrize("value,expected", [
    ("dynamic", LossScale.dynamic()), ("none", LossScale.none()), ("fixed:1024", LossScale.fixed(1024)),
    ("128", LossScale.fixed(128)), (256, LossScale.fixed(256)), (0.5, LossScale.fixed(0.5)), ("auto", None),
    # documented: 0 would zero every gradient, so it means no scaling (as "off" does)
    ("0", LossScale.none()), (0, LossScale.none()), ("0.0", LossScale.none()), ("off", LossScale.none()),
])
def test_loss_scale_values(value, expected):
    assert req(loss_scale=value).loss_scale == expected


@pytest.mark.parametrize("env,var,valid", [
    ({"AMP_POLICY": "bogus"}, "AMP_POLICY", "float32, mixed_float16, mixed_bfloat16"),
    ({"AMP_XLA": "maybe"}, "AMP_XLA", "auto, on, off"),
    ({"AMP_TF32": "2"}, "AMP_TF32", "auto, on, off"),
    ({"AMP_LOSS_SCALE": "fixed:-1"}, "AMP_LOSS_SCALE", "fixed:<scale>"),
    ({"AMP_LOSS_SCALE": "huge"}, "AMP_LOSS_SCALE", "dynamic, none"),
    ({"AMP_LOSS_SCALE": "fixed:0"}, "AMP_LOSS_SCALE", "fixed:<scale> (a positive number"),
    # beyond float32: the scaler's variable held inf and skipped every step
    ({"AMP_LOSS_SCALE": "1e40"}, "AMP_LOSS_SCALE", "a positive number a float32 holds, up to 3.4e+38"),
    ({"AMP_BACKEND": "rocm"}, "AMP_BACKEND", "nvidia, intel, cpu"),
    ({"AMP_STRICT": "perhaps"}, "AMP_STRICT", "on, off"),
    ({"AMP_FORCE": "x"}, "AMP_FORCE", "on, off"),
    ({"AMP_GRAPH_AMP": "x"}, "AMP_GRAPH_AMP", "on, off"),
    ({"AMP_ITEX_AMP": "x"}, "AMP_ITEX_AMP", "on, off"),  # graph_amp's old name: its own variable is named
    ({"AMP_FP8": "maybe"}, "AMP_FP8", "auto, on, off"),
])
def test_invalid_env_values_name_the_valid_ones(env, var, valid):
    with pytest.raises(AmpConfigError) as err:
        req(env)
    msg = str(err.value)
    assert var in msg and valid in msg and "Received: " + repr(next(iter(env.values()))) in msg
    assert f"export {var}=" in msg  # the fix


def test_invalid_keyword_values():
    with pytest.raises(AmpConfigError, match="policy= must be one of.*Received: 'half'.*pass policy="):
        req(policy="half")
    with pytest.raises(TypeError, match="policy must be a string"):
        req(policy=16)
    with pytest.raises(TypeError, match=r"xla must be True, False, 1, 0, None or one of 'auto', 'on', 'off'. Received: "
                                        r"xla=2.5 \(of type float\)"):
        req(xla=2.5)
    with pytest.raises(AmpConfigError, match=r"xla= must be one of auto, on, off \(or 1/0, true/false\). Received: 2"):
        req(xla=2)
    with pytest.raises(TypeError, match="loss_scale must be"):
        req(loss_scale=True)
    with pytest.raises(AmpConfigError, match="positive finite"):
        req(loss_scale=float("inf"))
    with pytest.raises(TypeError, match="Unknown override"):
        build_request(NAMES, environ={}, polcy="fp16")


def test_a_misspelt_variable_is_a_warning_naming_the_one_it_nearly_is():
    """AMP_POLCY=bf16 left the policy to the plan without a word (a misspelt keyword is a TypeError)."""
    import warnings

    from amp_backends.errors import AmpWarning

    env = {"AMP_POLCY": "bf16", "amp_xla": "on", "AMP_CACHE_DIR": "/tmp/c", "AMP_AUDIT_BACKEND": "cpu", "HOME": "/"}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert req(env) == req()  # ignored, as before
    said = sorted(str(w.message) for w in seen if issubclass(w.category, AmpWarning))
    assert said == ["AMP_POLCY is set, but amp_backends reads no variable of that name, so it was ignored; AMP_POLICY "
                    "is the nearest one. Fix: rename it AMP_POLICY (or unset it).",
                    "amp_xla is set, but amp_backends reads no variable of that name, so it was ignored; AMP_XLA is "
                    "the nearest one. Fix: rename it AMP_XLA (or unset it)."]


def test_keywords_win_over_environment_and_sources_are_kept():
    r = req({"AMP_POLICY": "bf16", "AMP_XLA": "off"}, policy="fp16")
    assert r.policy == "mixed_float16" and r.xla is False
    assert r.sources == {"policy": "argument", "xla": "AMP_XLA"}
    assert r.overrides() == {"policy": "mixed_float16", "xla": "off"}


def test_empty_environment_values_mean_auto():
    assert req({"AMP_POLICY": "", "AMP_XLA": "  "}) == req()


def test_every_override_help_names_its_variable_and_values():
    from amp_backends.request import ENV_VARS, option_help

    for name, var in ENV_VARS.items():
        assert f"${var}" in option_help(name)
    assert "aliases fp32, fp16, bf16" in option_help("policy")
    assert "0: no scaling" in option_help("loss_scale")


def test_strict_and_force_together_is_an_error():
    with pytest.raises(AmpConfigError, match="contradict"):
        req(strict=True, force=True)


# -- one table: OPTIONS ---------------------------------------------------------------------------------------

def test_the_table_is_what_build_request_accepts():
    from amp_backends.request import ENV_VARS, OPTIONS, Request

    assert [o.name for o in OPTIONS] == list(ENV_VARS) == [f for f in Request.__dataclass_fields__ if f != "sources"]
    assert all(ENV_VARS[o.name] == o.env == "AMP_" + o.name.upper() for o in OPTIONS)
    for o in OPTIONS:  # each option's parser is the one build_request uses, with the table's default
        assert o.default in ("auto", "off")
        assert req(**{o.name: "auto" if o.default == "auto" else "off"}) == req()


def docs_overrides_table() -> str:
    """The overrides table of the documentation's Options page (docs/generated/options.md, which it includes)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "generated" / "options.md").read_text(encoding="utf-8")
    section = text.split("\n## Overrides\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("|"))


def test_the_documented_overrides_table_is_the_table():
    from amp_backends.request import overrides_markdown

    assert docs_overrides_table() == overrides_markdown(), (
        "docs/generated/options.md's Overrides table differs from amp_backends.request.OPTIONS. Fix: run "
        "`python docs/generate.py`")


def _help(command, *args):
    from typer.testing import CliRunner

    from amp_backends.commands.typer_app import make_app

    app = make_app()
    app.command()(command)
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize("which", ["info", "check", "mnist", "gan"])
def test_every_command_takes_the_overrides_of_the_table(which):
    from amp_backends.commands import check_command, info_command, train_command
    from amp_backends.request import OPTIONS, option_help

    command = {"info": info_command.info, "check": check_command.check_command,
               "mnist": train_command.mnist_command(), "gan": train_command.gan_command()}[which]
    text = _help(command)
    for o in OPTIONS:
        if which in ("mnist", "gan") and o.name == "graph_amp":
            assert "--graph-amp" not in text  # the backend's graph rewrite is not offered to the examples
            continue
        usage = o.flag_name if o.flag else f"{o.flag_name} {o.metavar}"
        assert usage in text and " ".join(option_help(o.name).split()) in text, (o.name, text)


def test_a_command_receives_the_overrides_given_as_keywords():
    from typer.testing import CliRunner

    from amp_backends.commands.typer_app import make_app, with_overrides

    seen = {}

    @with_overrides()
    def show(name: str = "x", overrides=None) -> None:
        seen.update(name=name, overrides=overrides)

    app = make_app()
    app.command()(show)
    result = CliRunner().invoke(app, ["--policy", "bf16", "--strict", "--loss-scale", "0"])
    assert result.exit_code == 0, result.output
    # left out: not given, so AMP_* (else the plan) decides; a flag is given only when on
    assert seen == {"name": "x", "overrides": {"policy": "bf16", "loss_scale": "0", "strict": True}}
    assert req(**seen["overrides"]).policy == "mixed_bfloat16"


def test_overrides_given_leaves_out_what_was_not_given():
    from amp_backends.request import overrides_given

    parsed = {"policy": None, "xla": "off", "strict": False, "force": True, "epochs": 3}
    assert overrides_given(parsed) == {"xla": "off", "force": True}


def test_auto_configure_takes_the_overrides_of_the_table():
    """auto_configure spells its keywords out (for readers and editors): they are the table's, in its order."""
    import inspect

    from amp_backends.configure import auto_configure
    from amp_backends.request import OPTIONS

    names = [p.name for p in inspect.signature(auto_configure).parameters.values()]
    assert [n for n in names if n in {o.name for o in OPTIONS}] == [o.name for o in OPTIONS]


def test_a_loss_scale_a_float32_cannot_hold_is_refused_however_it_is_made():
    from amp_backends.loss_scale import LossScale

    with pytest.raises(AmpConfigError, match="a float32 holds.*Received: 1e\\+40.*Fix"):
        LossScale.fixed(1e40)
    assert LossScale.fixed(2.0**127).initial == 2.0**127


def test_a_device_or_environ_of_the_wrong_type_is_our_error_with_the_fix():
    """``plan_for(device=5)`` was "'int' object has no attribute 'backend'" and ``environ=[...]`` "'list' object
    has no attribute 'get'": both now say what they expect, what they received and the fix."""
    from amp_backends.configure import plan_for

    with pytest.raises(AmpConfigError, match=r"device must be a device name such as 'h100'. Received: 5\. Known"):
        plan_for(device=5, environ={})
    for wrong in ([("AMP_POLICY", "float32")], "AMP_POLICY=float32"):
        with pytest.raises(AmpConfigError, match=r"environ must be a mapping of variable names to values \(like "
                                                 r"os.environ\) or None. Received: .*Fix: pass a dict"):
            plan_for(device="h100", environ=wrong)
    assert plan_for(device="h100", environ={"AMP_POLICY": "float32"}).policy == "float32"
