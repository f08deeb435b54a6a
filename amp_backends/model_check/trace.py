"""Trace a model's forward pass once and read what its graph really computes.

Layer attributes say what a layer *should* compute in; the graph shows what it does (a custom layer casting to
float32 before its matmul). The model is traced once with ``training=False`` (nothing runs), each op mapped to
the layer whose call created it (`scopes`), each matmul and convolution read by `gemm`; the losses the call
collected are removed again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from ..layer_names import layer_geometry
from .gemm import GEMM_OPS, dims_of, float_dtype, prod, read_gemm
from .masks import MaskConstant, large_negative_constants
from ..errors import ModelCallError
from ..keras_compat import InputLeaf, compute_dtype, policy_name, user_code, walk
from .scopes import TOKEN, LayerFailure, LayerScopes, layer_of

# Ops that only move or relabel a tensor: a model output produced through them comes from the op before.
PASSTHROUGH_OPS = frozenset({"Identity", "IdentityN", "Cast", "Reshape", "Squeeze", "ExpandDims", "Transpose",
                             "StopGradient", "EnsureShape", "CheckNumerics"})
BOOKKEEPING_OPS = frozenset({"Const", "Placeholder", "ReadVariableOp", "Identity", "IdentityN", "NoOp", "Shape",
                             "ShapeN", "Size", "Rank", "VarHandleOp", "StopGradient", "EnsureShape"})


@dataclass(frozen=True)
class LayerInfo:
    """A layer of the model: its path (``model/block/dense``), class, dtype policy and compute dtype."""

    path: str
    class_name: str
    policy: str
    compute_dtype: str
    vocabulary: int | None = None  # an embedding's input_dim (its vocabulary size)
    bases: tuple[str, ...] = ()  # the names of its class and base classes
    strides: tuple[int, ...] = ()
    kernel: tuple[int, ...] = ()

    def kept_by(self, rules: Iterable[Any]) -> bool:
        """Whether one of ``rules`` (the plan's `Float32Layer` entries) keeps it in float32."""
        return any(r.matches(self.bases or (self.class_name,), self.strides, self.kernel) for r in rules)


@dataclass(frozen=True)
class GemmOp:
    """One matmul or convolution of the forward graph, with its ``dims`` (see `gemm`).

    ``input_from_data``: no other matmul/convolution lies between the model's inputs and it (its ``K``/``C_in``
    is the data's width); ``output_to_model``: none lies between it and a model output, nor after it (its
    ``N``/``C_out`` is the targets' width).
    """

    name: str
    op_type: str
    kind: str  # "matmul", "conv", "depthwise" or "conv_transpose"
    layer: int
    dtype: str
    flops: int | None
    dims: dict[str, int | None]
    input_from_data: bool
    output_to_model: bool
    rows_include_batch: bool = False
    constant_operand: bool = False  # an operand is a float32 constant (a NumPy array the layer's code passed in)


@dataclass(frozen=True)
class OtherOp:
    """Any other op on the activations' path: its type and dtype."""

    name: str
    op_type: str
    layer: int
    dtype: str | None


@dataclass(frozen=True)
class OutputInfo:
    """One model output: its dtype, and the op that computes it (through casts, reshapes, identities)."""

    index: int
    dtype: str
    producer_type: str
    producer_dtype: str | None
    layer: int


@dataclass
class ModelGraph:
    """What `trace_model` read: the model's layers, and the forward graph's ops mapped onto them."""

    layers: list[LayerInfo]
    batch: int
    gemms: list[GemmOp] = field(default_factory=list)
    others: list[OtherOp] = field(default_factory=list)
    outputs: list[OutputInfo] = field(default_factory=list)
    # Bytes each layer reads (activations and weights) and writes at its boundary, as if its ops were fused.
    layer_traffic: dict[int, int] = field(default_factory=dict)
    masks: list[MaskConstant] = field(default_factory=list)  # mask constants beyond float16/bfloat16's range
    uncounted: list[int] = field(default_factory=list)  # layers with matmuls inside a function call (not read)

    def layer(self, index: int) -> LayerInfo:
        """A layer by its index in `layers` (the ops' ``layer``; 0: the model itself).

        Args:
            index: The layer's index.

        Returns:
            The layer.
        """
        return self.layers[index]


def by_layer(items: Iterable[Any]) -> dict[int, list[Any]]:
    """``items`` (ops, masks) grouped by their ``layer``, in order."""
    groups: dict[int, list[Any]] = {}
    for item in items:
        groups.setdefault(item.layer, []).append(item)
    return groups


def _source(op: Any) -> Any:
    """The op that computes ``op``'s value, through casts, reshapes and identities (`PASSTHROUGH_OPS`)."""
    while op.type in PASSTHROUGH_OPS and op.inputs:
        op = op.inputs[0].op
    return op


def _constant_operand(op: Any) -> bool:
    """Whether one of ``op``'s operands is a float32 constant (through casts, reshapes and identities)."""
    sources = [_source(t.op) for t in op.inputs]
    return any(s.type == "Const" and s.outputs and s.outputs[0].dtype.name == "float32" for s in sources)


def trace_model(model: Any, batch: int, input_struct: Any) -> ModelGraph:
    """Trace ``model(inputs, training=False)`` for a batch of ``batch`` and read its graph."""
    import tensorflow as tf

    walked = list(walk(model, model.name))
    layers = [LayerInfo(path, type(obj).__name__, policy_name(obj), compute_dtype(obj),
                        _vocabulary(obj), *layer_geometry(obj)) for path, obj in walked]
    objects = [obj for _, obj in walked]

    def spec(leaf: InputLeaf) -> Any:
        return tf.TensorSpec((batch, *leaf.shape[1:]) if leaf.shape else leaf.shape, leaf.dtype)

    specs = tf.nest.map_structure(spec, input_struct)
    scopes = LayerScopes(objects, keep_losses=objects)
    try:
        with scopes:
            forward = user_code(model)  # (traced without AutoGraph, the model as AutoGraph would call it)
            concrete = tf.function(lambda x: forward(x, training=False), autograph=False).get_concrete_function(specs)
    except Exception as exc:
        raise _trace_error(model.name, layers, objects, specs, exc, scopes.culprit(exc)) from exc
    return _read_graph(concrete, layers, batch, len(tf.nest.flatten(specs)))


def run_once(model: Any, input_struct: Any, building: bool = False) -> None:
    """Call ``model`` once, eagerly, on zeros of one example at ``input_struct``'s shapes (``training=False``,
    losses restored): a shape the model cannot take fails only when it runs, never in the symbolic trace.
    Nothing runs where a dimension is open or an input takes strings.

    Args:
        model: The Keras model.
        input_struct: The shapes and dtypes of its inputs (`shapes.checked_inputs`).
        building: The call builds a model not built yet (no symbolic trace has run).

    Raises:
        ModelCallError: The model raised, naming the layer whose call did.
    """
    import numpy as np
    import tensorflow as tf

    leaves = tf.nest.flatten(input_struct)
    if not leaves or any(None in leaf.shape[1:] or not (leaf.dtype.is_floating or leaf.dtype.is_integer or
                                                        leaf.dtype.is_bool) for leaf in leaves):
        return
    zeros = tf.nest.map_structure(lambda leaf: tf.constant(np.zeros((1, *leaf.shape[1:]), leaf.dtype.as_numpy_dtype)),
                                  input_struct)
    paths, objects = zip(*walk(model, model.name), strict=True)
    scopes = LayerScopes(list(objects), keep_losses=objects)
    try:
        with scopes:
            model(zeros, training=False)
    except Exception as exc:
        failure = scopes.culprit(exc)
        where = (f"its layer {paths[failure.index]!r} ({type(objects[failure.index]).__name__}) raised "
                 if failure is not None and failure.index else "it raised ")
        shapes = tf.nest.map_structure(lambda leaf: (None, *leaf.shape[1:]), input_struct)
        error = failure.error if failure is not None else exc
        said = [line for line in re.sub(r"\x1b\[[0-9;]*m|\{\{function_node [^}]*\}\}|" + TOKEN + r"\d+/", "",
                                        str(error)).splitlines()
                if line.strip() and not line.startswith(("Exception encountered", "Arguments received"))]
        first = (said or [""])[0].strip()[:300]
        raise ModelCallError(
            f"The model {model.name!r} does not run on inputs of shape {shapes}: called once on zeros of that shape "
            f"(one example), {where}{type(error).__name__}: {first}. " + (
                "That call was to build it (a subclassed model not built yet). " if building else
                "The symbolic trace alone passed, so a check at these shapes would approve a model that fails on the "
                "first step. ") + "Expected the shapes the model is "
            "trained on, which it runs on. Fix: check (and train) at shapes it takes — a sequence length at most "
            "its maximum (the length of its position embedding), an image size its layers accept.") from exc


def _trace_error(name: str, layers: list[LayerInfo], objects: list[Any], specs: Any, exc: Exception,
                 failure: LayerFailure | None) -> Exception:
    """The error for a model whose call raised: the layer whose own code raised, when one did, and its inputs."""
    import tensorflow as tf

    shapes = tf.nest.map_structure(lambda s: tuple(s.shape.as_list()), specs)
    if failure is None or failure.index == 0:
        return ModelCallError(
            f"check_model could not trace the model {name!r}: it calls model(inputs, training=False) on inputs of "
            f"shape {shapes}, and that raised {type(exc).__name__}: {exc}. Expected a model that runs on such "
            "inputs. Fix: build the model with keras.Input(...) of the shape it is trained on (or call it once on a "
            "batch), and pass batch_size=... or inputs=...")
    info, error = layers[failure.index], failure.error
    said = re.sub(TOKEN + r"\d+/", "", str(error)).strip().rstrip(".")  # (without the check's own scopes)
    message = f"{type(error).__name__}: {said}"
    given = ", ".join(f"{t.dtype.name} {tuple(t.shape.as_list())}" for t in tf.nest.flatten(failure.inputs)
                      if hasattr(t, "dtype") and hasattr(t, "shape") and hasattr(t.shape, "as_list"))
    what = (f"the model {name!r}: its layer {info.path!r} ({info.class_name}, dtype policy {info.policy}) raised "
            f"{message} when called on {given or 'nothing it could read'} (the model on inputs of shape {shapes}, "
            "training=False)")
    if info.class_name == "Lambda":
        unseen = (" (Keras builds a Lambda given output_shape= without calling its function, so building the model "
                  "did not show it)" if getattr(objects[failure.index], "_output_shape", None) is not None else "")
        why = (f"the Lambda's own: its function does not run on these tensors, so neither does the model{unseen}. "
               "Expected a function that takes the tensors the layer receives, in its compute dtype "
               f"{info.compute_dtype}.")
        fix = ("make the function work on them: cast what it mixes in to their dtype (tf.cast(w, x.dtype)), or write "
               "it as a Layer subclass; model(one_batch) raises the same error")
    else:
        why = ("the layer's own: its call does not run on these tensors, so neither does the model. Expected a call "
               f"that takes them (in its compute dtype {info.compute_dtype}).")
        fix = "the error in the layer's call; model(one_batch) raises the same error"
    return ModelCallError(f"check_model could not trace {what}. The error is {why} Fix: {fix}", layer=info.path,
                          what=what, why=why, fix=fix)


def _vocabulary(layer: Any) -> int | None:
    size = getattr(layer, "input_dim", None) if "Embedding" in type(layer).__name__ else None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


CALL_OPS, LOOP_OPS = ("PartitionedCall", "StatefulPartitionedCall"), ("While", "StatelessWhile")


def _read_graph(concrete: Any, layers: list[LayerInfo], batch: int, n_inputs: int) -> ModelGraph:
    graph = concrete.graph
    ops = graph.get_operations()
    called = [op for op in ops if op.type in CALL_OPS or op.type in LOOP_OPS]
    library = {f.signature.name: f for f in graph.as_graph_def().library.function} if called else {}
    memo: dict[str, bool] = {}
    calls = {op.name for op in called if op.type in CALL_OPS  # matmuls the check does not read (not counted)
             and _calls_gemms(op.get_attr("f").name, library, memo)}
    loops = {op.name for op in called if op.type in LOOP_OPS  # (read and counted: `_count_loop_steps`)
             and _calls_gemms(op.get_attr("body").name, library, memo)}
    heavy = calls | loops  # what runs matmuls inside: above the ops after it, below the ops before it
    data_inputs = {t.op.name for t in graph.inputs[:n_inputs]}
    on_path: set[str] = set(data_inputs)  # ops computed from the model's inputs (activations)
    gemm_above: set[str] = set()  # ops with a matmul/convolution upstream
    for op in ops:  # creation order is a topological order
        producers = [t.op for t in op.inputs]
        if any(p.name in on_path for p in producers):
            on_path.add(op.name)
        if any(p.name in gemm_above or p.type in GEMM_OPS or p.name in heavy for p in producers):
            gemm_above.add(op.name)
    gemm_above |= heavy  # (their own matmuls are above their outputs)

    gemm_below: set[str] = set()  # ops with a matmul/convolution downstream (a residual stream feeds the next)
    for op in reversed(ops):
        if any(c.type in GEMM_OPS or c.name in heavy or c.name in gemm_below for t in op.outputs
               for c in t.consumers()):
            gemm_below.add(op.name)
    # Matmuls/convolutions that reach an output with no other matmul/convolution in between, or after them.
    to_output: set[str] = set()
    stack = [t.op for t in concrete.outputs]
    seen: set[str] = set()
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in GEMM_OPS or op.name in heavy:
            if op.type in GEMM_OPS and op.name not in gemm_below:
                to_output.add(op.name)
            continue
        stack.extend(t.op for t in op.inputs)

    result = ModelGraph(layers=layers, batch=batch)
    for op in ops:
        if op.name not in on_path or op.name in data_inputs:
            continue
        layer = layer_of(op.name)
        if op.type in GEMM_OPS:
            shape = read_gemm(op)
            data_op = shape.data.op
            from_data = data_op.name not in gemm_above and data_op.type not in GEMM_OPS
            m = shape.dims.get("M")
            rows_include_batch = bool(m and m % batch == 0) and not shape.batched  # a batched GEMM's M is its own
            result.gemms.append(GemmOp(op.name, op.type, shape.kind, layer, float_dtype(op), shape.flops, shape.dims,
                                       from_data, op.name in to_output, rows_include_batch=rows_include_batch,
                                       constant_operand=_constant_operand(op)))
        elif op.type not in BOOKKEEPING_OPS:
            floating = [t for t in op.outputs if t.dtype.is_floating]
            result.others.append(OtherOp(op.name, op.type, layer, floating[0].dtype.name if floating else None))
    _count_loop_steps(library, ops, result.gemms)
    result.uncounted = sorted({layer_of(op.name) for op in ops if op.name in on_path and op.name in calls})
    result.layer_traffic = _layer_traffic(ops, {t.name for t in concrete.outputs})
    result.masks = large_negative_constants(ops, layer_of)
    for i, tensor in enumerate(concrete.outputs):
        op = _source(tensor.op)
        producer_dtype = float_dtype(op) if op.inputs or op.outputs else None
        result.outputs.append(OutputInfo(i, tensor.dtype.name, op.type, producer_dtype, layer_of(op.name)))
    return result


def _calls_gemms(name: str, library: dict[str, Any], memo: dict[str, bool]) -> bool:
    """Whether the function ``name`` of the graph's ``library`` runs a matmul or convolution, itself or through the
    functions it calls (a ``While`` loop's body, a nested call); ``memo`` keeps each function's answer."""
    if name not in memo:
        memo[name] = False  # (while it is read: a function calling itself adds nothing)
        for node in getattr(library.get(name), "node_def", ()):
            called = [node.attr[k].func.name for k in ("f", "body", "then_branch", "else_branch") if k in node.attr]
            if node.op in GEMM_OPS or any(c and _calls_gemms(c, library, memo) for c in called):
                memo[name] = True
                break
    return memo[name]


def _count_loop_steps(library: dict[str, Any], ops: list[Any], gemms: list[GemmOp]) -> None:
    """A recurrent layer's ``While`` loop runs its cell's matmuls once per time step, shown once in the graph:
    they count ``T`` times (the sequence's static length), the peeled first step's matmuls of the initial state
    ``T - 1`` times, as in an unrolled layer."""
    loops = [op for op in ops if op.type in LOOP_OPS]
    if not loops:
        return
    bodies = {name: {n.op for n in f.node_def} for name, f in library.items()}
    for loop in loops:
        lengths = {t.op.inputs[0].shape[0] for t in loop.inputs if t.op.type == "TensorListFromTensor"}
        steps = lengths.pop() if len(lengths) == 1 else None
        if not isinstance(steps, int) or not bodies.get(loop.get_attr("body").name, set()) & GEMM_OPS:
            continue
        scope = loop.name.rsplit("/", 1)[0] + "/"
        for i, g in enumerate(gemms):
            if g.name.startswith(scope) and g.flops:
                gemms[i] = replace(g, flops=g.flops * steps)
        # the peeled step's matmuls of the initial state (zeros, not from the inputs): in the loop, the other steps
        counted = {g.name for g in gemms}
        for op in ops:
            if op.type in GEMM_OPS and op.name.startswith(scope) and op.name not in counted and steps > 1:
                shape = read_gemm(op)
                gemms.append(GemmOp(op.name, op.type, shape.kind, layer_of(op.name), float_dtype(op),
                                    shape.flops * (steps - 1) if shape.flops else None, shape.dims, False, False))


def _layer_traffic(ops: list[Any], outputs: set[str]) -> dict[int, int]:
    """Bytes read and written at each layer's boundary: the memory a fused implementation of it moves."""
    owner = {op.name: layer_of(op.name) for op in ops}
    counted: set[tuple[int, str]] = set()
    traffic: dict[int, int] = {}

    def add(layer: int, tensor: Any) -> None:
        if (layer, tensor.name) in counted or not tensor.dtype.is_floating or (n := prod(dims_of(tensor))) is None:
            return
        counted.add((layer, tensor.name))
        traffic[layer] = traffic.get(layer, 0) + n * tensor.dtype.size

    for op in ops:
        if op.type in ("Const", "Placeholder", "NoOp"):
            continue
        layer = owner[op.name]
        for t in op.inputs:
            if owner.get(t.op.name) != layer or t.op.type in ("ReadVariableOp", "Placeholder"):
                add(layer, t)
        for t in op.outputs:
            if t.name in outputs or any(owner.get(c.name) != layer for c in t.consumers()):
                add(layer, t)
    return traffic
