"""The audit's result: time per dtype and on the matrix units, float32 islands, contradictions with the plan.

Shares are of the *compute time*: the kernels doing matrix work (`KernelRecord.compute`: convolutions, matmuls,
GEMMs, XLA fusions holding a dot or convolution); reorders and other kernels are listed apart, and a kernel whose
dtype cannot be read counts as ``unknown``. The warnings' ``code`` (a backend's own come with its reading:
`KernelReading.warnings`) are explained on the Troubleshooting page. The JSON (`Audit.to_dict`, ``schema_version``
1, fields only ever added) has its schema in ``amp_backends/schemas/audit.schema.json``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..kernel_audit import CONVOLUTION, INNER_PRODUCT, MATMUL, KernelRecord

SCHEMA_VERSION = 1
REDUCED = ("bfloat16", "float16", "float8", "int8", "tfloat32")
LOW = ("bfloat16", "float16", "float8")  # the dtypes a float32 plan must not compute in
# A kind of kernel is reported when at least this share of its time, and this share of all the compute time, ran in
# float32 under a reduced-precision plan (the float32 output layer alone stays below them on the models we measured).
FLOAT32_KIND_SHARE = 0.10
MIN_TOTAL_SHARE = 0.01
# The families a kernel's problem (`KernelRecord.problem`; an entry without one: its kind) groups it in.
FAMILY = {CONVOLUTION: "convolution", INNER_PRODUCT: "matmul", MATMUL: "matmul"}


@dataclass(frozen=True)
class Entry(KernelRecord):
    """One kernel execution: a backend's `KernelRecord` and ``layers``, the layers it was matched to."""

    layers: tuple[str, ...] = ()

    @classmethod
    def of(cls, record: KernelRecord, layers: tuple[str, ...] = ()) -> Entry:
        """``record`` (the fields of `KernelRecord`, whichever backend made it) matched to ``layers``."""
        return cls(**{f.name: getattr(record, f.name) for f in fields(KernelRecord)}, layers=layers)


def _time(entries: Sequence[Entry]) -> float:
    return sum(e.time_ms for e in entries)


def _share(entries: Sequence[Entry], keep: Any) -> float | None:
    """The share of the entries' time in those ``keep`` takes (``None``: no time)."""
    total = _time(entries)
    return round(_time([e for e in entries if keep(e)]) / total, 6) if total else None


def _shares(entries: Sequence[Entry], field: str) -> dict[str, float]:
    """Each value of the entries' ``field`` (``dtype``, ``unit``) with its share of their time, largest first."""
    totals: dict[str, float] = defaultdict(float)
    for e in entries:
        totals[getattr(e, field)] += e.time_ms
    total = sum(totals.values())
    return {k: round(v / total, 6) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])} if total else {}


@dataclass
class Audit:
    """What ran, from the kernels' own records. ``str(audit)`` is a table; `to_json` the JSON.

    Attributes:
        model: The model audited (its factory, or its name).
        device: The device the kernels ran on.
        plan: The plan the model ran under, as data (its ``float32_layers``: the layer plan's float32 paths).
        entries: Each kernel execution counted (`Entry`).
        source: Where the records came from (oneDNN's verbose log, a profiler trace).
        measured: Whether kernels were recorded at all.
        outside_onednn: Why the matrix work's kernels were not visible to the backend (`KernelReading.not_visible`;
            on a CPU: they ran outside oneDNN), or ``None``. The JSON keeps the name.
        batch_size: The batch size the steps ran at.
        steps: How many steps were audited.
        step_time_ms: The mean time of the audited steps, in milliseconds (their wall time over their count).
        findings: The warnings, each with its fix.
        notes: What else the audit says.
        backend_warnings: The reading backend's warnings (`KernelReading.warnings`), listed before the generic ones.
    """

    model: str
    device: str
    plan: Mapping[str, Any]
    entries: Sequence[Entry] = ()
    source: str | None = None
    measured: bool = True
    outside_onednn: str | None = None
    batch_size: int | None = None
    steps: int | None = None
    step_time_ms: float | None = None
    findings: Sequence[Mapping[str, Any]] = ()
    notes: list[str] = field(default_factory=list)
    backend_warnings: Sequence[Mapping[str, str]] = ()

    # -- figures ------------------------------------------------------------------------------------------
    @property
    def compute(self) -> list[Entry]:
        """The entries of compute kernels (convolutions, matmuls), as opposed to reorders and the rest."""
        return [e for e in self.entries if e.compute]

    def time_share_by_dtype(self) -> dict[str, float]:
        """The share of the compute time spent in each dtype.

        Returns:
            Shares by dtype, summing to 1 (empty when nothing was seen).
        """
        return _shares(self.compute, "dtype")

    def time_share_by_unit(self) -> dict[str, float]:
        """The share of the compute time spent on each unit (matrix units, vector units, unknown).

        Returns:
            Shares by unit, summing to 1 (empty when nothing was seen).
        """
        return _shares(self.compute, "unit")

    def matrix_unit_share(self) -> float | None:
        """The share of the compute time on the matrix units (Tensor Cores, AMX tiles).

        Returns:
            The share, or ``None`` where no compute time was seen.
        """
        return _share(self.compute, lambda e: e.matrix_unit)

    def unknown_share(self) -> float:
        """The share of the compute time in kernels whose dtype is not known.

        Returns:
            The share (1 when the kernels were not visible or nothing was measured).
        """
        if self.outside_onednn or not self.measured:
            return 1.0
        return _share(self.compute, lambda e: e.dtype == "unknown") or 0.0

    def by_kind(self) -> dict[str, dict[str, Any]]:
        """Time, dtype shares and counts per kind of kernel (convolution, matmul...).

        Returns:
            The figures by kind.
        """
        kinds: dict[str, list[Entry]] = defaultdict(list)
        for e in self.compute:
            kinds[e.kind].append(e)
        return {kind: {"time_ms": round(_time(entries), 4), "dtypes": _shares(entries, "dtype"),
                       "units": _shares(entries, "unit")}
                for kind, entries in sorted(kinds.items(), key=lambda kv: -_time(kv[1]))}

    def planned_float32(self, layers: Sequence[str]) -> bool:
        """Whether the layer plan (``plan["float32_layers"]``) keeps all ``layers`` in float32 (a sublayer goes with
        its layer).

        Args:
            layers: Layer paths.

        Returns:
            Whether the plan keeps all of them in float32.
        """
        kept = tuple(self.plan.get("float32_layers") or ())
        return bool(layers) and all(any(path == k or path.startswith(k + "/") for k in kept) for path in layers)

    def float32_islands(self) -> list[dict[str, Any]]:
        """float32 compute under a reduced-precision plan, grouped by the layers it was matched to.

        Returns:
            One record per group of layers, the longest first: the layers, whether the layer plan keeps them in
            float32, their time and share of the compute, the kernel kinds, how they were matched, and the precision
            check's findings on them (empty where the plan is float32 or the run was not read).
        """
        if self.plan.get("compute_dtype") not in REDUCED or self.outside_onednn:
            return []
        total = _time(self.compute)
        groups: dict[tuple[str, ...], list[Entry]] = defaultdict(list)
        for e in self.compute:
            if e.dtype == "float32":
                groups[e.layers].append(e)
        islands = []
        for layers, entries in sorted(groups.items(), key=lambda kv: -_time(kv[1])):
            t = _time(entries)
            matched = "unmatched" if not layers else ("layer" if len(layers) == 1 else "ambiguous")
            check = [f for f in self.findings if f.get("layer") in layers]
            islands.append({"layers": list(layers), "planned": self.planned_float32(layers), "time_ms": round(t, 4),
                            "share": round(t / total, 6) if total else 0.0,
                            "kinds": sorted({e.kind for e in entries}), "matched": matched, "check": check})
        return islands

    def warnings(self) -> list[dict[str, str]]:
        """The contradictions between what ran and the plan, each with its ``code``, ``what`` and ``fix``.

        Returns:
            The backend's warnings, then the generic ones.
        """
        return [dict(w) for w in self.backend_warnings] + _contradictions(self)

    # -- output -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The audit as JSON-ready data (``amp-backends audit --json``; its schema is ``audit.schema.json``).

        Returns:
            What ran: the plan, the time shares, the float32 islands, the warnings, the notes.
        """
        return {
            "schema_version": SCHEMA_VERSION, "model": self.model, "device": self.device, "source": self.source,
            "measured": self.measured, "outside_onednn": self.outside_onednn, "plan": dict(self.plan),
            "batch_size": self.batch_size, "steps": self.steps,
            "step_time_ms": round(self.step_time_ms, 4) if self.step_time_ms is not None else None,
            "compute_time_ms": round(_time(self.compute), 4),
            "reorder_time_ms": round(_time([e for e in self.entries if e.reorder]), 4),
            "other_time_ms": round(_time([e for e in self.entries if not e.compute and not e.reorder]), 4),
            "time_share_by_dtype": self.time_share_by_dtype(), "time_share_by_unit": self.time_share_by_unit(),
            "matrix_unit_share": self.matrix_unit_share(), "unknown_share": self.unknown_share(),
            "by_kind": self.by_kind(), "float32_islands": self.float32_islands(),
            "warnings": self.warnings(), "notes": list(self.notes),
        }

    def to_json(self, **kwargs: Any) -> str:
        """The audit as JSON (its schema: ``amp_backends/schemas/audit.schema.json``).

        Args:
            **kwargs: Passed to `json.dumps` (``indent`` defaults to 2).

        Returns:
            The JSON text.
        """
        kwargs.setdefault("indent", 2)
        return json.dumps(self.to_dict(), **kwargs)

    def headline(self) -> str:
        """One line: the model, the device, the plan, and what the kernels were read from.

        Returns:
            The line.
        """
        p = self.plan
        return (f"Audit of {self.model!r} on {self.device}, plan {p.get('backend')} {p.get('policy')}"
                f" (xla {'on' if p.get('xla') else 'off'}): what ran, from {self.source or 'nothing measured'}")

    def render_text(self, console: Any = None) -> None:
        """Print what ran: the kernels by kind (a table on a terminal, else a line each), the shares, the float32
        islands, the warnings.

        Args:
            console: A ``rich`` console to print to (default: one on standard output).
        """
        from ..terminal import make_console, say, show_rows

        console = console or make_console()
        say(console, self.headline())
        if not self.measured or self.outside_onednn:
            say(console, self.outside_onednn or "not measured")
        d = self.to_dict()
        kinds, steps = d["by_kind"], max(self.steps or 1, 1)
        if kinds:
            rows = [(kind, f"{k['time_ms'] / steps:.2f}", _fmt(k["dtypes"]), _fmt(k["units"]))
                    for kind, k in kinds.items()]
            show_rows(console, [(name, {"overflow": "fold"}) for name in
                                ("kernels", "ms per step", "dtypes (share of time)", "executed on")], rows,
                      show_header=True, header_style="bold",
                      plain=lambda c: f"kernels {c[0]}: {c[1]} ms per step; dtypes {c[2]}; executed on {c[3]}")
        elif self.measured and not self.outside_onednn:
            say(console, f"no compute kernel (matmul, convolution) among the {len(self.entries)} kernel records read: "
                         "nothing to count by dtype" if self.entries else "no kernel record was read from the run: "
                         "nothing to count (did its kernels print or trace nothing?)")
        if kinds:
            units = ", ".join(sorted({e.unit for e in self.compute if e.matrix_unit}))  # (the ones that ran)
            say(console, f"compute time by dtype: {_fmt(d['time_share_by_dtype'])}; on matrix units"
                         f"{f' ({units})' if units else ''}: {_pct(d['matrix_unit_share'])}; unknown: "
                         f"{_pct(d['unknown_share'])}")
            say(console, f"per step: reorders {d['reorder_time_ms'] / steps:.2f} ms, other primitives "
                         f"{d['other_time_ms'] / steps:.2f} ms; step time "
                         f"{'-' if self.step_time_ms is None else f'{self.step_time_ms:.1f} ms'} "
                         f"({self.steps} step(s) measured, batch {self.batch_size})")
        for island in d["float32_islands"]:
            where = ", ".join(island["layers"]) or "no layer of that shape"
            why = "; ".join(f"{c.get('code')}: {c.get('what')}" for c in island["check"])
            planned = ", as the layer plan keeps them" if island.get("planned") else ""
            say(console, f"float32 island: {where} ({island['matched']}{planned}): {_pct(island['share'])} of "
                         f"compute time in {', '.join(island['kinds'])}" + (f" [check: {why}]" if why else ""))
        for w in d["warnings"]:
            say(console, f"warning: {w['what']}. Fix: {w['fix']}", style="yellow")
        for note in self.notes:
            say(console, f"note: {note}")

    def render(self, width: int = 140) -> str:
        """What `render_text` prints, as text.

        Args:
            width: The width of the text, in characters.

        Returns:
            The text.
        """
        from ..terminal import as_text

        return as_text(self.render_text, width)

    def __str__(self) -> str:
        return self.render()


def _pct(share: float | None) -> str:
    return "-" if share is None else "<0.1%" if 0 < share < 0.001 else f"{100 * share:.1f}%"


def _fmt(shares: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {_pct(v)}" for k, v in shares.items()) or "none"


def _contradictions(audit: Audit) -> list[dict[str, str]]:
    """The generic warnings: contradictions between what ran and the plan."""
    want, compute = audit.plan.get("compute_dtype"), audit.compute
    total = _time(compute)
    out: list[dict[str, str]] = []
    for kind in ("convolution", "matmul") if want in LOW else ():
        entries = [e for e in compute if FAMILY.get(e.problem or e.kind, e.problem or e.kind) == kind]
        kind_time = _time(entries)
        # float32 in a layer the layer plan keeps in float32 is as planned, never a contradiction
        f32 = [e for e in entries if e.dtype == "float32" and not audit.planned_float32(e.layers)]
        f32_time = _time(f32)
        if not kind_time or f32_time / kind_time < FLOAT32_KIND_SHARE or f32_time / total < MIN_TOTAL_SHARE:
            continue
        layers = sorted({layer for e in f32 for layer in e.layers})
        where = f" (layers: {', '.join(layers)})" if layers else " (not matched to a layer)"
        rows = sorted({e.kind for e in f32} - {kind})  # the table's rows (kinds) of that family they ran in
        out.append({"code": "float32-kernels",
                    "what": f"the plan says {want}; {f32_time / kind_time:.0%} of the {kind} time ran in "
                            f"float32 kernels{' (' + ', '.join(rows) + ')' if rows else ''}{where}",
                    "fix": "leave in float32 only the layers the layer plan keeps there (prepare_model: the output "
                           "layer, the plan's float32 layer kinds): the layers named are pinned to float32 "
                           "(dtype=\"float32\") or cast inside; `amp-backends check` names why"})
    reduced = {d: s for d, s in audit.time_share_by_dtype().items() if d in LOW} if want == "float32" else {}
    if reduced:
        d, s = max(reduced.items(), key=lambda kv: kv[1])
        out.append({"code": "reduced-precision-kernels",
                    "what": f"the plan says float32; {s:.0%} of the compute time ran in {d} kernels",
                    "fix": "unset the math libraries' reduced-precision modes for float32 (oneDNN's "
                           "ONEDNN_DEFAULT_FPMATH_MODE, TF32, ITEX's BF32) and build the model after "
                           "auto_configure(), so that no layer keeps a mixed policy"})
    emulated = _time([e for e in compute if e.emulated])
    if total and emulated / total >= 0.01:
        out.append({"code": "emulated-kernels",
                    "what": f"{emulated / total:.0%} of the compute time ran reduced-precision kernels on an ISA "
                            "without instructions for them (emulated: slower than float32)",
                    "fix": "plan float32 here (--policy float32)" if want != "float32" else
                           "under a float32 plan these come from layers on a mixed policy (build the model after "
                           "auto_configure(), or prepare_model(..., reset_policies=True)) or a float32 math mode "
                           "(unset ONEDNN_DEFAULT_FPMATH_MODE and ITEX_FP32_MATH_MODE; --tf32 off)"})
    return out
