"""Which Dense/EinsumDense layers may train in float8, and why each one is kept or skipped.

A small GEMM runs slower in float8 than in float16/bfloat16: the quantization around it costs more than the
fp8 math saves. The size rule is torchao's for per-tensor scaling, the kind Keras's float8 layers use
(``_auto_filter_for_tensorwise`` in ``torchao/float8/float8_linear_utils.py``, commit 7cdd43a5, tuned on H100s):
skip a layer whose units are at most 4096 and input features at most 1024.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .rules_base import DENSE_CLASSES, labels
from .trace import GemmOp, LayerInfo, ModelGraph, by_layer

FP8_ALIGNMENT = 16
# torchao's tensorwise filter (see the module documentation): skip when units <= 4096 and inputs <= 1024.
SMALL_UNITS = 4096
SMALL_INPUTS = 1024


@dataclass(frozen=True)
class Fp8Layer:
    """One Dense/EinsumDense layer and the float8 decision: ``eligible``, and ``why`` (kept or skipped).

    ``small`` marks a layer eligible but for its size (too small to gain): a plan whose fp8 is forced
    (emulated, to test float8's numerics) quantizes these too.
    """

    path: str
    eligible: bool
    why: str
    small: bool = False
    size: str = ""  # "units 256, input features 128" where the layer was sized

    def to_dict(self) -> dict[str, object]:
        """The decision as JSON data (the report's, by layer path).

        Returns:
            ``eligible``, ``why`` and ``small``.
        """
        return {"eligible": self.eligible, "why": self.why, "small": self.small}


def _decide(info: LayerInfo, ops: list[GemmOp], dims: Callable[[GemmOp], dict[str, int | None]]) -> Fp8Layer:
    path = info.path
    if any(op.input_from_data for op in ops):
        return Fp8Layer(path, False, "the first layer: it reads the input data, kept in the policy's precision")
    if any(op.output_to_model for op in ops):
        return Fp8Layer(path, False, "the last layer: its output is the model's, kept in the policy's precision")
    if any(op.kind != "matmul" for op in ops):
        return Fp8Layer(path, False, "not a plain matmul")
    names = labels(info.class_name, "matmul")
    if bad := {d: v for op in ops for d, v in dims(op).items() if v is None or v % FP8_ALIGNMENT}:
        why = "not a multiple of 16 (fp8 GEMMs need it): " + ", ".join(
            f"{names.get(d, d)} {'unknown' if v is None else v}" for d, v in bad.items())
        if any(v is None for v in bad.values()):
            why += " (dynamic shapes: give the check inputs= or a sequence length to size them)"
        return Fp8Layer(path, False, why)
    n = max((op.dims.get("N") or 0) for op in ops)
    k = max((op.dims.get("K") or 0) for op in ops)
    size = f"{names['N']} {n}, {names['K']} {k}"
    if n <= SMALL_UNITS and k <= SMALL_INPUTS:
        return Fp8Layer(path, False, f"too small to gain from float8 ({size}: at most {SMALL_UNITS} and "
                        f"{SMALL_INPUTS}, torchao's tensorwise filter): the quantization costs more than the fp8 GEMM "
                        "saves", small=True, size=size)
    return Fp8Layer(path, True, f"float8: a middle layer, multiples of 16, large enough ({size})", size=size)


def fp8_layers(graph: ModelGraph, dims: Callable[[GemmOp], dict[str, int | None]]) -> list[Fp8Layer]:
    """The decision for every Dense/EinsumDense layer with a matmul in the traced graph, in graph order.

    Eligible: neither the first layer (its input is the data) nor the last (its output is the model's:
    both stay in the policy's precision, as fp8 recipes keep them), one plain matmul, every dimension a
    multiple of 16 (what fp8 GEMMs need; ``dims`` leaves out rows that grow with an unknown batch), and
    large enough to gain (torchao's rule above).
    """
    return [_decide(graph.layer(layer), ops, dims) for layer, ops in by_layer(graph.gemms).items()
            if graph.layer(layer).class_name in DENSE_CLASSES]
