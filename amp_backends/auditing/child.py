"""The audit's child process: ``python -m amp_backends.auditing.child MODULE:FACTORY OUT.json [batch steps warmup]``.

A vendor library may read its verbose switch once, at start (oneDNN's ``ONEDNN_VERBOSE``), so the model runs here,
started with the kernel audits' environment, planned from the ``AMP_*`` variables and prepared as the trainer
prepares it. After ``warmup`` steps the measured steps run between two marker lines on stdout, inside the kernel
audit's `KernelAudit.begin`/`KernelAudit.end`; the layers' kernel shapes, the step's matrix ops, the precision
check's findings, the step time and the kernel audit's facts go to ``OUT.json``. Where the given plan's backend
(``AMP_AUDIT_BACKEND``) is not available here, the model computes under this machine's plan and that backend's kernel
audit still reads the steps; a note says so.

The step's matrix ops (`trace_step_ops`), forward and backward, are plain dicts: ``layer`` (the path of the layer
whose call created it, or ``None``), ``op`` (its type), ``dtype``, and ``M``, ``K``, ``N``, ``batch`` for a matmul
(logical sizes, as oneDNN's ``MxK:KxN``) or ``kernel`` (the filter's shape) and ``depthwise`` for a convolution.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, Mapping

from ..errors import AmpConfigError, FactoryError, ModelCallError
from ..factory import build_model, load_factory
from ..request import ENV_VARS
from .build import plan_data

OPEN_SIZE = 8  # an input dimension the model leaves open, unless the audit is given its size

BEGIN = "amp_backends_audit:begin"
END = "amp_backends_audit:end"
# The backend of the plan given to the audit (its kernel audit reads the run, even where it is not available here).
PLAN_BACKEND = "AMP_AUDIT_BACKEND"
MATMULS = frozenset({"MatMul", "SparseMatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"})
# the filter is input 1, except where the op computes it (the gradient of the filter: its output)
CONVS = {"Conv2D": 1, "Conv3D": 1, "Conv2DBackpropInput": 1, "Conv3DBackpropInputV2": 1,
         "DepthwiseConv2dNative": 1, "DepthwiseConv2dNativeBackpropInput": 1,
         "Conv2DBackpropFilter": None, "Conv3DBackpropFilterV2": None, "DepthwiseConv2dNativeBackpropFilter": None}


def _mark(text: str) -> None:
    sys.stdout.flush()
    os.write(1, (text + "\n").encode())


def layer_kernels(model: Any) -> list[dict[str, Any]]:
    """The model's layers that have a kernel, as the audit's ``layers`` (see `match.LayerKernel`).

    Args:
        model: The built model.

    Returns:
        One dict per layer with a kernel: ``path``, ``class_name``, ``kernel_shape``, ``compute_dtype``, ``policy``.
    """
    from .. import keras_compat

    out = []
    for path, layer in keras_compat.walk(model, model.name):
        kernel = getattr(layer, "kernel", None) if not hasattr(layer, "layers") else None
        shape = getattr(kernel, "shape", None)
        if shape is None:
            continue
        try:
            dims = [int(d) for d in shape]
        except (TypeError, ValueError):
            continue
        out.append({"path": path, "class_name": type(layer).__name__, "kernel_shape": dims,
                    "compute_dtype": keras_compat.compute_dtype(layer), "policy": keras_compat.policy_name(layer)})
    return out


def _matmul(op: Any) -> dict[str, Any] | None:
    from ..model_check.gemm import attr, dims_of, float_dtype, prod, read_gemm

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
    from ..model_check.gemm import dims_of

    at = CONVS[op.type]
    kernel = dims_of(op.outputs[0] if at is None else op.inputs[at])
    if not kernel or None in kernel:
        return None
    return {"kernel": kernel, "depthwise": op.type.startswith("Depthwise"), "dtype": op.outputs[0].dtype.name}


def trace_step_ops(model: Any, compiled: Any, inputs: Any) -> list[dict[str, Any]] | None:
    """Trace the step with each layer's call in a name scope naming it and list its matrix ops with their layers;
    ``None`` when it cannot be traced so (records are then matched by kernel shape)."""
    from .. import keras_compat
    from ..model_check.scopes import LayerScopes, owner

    walked = list(keras_compat.walk(model, model.name))
    try:
        with LayerScopes([layer for _, layer in walked]):
            concrete = compiled.get_concrete_function(inputs)
    except Exception:  # noqa: BLE001  # the audit stands without it: kernel shapes still match most records
        return None
    out = []
    for op in concrete.graph.get_operations():
        entry = _matmul(op) if op.type in MATMULS else _conv(op) if op.type in CONVS else None
        if entry is None:
            continue
        index = owner(op.name)  # the scope token of layer i: walked[i]
        layer = walked[index][0] if index is not None and 0 <= index < len(walked) else None
        out.append({"layer": layer, "op": op.type, **entry})
    return out


def _inputs_note(x: Any, left_open: bool) -> str:
    """The shapes the audit trained at, and whether dimensions left open were set to `OPEN_SIZE`."""
    import tensorflow as tf

    leaves = x.items() if isinstance(x, dict) else enumerate(tf.nest.flatten(x))
    said = "; ".join(f"{'' if isinstance(k, int) else f'{k} '}{tuple(t.shape)} {t.dtype.name}" for k, t in leaves)
    if left_open:
        said += (f" (the model leaves dimensions open: they were set to {OPEN_SIZE}. Fix: give the sizes you train "
                 "at: --seq-len N or --input-shape, seq_len= or input_shape= in Python)")
    return f"inputs: {said}"


def input_shapes(model: Any, given: Mapping[str, Any]) -> Any:
    """The shapes to train on, from the audit's ``seq_len`` or ``input_shape``.

    Args:
        model: The model built from the factory.
        given: ``{"seq_len": N}``, or ``{"input_shape": shapes}`` (JSON lists) with ``"flag"``: the text of
            ``--input-shape`` where it came from the option (its errors are then said in the option's words).

    Returns:
        The `InputLeaf` structure, or ``None`` where neither was given (the model's own shapes).

    Raises:
        ValueError: The shapes do not fit the model (their structure, rank, fixed sizes or input names).
    """
    from .. import keras_compat
    from ..model_check.shapes import checked_inputs, in_flag_words, refuse_unknown_names, shapes_with_sequence_length

    if given.get("seq_len") is not None:
        shapes = shapes_with_sequence_length(model, given["seq_len"])
    elif given.get("input_shape") is not None:  # (JSON lists back to shapes)
        shape = given["input_shape"]
        shapes = ({k: tuple(v) for k, v in shape.items()} if isinstance(shape, dict)
                  else [tuple(v) for v in shape] if shape and isinstance(shape[0], list) else tuple(shape))
    else:
        return None
    try:
        if given.get("flag"):
            refuse_unknown_names(model, shapes, given["flag"])
        return checked_inputs(model, shapes, keras_compat.input_structure(model))
    except (TypeError, ValueError) as exc:
        said = in_flag_words(given["flag"], exc, model) if given.get("flag") else str(exc)
        raise AmpConfigError(said.replace("inputs= ", "input_shape= ", 1) if said.startswith("inputs= ") else said) \
            from None


def synthetic_inputs(model: Any, batch: int, structure: Any = None) -> Any:
    """A batch of ``batch`` for ``model``: at the shapes of ``structure`` (`input_shapes`), else of the model's inputs
    with every open dimension after the batch set to `OPEN_SIZE`."""
    import tensorflow as tf

    from .. import keras_compat

    structure = structure if structure is not None else keras_compat.input_structure(model)
    if structure is None:
        raise AmpConfigError(f"The model {model.name!r} has no input shape to audit it on (a subclassed model, not "
                             "built). Expected a built model, or its input shape. Fix: give the shape after the "
                             "batch, --input-shape 8 (audit(..., input_shape=(None, 8))), or build it with "
                             "keras.Input.")

    def make(leaf: Any) -> Any:
        shape = [batch] + [d if d is not None else OPEN_SIZE for d in leaf.shape[1:]]
        if leaf.dtype.is_integer:
            return tf.zeros(shape, leaf.dtype)
        return tf.random.stateless_uniform(shape, seed=(1, 2), dtype=tf.float32)

    return tf.nest.map_structure(make, structure)


def run(target: str, out_path: str, batch: int, steps: int, warmup: int,
        given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The document ``OUT.json`` holds (``out_path``: its path, beside which the kernel audit's work folder goes;
    ``given``: the input shapes asked for, see `input_shapes`)."""
    import tensorflow as tf

    from .. import keras_compat
    from ..configure import auto_configure
    from ..model_check import check_model
    from ..model_check.checker import call_failure
    from ..model_check.shapes import dynamic_dims
    from ..prepare import prepare_model
    from ..registry import default_registry

    plan = auto_configure(verbose=False)
    backend = os.environ.get(PLAN_BACKEND) or plan.backend
    notes = [] if backend == plan.backend else [
        f"the plan's {backend} backend is not available here: the model computed under this machine's "
        f"{plan.backend} plan ({plan.policy}, xla {'on' if plan.xla else 'off'}), and the {backend} backend read "
        "what ran"]
    if (asked := os.environ.get(ENV_VARS["policy"])) and asked != plan.policy:  # (refused here even with force)
        notes.append(f"the plan's policy {asked} cannot run here ({plan.backend} backend): the model computed in "
                     f"{plan.policy} instead")
    try:  # a factory that cannot be found, raises or returns no model: the parent says so as `check` does
        factory = load_factory(target)
    except FactoryError as exc:
        return {"factory_error": str(exc)}
    kernel_audit = default_registry().kernel_audit(backend)
    if kernel_audit is None or kernel_audit.unavailable:  # nothing would be read: nothing runs
        return {"measured": False, "plan": {**plan_data(plan), "backend": backend}}
    try:
        model = build_model(factory, target, "its traceback is in the child's last lines below")
    except FactoryError as exc:  # the factory's own traceback, where it raised, goes with the message
        raised = exc.__cause__
        return {"factory_error": str(exc),
                "traceback": "".join(traceback.format_exception(raised)) if raised else None}
    try:
        shapes = input_shapes(model, given or {})
        x = synthetic_inputs(model, batch, shapes)
    except ValueError as exc:
        return {"input_error": str(exc)}
    open_dims = dynamic_dims(shapes if shapes is not None else keras_compat.input_structure(model) or ())
    notes.append(_inputs_note(x, bool(open_dims)))
    # prepared exactly as training prepares it: the same layer plan, measured or cached as the trainer would
    try:
        layer_plan = prepare_model(model, plan, inputs=x).layer_plan
    except ModelCallError as exc:  # a model that does not run on these shapes (a shape of another rank): as `check`
        return {"model_call_error": str(exc)}
    optimizer = tf.keras.optimizers.SGD(0.001)
    weights = model.trainable_variables

    forward = keras_compat.user_code(model)  # the step traced without AutoGraph; the model called as AutoGraph would

    def step(inputs: Any) -> Any:
        with tf.GradientTape() as tape:
            outputs = forward(inputs, training=True)
            loss = tf.add_n([tf.reduce_mean(tf.square(tf.cast(o, tf.float32))) for o in tf.nest.flatten(outputs)])
        grads = tape.gradient(loss, weights)
        optimizer.apply_gradients([(g, w) for g, w in zip(grads, weights, strict=True) if g is not None])
        return loss

    compiled = tf.function(step, jit_compile=bool(plan.xla), autograph=False)
    workdir = out_path + ".work"
    os.makedirs(workdir, exist_ok=True)
    try:
        ops = trace_step_ops(model, compiled, x)
        for _ in range(warmup):
            float(compiled(x))
    except Exception:  # a model that cannot run on these shapes: the check's words, naming the layer, as `check`
        if (failure := call_failure(model, plan, x, layer_plan)) is not None:
            return {"model_call_error": str(failure)}
        raise
    kernel_audit.begin(workdir)
    _mark(BEGIN)
    start = time.perf_counter()
    for _ in range(steps):
        loss = compiled(x)
    float(loss)
    elapsed = time.perf_counter() - start
    _mark(END)
    kernel_audit.end()
    try:
        findings = [f.to_dict() for f in check_model(model, plan=plan, batch_size=batch, layer_plan=layer_plan,
                                                     inputs=None if open_dims else x).findings]  # (unsized: said)
    except Exception as exc:  # noqa: BLE001  # the audit stands without the check's findings
        findings = [{"severity": "info", "code": "check-failed", "layer": model.name, "what": str(exc)}]
    return {
        "model": model.name, "plan": {**plan_data(plan), "backend": backend, "graph_amp": plan.graph_amp,
                 "float32_layers": list(layer_plan.float32) if layer_plan else []},
        "layer_plan": layer_plan.to_dict() if layer_plan else None,
        "batch_size": batch, "steps": steps, "step_time_ms": 1000 * elapsed / max(steps, 1),
        "layers": layer_kernels(model), "ops": ops, "findings": findings, "workdir": workdir,
        "tensorflow": tf.__version__, "facts": kernel_audit.facts(), "notes": notes,
    }


def main(argv: list[str]) -> int:
    """Run the audit's model and write ``OUT.json``: the child process's command line.

    Args:
        argv: ``MODULE:FACTORY OUT.json``, then optionally ``batch``, ``steps``, ``warmup`` (default 32, 3, 2) and the
            input shapes asked for as JSON (see `input_shapes`).

    Returns:
        The process's exit status, 0.
    """
    from ..tf_import import exit_quickly, import_tensorflow

    exit_quickly()
    import_tensorflow(quiet=False)
    target, out_path = argv[0], argv[1]
    batch, steps, warmup = (int(a) for a in (argv[2:5] + ["32", "3", "2"][len(argv[2:5]):]))
    doc = run(target, out_path, batch, steps, warmup, json.loads(argv[5]) if len(argv) > 5 else None)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
