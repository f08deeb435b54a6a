"""Where the MNIST CNN training step goes on a CPU under the auto plan, and what the things tried change.

The step profiled is the one users get: ``amp_backends.Trainer`` with ``classifier_updates`` (Adam), the
tutorials' MNIST CNN (``amp_backends.models.mnist_cnn``), batch 256, resident uint8 data gathered per step
(``mnist_batch_fn``), under ``auto_configure()`` (on a bf16 CPU: mixed_bfloat16, XLA off). Parts:

* ``peak``: 2048x2048 matmul GFLOP/s, bfloat16 and float32, measured in every round of the in-process A/B
  (bfloat16 before and after the round's variants): each share of peak uses its own round's peak;
* ``inproc``: variants built in one process and run interleaved (A B C ... per round), each call of
  ``--spc`` steps timed: the trainer; a hand-written step (same loop, no loss-scale / finite check);
  gradients only (no optimizer update); the forward pass only; the trainer on the model without its two
  Dropout layers (a diagnostic: not the tutorial's model); the trainer with a byte-wise Dropout (a prototype
  drawing a quarter of the random words); the trainer with the first Conv2D in float32; the trainer with one
  step per call (the call and loss-fetch overhead);
* ``env``: settings read when TensorFlow starts, each in its own child process, alternating
  (``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1``, one inter-op thread), with each round's ratio to the default;
* ``onednn``: one call under ``ONEDNN_VERBOSE=1``: every oneDNN primitive's implementation and time, per step;
* ``trace``: one call under the TensorFlow profiler: time per TensorFlow op type on the executor threads;
* ``share`` (not in the default parts): the trainer's share of the bf16 matmul peak from tightly interleaved
  pairs (one call, one matmul timing), for a machine whose load changes from second to second.

The machine may be busy with other work: every A/B keeps each call's figure (median, min, max reported).

Run (writes JSON with the machine, versions, command and date)::

    python benchmarks/cpu_step_profile.py --rounds 10 --calls 1 \\
        --out results/mnist-step-profile-zen4.json --note "..."
    python benchmarks/cpu_step_profile.py --parts share --pairs 40 \\
        --out results/mnist-step-profile-zen4-share.json --note "..."
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_policy import write  # noqa: E402  (how every CPU benchmark writes its results file)
from cpu_step_breakdown import MARK, onednn_breakdown, trace_breakdown  # noqa: E402  (the sibling module)
from cpu_step_variants import BATCH, RawRun, TrainerRun, _setup, matmul_peak  # noqa: E402  (what is measured)

from amp_backends.autotune.timing import Sample, interleaved  # noqa: E402

# FLOPs of one training step per image: forward 2*MACs (conv1 0.39 M, conv2 21.23 M, dense 2.36 M, out 0.003 M),
# backward twice the forward except conv1's data gradient (its input is the image, no gradient needed)
FWD_MFLOP = {"conv1": 26 * 26 * 32 * 9 * 2 / 1e6, "conv2": 24 * 24 * 64 * 9 * 32 * 2 / 1e6,
             "dense": 9216 * 128 * 2 / 1e6, "out": 128 * 10 * 2 / 1e6}
STEP_MFLOP = 3 * sum(FWD_MFLOP.values()) - FWD_MFLOP["conv1"]

ENV_CONFIGS: dict[str, dict[str, str]] = {
    "default": {},
    "TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1": {"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1"},
    "inter_op_threads=1": {"CPU_STEP_PROFILE_INTER": "1"},
}


# ----------------------------------------------------------------------------------- child side
def _median_call(variant: Any, calls: int) -> Sample:
    """The median img/s of ``calls`` calls of the variant, as one self-timed sample of the harness."""
    return Sample(statistics.median(variant.run() for _ in range(calls)), 1.0)


def child_inproc(spc: int, rounds: int, calls: int) -> dict[str, Any]:
    tf = _setup()
    from amp_backends import auto_configure

    plan = auto_configure(verbose=False)
    variants: dict[str, Any] = {
        "trainer (auto plan)": TrainerRun(tf, plan, spc),
        "hand-written step (no finite check)": RawRun(tf, spc, "step"),
        "gradients only (no optimizer update)": RawRun(tf, spc, "grads"),
        "forward only": RawRun(tf, spc, "forward"),
        "trainer, model without Dropout (diagnostic)": TrainerRun(tf, plan, spc, dropout="none"),
        "trainer, byte-wise Dropout (prototype)": TrainerRun(tf, plan, spc, dropout="byte"),
        "trainer, first Conv2D in float32 (prototype)": TrainerRun(tf, plan, spc, conv1_dtype="float32"),
        "trainer, 1 step per call": TrainerRun(tf, plan, 1, group=spc),
    }
    for v in variants.values():  # warm-up: tracing, primitive creation
        v.run()
        v.run()
    # each round: every variant (the order rotated each round), between two bf16 peaks (a round's closing peak is
    # the next one's opening peak); a variant's share of peak and its ratio to the trainer are taken within its round
    peak: list[float] = []
    f32_peak: list[float] = []
    opening = [matmul_peak(tf, "bfloat16", reps=5)]

    def round_done(r: int, _: Any) -> None:
        closing = matmul_peak(tf, "bfloat16", reps=5)
        peak.append(statistics.median([opening[0], closing]))
        opening[0] = closing
        f32_peak.append(matmul_peak(tf, "float32", reps=3))

    timings = interleaved({name: functools.partial(_median_call, v, calls) for name, v in variants.items()},
                          rounds=rounds, after_round=round_done)
    rates = {name: list(values) for name, values in timings.rates.items()}
    return {"plan": plan.headline, "rates": rates, "peak_gflops": {"bfloat16": peak, "float32": f32_peak}}


def child_share(spc: int, pairs: int) -> dict[str, Any]:
    """The trainer's share of the bf16 matmul peak from tightly interleaved pairs: one call, one peak measurement."""
    tf = _setup()
    from amp_backends import auto_configure

    plan = auto_configure(verbose=False)
    run = TrainerRun(tf, plan, spc)
    run.run()
    run.run()
    matmul_peak(tf, "bfloat16", reps=2)
    rates, peaks = [], []
    for i in range(pairs):
        if i % 2:
            peaks.append(matmul_peak(tf, "bfloat16", reps=3))
            rates.append(run.run())
        else:
            rates.append(run.run())
            peaks.append(matmul_peak(tf, "bfloat16", reps=3))
    return {"rates": rates, "peaks": peaks}


def child_env(spc: int, calls: int) -> dict[str, Any]:
    tf = _setup()
    from amp_backends import auto_configure

    plan = auto_configure(verbose=False)
    run = TrainerRun(tf, plan, spc)
    run.run()
    run.run()
    return {"rates": [run.run() for _ in range(calls)]}


def child_onednn(spc: int) -> dict[str, Any]:
    tf = _setup()
    from amp_backends import auto_configure

    plan = auto_configure(verbose=False)
    run = TrainerRun(tf, plan, spc)
    run.run()
    run.run()
    sys.stdout.flush()
    print(MARK, flush=True)
    rate = run.run()
    sys.stdout.flush()
    print(MARK, flush=True)
    return {"rate": rate}


def child_trace(spc: int) -> dict[str, Any]:
    tf = _setup()
    from amp_backends import auto_configure

    plan = auto_configure(verbose=False)
    run = TrainerRun(tf, plan, spc)
    run.run()
    run.run()
    logdir = tempfile.mkdtemp(prefix="step_trace_")
    tf.profiler.experimental.start(logdir)
    rate = run.run()
    tf.profiler.experimental.stop()
    return {"rate": rate, "steps": spc, **trace_breakdown(logdir)}


def _child(args: list[str], env: dict[str, str] | None = None, timeout: int = 900) -> tuple[dict[str, Any], str]:
    full = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.getcwd(), **(env or {})}
    p = subprocess.run([sys.executable, __file__, *args], check=False, capture_output=True, text=True, env=full,
                       timeout=timeout)
    last = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode or not last:
        raise RuntimeError(f"child {args} failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(last[-1]), p.stdout


def _stats(values: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
            "max": round(max(values), 1), "n": len(values)}


def environment() -> dict[str, Any]:
    import tensorflow as tf

    return {"python": platform.python_version(), "tensorflow": tf.__version__, "keras": tf.keras.__version__,
            "load_average_at_start": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    from machine import machine_record

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", choices=["inproc", "env", "onednn", "trace", "share"])
    ap.add_argument("--spc", type=int, default=8, help="steps per compiled call (default 8)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=3, help="timed calls per variant per round")
    ap.add_argument("--parts", default="inproc,env,onednn,trace", help="any of inproc,env,onednn,trace,share")
    ap.add_argument("--pairs", type=int, default=30, help="share: trainer call / matmul pairs (default 30)")
    ap.add_argument("--out")
    ap.add_argument("--note", default="")
    a = ap.parse_args(argv)
    if a.child:
        fn = {"inproc": lambda: child_inproc(a.spc, a.rounds, a.calls), "env": lambda: child_env(a.spc, a.calls),
              "onednn": lambda: child_onednn(a.spc), "trace": lambda: child_trace(a.spc),
              "share": lambda: child_share(a.spc, a.pairs)}[a.child]
        print(json.dumps(fn()), flush=True)
        return 0

    parts = a.parts.split(",")
    env = environment()
    out: dict[str, Any] = {"benchmark": "where the MNIST CNN training step goes under the auto plan (see the "
                                        "script's docstring and benchmarks/cpu_step_profile.md)",
                           **machine_record(),  # machine_kind and machine, as the CPU probe names them
                           "versions": {k: env.pop(k) for k in ("python", "tensorflow", "keras")},
                           "command": "python " + shlex.join(sys.argv),
                           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           "note": a.note, "environment": env, "batch": BATCH, "steps_per_call": a.spc,
                           "mflop_per_image_step": round(STEP_MFLOP, 2)}
    if "onednn" in parts:
        res, stdout = _child(["--child", "onednn", "--spc", str(a.spc)], {"ONEDNN_VERBOSE": "1"})
        out["onednn"] = {"img_per_s_under_verbose": round(res["rate"], 1), **onednn_breakdown(stdout, a.spc)}
        print(json.dumps(out["onednn"]["primitives"][:12], indent=1), flush=True)
    if "trace" in parts:
        res, _ = _child(["--child", "trace", "--spc", str(a.spc)])
        top = sorted(res["ms_by_type"].items(), key=lambda kv: -kv[1])
        out["trace"] = {"img_per_s_under_profiler": round(res["rate"], 1),
                        "ms_per_step_wall_in_trace": round(res["span_ms"] / a.spc, 2),
                        "ms_per_step_all_ops": round(sum(res["ms_by_type"].values()) / a.spc, 2),
                        "ms_per_step_by_category": {k: round(v / a.spc, 2) for k, v in
                                                    sorted(res["ms_by_category"].items(), key=lambda kv: -kv[1])},
                        "ms_per_step_by_op_type": {k: round(v / a.spc, 3) for k, v in top[:40]},
                        "ms_per_step_by_op": {k: round(v / a.spc, 3)
                                              for k, v in sorted(res["ms_by_op"].items(), key=lambda kv: -kv[1])[:40]}}
        print(json.dumps(out["trace"]["ms_per_step_by_op_type"], indent=1), flush=True)
    if "inproc" in parts:
        res, _ = _child(["--child", "inproc", "--spc", str(a.spc), "--rounds", str(a.rounds), "--calls", str(a.calls)])
        peaks = res["peak_gflops"]["bfloat16"]
        base = res["rates"]["trainer (auto plan)"]
        out["plan"] = res["plan"]
        out["matmul_2048_gflops"] = {k: _stats(v) for k, v in res["peak_gflops"].items()}
        out["inproc_img_per_s"] = {}
        for name, rates in res["rates"].items():
            mflop = sum(FWD_MFLOP.values()) if name == "forward only" else STEP_MFLOP
            shares = [rate * mflop / 1e3 / pk for rate, pk in zip(rates, peaks, strict=True)]
            ratios = [rate / b for rate, b in zip(rates, base, strict=True)]
            out["inproc_img_per_s"][name] = {
                **_stats(rates), "mflop_per_image": round(mflop, 2),
                "share_of_bf16_peak_per_round": [round(x, 3) for x in shares],
                "share_of_bf16_peak_median": round(statistics.median(shares), 3),
                "ratio_to_trainer_per_round": [round(x, 3) for x in ratios],
                "ratio_to_trainer_median": round(statistics.median(ratios), 3)}
        print(json.dumps({"peak": out["matmul_2048_gflops"], "inproc": out["inproc_img_per_s"]}, indent=1), flush=True)
    if "env" in parts:
        rates: dict[str, list[float]] = {k: [] for k in ENV_CONFIGS}
        paired: dict[str, list[float]] = {k: [] for k in ENV_CONFIGS}  # per round: median / default's median
        for r in range(a.rounds):
            order = list(ENV_CONFIGS) if r % 2 == 0 else list(reversed(ENV_CONFIGS))
            this: dict[str, float] = {}
            for name in order:
                res, _ = _child(["--child", "env", "--spc", str(a.spc), "--calls", str(a.calls)], ENV_CONFIGS[name])
                rates[name] += res["rates"]
                this[name] = statistics.median(res["rates"])
            for name in ENV_CONFIGS:
                paired[name].append(this[name] / this["default"])
        out["env_img_per_s"] = {k: {**_stats(v), "ratio_to_default_per_round": [round(x, 3) for x in paired[k]],
                                    "ratio_to_default_median": round(statistics.median(paired[k]), 3)}
                                for k, v in rates.items()}
        print(json.dumps(out["env_img_per_s"], indent=1), flush=True)
    if "share" in parts:
        res, _ = _child(["--child", "share", "--spc", str(a.spc), "--pairs", str(a.pairs)])
        shares = sorted(r * STEP_MFLOP / 1e3 / pk for r, pk in zip(res["rates"], res["peaks"], strict=True))
        q = statistics.quantiles(shares, n=4)
        out["share_of_bf16_peak_pairs"] = {
            "how": "each pair: one trainer call of --spc steps and one 2048^3 bf16 matmul timing (median of 3), "
                   "in alternating order; share = img/s * MFLOP per image / that pair's GFLOP/s",
            "trainer_img_per_s": _stats(res["rates"]), "bf16_gflops": _stats(res["peaks"]),
            "share_median": round(statistics.median(shares), 3), "share_quartiles": [round(q[0], 3), round(q[2], 3)],
            "share_best_against_best": round(max(res["rates"]) * STEP_MFLOP / 1e3 / max(res["peaks"]), 3)}
        print(json.dumps(out["share_of_bf16_peak_pairs"], indent=1), flush=True)
    out["environment"]["load_average_at_end"] = os.getloadavg()
    write(out, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
