"""What the user asks for: overrides from keyword arguments (which win) and ``AMP_*`` environment variables,
each defaulting to ``auto`` and validated here once, with errors that name the accepted values.

`OPTIONS` is the one table of the overrides: keyword, variable, parsing, documentation (`overrides_markdown`) and
command-line help (`option_help`). `RENAMED` holds old names that still work for one release, with a warning.
"""

from __future__ import annotations

import difflib
import numbers
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .assessment import POLICIES
from .errors import AmpConfigError, moved_names, nearest, warn
from .override_sources import GIVEN_BY, env_name, flag_name, format_value
from .layer_names import corrected, describe_unknown, unknown_layers
from .loss_scale import DEFAULT_GROWTH_INTERVAL, DEFAULT_INITIAL_SCALE, FLOAT32_MAX, LossScale  # noqa: F401  (re-exported)

_POLICY_ALIASES = {"float32": "float32", "fp32": "float32",
                   "mixed_float16": "mixed_float16", "float16": "mixed_float16", "fp16": "mixed_float16",
                   "mixed_bfloat16": "mixed_bfloat16", "bfloat16": "mixed_bfloat16", "bf16": "mixed_bfloat16"}
_TRUE, _FALSE = {"1", "on", "true", "yes"}, {"0", "off", "false", "no"}

@dataclass(frozen=True)
class Request:
    """The user's overrides, validated (`OPTIONS` says each one's values). ``None`` / ``"auto"``: the plan decides.

    Attributes:
        backend: The backend to plan with (``"nvidia"``, ``"intel"``, ``"cpu"``, a third party's), or ``"auto"``.
        policy: The Keras dtype policy (``"float32"``, ``"mixed_float16"``, ``"mixed_bfloat16"``), or ``"auto"``.
        xla: Whether training steps are compiled with XLA.
        tf32: Whether float32 matmuls may use TF32 (or the backend's equivalent).
        loss_scale: The loss scaling asked for (`LossScale`).
        graph_amp: Whether the backend's own graph rewrite replaces the Keras dtype policy.
        fp8: Whether the eligible Dense layers train in float8.
        float32_layers: Keras layer classes kept in float32 inside a mixed-precision model (``()``: none).
        strict: Raise `UnsupportedRequestError` instead of downgrading a request.
        force: Run a slow (emulated) request anyway.
        sources: Where each value given came from: ``{"policy": "AMP_POLICY"}``, ``{"policy": "argument"}`` (a
            keyword) or ``{"policy": "--policy"}`` (a command's option).
    """

    backend: str = "auto"
    policy: str = "auto"
    xla: bool | None = None
    tf32: bool | None = None
    loss_scale: LossScale | None = None
    graph_amp: bool = False
    fp8: bool | None = None
    float32_layers: tuple[str, ...] | None = None
    strict: bool = False
    force: bool = False
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def overrides(self) -> dict[str, str]:
        """Non-default values as text, keyed by option name (for reports and logs)."""
        values = {name: getattr(self, name) for name in ENV_VARS}
        return {name: format_value(v) for name, v in values.items()
                if not (v is None or v == "auto" or (v is False and OPTION[name].default == "off"))}

    def to_dict(self) -> dict[str, Any]:
        """The Request as JSON-ready data."""
        values = {name: getattr(self, name) for name in ENV_VARS} | {"sources": dict(self.sources)}
        return {name: v.to_dict() if isinstance(v, LossScale) else v for name, v in values.items()}


def _invalid(name: str, source: str, accepted: str, value: Any, example: str | None, more: str = "") -> AmpConfigError:
    """The error for an invalid value of option ``name``: what it accepts, what it got (and ``more``), the fix (with
    ``example``, else one of those accepted)."""
    var, flag = env_name(name), flag_name(name)
    shown = "<one of those>" if example is None else example if source != "argument" else repr(example)
    given = f"{var}={shown}" if source == "env" else f"{flag} {shown}" if source == "option" else f"{name}={shown}"
    where, fix = ((var, f"export {given}, or unset {var}") if source == "env" else
                  (flag, f"pass {given}, or leave {flag} out") if source == "option" else
                  (f"{name}=", f"pass {given}, or leave {name} out"))
    return AmpConfigError(f"{where} must be {accepted}. Received: {value!r}{more}. Fix: {fix} to let amp_backends "
                          "decide.")


def _wrong_type(name: str, expected: str, value: Any) -> TypeError:
    return TypeError(f"{name} must be {expected}. Received: {name}={value!r} (of type {type(value).__name__}).")


def parse_policy(value: Any, source: str = "argument") -> str:
    """The ``policy`` override parsed: ``"auto"`` or one of `POLICIES`, aliases resolved (``fp16``: ``mixed_float16``).

    Args:
        value: The value given: ``auto``, a policy or an alias, in any case.
        source: How it was given, for the error: ``"argument"`` (a keyword), ``"env"`` or ``"option"`` (a flag).

    Raises:
        AmpConfigError: ``value`` is no policy or alias (a ``TypeError`` where it is no string).
    """
    if not isinstance(value, str):
        raise _wrong_type("policy", "a string, such as 'mixed_float16'", value)
    v = value.strip().lower()
    if v in ("", "auto"):
        return "auto"
    if v not in _POLICY_ALIASES:
        near = nearest(v, [*_POLICY_ALIASES, "half"])
        raise _invalid("policy", source, f"one of auto, {', '.join(POLICIES)} (aliases fp32, fp16, bf16)", value,
                       _POLICY_ALIASES.get(near, "mixed_float16") if near else None)
    return _POLICY_ALIASES[v]


def parse_float32_layers(value: Any, source: str = "argument") -> tuple[str, ...] | None:
    """``None`` (auto: the plan's measured list), ``()`` (none) or Keras layer class names."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        names = [str(v).strip() for v in value]
    elif isinstance(value, str):
        v = value.strip()
        if v.lower() in ("", "auto"):
            return None
        if v.lower() in ("none", "off"):
            return ()
        names = [n.strip() for n in v.split(",")]
    else:
        raise _wrong_type("float32_layers", "'auto', 'none', a comma-separated string or a list of Keras layer class "
                          "names", value)
    bad = [n for n in names if not n.isidentifier()]
    unknown = {} if bad else unknown_layers(names)  # a typo would keep no layer in float32, silently
    if bad or unknown or not names:
        raise _invalid("float32_layers", source, "auto, none or Keras layer class names separated by commas, such "
                       "as DepthwiseConv2D,Conv1D", value, corrected(names, unknown) or "DepthwiseConv2D",
                       (f" (not class names: {', '.join(map(repr, bad))})" if bad else "") + describe_unknown(unknown))
    return tuple(dict.fromkeys(names))


def parse_switch(name: str, value: Any, source: str = "argument", known: tuple[str, ...] = ()) -> bool | None:
    """An on/off override parsed: ``None`` (auto: the plan decides), ``True`` or ``False``.

    Args:
        name: The option's name, for the error.
        value: ``None``, a bool, 1 or 0, or text: ``auto``, ``on``, ``off``, ``1``, ``0``, ``true``, ``false``...
        source: How it was given, for the error: ``"argument"`` (a keyword), ``"env"`` or ``"option"`` (a flag).
        known: Not read (the options table's parsers are all given the registered backends).

    Raises:
        AmpConfigError: ``value`` is none of those (a ``TypeError`` where it is of another type).
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral) and value in (0, 1):  # 1/0 (NumPy's ints too), as documented
        return bool(value)
    if not isinstance(value, (str, numbers.Integral)):
        raise _wrong_type(name, "True, False, 1, 0, None or one of 'auto', 'on', 'off'", value)
    v = str(value).strip().lower()
    if v in ("", "auto"):
        return None
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise _invalid(name, source, "one of auto, on, off (or 1/0, true/false)", value, "on")


def parse_loss_scale(value: Any, source: str = "argument") -> LossScale | None:
    """The ``loss_scale`` override parsed: a `LossScale`, or ``None`` (auto: the plan decides).

    Args:
        value: ``auto``, ``dynamic``, ``none`` (``off``, 0), ``fixed:<scale>``, a bare number or a `LossScale`.
        source: How it was given, for the error: ``"argument"`` (a keyword), ``"env"`` or ``"option"`` (a flag).

    Raises:
        AmpConfigError: ``value`` is none of those, or its scale no positive float32 (a ``TypeError``: another type).
    """
    if value is None or isinstance(value, LossScale):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _wrong_type("loss_scale", "'auto', 'dynamic', 'none', 'fixed:<scale>', a number or a LossScale", value)
    if isinstance(value, (int, float)):
        # 0 would zero every gradient: it means "no scaling", as AMP_LOSS_SCALE=0 does
        return LossScale.none() if value == 0 else LossScale.fixed(float(value))
    v = value.strip().lower()
    if v in ("", "auto"):
        return None
    if v == "dynamic":
        return LossScale.dynamic()
    if v in ("none", "off"):
        return LossScale.none()
    number = v.split(":", 1)[1] if v.startswith("fixed:") else (None if v == "fixed" else v)
    try:
        scale = float(number) if number is not None else None
    except ValueError:
        scale = None
    if scale == 0 and number == v:
        return LossScale.none()
    if scale is None or not (0 < scale <= FLOAT32_MAX):  # (held in a float32 variable: beyond it, inf)
        raise _invalid("loss_scale", source, "one of auto, dynamic, none (or 0), fixed:<scale> (a positive number a "
                       f"float32 holds, up to {FLOAT32_MAX:.3g}, such as fixed:1024) or a bare number", value,
                       "fixed:1024")
    return LossScale.fixed(scale)


def parse_backend(value: Any, known: Iterable[str], source: str = "argument") -> str:
    """The ``backend`` override parsed: ``"auto"`` or one of ``known``.

    Args:
        value: The value given: ``auto`` or a registered backend's name, in any case.
        known: The registered backends' names.
        source: How it was given, for the error: ``"argument"`` (a keyword), ``"env"`` or ``"option"`` (a flag).

    Raises:
        AmpConfigError: ``value`` names no registered backend (a ``TypeError`` where it is no string).
    """
    known = tuple(known)
    if not isinstance(value, str):
        raise _wrong_type("backend", "a string, such as 'cpu'", value)
    v = value.strip().lower()
    if v in ("", "auto"):
        return "auto"
    if v not in known:
        raise _invalid("backend", source, f"auto or a registered backend: {', '.join(known)}", value,
                       nearest(v, known))
    return v


# ---------------------------------------------------------------------------------------------- the table
Parser = Callable[[str, Any, str, tuple[str, ...]], Any]  # (name, value, source, registered backends) -> value


def _by_value(parse: Callable[[Any, str], Any]) -> Parser:
    """The table's parser for a ``parse(value, source)``."""
    return lambda name, value, source, known: parse(value, source)


def _on_off(name: str, value: Any, source: str, known: tuple[str, ...]) -> bool:
    return bool(parse_switch(name, value, source))


@dataclass(frozen=True)
class Option:
    """One plan override: its keyword, its ``AMP_*`` variable, how it parses and how it is documented.

    ``values`` documents the accepted values (Markdown); ``help`` is the command-line help (``{backends}``: the
    registered ones); ``metavar`` the placeholder, ``None`` for a flag; ``default`` what unset means.
    """

    name: str
    parse: Parser
    values: str
    help: str
    metavar: str | None = None
    default: str = "auto"

    @property
    def env(self) -> str:
        """The option's ``AMP_*`` environment variable (``AMP_POLICY``)."""
        return env_name(self.name)

    @property
    def flag(self) -> bool:
        """Whether its command-line option is a flag, given without a value."""
        return self.metavar is None

    @property
    def flag_name(self) -> str:
        """The option's command-line flag (``--loss-scale``)."""
        return flag_name(self.name)


OPTIONS: tuple[Option, ...] = (
    Option("backend", lambda _, value, source, known: parse_backend(value, known, source),
           "`auto`, `nvidia`, `intel`, `cpu` (any registered backend)",
           "Backend: auto or a registered one ({backends}, or one an installed package adds)", "NAME"),
    Option("policy", _by_value(parse_policy),
           "`auto`, `float32`, `mixed_float16`, `mixed_bfloat16` (aliases `fp32`, `fp16`, `bf16`)",
           f"Keras dtype policy: auto, {', '.join(POLICIES)} (aliases fp32, fp16, bf16)", "POLICY"),
    Option("xla", parse_switch, "`auto`, `on`, `off` (also `1/0`, `true/false`)",
           "XLA compilation of training steps: auto, on, off (also 1/0, true/false)", "auto|on|off"),
    Option("tf32", parse_switch,
           "`auto`, `on`, `off` (on Intel: ITEX's `ITEX_FP32_MATH_MODE`, TF32 on XPU, BF32 on AMX CPUs)",
           "TF32 for float32 matmuls (ITEX's math mode on Intel): auto, on, off", "auto|on|off"),
    Option("loss_scale", _by_value(parse_loss_scale),
           "`auto`, `dynamic`, `none` (also `off` and `0`: a scale of 0 would zero every gradient, so it means no "
           "scaling), `fixed:<scale>` or a bare positive number",
           "Loss scaling: auto, dynamic, none (also off or 0: no scaling), fixed:<scale> or a bare number "
           "(a fixed scale)", "SCALE"),
    Option("graph_amp", _on_off,
           "`on`/`off`: the backend rewrites the float32 graph to low precision itself instead of a Keras dtype "
           "policy, where it has such a rewrite (the plan's `graph_amp` reason names it); the Keras policy stays "
           "float32",
           "The backend's own rewrite of the float32 graph to low precision instead of a Keras policy, where it "
           "has one: on, off", "on|off", "off"),
    Option("fp8", parse_switch,
           "`auto` (off until a measurement shows it faster), `on`, `off`: float8 training of the eligible Dense "
           "layers (`amp_backends.prepare_model(model, plan)`); native on NVIDIA CC ≥ 8.9 with Keras ≥ 3.3 and "
           "XLA on",
           "float8 training of the eligible Dense layers (NVIDIA CC >= 8.9, Keras >= 3.3, XLA on): auto (off until "
           "measured faster), on, off", "auto|on|off"),
    Option("float32_layers", _by_value(parse_float32_layers),
           "`auto` (the layer kinds measured slower in the policy's low precision than in float32 on this hardware), "
           "`none`, or Keras layer class names separated by commas (`DepthwiseConv2D,Conv1D`; subclasses match): "
           "kept in float32 inside the mixed-precision model by `amp_backends.prepare_model(model, plan)` and the "
           "trainer",
           "Keras layer classes kept in float32 inside a mixed-precision model: auto (those measured slower in low "
           "precision here), none, or class names separated by commas", "auto|none|NAMES"),
    Option("strict", _on_off, "`on`: raise `UnsupportedRequestError` instead of downgrading a request",
           "Fail instead of downgrading a request the hardware cannot honour", None, "off"),
    Option("force", _on_off, "`on`: run a slow (emulated) request anyway; an unsafe one is still refused",
           "Run a slow (emulated) request anyway; an unsafe one is still refused", None, "off"),
)
OPTION = {o.name: o for o in OPTIONS}
ENV_VARS = {o.name: o.env for o in OPTIONS}
# Old names that still work for one release, with a deprecation warning: old name -> the option it now is.
RENAMED = {"itex_amp": "graph_amp"}
RENAMED_ENV_VARS = {old: env_name(old) for old in RENAMED}


def renamed_message(old: str, source: str = "argument") -> str:
    """The deprecation warning for ``old`` (a name of `RENAMED`), naming the new option the way the old one was
    given: ``source`` is ``"argument"`` (a keyword), ``"env"`` (its ``AMP_*`` variable) or ``"option"`` (a flag)."""
    new = RENAMED[old]
    given, use = {"env": (env_name(old), env_name(new)),
                  "option": (flag_name(old), flag_name(new))}.get(source, (old, new))
    return f"{given} is deprecated: use {use}, its new name (the same values); {given} goes in the next release"


def option_help(name: str, backends: Iterable[str] = ("nvidia", "intel", "cpu")) -> str:
    """The command-line help of override ``name``: its values and the ``AMP_*`` variable it defaults to."""
    option = OPTION[name]
    return f"{option.help.format(backends=', '.join(backends))}. Default: ${option.env}, else {option.default}."


def overrides_markdown() -> str:
    """The documentation's overrides table (Markdown, docs/reference/options.md), from `OPTIONS`."""
    rows = ["| keyword | environment | values |", "|---|---|---|"]
    rows += [f"| `{o.name}` | `{o.env}` | {o.values} |" for o in OPTIONS]
    return "\n".join(rows)


def overrides_given(parsed: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides among a command's parsed options, as ``auto_configure``'s keywords: those given only (an
    option left out or a flag left off leaves it to the ``AMP_*`` variable, else the plan)."""
    return {o.name: parsed[o.name] for o in OPTIONS if parsed.get(o.name) not in (None, False)}


def build_request(known_backends: Iterable[str], environ: Mapping[str, str] | None = None, **kwargs: Any) -> Request:
    """Merge keyword overrides (which win; ``None`` falls back) with ``AMP_*`` environment variables and validate
    them. An old name of `RENAMED` stands for its new one, with a ``DeprecationWarning`` (a keyword) or a
    ``FutureWarning`` (a variable); the new name, given the same way, wins over it.

    Args:
        known_backends: The registered backends' names (``backend=`` must be one, or ``auto``).
        environ: The environment to read the ``AMP_*`` variables from; ``None``: ``os.environ``.
        **kwargs: The keyword overrides, by option name (`OPTIONS`).

    Returns:
        The validated `Request`, with where each value came from.

    Raises:
        AmpConfigError: An unknown override, an invalid value, ``environ`` no mapping, or both strict and force.
    """
    unknown = set(kwargs) - set(ENV_VARS) - set(RENAMED)
    if unknown:
        raise AmpConfigError(
            f"Unknown override(s) {sorted(unknown)}. Accepted keyword arguments: {', '.join(ENV_VARS)}.")
    if environ is not None and not isinstance(environ, Mapping):
        raise AmpConfigError(f"environ must be a mapping of variable names to values (like os.environ) or None. "
                             f"Received: {environ!r:.80} (of type {type(environ).__name__}). Fix: pass a dict, such "
                             "as {'AMP_POLICY': 'float32'}, or leave environ out to read os.environ.")
    env = os.environ if environ is None else environ

    def given(name: str) -> tuple[Any, str, str, str] | None:
        """(value, "argument", "option" or "env", the name it was given as, its source as the plan says it), or
        ``None`` where it was not."""
        if kwargs.get(name) is not None:
            value, kind, source = (GIVEN_BY.get() or {}).get(name, (None, "", ""))
            if kind and value == kwargs[name]:
                return value, kind, name, source
            return kwargs[name], "argument", name, "argument"
        return (env[env_name(name)], "env", name, env_name(name)) if env.get(env_name(name), "").strip() != "" else None

    raw = {name: found for name in ENV_VARS if (found := given(name)) is not None}
    known_vars = [*ENV_VARS.values(), *RENAMED_ENV_VARS.values()]
    for variable in (k for k in env if k.upper().startswith("AMP_") and k not in known_vars):  # a typo, another case
        for meant in difflib.get_close_matches(variable.upper(), known_vars, n=1, cutoff=0.85):
            warn(f"{variable} is set, but amp_backends reads no variable of that name, so it was ignored; "
                 f"{meant} is the nearest one. Fix: rename it {meant} (or unset it).")
    for old, new in RENAMED.items():
        if (old_given := given(old)) is None:
            continue
        by_argument = old_given[1] != "env"
        warn(renamed_message(old, old_given[1]), DeprecationWarning if by_argument else FutureWarning)
        if new not in raw or (raw[new][1] == "env" and by_argument):
            raw[new] = old_given

    known = tuple(known_backends)
    values = {name: OPTION[name].parse(given_as, value, kind, known)
              for name, (value, kind, given_as, _) in raw.items()}
    sources = {name: source for name, (*_, source) in raw.items()}
    request = Request(**values, sources=sources)
    if request.strict and request.force:
        raise AmpConfigError("strict and force contradict each other: strict raises on any request the hardware "
                             "cannot honour, force honours slow ones anyway. Received both. Fix: keep one of them.")
    return request


# Names that moved to amp_backends.override_sources, kept here for one release
__getattr__ = moved_names(__name__, "amp_backends.override_sources",
                          ("keywords_as_options", "keywords_chosen_by", "undo_of"))
