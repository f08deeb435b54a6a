"""Which layer a kernel belongs to: a backend's records carry shapes and dtypes (oneDNN's) or the TensorFlow op that
ran them (a profiler trace's), not the layer's name.

A record is matched to the traced step's ops of its dtype and shape, named by the layers whose calls created them
(`match_ops`); where none fits, by kernel shape (`match`): a matmul ``MxK:KxN`` matches a dense kernel ``(I, U)``
forward (``K=I, N=U``), in the input's gradient (``K=U, N=I``) or the weights' (``M=I, N=U``), every split of the
kernel's dims tried; several layers of that shape all match (*ambiguous*), none: *unmatched*. A record with a
TensorFlow op goes to the layer named by the op's innermost scope (`match_op_name`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..kernel_audit import CONVOLUTION, INNER_PRODUCT, MATMUL, KernelRecord


@dataclass(frozen=True)
class LayerKernel:
    """A layer with a kernel: its path in the model, its class, its kernel's shape, its compute dtype."""

    path: str
    class_name: str
    kernel_shape: tuple[int, ...]
    compute_dtype: str
    policy: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerKernel:
        """Read one of the audit's ``layers`` (`child.layer_kernels`).

        Args:
            d: A dict with ``path``, ``class_name``, ``kernel_shape``, ``compute_dtype`` and optionally ``policy``.

        Returns:
            The layer it describes.
        """
        return cls(d["path"], d["class_name"], tuple(d["kernel_shape"]), d["compute_dtype"], d.get("policy", ""))

    @property
    def is_conv(self) -> bool:
        """Whether the layer is a convolution (its class says so and its kernel has spatial dims)."""
        return "Conv" in self.class_name and len(self.kernel_shape) >= 3

    def dense_splits(self) -> list[tuple[int, int]]:
        """``(inputs, outputs)`` sizes of the kernel read as a matrix, for every split point of its dims."""
        dims = self.kernel_shape
        return [(math.prod(dims[:i]), math.prod(dims[i:])) for i in range(1, len(dims))]


def _conv_matches(shape: Mapping[str, int], layer: LayerKernel) -> bool:
    if not layer.is_conv:
        return False
    k = layer.kernel_shape
    spatial, c_in, c_out = k[:-2], k[-2], k[-1]
    groups = shape.get("g", 1)
    names = {1: ("kw",), 2: ("kh", "kw"), 3: ("kd", "kh", "kw")}.get(len(spatial))
    if names is None or any(shape.get(n, 1) != s for n, s in zip(names, spatial, strict=True)):
        return False
    ic, oc = shape.get("ic"), shape.get("oc")
    if "Depthwise" in layer.class_name:  # kernel (kh, kw, C, multiplier): oneDNN sees g=C groups
        return groups == c_in and ic == c_in and oc == c_in * c_out
    return ic == c_in * groups and oc == c_out  # Keras keeps a grouped kernel's input channels per group


def _ip_inputs(shape: Mapping[str, int]) -> int:
    """An inner product's inputs: its channels times the source's spatial size."""
    return shape.get("ic", 0) * math.prod(shape.get(n, 1) for n in ("id", "ih", "iw"))


def _ip_matches(shape: Mapping[str, int], layer: LayerKernel) -> bool:
    return not layer.is_conv and (_ip_inputs(shape), shape.get("oc")) in layer.dense_splits()


def _matmul_matches(shape: Mapping[str, int], layer: LayerKernel) -> bool:
    if layer.is_conv or not {"M", "K", "N"} <= shape.keys():
        return False
    m, k, n = shape["M"], shape["K"], shape["N"]
    return any((k, n) in ((i, u), (u, i)) or (m, n) == (i, u) for i, u in layer.dense_splits())


def match(record: KernelRecord, layers: Sequence[LayerKernel]) -> list[str]:
    """The paths of the layers whose kernel shape fits ``record``'s problem (empty: unmatched)."""
    test = {CONVOLUTION: _conv_matches, INNER_PRODUCT: _ip_matches, MATMUL: _matmul_matches}.get(record.problem)
    if not record.shape or test is None:
        return []
    return [layer.path for layer in layers if test(record.shape, layer)]


def _op_fits(shape: Mapping[str, int], problem: str, op: dict[str, Any]) -> bool:
    """Whether a record of ``problem`` with sizes ``shape`` can be the step's op ``op`` (any direction's)."""
    if "kernel" in op:
        if problem != CONVOLUTION:
            return False
        layer = LayerKernel("", "DepthwiseConv2D" if op.get("depthwise") else "Conv2D", tuple(op["kernel"]), "")
        return _conv_matches(shape, layer)
    m, k, n, batch = op["M"], op["K"], op["N"], op.get("batch", 1)
    if problem == INNER_PRODUCT:
        return shape.get("mb") in (m, m * batch) and {_ip_inputs(shape), shape.get("oc")} == {k, n}
    if problem != MATMUL or not {"M", "K", "N"} <= shape.keys():
        return False
    rows, rec_batch = shape["M"], shape.get("batch", 1)  # batches folded into rows, or not
    return (shape["K"], shape["N"]) == (k, n) and ((rows, rec_batch) == (m, batch) or rows * rec_batch == m * batch)


def match_ops(record: KernelRecord, ops: Sequence[dict[str, Any]]) -> list[str]:
    """The paths of the layers that created the traced step's ops (`child.trace_step_ops`) of ``record``'s dtype and
    shape (empty: none fits)."""
    if not record.shape:
        return []
    return sorted({op["layer"] for op in ops if op.get("layer") and op.get("dtype") == record.dtype
                   and _op_fits(record.shape, record.problem, op)})


def match_op_name(op: str | None, layers: Sequence[LayerKernel]) -> list[str]:
    """The layers a GPU kernel's TensorFlow op belongs to, by name: ``gradient_tape/mnist_cnn_1/dense_1/MatMul``
    -> the layer whose own name (``dense_1``) is a scope of the op; the innermost scope wins, ``[]`` if none."""
    if not op:
        return []
    scopes = op.split(":")[0].split("/")[:-1]
    by_name: dict[str, list[str]] = {}
    for layer in layers:
        by_name.setdefault(layer.path.rsplit("/", 1)[-1], []).append(layer.path)
    return next((by_name[scope] for scope in reversed(scopes) if scope in by_name), [])
