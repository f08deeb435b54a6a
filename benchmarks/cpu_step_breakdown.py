"""Where a profiled training step's time went: TensorFlow's op trace and oneDNN's verbose records, by category.

The parsing half of ``cpu_step_profile.py`` (its child processes record; these functions read what they recorded).
"""

from __future__ import annotations

import collections
import glob
import os
from typing import Any

MARK = "@@CPU_STEP_PROFILE@@"  # printed around the one call whose oneDNN records are read


def category(name: str, kind: str) -> str:
    """What a TensorFlow op of the step is for (its type first, then the layer or optimizer in its name)."""
    if "BackpropFilter" in kind:
        return "convolution backward-weights (oneDNN)"
    if "BackpropInput" in kind:
        return "convolution backward-data (oneDNN)"
    if "Conv2D" in kind:
        return "convolution forward, bias and ReLU fused (oneDNN)"
    if "MatMul" in kind:
        return "Dense matmuls (oneDNN)"
    if "MaxPool" in kind:
        return "max pooling and its gradient (oneDNN)"
    if "dropout" in name:
        return "Dropout: random numbers, mask, select, scale (forward and backward)"
    if "/adam/" in name or "VariableOp" in kind:
        return "Adam update (elementwise, float32)"
    if kind == "ReluGrad":
        return "ReluGrad of the convolutions (Eigen, bfloat16)"
    if kind == "Cast":
        return "casts bfloat16 <-> float32"
    if kind in ("GatherV2", "RealDiv") and "mnist_cnn" not in name:
        return "batch gather and /255 (input)"
    if kind in ("IsFinite", "All", "LogicalAnd", "LogicalNot"):
        return "finite check of the gradients"
    return "other"


def trace_breakdown(logdir: str) -> dict[str, Any]:
    """Time per TensorFlow op type, op and category on the executor threads of the profile in ``logdir``."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    path = max(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    by_type: dict[str, float] = collections.defaultdict(float)
    by_op: dict[str, float] = collections.defaultdict(float)
    by_category: dict[str, float] = collections.defaultdict(float)
    first, last = float("inf"), 0.0
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for ev in line.events:
                meta = plane.event_metadata.get(ev.metadata_id)
                if meta is None or ":" not in meta.name or "::" in meta.name:
                    continue
                name, _, kind = meta.name.rpartition(":")
                start = (line.timestamp_ns * 1000 + ev.offset_ps) / 1e9
                first, last = min(first, start), max(last, start + ev.duration_ps / 1e9)
                by_type[kind] += ev.duration_ps / 1e9
                by_op[name] += ev.duration_ps / 1e9
                by_category[category(name, kind)] += ev.duration_ps / 1e9
    return {"span_ms": last - first, "ms_by_type": dict(by_type), "ms_by_op": dict(by_op),
            "ms_by_category": dict(by_category)}


def onednn_breakdown(stdout: str, steps: int) -> dict[str, Any]:
    from amp_backends.backends.cpu import verbose as onednn

    inside, lines = False, []
    for line in stdout.splitlines():
        if line.strip() == MARK:
            inside = not inside
            continue
        if inside:
            lines.append(line)
    records = onednn.parse(lines)
    rows: dict[tuple[str, str, str, str], list[float]] = collections.defaultdict(list)
    for r in records:
        shape = r.problem if r.kind != "reorder" else ""
        rows[(r.kind, r.implementation, r.prop, shape)].append(r.time_ms)
    table = sorted(({"kind": k[0], "implementation": k[1], "prop": k[2], "problem": k[3],
                     "ms_per_step": round(sum(v) / steps, 3), "calls_per_step": len(v) / steps}
                    for k, v in rows.items()), key=lambda d: -d["ms_per_step"])
    return {"library": onednn.library_version(stdout.splitlines()), "records": len(records),
            "ms_per_step_total": round(sum(r.time_ms for r in records) / steps, 2), "primitives": table}
