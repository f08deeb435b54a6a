"""What the benchmarks write: the run's header (date, command, machine, versions), tables, JSON and charts."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...assessment import UNSAFE
from ...errors import AmpConfigError

if TYPE_CHECKING:
    from ...plan import Plan
    from ..capability_report import Report


def now_iso() -> str:
    """The time now, UTC, in ISO 8601 to the second (``2026-11-29T14:53:47+00:00``).

    Returns:
        The time, as text.
    """
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_header() -> dict[str, Any]:
    """``date`` (UTC), ``command`` (as typed, module form) and ``host`` of this run."""
    return {"date": now_iso(), "command": " ".join([*_program(), *sys.argv[1:]]), "host": platform.node()}


def results_folder(out: Path, result: str) -> Path:
    """The folder a run writes into, made before any work: ``out``, or where it holds an earlier run's ``result``, the
    first free ``out-2``, ``out-3``...

    Args:
        out: The folder asked for (``--out``), relative or absolute.
        result: The run's main file (``"bench.json"``, ``"zoo.json"``).

    Returns:
        The folder, made.

    Raises:
        ValueError: ``out`` (or a folder above it) is a file, or the folder cannot be made.
    """
    folder, n = out, 1
    while (folder / result).exists():
        n += 1
        named = out if out.name else out.absolute()  # (".": the folder's own name, beside it)
        folder = named.with_name(f"{named.name}-{n}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AmpConfigError(f"--out must be a folder the results can be written to. Received: {str(out)!r}, which "
                             f"cannot be made ({exc.strerror or exc}). Fix: pass another --out DIR.") from None
    if folder != out:
        print(f"{out} holds an earlier run's {result}: this run writes to {folder}", file=sys.stderr)
    return folder


def _program() -> list[str]:
    """How this run was started, as one would type it again (``python -m amp_backends.bench``, ``amp-backends``)."""
    started = Path(sys.argv[0])
    if started.name in ("bench.py", "__main__.py") and started.parent.name == "amp_backends":
        module = "amp_backends.bench" if started.name == "bench.py" else "amp_backends"
        return [Path(sys.executable).name, "-m", module]
    return [started.name]


def stop_reason(stop: BaseException) -> str:
    """What stopped a run: SIGTERM's message (``stopped by SIGTERM``), else ``interrupted by Ctrl-C``."""
    return str(stop) or "interrupted by Ctrl-C"


def interrupted(stop: BaseException) -> str:
    """What a results file says of a run stopped by Ctrl-C or SIGTERM (its ``interrupted`` field)."""
    return f"{stop_reason(stop)}: only what finished before it is here"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` whole or not at all (a stopped run never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def unsafe_policies(plan: Plan) -> dict[str, str]:
    """Policies known to crash this machine (from the plan's support table), with the reason."""
    if plan.assessment is None:
        return {}
    return {p: s.why for p, s in plan.assessment.policies.items() if s.level == UNSAFE}


def environment(collected: Report | None = None) -> dict[str, Any]:
    """What the figures were measured on: the planned backend, its devices (``"NVIDIA H200 (CC 9.0)"``) and details,
    the CPU, the software's versions and the plan's main settings; ``{"error": ...}`` where the report (``collected``,
    default: collected here, with TensorFlow where it is imported or a backend needs it) could not be collected.

    Args:
        collected: The capability report of this machine.

    Returns:
        The environment, as data.
    """
    if collected is None:
        from ..capability_report import collect

        try:  # (the zoo's parent process has not imported TensorFlow: on a CPU it need not, for these fields)
            collected = collect(use_tensorflow=True if "tensorflow" in sys.modules else None)
        except Exception as exc:  # the benchmark still runs
            return {"error": f"{type(exc).__name__}: {exc}"}
    report = collected.data
    plan = report["plan"] or {}
    chosen = next((b for b in report["hardware"]["backends"] if b["backend"] == plan.get("backend")), None)
    probe = collected.hardware.get(plan.get("backend", "")) if collected.hardware else None
    cpu = next((b["cpu"] for b in report["hardware"]["backends"] if b["cpu"]), None)
    return {
        "backend": plan.get("backend"),
        "devices": [d.label for d in probe.devices] if probe else [],
        "backend_details": (chosen or {}).get("details", {}),
        "cpu": (f"{cpu['model']}" + (f" ({cpu['microarchitecture']})" if cpu.get("microarchitecture") else "")
                + f", {cpu['logical_cores']} logical cores") if cpu else None,
        "python": report["software"]["python"],
        "tensorflow": report["software"]["tensorflow"]["version"],
        "cuda_build": report["software"]["tensorflow"].get("cuda_version"),
        "keras": report["software"]["keras"]["version"],
        "plan": plan and {k: plan[k] for k in ("backend", "policy", "loss_scale", "tf32", "xla")},
    }


def machine_line(env: dict[str, Any]) -> str:
    """The machine a run's figures were measured on, in a few words: its devices, else its CPU, else the error.

    Args:
        env: The run's ``environment`` (`environment`'s).

    Returns:
        The line, as the tables' and charts' titles show it.
    """
    if env.get("error"):
        return f"the machine could not be read: {env['error']}"
    return ", ".join(env.get("devices") or []) or str(env.get("cpu") or "the machine's devices were not read")


# --------------------------------------------------------------------------- the tutorials' loops
def loops_table(report: dict[str, Any], console: Any = None) -> None:
    """The loops' rates: a table on a terminal, else one line a configuration (`amp_backends.terminal`)."""
    from ...terminal import make_console, show_rows

    rows = [(r["model"], r["config"], f"{r['img_per_s']:,.0f}" if r["img_per_s"] else "-",
             f"{r['ratio_to_best_manual']:.2f}" if r.get("ratio_to_best_manual") else "-", r["error"] or r["detail"])
            for r in report["results"]]
    columns = [(c, {"justify": "right" if c in ("img/s", "x best manual") else "left"})
               for c in ("model", "configuration", "img/s", "x best manual", "note")]
    show_rows(console or make_console(width=160), columns, rows,
              title=f"img/s, median of {report['settings']['epochs_timed']} epochs after 1 warm-up "
                    f"({machine_line(report['environment'])})",
              plain=lambda c: f"{c[0]} {c[1]}: {c[2]} img/s, x best manual {c[3]}" + (f"; {c[4]}" if c[4] else ""))


def loops_chart(report: dict[str, Any], path: Path) -> None:
    """The loops' bar chart: one panel a model, one bar a configuration, coloured by kind (manual, fit, auto plan).

    Without matplotlib (the ``bench`` extra) it says so on stderr and draws nothing: the run's JSON and table hold
    every figure.

    Args:
        report: The benchmark's report (``bench.json``'s contents).
        path: The PNG file to write.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (pip install 'amp-backends[bench]')", file=sys.stderr)
        return
    models = sorted({r["model"] for r in report["results"]})
    fig, axes = plt.subplots(len(models), 1, figsize=(10, 4.5 * len(models)), squeeze=False)
    for ax, model in zip(axes[:, 0], models, strict=True):
        rows = [r for r in report["results"] if r["model"] == model and r["img_per_s"]]
        colors = {"manual": "#8c8c8c", "keras_fit": "#4c72b0", "auto": "#dd8452"}
        ax.barh([r["config"] for r in rows], [r["img_per_s"] for r in rows], color=[colors[r["kind"]] for r in rows])
        ax.set_title(f"{model}: images/s (grey: tutorials' manual loops, blue: Keras fit, orange: auto plan)")
        ax.invert_yaxis()
        ax.set_xlabel("images per second")
    env = report["environment"]
    fig.suptitle(f"{machine_line(env)} - TF {env.get('tensorflow')} - {report['date'][:10]}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- the model zoo
def _f(v: Any, spec: str, none: str = "-") -> str:
    return format(v, spec) if isinstance(v, (int, float)) else none


def _rate(configs: dict[str, Any], name: str | None) -> str:
    """The median samples/s of the configuration ``name`` of one model: "failed" when it ran without one, "-" when it
    was not run (not among ``--configs``)."""
    if not name or name not in configs:
        return "-"
    s = configs[name].get("samples_per_s")
    return _f(s["median"], ",.0f") if s else "failed"


def zoo_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per model: baseline, best manual, auto fit, trainer, speed-up, ratio to best manual, share of peak."""
    rows: list[tuple[str, ...]] = []
    for m in report["models"]:
        if m.get("skipped"):
            rows.append((str(m["model"]), f"skipped: {m['skipped']}", "", "", "", "", "", "", "", ""))
            continue
        c = m["configs"]
        fit, tr = c.get("auto plan, fit", {}), c.get("auto plan, trainer", {})
        best = m.get("best_manual")
        rows.append((str(m["model"]), f"{m['batch']}", _rate(c, "float32 fit (defaults)"),
                     f"{_rate(c, best)} ({best})" if best else "-",
                     _rate(c, "auto plan, fit"), _rate(c, "auto plan, trainer"),
                     f"{_f(fit.get('x_baseline'), '.2f')} / {_f(tr.get('x_baseline'), '.2f')}",
                     f"{_f(fit.get('x_best_manual'), '.2f')} / {_f(tr.get('x_best_manual'), '.2f')}",
                     f"{_f(tr.get('share_of_peak'), '.0%')}",
                     f"{_parity(fit)} / {_parity(tr)} ({_f(m.get('float32_loss_spread'), '.4f')})"))
    return rows


def loss_vs_baseline(c: dict[str, Any]) -> str:
    """The loss minus the baseline's, and whether within the float32 spread: ``+0.0012 (ok)``, ``-0.0300 (outside)``."""
    within = c.get("loss_within_spread")
    return _f(c.get("loss_vs_baseline"), "+.4f") + ("" if within is None else " (ok)" if within else " (outside)")


def _parity(c: dict[str, Any]) -> str:
    """``ok`` when the loss lies within the float32 run-to-run spread of the baseline's, else the difference."""
    within = c.get("loss_within_spread")
    return "-" if within is None else "ok" if within else _f(c.get("loss_vs_baseline"), "+.4f")


ZOO_HEAD = ("model", "batch", "fp32 fit", "best manual", "auto fit", "auto trainer", "x baseline (fit / trainer)",
            "x best manual (fit / trainer)", "trainer % of peak", "loss parity (fit / trainer) (float32 spread)")


def zoo_markdown(report: dict[str, Any]) -> str:
    """The model zoo's results as Markdown (``zoo.md``): the run's header, one table row a model, then each model's
    configurations in full.

    Args:
        report: The zoo benchmark's report (``zoo.json``'s contents).

    Returns:
        The Markdown text.
    """
    env = report.get("environment") or {}
    peaks = report.get("peak_gflops") or {}
    lines = [f"# Model zoo: {machine_line(env)}", "",
             f"{report['date']} - TensorFlow {env.get('tensorflow')}, Keras {env.get('keras')} - "
             f"`{report['command']}` - {report.get('elapsed_s')} s", "",
             *([f"- **{report['interrupted']}**"] if report.get("interrupted") else []),
             f"- plan: {report.get('plan')}",
             "- matmul peak measured in this run, GFLOP/s: " + ", ".join(f"{k} {v}" for k, v in peaks.items()),
             f"- figures: samples/s of the median of {report['settings']['reps']} interleaved repetitions of "
             f"{report['settings']['steps_per_rep']} steps, after one warm-up repetition; speed-ups are of the "
             "auto plan over the float32 fit baseline (compile defaults); loss parity: `ok` when a configuration's "
             "training loss after the same steps differs from the baseline's by no more than two float32 runs "
             "from other initial weights differ (seed 0 and seed 1: the float32 spread), else the difference", "",
             "| " + " | ".join(ZOO_HEAD) + " |", "|" + "---|" * len(ZOO_HEAD)]
    lines += ["| " + " | ".join(r) + " |" for r in zoo_rows(report)]
    for m in report["models"]:
        if m.get("skipped"):
            continue
        flops = m.get("flops_per_sample")
        lines += ["", f"## {m['model']}: {m['title']}", "",
                  f"batch {m['batch']}, {m['steps_per_rep']} steps per repetition; "
                  f"{_f(flops and flops / 1e6, ',.1f')} MFLOP per {m['unit'][:-1]} per training step "
                  f"({m.get('flops_note', '')}); float32 run-to-run spread of the training loss (seed 0 against "
                  f"seed 1): {_f(m.get('float32_loss_spread'), '.4f')}", "",
                  f"| configuration | {m['unit']}/s | min-max | x baseline | x best manual | % of peak | predict/s | "
                  "train loss | loss - baseline | set-up | note |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
        for name, c in m["configs"].items():
            s = c.get("samples_per_s")
            lines.append(
                f"| {name} | {_f(s and s['median'], ',.0f')} | "
                f"{_f(s and s['min'], ',.0f')}-{_f(s and s['max'], ',.0f')} | "
                f"{_f(c.get('x_baseline'), '.2f')} | {_f(c.get('x_best_manual'), '.2f')} | "
                f"{_f(c.get('share_of_peak'), '.0%')} | "
                f"{_f((c.get('predict_samples_per_s') or {}).get('median'), ',.0f')} | {_f(c.get('loss'), '.4f')} | "
                f"{loss_vs_baseline(c)} | {c.get('setup', '')} | "
                f"{str(c.get('error') or '').replace('|', '/')[:200]} |")
    return "\n".join(lines) + "\n"


def zoo_table(report: dict[str, Any], console: Any = None) -> None:
    """The model zoo's rates: a table on a terminal, else one line a model (`amp_backends.terminal`)."""
    from ...terminal import make_console, plain_row, show_rows

    columns = [(c, {"justify": "left" if c in ("model", "best manual") else "right"}) for c in ZOO_HEAD]
    show_rows(console or make_console(width=200), columns, zoo_rows(report),
              title=f"model zoo, samples/s ({machine_line(report.get('environment') or {})}); details in zoo.md",
              plain=lambda c: f"{c[0]}: {c[1]}" if c[1].startswith("skipped") else plain_row(ZOO_HEAD, c))
