"""The check's result: findings and a summary, rendered as a table (rich) or as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from ..errors import AmpConfigError

DEFAULT_TRACE_BATCH = 8  # when the batch is unknown: a multiple of every alignment but fp8's

SCHEMA_VERSION = 1
SEVERITIES = ("error", "warning", "info")
# The sized ops (static shapes) must be this share of the matmuls/convolutions, by count, for FLOP shares to be
# given: the FLOPs of the others are unknown, so a share of the sized ones would pass for the model's.
SIZED_MOST = 0.75


@dataclass(frozen=True)
class Finding:
    """One thing the check found: ``severity`` (``error``: wrong or unstable numbers; ``warning``: speed lost;
    ``info``: expected, or too small to matter), the rule's stable ``code``, the ``layer``'s path
    (``model/block/dense``), what, why, the fix, and the share of the model's FLOPs it concerns.

    Attributes:
        severity: ``"error"``, ``"warning"`` or ``"info"`` (any other raises `AmpConfigError`); the findings are
            ordered by it, errors first.
        code: The rule's stable code (``"tensor-core-shape"``, ``"final-activation"``...), one of those the module
            `amp_backends.model_check` lists.
        layer: The path of the layer it concerns (``model/block/dense``); the model's name where it concerns the
            whole model (the plan's policy, ``unsized-model``).
        what: What was found (the table's "finding" column, followed by the FLOP share where there is one).
        why: Why it matters (the table's "why" column).
        fix: What to change (the table's "fix" column).
        flops_share: The share (0 to 1, rounded to 6 decimals) of the model's matmul and convolution FLOPs it
            concerns, shown as "(12.3% of FLOPs)" after ``what`` and ordering the findings of one severity, largest
            first; ``None`` where it cannot be told (the model or its ops unsized) or the rule gives none.
        details: The rule's own figures, as JSON data (``dims``, ``expected``, ``alignment`` and ``unit`` for
            ``tensor-core-shape``, ``batch_size`` and ``alignment`` for ``batch-size``...: per code in
            `amp_backends.model_check`); empty where the rule gives none.
    """

    severity: str
    code: str
    layer: str
    what: str
    why: str
    fix: str
    flops_share: float | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise AmpConfigError(f"Finding severity must be one of {SEVERITIES}. Received: {self.severity!r}.")

    def to_dict(self) -> dict[str, Any]:
        """The finding as JSON-ready data (one of the check's ``findings``).

        Returns:
            Its fields by name.
        """
        return asdict(self)


@dataclass(frozen=True)
class Summary:
    """Where the model's matmul and convolution FLOPs (forward, per image) run: their share per compute dtype, in
    reduced precision, and on shapes the matrix units run at full efficiency (``None`` without a matrix unit).
    ``unknown_flops_ops`` of the ``gemm_ops`` have dynamic shapes (not counted); unless ``sized`` (the counted
    ones are most of them, `SIZED_MOST`) no shares are given: a share of part of the graph would pass for the
    model's.

    Attributes:
        flops_per_image: The forward pass's matmul and convolution FLOPs per image (multiply-adds counted as two),
            over the ops with static shapes; 0.0 where none has them.
        dtype_shares: Each compute dtype's share of those FLOPs (``{"float16": 0.97, "float32": 0.03}``), rounded to
            6 decimals; empty unless ``sized``.
        reduced_precision_share: The share computed in float16, bfloat16 or float8; ``None`` unless ``sized``.
        eligible_share: The share on shapes the matrix units run at full efficiency (every dimension a multiple of
            the alignment of the unit for the op's dtype; depthwise convolutions never); ``None`` where the plan's
            device has no matrix unit, or unless ``sized``.
        matrix_units: The matrix unit that runs each compute dtype on the plan's device, by dtype
            (``{"float16": "Tensor Cores"}``; float32's only with TF32 on, float8's only with fp8 on); empty without
            a support table.
        unknown_flops_ops: How many of the ``gemm_ops`` have dynamic shapes (their FLOPs unknown, not counted).
        gemm_ops: How many matmul and convolution ops the trace found.
        sized: Whether the ops with static shapes are at least `SIZED_MOST` of ``gemm_ops``, by count (True where
            there are none); False where the trace stopped at a layer that raised.
    """

    flops_per_image: float
    dtype_shares: Mapping[str, float]
    reduced_precision_share: float | None
    eligible_share: float | None
    matrix_units: Mapping[str, str]
    unknown_flops_ops: int = 0
    gemm_ops: int = 0
    sized: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (the check's ``summary``).

        Returns:
            Its fields by name.
        """
        return asdict(self)


def _share(f: Finding) -> str:
    return f" ({_pct(f.flops_share)} of FLOPs)" if f.flops_share is not None else ""


def _pct(share: float | None) -> str:
    return "-" if share is None else "<0.1%" if 0 < share < 0.001 else f"{100 * share:.1f}%"


def _flops(value: float) -> str:
    for unit, scale in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} FLOP"


@dataclass(frozen=True)
class ModelCheck:
    """The result of `check_model`: findings (worst first) and a summary; a table (`render_text`) or JSON.

    Attributes:
        model: The model checked (its name).
        keras_version: The Keras version it was checked under.
        plan: The plan it was checked against, as data.
        batch_size: The batch size it was traced at (``None``: left open).
        findings: What makes mixed precision slow or wrong, worst first (`Finding`).
        summary: The counts and shares (FLOPs by dtype, layers by policy).
        fp8_eligible_layers: The layers float8 would train.
        notes: What else the check says.
        fp8_ineligible_layers: ``(layer, why)`` for the Dense layers float8 leaves out.
        fp8_layers: Every Dense and EinsumDense layer, kept in float8 or skipped, and why.
        open_dims: Input dimensions after the batch left unknown (not given by ``inputs=``).
    """

    model: str
    keras_version: str
    plan: Mapping[str, Any]
    batch_size: int | None
    findings: tuple[Finding, ...]
    summary: Summary
    fp8_eligible_layers: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    fp8_ineligible_layers: tuple[tuple[str, str], ...] = ()
    fp8_layers: tuple[Any, ...] = ()
    open_dims: int = 0

    def of_severity(self, severity: str) -> list[Finding]:
        """The findings of one severity.

        Args:
            severity: ``"error"``, ``"warning"`` or ``"info"``.

        Returns:
            Those findings, worst first.

        Raises:
            ValueError: ``severity`` is not one of the three.
        """
        if severity not in SEVERITIES:
            raise AmpConfigError(f"severity must be one of {SEVERITIES}. Received: {severity!r}.")
        return [f for f in self.findings if f.severity == severity]

    @property
    def counts(self) -> dict[str, int]:
        """How many findings of each severity (``error``, ``warning``, ``info``)."""
        return {s: len(self.of_severity(s)) for s in SEVERITIES}

    def to_dict(self) -> dict[str, Any]:
        """The check as JSON-ready data (``amp-backends check --json``; its schema is ``check.schema.json``).

        Returns:
            The model, the plan, the findings, the summary and the float8 decisions.
        """
        return {"schema_version": SCHEMA_VERSION, "model": self.model, "keras_version": self.keras_version,
                "plan": dict(self.plan), "batch_size": self.batch_size, "summary": self.summary.to_dict(),
                "counts": self.counts, "findings": [f.to_dict() for f in self.findings],
                "fp8_eligible_layers": list(self.fp8_eligible_layers),
                "fp8_ineligible_layers": dict(self.fp8_ineligible_layers),
                "fp8_layers": {layer.path: layer.to_dict() for layer in self.fp8_layers}, "notes": list(self.notes)}

    def to_json(self, **kwargs: Any) -> str:
        """The check as JSON (its schema: ``amp_backends/schemas/check.schema.json``).

        Args:
            **kwargs: Passed to `json.dumps` (``indent`` defaults to 2).

        Returns:
            The JSON text.
        """
        kwargs.setdefault("indent", 2)
        return json.dumps(self.to_dict(), **kwargs)

    @property
    def sized(self) -> bool:
        """Whether the check could size most of the model's matmuls/convolutions (else its shares are not given)."""
        return self.summary.sized

    def unsized_line(self) -> str:
        """What the check says when too many of the model's matmuls and convolutions have dynamic shapes, with the fix.

        Returns:
            The line.
        """
        s = self.summary
        return (f"could not size enough of the model: {s.unknown_flops_ops} of {s.gemm_ops} matmul/convolution ops "
                f"have dynamic shapes (shares are given once {SIZED_MOST:.0%} are sized; a sequence length or image "
                "size the model leaves open), so their FLOPs, shares and "
                "widths are unknown. Fix: give the shapes: check_model(model, inputs=<one batch, its shapes or "
                "dataset.element_spec>), or amp-backends check --seq-len N / --input-shape")

    def headline(self) -> str:
        """One line: the model, the plan it was checked for and the batch (and why it is unsized, where it is).

        Returns:
            The line.
        """
        p = self.plan
        batch = f"batch {self.batch_size}" if self.batch_size else f"batch not given (traced at {DEFAULT_TRACE_BATCH})"
        line = (f"Precision check of {self.model!r} for the plan {p.get('backend')} {p.get('policy')} "
                f"(tf32 {'on' if p.get('tf32') else 'off'}, xla {'on' if p.get('xla') else 'off'}"
                f"{', fp8 on' if p.get('fp8') else ''}), {batch}")
        return line if self.sized or not self.summary.gemm_ops else f"{line}: {self.unsized_line()}"

    def summary_lines(self) -> list[str]:
        """The summary under the headline: FLOPs and their dtypes and shares, the findings counted, float8, notes.

        Returns:
            The lines.
        """
        s, c = self.summary, self.counts
        dtypes = ", ".join(f"{d} {_pct(v)}" for d, v in sorted(s.dtype_shares.items(), key=lambda kv: -kv[1]))
        counted = s.gemm_ops - s.unknown_flops_ops
        if not s.sized and not s.gemm_ops:  # the trace stopped first (a layer raised): the findings say where
            lines = ["matmul + convolution FLOPs: not known: the check stopped before it reached any"]
        elif not s.sized:
            lines = [f"matmul + convolution FLOPs: not known: only {counted} of {s.gemm_ops} ops are sized "
                     f"({_flops(s.flops_per_image)} per image over those, the rest unknown); no shares are given"]
        else:
            over = (f" (over the {counted} of {s.gemm_ops} ops that are sized; shares below are of these)"
                    if s.unknown_flops_ops else "")
            lines = [f"matmul + convolution FLOPs: {_flops(s.flops_per_image)} per image (forward){over}; "
                     f"{dtypes or 'none'}",
                     f"in reduced precision: {_pct(s.reduced_precision_share)}"]
            if s.eligible_share is None:
                lines.append(f"matrix-unit (Tensor Core) shapes: not checked: {self.plan.get('compute_dtype')} has "
                             f"no matrix unit on this {self.plan.get('backend')} device, so layer widths do not matter "
                             "here (they would on a GPU with Tensor Cores: check with a plan for one)")
            else:
                units = ", ".join(f"{u} for {d}" for d, u in s.matrix_units.items() if d in s.dtype_shares)
                lines.append(f"on shapes the matrix units run at full efficiency: {_pct(s.eligible_share)}"
                             + (f" ({units})" if units else ""))
            if s.unknown_flops_ops:
                lines.append(f"{s.unknown_flops_ops} matmul/convolution op(s) with dynamic shapes were not counted")
        lines.append(f"findings: {c['error']} error(s), {c['warning']} warning(s), {c['info']} info")
        if self.plan.get("fp8"):
            lines.append("fp8-eligible layers: " + (", ".join(self.fp8_eligible_layers) or "none"))
            if small := [layer.path for layer in self.fp8_layers if layer.small]:
                lines.append(f"too small to gain from float8: {len(small)} layer(s) ({', '.join(small[:4])}"
                             f"{', ...' if len(small) > 4 else ''})")
        return lines + list(self.notes)

    def log_lines(self) -> list[str]:
        """The check for a training log.

        Returns:
            One line per finding (severity, layer, what, FLOP share, fix), then the summary.
        """
        findings = [f"{f.severity}: {f.layer}: {f.what}{_share(f)}. Fix: {f.fix}" for f in self.findings]
        return [self.headline(), *findings, *self.summary_lines()]

    def render_text(self, console: Any = None) -> None:
        """Print the findings (a table on a terminal, else one line each: `amp_backends.terminal`) and the summary.

        Args:
            console: A ``rich`` console to print to (default: one on standard output).
        """
        from rich.text import Text

        from ..terminal import make_console, say, show_rows

        console = console or make_console()
        say(console, self.headline())
        if self.findings:
            style = {"error": "bold red", "warning": "yellow", "info": "dim"}
            rows = [(Text(f.severity, style=style[f.severity]), f.layer, f.what + _share(f), f.why, f.fix)
                    for f in self.findings]
            columns = [(name, {"ratio": ratio, "overflow": "fold"})
                       for name, ratio in (("severity", 1), ("layer", 2), ("finding", 4), ("why", 4), ("fix", 4))]
            show_rows(console, columns, rows, show_header=True, header_style="bold", show_lines=True,
                      plain=lambda c: f"{c[0]}: {c[1]}: {c[2]}. Why: {c[3].rstrip('.')}. Fix: {c[4]}")
        else:
            say(console, "No findings.")
        for line in self.summary_lines():
            say(console, line)

    def render(self, width: int = 140) -> str:
        """The findings and summary as plain text: one line a finding (no colours, no table).

        Args:
            width: The width of the text, in characters.

        Returns:
            The text.
        """
        from ..terminal import as_text

        return as_text(self.render_text, width)

    def __str__(self) -> str:
        return self.render()
