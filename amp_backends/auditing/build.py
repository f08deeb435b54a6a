"""From a backend's reading to an `Audit`: its kernel records counted, each compute record matched to its layers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..kernel_audit import KernelAudit, KernelReading, KernelRecord, not_read
from .match import LayerKernel, match, match_op_name, match_ops
from .audit_result import Audit, Entry

if TYPE_CHECKING:  # pragma: no cover
    from ..plan import Plan


def entries_from_records(records: Iterable[KernelRecord], layers: Sequence[LayerKernel],
                         ops: Sequence[Mapping[str, Any]] = ()) -> list[Entry]:
    """One entry a record; a compute record names the layers of the step's ops it fits, else those whose kernel shape
    it fits, else the layer whose name scope its TensorFlow op is in.

    Args:
        records: The backend's records (`KernelRecord`).
        layers: The model's layers with a kernel.
        ops: The traced step's matrix ops (`step_ops`).

    Returns:
        The entries the report counts.
    """
    step = [dict(op) for op in ops]

    def owners(r: KernelRecord) -> tuple[str, ...]:
        if not r.compute:
            return ()
        found = (match_ops(r, step) or match(r, layers)) if r.shape else []
        return tuple(found or match_op_name(r.op, layers))

    return [Entry.of(r, owners(r)) for r in records]


def from_reading(reading: KernelReading, doc: Mapping[str, Any]) -> Audit:
    """The audit of a run from a backend's reading and what the run recorded.

    Args:
        reading: What the backend read (`KernelAudit.read`, `KernelAudit.read_trace`).
        doc: The run's document: ``model``, ``plan``, ``batch_size``, ``steps``, ``step_time_ms``, ``layers``,
            ``ops``, ``findings``, ``notes`` (all optional).

    Returns:
        The `Audit`.
    """
    layers = [LayerKernel.from_dict(dict(d)) for d in doc.get("layers") or []]
    entries = entries_from_records(reading.records, layers, doc.get("ops") or ())
    audit = Audit(model=doc.get("model", "?"), device=reading.device, plan=dict(doc.get("plan") or {}),
                  entries=entries, source=reading.source, measured=reading.measured,
                  outside_onednn=reading.not_visible, batch_size=doc.get("batch_size"), steps=doc.get("steps"),
                  step_time_ms=doc.get("step_time_ms"), findings=doc.get("findings", []),
                  backend_warnings=tuple(dict(w) for w in reading.warnings))
    audit.notes.extend([*reading.notes, *doc.get("notes", ())])
    return audit


def not_measured(model: str, plan: Mapping[str, Any], kernel_audit: KernelAudit | None) -> Audit:
    """The audit of a plan whose backend reads nothing: nothing ran, the notes say why.

    Args:
        model: The model (its factory).
        plan: The plan, as data (``backend``, ``policy``, ``compute_dtype``, ``xla``).
        kernel_audit: The backend's kernel audit (its `KernelAudit.unavailable` reason), or ``None``.

    Returns:
        An unmeasured `Audit`.
    """
    backend = str(plan.get("backend"))
    device = kernel_audit.device if kernel_audit is not None else backend
    audit = Audit(model=model, device=device, plan=dict(plan), measured=False, source=None)
    audit.notes.append(kernel_audit.unavailable if kernel_audit is not None and kernel_audit.unavailable
                       else not_read(backend))
    return audit


def plan_data(plan: Plan) -> dict[str, Any]:
    """A `Plan` as the audit records it.

    Args:
        plan: The plan.

    Returns:
        Its ``backend``, ``policy``, ``compute_dtype`` and ``xla``.
    """
    return {"backend": plan.backend, "policy": plan.policy, "compute_dtype": plan.compute_dtype, "xla": bool(plan.xla)}
