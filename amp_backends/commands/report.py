"""The capability report: :func:`collect` gathers plain data, :func:`render_text` / :func:`to_json` show it.

What the report needs TensorFlow for, and when it imports it: TensorFlow's version, its CUDA/cuDNN build
and the Keras version are read from package metadata and TensorFlow's ``build_info.py`` without importing
it. Importing TensorFlow (about 3 s of the old 3.5-4 s ``info`` on a 2-core CPU machine) is needed only
to list Intel XPUs (ITEX is a TensorFlow plugin) and to confirm that TensorFlow sees the GPUs NVML
reports (a CPU-only build does not). By default (``use_tensorflow=None``) the report imports it exactly
then — an available backend with TensorFlow devices, or a probe that needs TensorFlow — and says why;
``True`` always imports it (TensorFlow's own device list), ``False`` never.

JSON (:func:`to_json`, ``schema_version`` 2; within a version fields are only ever added): the plan first
(``Plan.to_dict()`` with its support table), then ``plan_error``, the overrides in force, the autotune cache,
the software, each backend's rows, and the hardware (with the CPU flags) last. Its JSON Schema, every field
described, is ``amp_backends/schemas/report.schema.json`` (shipped with the package), with the changes
from version 1.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..configure import plan_for
from ..errors import AmpConfigError
from ..hardware import Hardware
from ..keras_compat import keras_info
from ..probe import needs_tensorflow, probe_hardware
from ..registry import BackendRegistry, default_registry
from ..request import ENV_VARS
from ..software import tensorflow_build_info, tensorflow_version
from ..version import __version__

SCHEMA_VERSION = 2


@dataclass
class Report:
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def plan_error(self) -> str | None:
        return self.data.get("plan_error")


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
    info["is_cuda_build"] = bool(build.get("is_cuda_build")) if build else None
    info["cuda_version"] = build.get("cuda_version")
    info["cudnn_version"] = build.get("cudnn_version")
    if not info["version"]:
        info["error"] = "TensorFlow is not installed (pip install tensorflow)"
    return info


def _hardware(
    registry: BackendRegistry, use_tensorflow: bool | None, quiet: bool
) -> tuple[Hardware, Any, str, str | None]:
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


def _rows(call: Any) -> list[list[str]]:
    try:
        return [[str(label), str(value)] for label, value in call()]
    except Exception as exc:  # a backend's bug is shown, never raised
        return [["error", f"{type(exc).__name__}: {exc}"]]


def _backend_rows(backend: Any, probe: Any) -> list[list[str]]:
    return _rows(lambda: backend.report_rows(probe))


def collect(
    *,
    use_tensorflow: bool | None = None,
    registry: BackendRegistry | None = None,
    environ: Mapping[str, str] | None = None,
    quiet: bool = False,
    device: str | None = None,
    **overrides: Any,
) -> Report:
    """Gather the plan, the software and the hardware. Never raises for broken or missing software or
    backends: they are reported. ``quiet`` filters TensorFlow's start-up noise if it is imported.

    A bad override (``AMP_POLICY=bogus``) or an unknown ``device`` is the user's error and raises
    :class:`AmpConfigError`. ``device`` plans for a device of the catalogue (:mod:`amp_backends.devices`)
    instead of this machine.
    """
    registry = registry or default_registry()
    env = os.environ if environ is None else environ
    if device is not None:  # a catalogue device's description, not this machine
        from ..devices import device_hardware

        hardware, tf, tf_error = device_hardware(device), None, None
        why = f"not imported: planned for the catalogue device {device!r}"
    else:
        hardware, tf, why, tf_error = _hardware(registry, use_tensorflow, quiet)
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "amp_backends_version": __version__,
        "plan": None,
        "plan_error": None,
        "overrides": {var: env[var] for var in ENV_VARS.values() if env.get(var, "").strip()},
        "autotune": None,
        "software": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "tensorflow": _tensorflow_section(tf, why, tf_error),
            "keras": keras_info(tf).to_dict(),
            "backends": {b.name: _rows(b.software_rows) for b in registry},
        },
        "backend_rows": {},
        "hardware": hardware.to_dict(),
    }
    for backend in registry:
        probe = hardware.get(backend.name)
        if probe is not None:
            data["backend_rows"][backend.name] = _backend_rows(backend, probe)
    for name, err in registry.load_errors.items():
        data["backend_rows"][name] = [["status", f"failed to load: {err}"]]
    try:
        plan = plan_for(hardware, registry=registry, environ=dict(env), **overrides)
    except AmpConfigError:  # the user's error: the caller reports it
        raise
    except Exception as exc:  # anything else is shown in the report
        data["plan_error"] = f"{type(exc).__name__}: {exc}"
        return Report(data)
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
    return Report(data)


def to_json(report: Report) -> str:
    return json.dumps(report.data, indent=2, sort_keys=False, default=str)


def render_text(report: Report, console: Any = None) -> None:
    """Print the report as tables (rich); plain text when not on a terminal."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(width=None if sys.stdout.isatty() else 120)
    d = report.data
    hw = Table(title="Hardware", show_header=True, header_style="bold", expand=False)
    hw.add_column("backend")
    hw.add_column("item")
    hw.add_column("value", overflow="fold")
    for name, rows in d["backend_rows"].items():
        for i, (label, value) in enumerate(rows):
            hw.add_row(name if i == 0 else "", escape(label), escape(str(value)))
        hw.add_section()
    tf_types = d["hardware"]["tensorflow_device_types"]
    hw.add_row("tensorflow", "devices listed", ", ".join(tf_types) if tf_types is not None else "not consulted")
    console.print(hw)

    sw = d["software"]
    st = Table(title="Software", show_header=False)
    st.add_column("item")
    st.add_column("value", overflow="fold")
    tf = sw["tensorflow"]
    st.add_row("amp_backends", d["amp_backends_version"])
    st.add_row("Python", f"{sw['python']} ({sw['platform']})")
    tf_text = tf["version"] or "not installed"
    if tf.get("is_cuda_build") is not None:
        build = "CUDA build" if tf.get("is_cuda_build") else "CPU-only build"
        cuda = f", CUDA {tf.get('cuda_version')}, cuDNN {tf.get('cudnn_version')}" if tf.get("is_cuda_build") else ""
        tf_text += f" ({build}{cuda})"
    tf_text += f"; {tf['why']}"
    if tf.get("error"):
        tf_text += f" [{tf['error']}]"
    st.add_row("TensorFlow", escape(tf_text))
    k = sw["keras"]
    generation = f" (Keras {k['generation']} API)" if k.get("generation") else ""
    st.add_row("Keras", f"{k['version'] or 'not installed'}" + generation)
    for rows in sw["backends"].values():
        for label, value in rows:
            st.add_row(escape(label), escape(value))
    console.print(st)

    pt = Table(title="Plan", show_header=True, header_style="bold")
    pt.add_column("setting")
    pt.add_column("choice")
    pt.add_column("why", overflow="fold")
    plan = d["plan"]
    if plan is None:
        pt.add_row("error", "-", escape(d["plan_error"] or "no plan"))
    else:
        ls = plan["loss_scale"]
        ls_text = ls["mode"] + (f" ({ls['scale']:g})" if ls["mode"] == "fixed" else "")
        pt.add_row("backend", plan["backend"], escape(", ".join(
            f"{b['name']}: " + ("selected" if b["selected"] else "failed" if b.get("failed") else
                                "available" if b["available"] else "unavailable")
            for b in plan["backends"])))
        pt.add_row("devices", ", ".join(plan["devices"]), "")
        for key, value in (("policy", plan["policy"]), ("loss_scale", ls_text),
                           ("tf32", "on" if plan["tf32"] else "off"),
                           ("xla", "on" if plan["xla"] else "off"), ("fp8", "on" if plan.get("fp8") else "off"),
                           ("steps_per_execution", str(plan.get("steps_per_execution", 1))),
                           ("float32_layers", ", ".join(k["layer"] for k in plan.get("float32_layers") or [])
                            or "none")):
            pt.add_row(key, value, escape(plan["reasons"].get(key, "")))
        if plan.get("graph_amp"):
            pt.add_row("graph_amp", plan["graph_amp"], escape(plan["reasons"].get("graph_amp", "")))
        for s in plan["vendor_settings"]:
            pt.add_row(escape(s["name"]), escape(s["value"]), escape(s["why"]))
        for r in plan["rejected"]:
            pt.add_row(f"[dim]rejected {r['setting']}[/dim]", f"[dim]{r['value']}[/dim]",
                       f"[dim]{escape(r['why'])}[/dim]")
        for w in plan["warnings"]:
            pt.add_row("[yellow]warning[/yellow]", "", escape(w))
        for n in plan["notes"]:
            pt.add_row("note", "", escape(n))
    console.print(pt)
    tuned = (d.get("autotune") or {}).get("choices") or {}
    if tuned:
        console.print(escape(f"Autotuned choices for this device ({d['autotune']['cache']}): " + "; ".join(
            f"model {k.split('#')[-1]}: policy={v['policy']} xla={'on' if v['xla'] else 'off'} "
            f"({v['img_per_s']:.4g} img/s, {v['date']})" for k, v in tuned.items())))
    overrides = d["overrides"]
    in_force = ", ".join(f"{k}={v}" for k, v in overrides.items()) if overrides else "none (all automatic)"
    console.print(escape("Overrides in force: " + in_force))
