"""A profiler trace, summarized: the trace kept (gzipped) and op statistics read from its XPlane.

For a GPU: how busy the kernel streams were, kernels and kernel time per step, the top kernels, the XLA
op lines; on any device the host threads' events and TensorFlow's own ``framework_op_stats`` table
(the converter TensorBoard's profile plugin calls), when it answers.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any, Callable


def summarize_trace(logdir: str, dest: Path, steps: int, say: Callable[[str], None], batch: int = 0) -> dict[str, Any]:
    """Copy the trace (gzipped) to ``dest`` and derive op statistics from its XPlane (TensorFlow's own protobuf)."""
    dest.mkdir(parents=True, exist_ok=True)
    paths = sorted(Path(logdir).glob("plugins/profile/*/*.xplane.pb"))
    if not paths:
        raise RuntimeError(f"the profiler wrote no .xplane.pb under {logdir}")
    path = paths[-1]
    kept = dest / "trace.xplane.pb.gz"
    with open(path, "rb") as f, gzip.open(kept, "wb", compresslevel=6) as g:
        shutil.copyfileobj(f, g)
    result: dict[str, Any] = {"xplane_mib": round(path.stat().st_size / 2**20, 2),
                              "trace": f"{dest.name}/{kept.name} (gunzip it into plugins/profile/<run>/ of a log "
                                       "directory, then open it with TensorBoard's profile plugin)"}
    lines = [f"trace: {path.name}, {result['xplane_mib']} MiB, {steps} training steps traced"]

    def table(agg: dict[str, list[float]], n: int) -> list[str]:
        total = sum(us for _, us in agg.values()) or 1.0
        top = sorted(agg.items(), key=lambda kv: -kv[1][1])[:n]
        return [f"  {us / total:6.1%} {us:11.0f} {int(c):7d}  {name[:120]}" for name, (c, us) in top]

    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2

        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        streams: dict[str, list[float]] = {}  # kernel name -> [count, us], over the GPU's streams
        spans: list[tuple[int, int]] = []
        device_lines: list[tuple[str, dict[str, list[float]]]] = []
        host: dict[str, list[float]] = {}
        for plane in space.planes:
            meta = {k: v.name for k, v in plane.event_metadata.items()}
            gpu = plane.name.startswith("/device:GPU")
            if not gpu and not plane.name.startswith("/host:CPU"):
                continue
            for line in plane.lines:
                name = line.display_name or line.name
                kernels = gpu and line.name.startswith("Stream")
                agg = streams if kernels else (host if not gpu else {})
                for ev in line.events:
                    a = agg.setdefault(meta.get(ev.metadata_id, str(ev.metadata_id)), [0, 0.0])
                    a[0] += 1
                    a[1] += ev.duration_ps / 1e6
                    if kernels:
                        start = line.timestamp_ns * 1000 + ev.offset_ps
                        spans.append((start, start + ev.duration_ps))
                if gpu and not kernels and agg:
                    device_lines.append((f"{plane.name} / {name}", agg))
        if spans:
            spans.sort()
            busy, (cur_s, cur_e) = 0, spans[0]
            for s, e in spans[1:]:
                if s > cur_e:
                    busy += cur_e - cur_s
                    cur_s, cur_e = s, e
                else:
                    cur_e = max(cur_e, e)
            busy += cur_e - cur_s
            span = max(e for _, e in spans) - spans[0][0]
            kernels = int(sum(c for c, _ in streams.values()))
            result.update(gpu_busy_fraction=round(busy / span, 3) if span else None, gpu_span_ms=round(span / 1e9, 2),
                          gpu_busy_ms=round(busy / 1e9, 2), kernels=kernels, kernels_per_step=round(kernels / steps, 1),
                          gpu_busy_us_per_step=round(busy / 1e6 / steps, 1))
            lines.append(f"GPU kernels: busy {busy / 1e9:.1f} ms of the {span / 1e9:.1f} ms from first to last kernel "
                         f"({100 * busy / max(span, 1):.0f}%); {kernels} kernels, {kernels / steps:.1f} per step; "
                         f"{busy / 1e6 / steps:.1f} us of kernel time per step")
            if batch and busy:
                bound = batch * steps / (busy / 1e12)
                result["kernel_bound_img_per_s"] = round(bound)
                lines.append(f"if the GPU were never idle: {bound:,.0f} img/s at batch {batch} (1.5 M img/s needs "
                             f"{batch / 1.5e6 * 1e6:.0f} us per step)")
            total = sum(us for _, us in streams.values()) or 1.0
            result["top_kernels"] = [
                {"name": n[:160], "count": int(c), "us": round(us, 1), "share": round(us / total, 3)}
                for n, (c, us) in sorted(streams.items(), key=lambda kv: -kv[1][1])[:25]]
            lines += ["top GPU kernels, all streams:   share    total us   count  name"] + table(streams, 25)
        else:
            lines.append("no GPU kernels in the trace (a CPU run)")
        for label, agg in device_lines:
            if any(k in label for k in ("XLA Ops", "XLA Modules", "TensorFlow Ops", "Steps", "Launch")):
                lines += [f"{label}: {int(sum(c for c, _ in agg.values()))} events"] + table(agg, 12)
        if host:
            lines += [f"host threads, all: {int(sum(c for c, _ in host.values()))} events (nested: shares overlap)"]
            lines += table(host, 20)
    except Exception as exc:
        lines.append(f"op statistics could not be derived from the XPlane ({type(exc).__name__}: {exc}); "
                     "the trace is kept: open it with TensorBoard's profile plugin")
    try:  # TensorFlow's own converter (what TensorBoard's profile plugin calls), when it answers
        from tensorflow.python.profiler.internal import _pywrap_profiler_plugin as plugin

        data, ok = plugin.xspace_to_tools_data([str(path)], "framework_op_stats", {})
        rows = framework_op_table(data) if ok and data else []
        if rows:
            lines += ["framework_op_stats (TensorFlow's converter), top 20 by self time:"] + rows
        result["framework_op_stats"] = "converted" if rows else "the converter returned nothing readable"
    except Exception as exc:
        result["framework_op_stats"] = f"unavailable: {type(exc).__name__}: {str(exc)[:200]}"
    text = "\n".join(lines)
    (dest / "op_stats.txt").write_text(text + "\n")
    say("   profile: " + (lines[1] if len(lines) > 1 else lines[0]))
    result["text"] = text
    return result


def framework_op_table(data: Any) -> list[str]:
    """The top rows of framework_op_stats' table (a Google Charts DataTable in JSON), or [] if unreadable."""
    try:
        if isinstance(data, bytes):
            data = data.decode("utf-8", "replace")
        parsed = json.loads(data)
        table = parsed[0] if isinstance(parsed, list) else parsed
        cols = [c.get("id") or c.get("label") for c in table["cols"]]
        rows = [[cell.get("v") if isinstance(cell, dict) else None for cell in r["c"]] for r in table["rows"]]
        want = [c for c in ("host_or_device", "type", "operation", "occurrences", "total_self_time",
                            "device_total_self_time_percent", "total_self_time_percent") if c in cols]
        if "total_self_time" in cols:
            rows.sort(key=lambda r: -(r[cols.index("total_self_time")] or 0))
        out = ["  " + " | ".join(want)]
        for r in rows[:20]:
            out.append("  " + " | ".join(str(r[cols.index(c)])[:60] for c in want))
        return out
    except Exception:
        return []
