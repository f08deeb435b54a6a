"""The matmuls and convolutions of the audited training step, each with the layer whose call created it.

The child traces its step once with every layer's call in a name scope naming it (`amp_backends.model_check.scopes`)
and lists each matrix op, forward and backward, as a plain dict (it crosses to the parent as JSON): ``layer`` (a path,
or ``None``), ``op`` (its type), ``dtype``, and ``M``, ``K``, ``N``, ``batch`` for a matmul (logical sizes, as
oneDNN's ``MxK:KxN``) or ``kernel`` (the filter's shape) and ``depthwise`` for a convolution in any direction.
"""

from __future__ import annotations

from typing import Any

from ..model_check.gemm import attr, dims_of, prod
from ..model_check.scopes import owner

MATMULS = frozenset({"MatMul", "SparseMatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"})
# the filter is input 1, except where the op computes it (the gradient of the filter: its output)
CONVS = {"Conv2D": 1, "Conv3D": 1, "Conv2DBackpropInput": 1, "Conv3DBackpropInputV2": 1,
         "DepthwiseConv2dNative": 1, "DepthwiseConv2dNativeBackpropInput": 1,
         "Conv2DBackpropFilter": None, "Conv3DBackpropFilterV2": None, "DepthwiseConv2dNativeBackpropFilter": None}


def _matmul(op: Any) -> dict[str, Any] | None:
    from ..model_check.gemm import float_dtype, read_gemm

    if op.type in ("MatMul", "SparseMatMul"):
        a, b = dims_of(op.inputs[0]), dims_of(op.inputs[1])
        if len(a) != 2 or len(b) != 2:
            return None
        m, k = (a[1], a[0]) if attr(op, "transpose_a") else (a[0], a[1])
        n = b[0] if attr(op, "transpose_b") else b[1]
        batch: int | None = 1
    elif op.type == "Einsum":
        shape = read_gemm(op)
        m, k, n = shape.dims.get("M"), shape.dims.get("K"), shape.dims.get("N")
        one = prod([2, m, k, n])
        batch = shape.flops // one if shape.flops and one else None
    else:
        a, b, out = dims_of(op.inputs[0]), dims_of(op.inputs[1]), dims_of(op.outputs[0])
        if len(a) < 2 or len(b) < 2:
            return None
        m, k = (a[-1], a[-2]) if attr(op, "adj_x") else (a[-2], a[-1])
        n = b[-2] if attr(op, "adj_y") else b[-1]
        batch = prod(out[:-2])
    if None in (m, k, n, batch):
        return None
    return {"M": m, "K": k, "N": n, "batch": batch, "dtype": float_dtype(op)}


def _conv(op: Any) -> dict[str, Any] | None:
    at = CONVS[op.type]
    kernel = dims_of(op.outputs[0] if at is None else op.inputs[at])
    if not kernel or None in kernel:
        return None
    return {"kernel": kernel, "depthwise": op.type.startswith("Depthwise"), "dtype": op.outputs[0].dtype.name}


def step_ops(graph: Any, paths: list[str]) -> list[dict[str, Any]]:
    """The matrix ops of a traced step's ``graph``; ``paths[i]`` names the layer whose scope token is ``i``."""
    out = []
    for op in graph.get_operations():
        entry = _matmul(op) if op.type in MATMULS else _conv(op) if op.type in CONVS else None
        if entry is None:
            continue
        index = owner(op.name)
        layer = paths[index] if index is not None and 0 <= index < len(paths) else None
        out.append({"layer": layer, "op": op.type, **entry})
    return out
