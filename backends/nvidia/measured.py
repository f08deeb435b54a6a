"""The GPU measurements the NVIDIA plan's reasons quote, read from the committed results files.

``results/gpu-suite-h200/gpu_suite.json`` (the tutorials' loops), ``results/gpu-suite-h200-trainer/gpu_suite.json``
(Keras ``fit`` at one and many steps per call) and ``results/zoo-h200/mnist-cnn/zoo.json`` (the matmul peak per
dtype). A reason quotes a file with its machine, never a typed figure; a missing file makes it say so.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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


def _ok_rows(doc: Mapping[str, Any], experiment: str) -> Iterator[tuple[str, float]]:
    """``(label, img/s)`` of each row of a GPU suite experiment that ran."""
    for r in (doc["experiments"].get(experiment) or {}).get("rows") or []:
        if r.get("status") == "ok" and isinstance(r.get("img_per_s"), (int, float)):
            yield str(r["label"]), float(r["img_per_s"])


def _suite_results(file: str, doc: Mapping[str, Any], medians: dict[str, float]) -> Results:
    # the suite ran as an option of the bench command before it moved to benchmarks/: name the command that runs it now
    command = str(doc["command"]).replace("-m amp_backends.bench --gpu-suite", "benchmarks/gpu_suite.py")
    return Results(file, _machine(doc), str(doc["software"]["tensorflow"]), command, str(doc["date"]), medians)


def _suite(file: str, doc: Mapping[str, Any]) -> Results:
    return _suite_results(file, doc, dict(_ok_rows(doc, "bench")))


def _fit_call_name(label: str) -> str:
    """A keras_fit row as a reason says it: "float32 fit as written", "fit at 1 step per call"
    (compile(**plan.compile_kwargs())), "fit at 58 steps per call" (steps_per_execution=58)."""
    if label.startswith("as users write it"):
        return "float32 fit as written"
    if "steps_per_execution=" in label:
        return f"fit at {label.rpartition('=')[2]} steps per call"
    return "fit at 1 step per call"


def _fit_calls(file: str, doc: Mapping[str, Any]) -> Results:
    return _suite_results(file, doc, {_fit_call_name(label): v for label, v in _ok_rows(doc, "keras_fit")})


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
