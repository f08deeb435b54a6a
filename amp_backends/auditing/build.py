"""From a backend's reading to an `Audit`: its kernel records counted, each compute record matched to its layers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import BackendError
from ..registry import AT_FAULT
from ..kernel_audit import Capture, KernelAudit, KernelReading, KernelRecord
from .match import LayerKernel, match, match_op_name, match_ops
from .audit_result import Audit, Entry

if TYPE_CHECKING:  # pragma: no cover
    from ..plan import Plan


def read_kernels(kernel_audit: KernelAudit, capture: Capture, backend: str) -> KernelReading:
    """``kernel_audit.read(capture)``, what the backend read checked, as our error.

    Args:
        kernel_audit: The backend's `KernelAudit`.
        capture: What its process printed, and the run's document.
        backend: The backend's name.

    Returns:
        The reading.

    Raises:
        BackendError: ``read`` raised, or gave no `KernelReading` of `KernelRecord`.
    """
    where = f"the {backend} backend's kernel audit ({type(kernel_audit).__module__}.{type(kernel_audit).__qualname__}" \
            ".read)"
    fix = f"Fix: {AT_FAULT}, or pass backend= to audit under another"
    try:
        reading = kernel_audit.read(capture)
    except Exception as exc:
        raise BackendError(f"{where} raised {type(exc).__name__}: {exc}. {fix}.") from exc
    records = getattr(reading, "records", None)
    if not isinstance(reading, KernelReading) or not isinstance(records, tuple) or not all(
            isinstance(r, KernelRecord) for r in records):
        got = type(reading).__name__ if not isinstance(reading, KernelReading) else f"records={str(records)[:80]}"
        raise BackendError(f"{where} returned {got}; expected a KernelReading whose records are a tuple of "
                           f"KernelRecord. {fix}.")
    return reading


def from_reading(reading: KernelReading, doc: Mapping[str, Any]) -> Audit:
    """The audit of a run from a backend's reading (`KernelAudit.read`, `KernelAudit.read_trace`) and the run's
    document (``model``, ``plan``, ``batch_size``, ``steps``, ``step_time_ms``, ``layers``, ``ops``, ``findings``,
    ``notes``: all optional). A compute record names the layers of the step's ops it fits, else those whose kernel
    shape it fits, else the layer whose name scope its TensorFlow op is in."""
    layers = [LayerKernel.from_dict(dict(d)) for d in doc.get("layers") or []]
    step = [dict(op) for op in doc.get("ops") or ()]

    def owners(r: KernelRecord) -> tuple[str, ...]:
        if not r.compute:
            return ()
        found = (match_ops(r, step) or match(r, layers)) if r.shape else []
        return tuple(found or match_op_name(r.op, layers))

    audit = Audit(model=doc.get("model", "?"), device=reading.device, plan=dict(doc.get("plan") or {}),
                  entries=[Entry.of(r, owners(r)) for r in reading.records], source=reading.source,
                  measured=reading.measured, outside_onednn=reading.not_visible, batch_size=doc.get("batch_size"),
                  steps=doc.get("steps"), step_time_ms=doc.get("step_time_ms"), findings=doc.get("findings", []),
                  backend_warnings=tuple(dict(w) for w in reading.warnings))
    audit.notes.extend([*reading.notes, *doc.get("notes", ())])
    return audit


def not_measured(model: str, plan: Mapping[str, Any], kernel_audit: KernelAudit | None) -> Audit:
    """The unmeasured audit of a plan (as data) whose backend reads nothing: the notes say why."""
    backend = str(plan.get("backend"))
    device = kernel_audit.device if kernel_audit is not None else backend
    audit = Audit(model=model, device=device, plan=dict(plan), measured=False, source=None)
    audit.notes.append(kernel_audit.unavailable if kernel_audit is not None and kernel_audit.unavailable
                       else f"not measured: the {backend} backend does not read what ran")
    return audit


def plan_data(plan: Plan) -> dict[str, Any]:
    """A `Plan` as the audit records it: its ``backend``, ``policy``, ``compute_dtype`` and ``xla``."""
    return {"backend": plan.backend, "policy": plan.policy, "compute_dtype": plan.compute_dtype, "xla": bool(plan.xla)}
