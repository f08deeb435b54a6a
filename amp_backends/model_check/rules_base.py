"""What every rule shares: the thresholds, and `RuleContext` (one check's state and helpers), which `Rules`
extends and the rules by subject (`rules_policy`, `rules_transformer`) take.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .result import SIZED_MOST, Finding
from .target import Target
from .trace import GemmOp, ModelGraph

SIGNIFICANT = 0.01  # share of matmul/convolution FLOPs above which a slow or misaligned layer is a warning
# A float32 first or output layer is a deliberate, recommended pattern: a warning only when it is this large.
EDGE_SIGNIFICANT = 0.05
SLOW_OP_SIGNIFICANT = 0.05  # share of the forward pass's memory traffic above which a slow op is a warning
REDUCED = ("float16", "bfloat16", "float8")
DENSE_CLASSES = ("Dense", "EinsumDense")
# Ops with no matrix-unit path: they only move memory, forward and (their *Grad ops) backward.
SLOW_OPS = {"ResizeNearestNeighbor": "ResizeNearestNeighborGrad", "ResizeBilinear": "ResizeBilinearGrad",
            "ResizeBicubic": "ResizeBicubicGrad", "ResizeArea": "(no gradient)",
            "ScaleAndTranslate": "ScaleAndTranslateGrad"}
SLOW_LAYERS = ("UpSampling1D", "UpSampling2D", "UpSampling3D", "Resizing")
FINAL_ACTIVATIONS = {"Softmax": "softmax", "LogSoftmax": "log_softmax", "Sigmoid": "sigmoid"}


def next_multiple(value: int, align: int) -> int:
    """The size a dimension is padded to for its matrix unit.

    Args:
        value: The dimension's size.
        align: The alignment it needs.

    Returns:
        The smallest multiple of ``align`` that is at least ``value``.
    """
    return -(-value // align) * align


def op_dtype(graph: ModelGraph, op: GemmOp) -> str:
    """The dtype an op computes in, as the check counts it: ``float8`` in a float8 layer, else its own.

    Args:
        graph: The traced model.
        op: One of its matmuls or convolutions.

    Returns:
        ``float8``, or the op's dtype (``float16``, ``bfloat16``, ``float32``).
    """
    return "float8" if graph.layer(op.layer).policy.startswith("float8") else op.dtype


def fp8_layer(graph: ModelGraph, target: Target, op: GemmOp) -> bool:
    """Whether an op runs in float8: its layer's policy is a float8 one, or the plan trains in float8 and the op, in a
    Dense/EinsumDense layer, neither reads the input data nor gives a model output.

    Args:
        graph: The traced model.
        target: The planned device.
        op: One of the model's matmuls or convolutions.

    Returns:
        Whether its matrix unit is the float8 one.
    """
    info = graph.layer(op.layer)
    return info.policy.startswith("float8") or (target.fp8 and info.class_name in DENSE_CLASSES
                                                and not op.input_from_data and not op.output_to_model)


def labels(class_name: str, kind: str) -> dict[str, str]:
    """The words the findings use for a GEMM's dimensions in a layer (``N`` of a Dense layer: ``units``).

    Args:
        class_name: The layer's class name.
        kind: The op's kind: ``matmul``, ``conv``, ``depthwise`` or ``conv_transpose``.

    Returns:
        By dimension (``M``, ``N``, ``K``; ``C_in``, ``C_out`` for a convolution), its name.
    """
    if kind in ("conv", "conv_transpose", "depthwise"):
        return {"C_out": "filters", "C_in": "input channels"}
    if class_name == "Dense":
        return {"M": "rows (batch x positions)", "N": "units", "K": "input features"}
    if class_name == "EinsumDense":
        return {"M": "rows (batch x positions)", "N": "output width", "K": "input width"}
    return {"M": "rows M", "N": "columns N", "K": "reduction K"}


class RuleContext:
    """One traced model judged for one target: the findings so far, and the helpers every rule uses."""

    def __init__(self, graph: ModelGraph, target: Target, batch_size: int | None, layer_plan: Any = None) -> None:
        self.graph = graph
        self.target = target
        self.batch_size = batch_size
        self.known = [op for op in graph.gemms if op.flops is not None]
        self.total = float(sum(op.flops or 0 for op in self.known)) or 1.0
        # Shares are of the sized ops' FLOPs: they stand for the model only when the sized ops are most of it.
        self.sized = not graph.gemms or len(self.known) >= SIZED_MOST * len(graph.gemms)
        self.findings: list[Finding] = []
        self.model_built_float32 = False
        self.layer_plan = layer_plan  # the model's LayerPlan: the layers it computes in float32 on purpose
        # the measurement that set every layer to float32, if one did
        self.measured_float32: Any = layer_plan.measurement if layer_plan and layer_plan.all_float32 else None
        # the layers the layer plan keeps in float32 (their sublayers, an LSTM's cell, go with them)
        self.kept_paths = list(layer_plan.float32) if layer_plan is not None else [
            i.path for i in graph.layers[1:] if i.kept_by(target.float32_layers)]

    # -- helpers ---------------------------------------------------------------------------------
    def kept_float32(self, info: Any) -> bool:
        """Whether the plan keeps this layer in float32: it, or a layer it belongs to (an LSTM's cell)."""
        return any(info.path == p or info.path.startswith(p + "/") for p in self.kept_paths)

    def dims(self, op: GemmOp) -> dict[str, int | None]:
        """The op's dimensions that decide alignment; rows that grow with an unknown batch are left out."""
        if op.rows_include_batch and self.batch_size is None:
            return {d: v for d, v in op.dims.items() if d != "M"}
        return dict(op.dims)

    def share(self, ops: Iterable[GemmOp]) -> float | None:
        """The ops' share of the model's FLOPs; ``None`` when it cannot be told (unsized ops or model)."""
        ops = list(ops)
        if not self.sized or any(op.flops is None for op in ops):
            return None
        return sum(op.flops or 0 for op in ops) / self.total

    def fraction(self, ops: Iterable[GemmOp]) -> float:
        """The ops' share of the FLOPs when the model is sized, else their share of the matmul/convolution count."""
        ops = list(ops)
        if self.sized:
            return sum(op.flops or 0 for op in ops) / self.total
        return len(ops) / (len(self.graph.gemms) or 1)

    @staticmethod
    def level(share: float | None, threshold: float, unknown: str = "warning") -> str:
        """``warning`` from ``threshold`` up, ``info`` below; ``unknown`` where the share cannot be told."""
        return unknown if share is None else "warning" if share >= threshold else "info"

    def add(self, severity: str, code: str, layer: int | str, what: str, why: str, fix: str,
            share: float | None = None, **details: Any) -> None:
        """Add a finding.

        Args:
            severity: ``error``, ``warning`` or ``info``.
            code: The rule's stable code.
            layer: The layer's index in the traced graph, or its path.
            what: What was found.
            why: Why it matters.
            fix: What to change.
            share: The share of the model's FLOPs it concerns (rounded to 6 decimals), or ``None``.
            **details: The finding's ``details``.
        """
        path = self.graph.layer(layer).path if isinstance(layer, int) else layer
        self.findings.append(Finding(severity, code, path, what, why, fix,
                                     None if share is None else round(share, 6), details))
