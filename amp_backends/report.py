"""The capability report: :func:`collect` gathers plain data, :func:`render_text` / :func:`to_json` show it.

JSON schema (``schema_version`` 1; fields are only ever added)::

    {
      "schema_version": 1,
      "amp_backends_version": "0.1.0",
      "hardware": {
        "backends": [ {"backend", "available", "reason", "devices": [...], "cpu": {...}|null, "details": {...}} ],
        "tensorflow_device_types": ["CPU", ...] | null
      },
      "backend_rows": {"<backend>": [["label", "value"], ...]},
      "software": {
        "python", "platform",
        "tensorflow": {"version", "imported", "error", "is_cuda_build", "cuda_version", "cudnn_version"},
        "keras": {"version", "generation"} ,
        "itex": {"version", "compatible", "status", "end_of_life"},
        "nvidia_ml_py": "<version>"|null
      },
      "plan": {...Plan.to_dict()...} | null,
      "plan_error": "<message>" | null,
      "autotune": {"cache": "<path>", "device": "<signature>", "choices": {"<device>#<model>": {...}}},
      "overrides": {"AMP_POLICY": "bf16", ...}
    }
"""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Any

from . import __version__
from .configure import plan_for
from .errors import AmpConfigError
from .options import ENV_VARS
from .probe import probe_hardware
from .registry import BackendRegistry, default_registry
from .software import ITEX_EOL, installed_version, itex_status, tensorflow_version

SCHEMA_VERSION = 1


@dataclass
class Report:
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def plan_error(self) -> str | None:
        return self.data.get("plan_error")


def _tensorflow_info(import_it: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    tf_info: dict[str, Any] = {"version": tensorflow_version(), "imported": False, "error": None}
    keras: dict[str, Any] = {"version": installed_version("keras"), "generation": None}
    if import_it and tf_info["version"]:
        try:
            import tensorflow as tf

            from .apply import keras_info

            tf_info["imported"] = True
            tf_info["version"] = tf.__version__
            build = dict(tf.sysconfig.get_build_info())
            tf_info["is_cuda_build"] = bool(build.get("is_cuda_build"))
            tf_info["cuda_version"] = build.get("cuda_version")
            tf_info["cudnn_version"] = build.get("cudnn_version")
            k = keras_info(tf)
            keras = {"version": k.version, "generation": k.generation}
        except Exception as exc:
            tf_info["error"] = f"{type(exc).__name__}: {exc}"
    elif not tf_info["version"]:
        tf_info["error"] = "TensorFlow is not installed (pip install tensorflow)"
    if keras["generation"] is None and keras["version"]:
        keras["generation"] = int(keras["version"].split(".")[0]) if keras["version"][0].isdigit() else None
    return tf_info, keras


def collect(
    *,
    use_tensorflow: bool = True,
    registry: BackendRegistry | None = None,
    environ: dict[str, str] | None = None,
    **overrides: Any,
) -> Report:
    """Gather hardware, software and the plan. Never raises for broken or missing software: it is reported.

    A bad override (``AMP_POLICY=bogus``) is the user's error and raises :class:`AmpConfigError`.
    """
    registry = registry or default_registry()
    env = os.environ if environ is None else environ
    tf_info, keras = _tensorflow_info(use_tensorflow)
    hardware = probe_hardware(registry, use_tensorflow=use_tensorflow and tf_info["imported"])
    itex = itex_status()
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "amp_backends_version": __version__,
        "hardware": hardware.to_dict(),
        "backend_rows": {},
        "software": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "tensorflow": tf_info,
            "keras": keras,
            "itex": {
                "version": itex.version,
                "compatible": itex.compatible,
                "status": itex.reason,
                "end_of_life": ITEX_EOL if itex.installed else None,
            },
            "nvidia_ml_py": installed_version("nvidia-ml-py"),
        },
        "plan": None,
        "plan_error": None,
        "overrides": {var: env[var] for var in ENV_VARS.values() if env.get(var, "").strip()},
    }
    for backend in registry:
        probe = hardware.get(backend.name)
        if probe is not None:
            try:
                data["backend_rows"][backend.name] = [list(r) for r in backend.report_rows(probe)]
            except Exception as exc:
                data["backend_rows"][backend.name] = [["error", f"{type(exc).__name__}: {exc}"]]
    for name, err in registry.load_errors.items():
        data["backend_rows"][name] = [["status", f"failed to load: {err}"]]
    try:
        plan = plan_for(hardware, registry=registry, environ=dict(env), **overrides)
        data["plan"] = plan.to_dict()
        from .autotune import cache_path, cached_for_device, device_signature

        data["autotune"] = {"cache": str(cache_path()), "device": device_signature(plan, hardware),
                            "choices": cached_for_device(device_signature(plan, hardware))}
    except AmpConfigError:  # the user's error: the caller reports it
        raise
    except Exception as exc:  # anything else is shown in the report
        data["plan_error"] = f"{type(exc).__name__}: {exc}"
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
    titles = {b["backend"]: b for b in d["hardware"]["backends"]}
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
    if tf.get("imported"):
        build = "CUDA build" if tf.get("is_cuda_build") else "CPU-only build"
        cuda = f", CUDA {tf.get('cuda_version')}, cuDNN {tf.get('cudnn_version')}" if tf.get("is_cuda_build") else ""
        tf_text += f" ({build}{cuda})"
    if tf.get("error"):
        tf_text += f" [{tf['error']}]"
    st.add_row("TensorFlow", escape(tf_text))
    k = sw["keras"]
    st.add_row("Keras", f"{k['version'] or 'not installed'}" + (f" (Keras {k['generation']} API)" if k.get("generation") else ""))
    it = sw["itex"]
    st.add_row("ITEX", escape(f"{it['version']}: {it['status']}; {it['end_of_life']}" if it["version"] else it["status"]))
    st.add_row("nvidia-ml-py", sw["nvidia_ml_py"] or "not installed (no NVML probes)")
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
        ls_text = ls["mode"] + (f" ({ls['initial']:g})" if ls["mode"] == "fixed" else "")
        pt.add_row("backend", plan["backend"], ", ".join(
            f"{b['name']}: {'selected' if b['selected'] else ('available' if b['available'] else 'unavailable')}"
            for b in plan["backends"]))
        pt.add_row("devices", ", ".join(plan["devices"]), "")
        for key, value in (("policy", plan["policy"]), ("loss_scale", ls_text), ("tf32", "on" if plan["tf32"] else "off"),
                           ("xla", "on" if plan["xla"] else "off")):
            pt.add_row(key, value, escape(plan["reasons"].get(key, "")))
        if plan.get("itex_amp"):
            pt.add_row("itex_amp", plan["itex_amp"], plan["reasons"].get("itex_amp", ""))
        if plan.get("math_mode"):
            pt.add_row("ITEX math mode", plan["math_mode"], "ITEX_FP32_MATH_MODE")
        for r in plan["rejected"]:
            pt.add_row(f"[dim]rejected {r['setting']}[/dim]", f"[dim]{r['value']}[/dim]", f"[dim]{escape(r['why'])}[/dim]")
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
    console.print(escape("Overrides in force: " + (", ".join(f"{k}={v}" for k, v in overrides.items()) if overrides else "none (all automatic)")))
