"""What one matmul or convolution op of a TensorFlow graph computes: its kind, FLOPs and dimensions.

Dimensions as the GEMM sees them: ``M`` (rows), ``N`` (columns), ``K`` (reduction) for matmuls; ``C_in`` (per
group) and ``C_out`` for convolutions. A layer applied at every position is one GEMM of batch x positions rows
however the graph writes it (a 2-D ``MatMul`` after a reshape, an einsum, a ``BatchMatMulV2`` with one weight,
whose leading dimensions XLA folds into the rows). A matmul whose operands share batch dimensions (attention) is
*batched*: ``M`` is one small GEMM's rows. FLOPs are per batch, multiply-adds counted as 2: ``2*M*N*K`` for a
matmul, ``2*H_out*W_out*K_h*K_w*C_in*C_out`` per image for a convolution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# SparseMatMul: what tf.matmul of a bfloat16 and a float32 tensor becomes; it computes in float32.
MATMUL_OPS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "SparseMatMul"})
CONV_OPS = frozenset({"Conv2D", "Conv3D", "Conv", "DepthwiseConv2dNative", "Conv2DBackpropInput",
                      "Conv3DBackpropInputV2"})
GEMM_OPS = MATMUL_OPS | CONV_OPS


@dataclass(frozen=True)
class GemmShape:
    """``kind`` (``matmul``, ``conv``, ``depthwise``, ``conv_transpose``), ``flops`` per batch, ``dims``, the
    ``data`` operand (the activations' tensor), and whether the op is a batch of GEMMs (``batched``: its
    ``M`` is one GEMM's rows, not the batch's)."""

    kind: str
    flops: int | None
    dims: dict[str, int | None]
    data: Any
    batched: bool = False


def dims_of(tensor: Any) -> list[int | None]:
    """A tensor's static shape.

    Args:
        tensor: A graph tensor.

    Returns:
        Its dimensions, ``None`` where one is unknown; ``[]`` where the rank is unknown.
    """
    try:
        return list(tensor.shape.as_list())
    except ValueError:  # unknown rank
        return []


def prod(values: list[int | None]) -> int | None:
    """The product of sizes that may be unknown.

    Args:
        values: The sizes, ``None`` where one is unknown.

    Returns:
        Their product (1 for none), or ``None`` where any is unknown.
    """
    return None if any(v is None for v in values) else math.prod(v for v in values if v is not None)


def attr(op: Any, name: str, default: Any = None) -> Any:
    """An attribute of a graph op, or ``default`` where the op has none of that name.

    Args:
        op: The graph op.
        name: The attribute's name (``transpose_a``, ``adj_x``, ``equation``).
        default: What an op without it gives.

    Returns:
        The attribute's value, or ``default``.
    """
    try:
        return op.get_attr(name)
    except (ValueError, TypeError):
        return default


def float_dtype(op: Any) -> str:
    """The dtype the op computes in: its first floating input's, its output's for ``SparseMatMul`` (float32)."""
    tensors = list(op.outputs) if op.type == "SparseMatMul" else list(op.inputs) + list(op.outputs)
    for t in tensors:
        if t.dtype.is_floating:
            return t.dtype.name
    return op.inputs[0].dtype.name if op.inputs else "unknown"


def _einsum(op: Any) -> tuple[int | None, dict[str, int | None], bool]:
    equation = attr(op, "equation", b"")
    equation = equation.decode() if isinstance(equation, bytes) else str(equation)
    if "->" not in equation or len(op.inputs) != 2:
        return None, {}, False
    lhs, out = equation.replace(" ", "").split("->")
    terms = lhs.split(",")
    sizes: dict[str, int | None] = {}
    letters = []
    for term, tensor in zip(terms, op.inputs, strict=True):
        shape = dims_of(tensor)
        if "..." in term:  # name the ellipsis dimensions, aligned from the right as broadcasting does
            n = len(shape) - (len(term) - 3)
            term = term.replace("...", "".join(chr(0x3B1 + i) for i in range(max(n, 0))))
        letters.append(term)
        for ch, size in zip(term, shape, strict=False):
            if sizes.get(ch) is None:
                sizes[ch] = size
    a, b = letters
    out_letters = set(out) | {ch for ch in sizes if 0x3B1 <= ord(ch) < 0x3B1 + 26}
    contracted = [ch for ch in a if ch in b and ch not in out_letters]
    m_letters = [ch for ch in a if ch not in b]
    n_letters = [ch for ch in b if ch not in a]
    batched = any(ch in b and ch in out_letters and sizes[ch] != 1 for ch in a)
    dims = {"M": prod([sizes[ch] for ch in m_letters]), "N": prod([sizes[ch] for ch in n_letters]),
            "K": prod([sizes[ch] for ch in contracted])}
    return prod([2, *sizes.values()]), dims, batched


def _batch_matmul(op: Any) -> GemmShape:
    a, b = dims_of(op.inputs[0]), dims_of(op.inputs[1])
    if len(a) < 2 or len(b) < 2:
        return GemmShape("matmul", None, {"M": None, "N": None, "K": None}, op.inputs[0])
    adj_x = attr(op, "adj_x")
    m, k = (a[-1], a[-2]) if adj_x else (a[-2], a[-1])
    n = b[-2] if attr(op, "adj_y") else b[-1]
    flops = prod([2, prod(dims_of(op.outputs[0])), k])
    if prod(b[:-2]) == 1 and not adj_x:  # one weight for every batch: a single GEMM over all the rows
        return GemmShape("matmul", flops, {"M": prod(a[:-2] + [m]), "N": n, "K": k}, op.inputs[0])
    return GemmShape("matmul", flops, {"M": m, "N": n, "K": k}, op.inputs[0], batched=prod(a[:-2]) != 1)


def read_gemm(op: Any) -> GemmShape:
    """The `GemmShape` of a matmul/convolution op (one of `GEMM_OPS`)."""
    t = op.type
    if t in ("MatMul", "SparseMatMul"):
        a, b = dims_of(op.inputs[0]), dims_of(op.inputs[1])
        m, k = (a[1], a[0]) if attr(op, "transpose_a") else (a[0], a[1])
        n = b[0] if attr(op, "transpose_b") else b[1]
        return GemmShape("matmul", prod([2, m, n, k]), {"M": m, "N": n, "K": k}, op.inputs[0])
    if t in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        return _batch_matmul(op)
    if t == "Einsum":
        flops, dims, batched = _einsum(op)
        return GemmShape("matmul", flops, dims, op.inputs[0], batched)
    if t in ("Conv2DBackpropInput", "Conv3DBackpropInputV2"):
        kernel = dims_of(op.inputs[1]) or [None] * 3  # unknown rank: every size unknown
        c_out = kernel[-2]
        return GemmShape("conv_transpose", prod([2, prod(dims_of(op.inputs[2])), prod(kernel[:-2]), c_out]),
                         {"C_in": kernel[-1], "C_out": c_out}, op.inputs[2])
    kernel, numel = dims_of(op.inputs[1]) or [None] * 3, prod(dims_of(op.outputs[0]))
    if t == "DepthwiseConv2dNative":
        return GemmShape("depthwise", prod([2, numel, prod(kernel[:-2])]),
                         {"C_in": kernel[-2], "C_out": prod(kernel[-2:])}, op.inputs[0])
    return GemmShape("conv", prod([2, numel, prod(kernel[:-1])]), {"C_in": kernel[-2], "C_out": kernel[-1]},
                     op.inputs[0])
