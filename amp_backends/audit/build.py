"""From raw observations to an `Audit`: oneDNN records (CPU) or GPU kernels (NVIDIA)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from . import nvidia, onednn
from .match import LayerKernel, match, match_op_name, match_ops
from .report import Audit, Entry
from .verdict import outside_onednn_reason


def entries_from_records(records: Iterable[onednn.Record], layers: Sequence[LayerKernel],
                         ops: Sequence[Mapping[str, Any]] = ()) -> list[Entry]:
    """One entry a record; a compute record names the layers of the step's ops it fits (``ops``, from the
    child's traced step), else the layers whose kernel shape it fits."""
    step = [dict(op) for op in ops]

    def owners(r: onednn.Record) -> tuple[str, ...]:
        if not r.is_compute:
            return ()
        return tuple(match_ops(r, step) or match(r, layers))

    return [Entry(kind=r.kind, dtype=r.dtype, unit=r.unit, time_ms=r.time_ms, compute=r.is_compute,
                  reorder=r.is_reorder, layers=owners(r), matrix_unit=r.on_matrix_unit, emulated=r.emulated)
            for r in records]


def from_onednn(lines: Sequence[str], doc: Mapping[str, Any], header: Sequence[str] = ()) -> Audit:
    """The audit of a CPU run: ``lines`` are the measured steps' verbose output, ``doc`` the child's JSON."""
    records = onednn.parse(lines)
    layers = [LayerKernel.from_dict(d) for d in doc.get("layers", [])]
    entries = entries_from_records(records, layers, doc.get("ops") or ())
    # Eigen's float32 contractions call oneDNN's sgemm (``gemm_api``) even with TensorFlow's oneDNN ops off:
    # only a oneDNN convolution/matmul/inner-product primitive shows that TensorFlow's matrix ops ran in oneDNN.
    has_compute = any(e.compute and e.kind != "gemm_api" for e in entries)
    eigen_sgemm = 0.0
    if not has_compute:
        eigen_sgemm = sum(e.time_ms for e in entries if e.compute)
        entries = [replace(e, compute=False, layers=()) for e in entries]
    version = onednn.library_version(header) or onednn.library_version(lines)
    audit = Audit(model=doc.get("model", "?"), device="cpu", plan=dict(doc.get("plan", {})), entries=entries,
                  source=f"{version or 'oneDNN'} verbose ({len(records)} records)", batch_size=doc.get("batch_size"),
                  steps=doc.get("steps"), step_time_ms=doc.get("step_time_ms"), findings=doc.get("findings", []),
                  outside_onednn=outside_onednn_reason(dict(doc), has_compute))
    if audit.outside_onednn:
        audit.notes.append("kernels outside oneDNN are not visible to the audit: their dtypes are not reported "
                           "(never guessed)")
        if eigen_sgemm:
            audit.notes.append(f"{eigen_sgemm:.1f} ms of oneDNN sgemm calls (gemm_api, float32) were seen: Eigen's "
                               "float32 contractions use it; they are not counted as compute time")
    elif entries:
        total = sum(e.time_ms for e in entries) / max(audit.steps or 1, 1)
        audit.notes.append(f"oneDNN's own times sum to {total:.1f} ms per step; TensorFlow runs independent ops "
                           "side by side, so this may exceed the step time")
    return audit


def entries_from_kernels(events: Iterable[nvidia.KernelEvent], layers: Sequence[LayerKernel] = ()) -> list[Entry]:
    out = []
    for event, k in nvidia.classify_events(events):
        compute = k.is_compute or (k.kind == "fusion")  # a fusion without HLO may hold a dot: counted as unknown
        unit = "Tensor Cores" if k.tensor_core else ("CUDA cores" if k.tensor_core is False else "unknown")
        out.append(Entry(kind=k.kind, dtype=k.dtype, unit=unit, time_ms=event.duration_us / 1000.0,
                         compute=compute, matrix_unit=k.tensor_core,
                         layers=tuple(match_op_name(event.op, layers)) if compute else ()))
    return out


def from_trace(events: Iterable[nvidia.KernelEvent], plan: Mapping[str, Any], model: str = "?",
               steps: int | None = None, findings: Sequence[Mapping[str, Any]] = (),
               layers: Sequence[Mapping[str, Any]] = ()) -> Audit:
    """The audit of a GPU run from its profiler trace's kernels (matched to ``layers`` by their ops' names)."""
    entries = entries_from_kernels(events, [LayerKernel.from_dict(dict(d)) for d in layers])
    audit = Audit(model=model, device="nvidia", plan=dict(plan), entries=entries, source="TensorFlow profiler trace",
                  steps=steps, findings=findings)
    audit.notes.append("GPU kernels are matched to layers by their TensorFlow op's name scopes where the trace gives "
                       "one; XLA fusions without HLO in the trace are unknown")
    return audit
