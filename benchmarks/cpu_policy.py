"""The CPU plan's measurements: dtype policy, XLA and oneDNN for the MNIST CNN training step.

Each configuration runs in its own child process (``TF_ENABLE_ONEDNN_OPTS`` is read when TensorFlow is
imported, so it cannot change inside one process): the tutorials' MNIST CNN, one ``tf.function`` per
training step, batch 256, a few warm-up steps, then the median of the timed steps. Rounds interleave the
configurations (the order rotated every round: :func:`amp_backends.autotune.timing.interleaved`), and the
result keeps every round: median, min and max over rounds.

``onednn_isa=AVX2`` limits oneDNN to AVX2 kernels (``ONEDNN_MAX_CPU_ISA=AVX2``): the nearest this machine
comes to the oneDNN path of a CPU without AVX-512 (Zen 2/3, older Xeons). It is not such a CPU (caches,
clocks and Eigen's own kernels stay this CPU's).

Run (writes JSON with the machine, versions, command and date; the CPU backend quotes these files)::

    python benchmarks/cpu_policy.py --rounds 3 --steps 8 --out results/cpu-policy-zen4.json --note "..."
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any

from amp_backends.autotune.timing import Sample, interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (machine.py beside it, however it is loaded)
BATCH = 256

# name -> (policy, jit_compile, TF_ENABLE_ONEDNN_OPTS, ONEDNN_MAX_CPU_ISA or None)
CONFIGS: dict[str, tuple[str, bool, str, str | None]] = {
    "float32": ("float32", False, "1", None),
    "mixed_bfloat16": ("mixed_bfloat16", False, "1", None),
    "mixed_float16": ("mixed_float16", False, "1", None),
    "float32+xla": ("float32", True, "1", None),
    "mixed_bfloat16+xla": ("mixed_bfloat16", True, "1", None),
    "float32 onednn=0": ("float32", False, "0", None),
    "mixed_bfloat16 onednn=0": ("mixed_bfloat16", False, "0", None),
    "mixed_float16 onednn=0": ("mixed_float16", False, "0", None),
    "float32 onednn_isa=AVX2": ("float32", False, "1", "AVX2"),
}


def child(policy: str, jit: bool, warmup: int, steps: int) -> dict[str, Any]:
    """One configuration in this process: median img/s over ``steps`` timed training steps."""
    import numpy as np
    import tensorflow as tf

    keras = tf.keras
    keras.mixed_precision.set_global_policy(policy)
    x = tf.random.uniform((BATCH, 28, 28, 1))
    y = tf.random.uniform((BATCH,), maxval=10, dtype=tf.int32)
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Dropout(0.25),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(10, activation="softmax", dtype="float32"),
    ])
    opt = keras.optimizers.Adam(0.01)
    lossf = keras.losses.SparseCategoricalCrossentropy()

    @tf.function(jit_compile=jit)
    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = lossf(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    for _ in range(warmup):
        step(x, y).numpy()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(x, y).numpy()
        times.append(time.perf_counter() - t0)
    try:
        from tensorflow.python.util import _pywrap_util_port

        onednn = bool(_pywrap_util_port.IsMklEnabled())
    except Exception:
        onednn = None
    return {"img_per_s": round(BATCH / float(np.median(times)), 1), "onednn_enabled": onednn}


def versions() -> dict[str, str | None]:
    from importlib import metadata

    def v(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "tensorflow": v("tensorflow") or v("tensorflow-cpu"),
            "keras": v("keras"), "numpy": v("numpy")}


def document(benchmark: str, script: str, argv: list[str] | None, started: datetime.datetime, a: Any, unit: str,
             results: dict[str, Any], **versions_extra: Any) -> dict[str, Any]:
    """A results file's contents: what was measured, the machine (named by the CPU probe, never by hand), versions,
    command, date, note and results (the form ``backends/cpu/measured.py`` reads)."""
    from machine import machine_record

    return {
        "benchmark": benchmark,
        **machine_record(),  # machine_kind ("AMD EPYC (Zen 5)") and machine, as the CPU probe names them
        "versions": versions() | versions_extra,
        "command": shlex.join(["python", f"benchmarks/{script}", *(argv if argv is not None else sys.argv[1:])]),
        "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "note": a.note,
        "unit": unit,
        "results": results,
    }


def write(doc: dict[str, Any], out: str | None) -> str:
    """The document as JSON, written to ``out`` when given."""
    text = json.dumps(doc, indent=2)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return text


def run_child(name: str, warmup: int, steps: int) -> dict[str, Any]:
    policy, jit, onednn, isa = CONFIGS[name]
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    args = [sys.executable, os.path.abspath(__file__), "--child", json.dumps([policy, jit, warmup, steps])]
    out = subprocess.run(args, env=env, check=False, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8, help="timed steps per configuration and round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from: {', '.join(CONFIGS)}")
    p.add_argument("--out", help="write the JSON here")
    p.add_argument("--note", default="")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        policy, jit, warmup, steps = json.loads(a.child)
        print(json.dumps(child(policy, jit, warmup, steps)))
        return 0
    names = [n.strip() for n in a.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"unknown configurations {unknown}; expected some of: {', '.join(CONFIGS)}")
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    started = datetime.datetime.now(datetime.timezone.utc)

    def configuration(name: str) -> Any:
        def run() -> Sample:
            result = run_child(name, a.warmup, a.steps)
            runs[name].append(result)
            print(f"{name}: {result}", flush=True)
            if "error" in result:
                raise RuntimeError(result["error"])
            return Sample(result["img_per_s"], 1.0)  # the child's own rate over its timed steps
        return run

    # a configuration that fails sits out the remaining rounds; its error is kept in the results
    interleaved({n: configuration(n) for n in names}, rounds=a.rounds, on_error=lambda name, exc: None)
    results = {}
    for name, rs in runs.items():
        policy, jit, onednn, isa = CONFIGS[name]
        speeds = [x["img_per_s"] for x in rs if "img_per_s" in x]
        entry: dict[str, Any] = {"policy": policy, "xla": jit, "TF_ENABLE_ONEDNN_OPTS": onednn,
                                 "ONEDNN_MAX_CPU_ISA": isa, "rounds": speeds,
                                 "onednn_enabled": sorted({str(x.get("onednn_enabled")) for x in rs})}
        if speeds:
            entry.update(median=round(statistics.median(speeds)), min=round(min(speeds)), max=round(max(speeds)))
        errors = [x["error"] for x in rs if "error" in x]
        if errors:
            entry["errors"] = errors
        results[name] = entry
    doc = document("MNIST CNN training step (the tutorials' model), one tf.function per step, batch "
                   f"{BATCH}: median img/s of {a.steps} timed steps after {a.warmup} warm-up steps, one child "
                   f"process per configuration and round, {a.rounds} interleaved rounds",
                   "cpu_policy.py", argv, started, a, "img/s", results)
    print(write(doc, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
