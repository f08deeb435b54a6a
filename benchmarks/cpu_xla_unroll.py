"""The trainer's compiled call under XLA on a CPU: its steps unrolled into one graph, or looped.

With ``steps_per_call`` > 1 the trainer runs several steps in one compiled call: in a loop whose length is an
argument (one compiled function for every call size), or unrolled (one graph per call size). Under XLA on a CPU
the trainer unrolls (``Trainer(unroll_steps=None)``); this script measures why. The MNIST CNN (the tutorials'
model) trains on random MNIST-shaped data under the machine's plan with XLA forced on, one trainer per variant:
each first trains ``--warmup-steps`` (tracing, compiling), then ``--rounds`` rounds in which every variant trains
``--steps`` more steps in turn (interleaved, so a slow spell hits them alike). A round's figure is the median
img/s of that ``fit``'s compiled calls after its warm-up call; printed and written: each variant's median over the
rounds, with its range.

Run: ``python benchmarks/cpu_xla_unroll.py --out results/cpu-xla-unroll-<cpu>.json`` (``--rounds 3 --steps 48
--steps-per-call 8 --batch 128``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (machine.py beside it)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=48, help="steps each variant trains per round")
    parser.add_argument("--warmup-steps", type=int, default=16)
    parser.add_argument("--steps-per-call", type=int, default=8)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--out", help="write the results here (JSON)")
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    import amp_backends
    from amp_backends.keras_compat import keras_info
    from amp_backends.models import mnist_cnn
    from machine import machine_record

    plan = amp_backends.auto_configure(xla="on", verbose=False)
    rng = np.random.default_rng(0)
    samples = args.batch * args.steps_per_call * 8
    x = rng.integers(0, 256, (samples, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, samples)
    trainers = {}
    for name, unroll in (("unrolled", True), ("looped", False)):
        tf.keras.utils.set_random_seed(0)
        model = mnist_cnn()
        updates = amp_backends.classifier_updates(model, tf.keras.optimizers.Adam(1e-3),
                                                  "sparse_categorical_crossentropy")
        trainers[name] = amp_backends.Trainer(updates, plan, batch_size=args.batch, steps_per_call=args.steps_per_call,
                                              unroll_steps=unroll, progress=False, log_every=10**9)
        trainers[name].fit(x, y, epochs=10**6, max_steps=args.warmup_steps)
    rates: dict[str, list[float]] = {name: [] for name in trainers}
    for r in range(args.rounds):
        for name in list(trainers)[r % 2:] + list(trainers)[:r % 2]:
            result = trainers[name].fit(x, y, epochs=10**6, max_steps=args.warmup_steps + (r + 1) * args.steps)
            rates[name].append(round(result.median_throughput or 0.0, 1))
            print(f"round {r} {name}: {rates[name][-1]:.0f} img/s", flush=True)
    record = {
        "benchmark": (f"the trainer's compiled call under XLA on a CPU, {args.steps_per_call} steps per call unrolled "
                      f"into one graph or looped: the MNIST CNN, batch {args.batch}, the plan's policy with XLA "
                      f"forced on; per round, the median img/s of {args.steps} steps' calls after the warm-up call, "
                      f"{args.rounds} interleaved rounds after {args.warmup_steps} warm-up steps"),
        **machine_record(),
        "versions": {"tensorflow": tf.__version__, "keras": keras_info(tf).version},
        "command": "python benchmarks/cpu_xla_unroll.py" + "".join(f" {a}" for a in sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "plan": {"policy": plan.policy, "xla": plan.xla},
        "unit": "img/s",
        "results": {name: {"rounds": r, "median": statistics.median(r), "min": min(r), "max": max(r)}
                    for name, r in rates.items()},
    }
    for name, row in record["results"].items():
        print(f"{name}: {row['median']:.0f} img/s (range {row['min']:.0f}-{row['max']:.0f})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
