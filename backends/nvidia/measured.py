"""The GPU measurements the NVIDIA plan's reasons quote, read from the committed results files.

``results/gpu-suite-h200/gpu_suite.json`` (``python benchmarks/gpu_suite.py``: the tutorials' hand-written loops,
each configuration's median epoch), ``results/gpu-suite-h200-trainer/gpu_suite.json`` (the suite's experiments:
Keras ``fit`` at one and at many steps per call, the trainer's compiled calls) and
``results/zoo-h200/mnist-cnn/zoo.json`` (``--zoo``: the matmul peak per dtype, 4 chained 8192x8192 matmuls) ship
in the wheel as ``amp_backends/results``. A reason never types a
figure itself: it quotes one of these files with its machine; a missing file makes the reason say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from amp_backends.backend_api import Results, load_results

from .capability import cc_label

GPU_SUITE = "gpu-suite-h200/gpu_suite.json"
EXPERIMENTS = "gpu-suite-h200-trainer/gpu_suite.json"
MATMUL_PEAK = "zoo-h200/mnist-cnn/zoo.json"


def _machine(doc: Mapping[str, Any]) -> str:
    nvml = (doc.get("device") or {}).get("nvml")
    gpus = (nvml.get("gpus") or []) if isinstance(nvml, Mapping) else []  # a string where NVML could not be read
    if gpus:
        gpu = gpus[0]
        return f"{gpu['name']} ({cc_label(gpu['compute_capability'])})"
    devices = (doc.get("environment") or {}).get("devices") or []
    return str(devices[0]) if devices else "unknown GPU"


def _suite(file: str, doc: Mapping[str, Any]) -> Results:
    rows = (doc["experiments"].get("bench") or {}).get("rows") or []
    medians = {str(r["label"]): float(r["img_per_s"]) for r in rows
               if r.get("status") == "ok" and isinstance(r.get("img_per_s"), (int, float))}
    # the suite ran as an option of the bench command before it moved to benchmarks/: name the command that runs it now
    command = str(doc["command"]).replace("-m amp_backends.bench --gpu-suite", "benchmarks/gpu_suite.py")
    return Results(file, _machine(doc), str(doc["software"]["tensorflow"]), command, str(doc["date"]), medians)


def _fit_calls(file: str, doc: Mapping[str, Any]) -> Results:
    # the suite's keras_fit rows, named as a reason says them: "float32 fit as written", "fit at 1 step per call"
    # (compile(**plan.compile_kwargs())), "fit at 58 steps per call" (steps_per_execution=58)
    medians = {}
    for r in (doc["experiments"].get("keras_fit") or {}).get("rows") or []:
        label, figure = str(r["label"]), r.get("img_per_s")
        if r.get("status") != "ok" or not isinstance(figure, (int, float)):
            continue
        if label.startswith("as users write it"):
            medians["float32 fit as written"] = float(figure)
        elif "steps_per_execution=" in label:
            medians[f"fit at {label.rpartition('=')[2]} steps per call"] = float(figure)
        else:
            medians["fit at 1 step per call"] = float(figure)
    command = str(doc["command"])
    return Results(file, _machine(doc), str(doc["software"]["tensorflow"]), command, str(doc["date"]), medians)


def _peaks(file: str, doc: Mapping[str, Any]) -> Results:
    medians = {f"{k} matmul": float(v) / 1000 for k, v in (doc.get("peak_gflops") or {}).items()
               if isinstance(v, (int, float))}
    return Results(file, _machine(doc), str(doc["environment"]["tensorflow"]), str(doc["command"]), str(doc["date"]),
                   medians)


def suite() -> Results | None:
    """The GPU suite's hand-written loops (``"mnist: fp16 dynamic+XLA"``, ...), or ``None`` if missing."""
    return load_results(GPU_SUITE, _suite)


def fit_calls() -> Results | None:
    """Keras ``fit`` under the plan at one step per compiled call and at many (``"fit at 1 step per call"``,
    ``"fit at 58 steps per call"``) and as users write it (``"float32 fit as written"``), or ``None`` if missing."""
    return load_results(EXPERIMENTS, _fit_calls)


def peaks() -> Results | None:
    """The matmul peak per dtype in TFLOP/s (``"tf32 matmul"``, ``"float32 matmul"``, ...), or ``None`` if missing."""
    return load_results(MATMUL_PEAK, _peaks)
