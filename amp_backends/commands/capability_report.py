"""The capability report: `collect` gathers plain data, `render_text` / `to_json` show it.

TensorFlow's version, its CUDA/cuDNN build and Keras's version are read without importing TensorFlow (package
metadata, ``build_info.py``). Importing it (most of ``info``'s time) is needed only to list Intel XPUs (ITEX is a
plugin) and to confirm TensorFlow sees the GPUs NVML reports: by default (``use_tensorflow=None``) the report
imports it exactly then and says why; ``True`` always imports it, ``False`` never.

JSON (`to_json`, ``schema_version`` 2; fields are only ever added within a version): its schema, every field
described along with what changed since version 1, is ``amp_backends/schemas/report.schema.json``.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..configure import quiet_plan_for
from ..errors import AmpConfigError
from ..hardware import BackendProbe, Hardware
from ..keras_compat import keras_info
from ..probe import needs_tensorflow, probe_hardware
from ..registry import BackendRegistry, registry_or_default
from ..request import ENV_VARS, RENAMED, RENAMED_ENV_VARS
from ..software import tensorflow_build_info, tensorflow_version
from ..version import __version__

SCHEMA_VERSION = 2


@dataclass
class Report:
    """The report: its plain data (``data``, what `to_json` writes) and the hardware it describes."""

    data: dict[str, Any] = field(default_factory=dict)
    hardware: Hardware | None = field(default=None, repr=False)
    sources: dict[str, str] = field(default_factory=dict, repr=False)  # where the plan's overrides came from


def _tensorflow_section(imported: Any, why: str, error: str | None) -> dict[str, Any]:
    info: dict[str, Any] = {"version": tensorflow_version(), "imported": imported is not None,
                            "why": why, "error": error}
    build = tensorflow_build_info() or {}
    if imported is not None:
        info["version"] = imported.__version__
        try:
            build = dict(imported.sysconfig.get_build_info())
        except Exception:
            pass
    info.update(is_cuda_build=bool(build.get("is_cuda_build")) if build else None,
                cuda_version=build.get("cuda_version"), cudnn_version=build.get("cudnn_version"))
    if not info["version"]:
        info["error"] = "TensorFlow is not installed (pip install tensorflow)"
    return info


def _hardware(registry: BackendRegistry, use_tensorflow: bool | None,
              quiet: bool) -> tuple[Hardware, Any, str, str | None]:
    """Probe, importing TensorFlow when asked or (``None``) when it can change the plan."""
    hardware = probe_hardware(registry, use_tensorflow=False)
    if use_tensorflow is None:
        use_tensorflow = needs_tensorflow(hardware, registry)
        why = ("auto: imported to list the devices an accelerator backend needs TensorFlow for" if use_tensorflow
               else "auto: not imported, no accelerator backend needs it (--tensorflow lists its devices)")
    else:
        why = "imported as asked (--tensorflow)" if use_tensorflow else "not imported, as asked (--no-tensorflow)"
    if not use_tensorflow or tensorflow_version() is None:
        return hardware, None, why, None
    try:
        from ..tf_import import import_tensorflow

        tf = import_tensorflow(quiet)
    except Exception as exc:
        return hardware, None, why, f"{type(exc).__name__}: {exc}"
    return probe_hardware(registry, use_tensorflow=True), tf, why, None


def _rows(call: Any, *args: Any) -> list[list[str]]:
    try:
        return [[str(label), str(value)] for label, value in call(*args)]
    except Exception as exc:  # a backend's bug is shown, never raised
        return [["error", f"{type(exc).__name__}: {exc}"]]


def _status_first(rows: list[list[str]], probe: BackendProbe) -> list[list[str]]:
    """A backend's rows, opening with why it is not available where its own rows do not say so."""
    if probe.available or any(label in ("status", "error") for label, _ in rows):
        return rows
    return [["status", f"not available: {probe.reason}"], *rows]


def collect(*, use_tensorflow: bool | None = None, registry: BackendRegistry | None = None,
            environ: Mapping[str, str] | None = None, quiet: bool = False, device: str | None = None,
            **overrides: Any) -> Report:
    """Gather the plan, the software and the hardware; broken or missing software or backends are reported, never
    raised. ``quiet`` filters TensorFlow's start-up noise; ``device`` plans for a catalogue device
    (`amp_backends.devices`) instead of this machine. A bad override or an unknown ``device`` raises
    `AmpConfigError`."""
    registry = registry_or_default(registry)
    env = os.environ if environ is None else environ
    if device is not None:  # a catalogue device's description, not this machine
        from ..devices import device_hardware

        hardware, tf, tf_error = device_hardware(device, registry), None, None
        why = f"not imported: planned for the catalogue device {device!r}"
    else:
        hardware, tf, why, tf_error = _hardware(registry, use_tensorflow, quiet)
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "amp_backends_version": __version__, "plan": None, "plan_error": None,
        "overrides": {var: env[var] for var in (*ENV_VARS.values(), *RENAMED_ENV_VARS.values())
                      if env.get(var, "").strip()},
        "autotune": None,
        "software": {"python": platform.python_version(), "platform": platform.platform(),
                     "tensorflow": _tensorflow_section(tf, why, tf_error), "keras": keras_info(tf).to_dict(),
                     "backends": {b.name: _rows(b.software_rows) for b in registry}},
        "backend_rows": {b.name: _status_first(_rows(b.report_rows, probe), probe) for b in registry
                         if (probe := hardware.get(b.name)) is not None},
        "hardware": hardware.to_dict(),
    }
    for name, err in registry.load_errors.items():
        data["backend_rows"][name] = [["status", f"failed to load: {err}"]]
    try:
        plan = quiet_plan_for(hardware, registry=registry, environ=dict(env), **overrides)  # (warnings: shown)
    except AmpConfigError:  # the user's error: the caller reports it
        raise
    except Exception as exc:  # anything else is shown in the report
        data["plan_error"] = f"{type(exc).__name__}: {exc}"
        return Report(data, hardware)
    data["plan"] = plan.to_dict()
    for status in plan.backends:
        if status.failed and status.name not in registry.load_errors:
            data["backend_rows"].setdefault(status.name, []).append(["failure", status.reason])
    try:
        from ..autotune import cache_path, cached_for_device, device_signature

        signature = device_signature(plan, hardware)
        data["autotune"] = {"cache": str(cache_path()), "device": signature, "choices": cached_for_device(signature)}
    except Exception as exc:
        data["autotune"] = {"error": f"{type(exc).__name__}: {exc}"}
    return Report(data, hardware, dict(plan.request.sources))


def to_json(report: Report) -> str:
    """The report as JSON (its schema: ``amp_backends/schemas/report.schema.json``).

    Args:
        report: The report (`collect`'s).

    Returns:
        The JSON text, indented.
    """
    return json.dumps(report.data, indent=2, sort_keys=False, default=str)


def _said(source: str) -> str:
    """An override's source as a phrase: ``--policy``, or ``an argument`` (a keyword of the Python API)."""
    return "an argument" if source == "argument" else source


def render_text(report: Report, console: Any = None, why: bool = False) -> None:
    """Print the report: tables on a terminal, one plain line a row elsewhere; the plan's settings with their short
    reasons, or with ``why`` their whole reasons (and the measurements they quote) and the rejected alternatives."""
    from ..terminal import make_console, say, show_rows

    console = console or make_console()
    d = report.data
    rows = [(name if i == 0 else "", str(label), str(value))
            for name, backend_rows in d["backend_rows"].items() for i, (label, value) in enumerate(backend_rows)]
    tf_types = d["hardware"]["tensorflow_device_types"]
    rows.append(("tensorflow", "devices listed", ", ".join(tf_types) if tf_types is not None else "not consulted"))
    backend = [""]

    def hardware_line(cells: Any) -> str:  # a plain line names its backend, which the table shows once
        backend[0] = cells[0] or backend[0]
        return f"{backend[0]} {cells[1]}: {cells[2]}"

    show_rows(console, ["backend", "item", ("value", {"overflow": "fold"})], rows, title="Hardware",
              show_header=True, header_style="bold", plain=hardware_line)
    sw = d["software"]
    tf = sw["tensorflow"]
    build = {True: f" (CUDA build, CUDA {tf.get('cuda_version')}, cuDNN {tf.get('cudnn_version')})",
             False: " (CPU-only build)"}.get(tf.get("is_cuda_build"), "")
    error = f" [{tf['error']}]" if tf.get("error") else ""
    tf_text = f"{tf['version'] or 'not installed'}{build}; {tf['why']}{error}"
    k = sw["keras"]
    generation = f" (Keras {k['generation']} API)" if k.get("generation") else ""
    software = [("amp_backends", d["amp_backends_version"]), ("Python", f"{sw['python']} ({sw['platform']})"),
                ("TensorFlow", tf_text), ("Keras", f"{k['version'] or 'not installed'}" + generation)]
    software += [(str(label), str(value)) for backend_rows in sw["backends"].values() for label, value in backend_rows]
    show_rows(console, ["item", ("value", {"overflow": "fold"})], software, title="Software", show_header=False,
              plain=lambda c: f"{c[0]}: {c[1]}")
    plan_rows, styles = _plan_rows(d, why)
    show_rows(console, ["setting", "choice", ("why", {"overflow": "fold"})], plan_rows, title="Plan", styles=styles,
              show_header=True, header_style="bold",
              plain=lambda c: f"{c[0]}: " + " - ".join(str(v) for v in c[1:3] if v))  # (a warning has no choice)
    tuned = (d.get("autotune") or {}).get("choices") or {}
    if tuned:
        say(console, f"Autotuned choices for this device ({d['autotune']['cache']}): " + "; ".join(
            f"model {k.split('#')[-1]}: policy={v['policy']} xla={'on' if v['xla'] else 'off'} "
            f"({v['img_per_s']:.4g} img/s, {v['date']})" for k, v in tuned.items()))
    # the AMP_* variables set, and the plan's overrides given another way (a keyword, a command's flag), which win
    names = {var: name for name, var in ENV_VARS.items()} | {var: RENAMED[old] for old, var in RENAMED_ENV_VARS.items()}
    env, sources, given = d["overrides"], report.sources, (d["plan"] or {}).get("overrides") or {}
    in_force = [f"{var}={value}" + (f" (overridden by {_said(sources[names[var]])})" if names[var] in sources
                                    and not sources[names[var]].startswith("AMP_") else "")
                for var, value in env.items()]
    in_force += [f"{k}={v} ({sources.get(k, 'argument')})" for k, v in given.items()
                 if not sources.get(k, "argument").startswith("AMP_")]
    say(console, "Overrides in force: " + (", ".join(in_force) or "none (all automatic)"))
    if d["plan"] is not None and not why:
        say(console, "The reasons in full, with the measurements they quote: amp-backends info --why")


def _plan_rows(d: dict[str, Any], why: bool) -> tuple[list[tuple[str, str, str]], list[str | None]]:
    """The plan table's rows (setting, choice, reason: short, or whole with ``why``) and their styles."""
    plan = d["plan"]
    if plan is None:
        return [("error", "-", d["plan_error"] or "no plan")], [None]
    found = {p["backend"] for p in d["hardware"]["backends"] if p["available"]}  # (its reason: not in Hardware)
    rows: list[tuple[str, str, str]] = [("backend", plan["backend"], ", ".join(
        f"{b['name']}: " + ("selected" if b["selected"] else "failed" if b.get("failed") else "available" if
                            b["available"] else f"unavailable ({b['reason']})" if b["name"] in found else
                            "unavailable") for b in plan["backends"]))]
    names = plan.get("device_names") or []
    rows.append(("devices", ", ".join(plan["devices"]), ", ".join(dict.fromkeys(names))))
    for decision in plan["decisions"]:  # the whole reason quotes its evidence (file, machine, figures)
        reason, value = (decision["detail"], decision["value"]) if why else (decision["reason"], "")
        rows.append((decision["setting"], decision["value"], reason.removeprefix(f"{value}: ")))
    rows += [(s["name"], s["value"], s["why"]) for s in plan["vendor_settings"]]
    styled: list[tuple[tuple[str, str, str], str | None]] = [(row, None) for row in rows]
    styled += [((f"rejected {r['setting']}", r["value"], r["why"]), "dim") for r in plan["rejected"] if why]
    styled += [(("warning", "", w), "yellow") for w in plan["warnings"]]
    styled += [(("note", "", n), None) for n in plan["notes"]]
    return [row for row, _ in styled], [style for _, style in styled]
