#!/usr/bin/env python
"""Where the MNIST CNN training step goes on a CPU, op by op: the trainer under the auto plan, a TensorFlow
profiler trace of its steady state, and each op's time per step summed over the host's threads (ops run
side by side on the cores, so the sum exceeds the wall time of a step).

    python benchmarks/cpu_step_profile.py [--batch 256] [--steps 16]

Measured on the development machine (AMD EPYC Zen 4 with avx512_bf16, 2 cores, TF 2.21, Keras 3.15,
2026-11-23, a machine shared with other work; the auto plan: mixed_bfloat16, XLA off), batch 256,
16 steps per call: 44.3 ms per step (5,780 img/s), op time per step: convolution backward-weights
(``_MklNativeConv2DBackpropFilterWithBias``, oneDNN ``jit_bf16``, not the brgemm kernel the other two
directions use) 19.4 ms, backward-data 14.8, forward 10.6; Dropout's random numbers
(``StatelessRandomUniformV2``, float32, two layers) 8.0 ms, with its mask (``GreaterEqual``, ``SelectV2``)
1.7 more; ``ReluGrad`` 5.1; the Dense matmuls 4.3; ``Mul`` (Adam and Dropout's scaling, 39 ops) 3.4;
pooling 2.1; ``Cast`` 1.1 (28 ops); the rest of Adam (``Sub``, ``Square``, ``Sqrt``, ``RealDiv``,
assignments) about 2.3; the loss fetch nothing measurable (one per call). ``ONEDNN_VERBOSE=1`` on the same
run agrees on the convolutions (backward-weights 19.5, backward-data 14.7, forward 10.5 ms per step;
reorders 0.8 ms).
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=16, help="steps per compiled call; one call is traced")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    import tensorflow as tf

    from amp_backends.configure import auto_configure
    from amp_backends.data import synthetic_mnist
    from amp_backends.models import mnist_cnn
    from amp_backends.training import Trainer, classifier_updates, mnist_batch_fn

    plan = auto_configure(verbose=False)
    (x, y), _ = synthetic_mnist(args.batch * args.steps, 8)
    trainer = Trainer(classifier_updates(mnist_cnn(), tf.keras.optimizers.Adam(1e-3)), plan, batch_size=args.batch,
                      steps_per_call=args.steps, log_every=10**9, progress=False, batch_fn=mnist_batch_fn,
                      check_models=False)
    trainer.fit(x, y, epochs=2)  # compile, warm up
    logdir = tempfile.mkdtemp(prefix="cpu-step-profile-")
    tf.profiler.experimental.start(logdir)
    t0 = time.perf_counter()
    trainer.fit(x, y, epochs=3)
    dt = time.perf_counter() - t0
    tf.profiler.experimental.stop()
    print(f"plan: {plan.policy}, XLA {'on' if plan.xla else 'off'}; {dt / args.steps * 1e3:.1f} ms per step "
          f"({args.steps * args.batch / dt:,.0f} img/s, profiler on)")
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    path = sorted(Path(logdir).glob("plugins/profile/*/*.xplane.pb"))[-1]
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    agg: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        meta = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for ev in line.events:
                name = meta.get(ev.metadata_id, "?")
                a = agg[name.split(":")[-1] if ":" in name else name]
                a[0] += 1
                a[1] += ev.duration_ps / 1e9
    print("  ms/step  ops/step  op (enclosing events such as Process, run, ParallelFor include the ops inside them)")
    for name, (n, ms) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{ms / args.steps:9.2f} {n / args.steps:9.1f}  {name[:100]}")


if __name__ == "__main__":
    main()
