"""`check_model`: trace the model, read the planned device, apply the rules."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .fp8_choice import fp8_layers
from ..errors import AmpConfigError, ModelCallError
from ..keras_compat import input_structure, is_keras_model, keras_info
from .result import DEFAULT_TRACE_BATCH, Finding, ModelCheck, Summary
from .rules_general import Rules
from .shapes import checked_inputs, dynamic_dims, shapes_with_sequence_length
from .target import make_target
from .trace import run_once, trace_model

if TYPE_CHECKING:
    from ..hardware import Hardware
    from ..plan import Plan
    from ..layer_plan import LayerPlan

__all__ = ["DEFAULT_TRACE_BATCH", "check_model", "shapes_with_sequence_length"]



def _batch(structure: Any, batch_size: int | None, source: str = "batch_size={}") -> int | None:
    import tensorflow as tf

    static = {leaf.shape[0] for leaf in tf.nest.flatten(structure) if leaf.shape and leaf.shape[0] is not None}
    if len(static) > 1:
        raise AmpConfigError(
            f"The model's inputs have different fixed batch sizes {sorted(static)}: they cannot be called "
            "together. Fix: give the inputs the same batch size (or none).")
    fixed = static.pop() if static else None
    if fixed is not None and batch_size is not None and fixed != batch_size:
        raise AmpConfigError(
            f"The model's inputs have a fixed batch size of {fixed}, but {source.format(batch_size)} was "
            f"given. Expected batch_size={fixed} or None. Fix: pass batch_size={fixed} (inputs of that "
            "batch), or build the model without a fixed batch size.")
    return batch_size if batch_size is not None else fixed


def require_model(model: Any, caller: str, unbuilt: str | None = None) -> None:
    """Refuse what is not a Keras model and, with ``unbuilt`` (why it matters to ``caller``), a model not built.

    Args:
        model: What the caller was given.
        caller: The caller's name as the user wrote it (``"check_model()"``).
        unbuilt: Why a model that is not built cannot be worked on, or ``None`` to accept one.

    Raises:
        TypeError: ``model`` is not a Keras model.
        ValueError: ``model`` is not built and ``unbuilt`` is given.
    """
    if not is_keras_model(model):
        raise AmpConfigError(
            f"{caller} takes a Keras model (keras.Model: functional, Sequential or subclassed) of the Keras that "
            f"tf.keras is ({keras_info().version or 'unknown'}). Received: {model!r} (of type {type(model).__name__}). "
            "Fix: pass the model itself (for a layer, wrap it: keras.Sequential([keras.Input(shape), layer])).")
    if unbuilt and not model.built:
        raise AmpConfigError(
            f"The model {model.name!r} is not built, so {unbuilt}. Expected a built model. Fix: give a few samples to "
            f"build it on, {caller[:-2]}(model, ..., inputs=x[:32]) (as a subclassed model is built by its first "
            "call), or build it with keras.Input(...) (functional or Sequential) or model.build(input_shape).")


def built_by_inputs(model: Any, inputs: Any, caller: str, unbuilt: str) -> Any:
    """``inputs=`` checked against ``model``; a model not built yet (a subclassed one) is built by one call on
    zeros of one example of them, as a first call on a batch builds it.

    Args:
        model: The Keras model.
        inputs: One batch, a ``tf.data`` dataset or element spec, or shapes (`amp_backends.model_check.shapes`).
        caller: The caller's name as the user wrote it (``"check_model()"``).
        unbuilt: Why a model that is not built cannot be worked on.

    Returns:
        The inputs as checked (`amp_backends.model_check.shapes.checked_inputs`).

    Raises:
        ValueError: ``inputs`` do not fit the model, or they cannot build it (an open dimension, string inputs).
        amp_backends.errors.ModelCallError: The model does not run on them.
    """
    given = checked_inputs(model, inputs, input_structure(model))
    if not model.built:
        run_once(model, given, building=True)
        require_model(model, caller, f"{unbuilt} (inputs= builds it where every dimension after the batch is given "
                                     "and no input takes strings)")
    return given


def check_model(model: Any, plan: Plan | None = None, batch_size: int | None = None, *, inputs: Any = None,
                hardware: Hardware | None = None, layer_plan: LayerPlan | None = None, run: bool = True) -> ModelCheck:
    """Check a Keras model for what makes mixed precision slow or wrong on the planned device.

    The forward pass is traced once and every matmul and convolution read (its real dtype, shapes, FLOPs). It
    reports outputs not in float32, a final softmax/sigmoid in float16/bfloat16, float32 matmuls under a mixed
    policy, widths and batch sizes the matrix units run at reduced efficiency, ops with no fast reduced-precision
    path, a policy the hardware only emulates. Global state (the dtype policy, the applied plan, the model's
    weights and losses) is left as it was.

    Args:
        model: a built ``keras.Model`` (functional, Sequential, or subclassed and already built or called); a
            subclassed model not built yet is built by ``inputs`` (called once on zeros of one example).
        plan: the `Plan` to judge against (one made for other hardware checks the model as that hardware would
            run it); ``None``: the applied plan (`amp_backends.current_plan`), else `amp_backends.plan_for`'s.
        batch_size: the training batch size, which decides whether Dense rows are aligned (without it they are
            assumed aligned; FLOPs are per image either way). It overrides the batch of ``inputs``.
        inputs: the shapes to trace on, for a model that leaves dimensions open (a keras_hub backbone's
            sequence length): one batch, a ``tf.data.Dataset`` or its ``element_spec``, or shapes such as
            ``(None, 128)``; see `shapes` and `shapes.shapes_with_sequence_length`. Only shapes and dtypes
            are read.
        hardware: the probed `Hardware` to plan for when ``plan`` is ``None`` (probed here if not given).
        layer_plan: the model's `LayerPlan` to compare it with (a trainer's, a checkpoint's); by default the one
            `amp_backends.layer_plan.decide` gives it.
        run: with ``inputs``, also call the model once, eagerly, on zeros of one example at those shapes: a shape
            the model cannot take (a sequence past its position embedding) shows only there. The trainer, whose
            first step runs the model, passes ``False``.

    Returns:
        A `ModelCheck`: findings (errors first), a summary, JSON.

    Raises:
        TypeError: ``model`` is not a Keras model, or ``plan`` not a `Plan`.
        ValueError: ``batch_size`` is not a positive int, ``inputs`` do not fit the model, or its input shape
            cannot be told.
        amp_backends.errors.ModelCallError: The model as a whole does not run on the inputs (a layer that raises
            only under the plan's policy is a finding instead).
    """
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)):
        raise AmpConfigError(f"batch_size must be a positive int, such as 1024, or None. Received: {batch_size!r} "
                             f"(of type {type(batch_size).__name__}).")
    if batch_size is not None and batch_size < 1:
        raise AmpConfigError(f"batch_size must be a positive int, such as 1024, or None. Received: {batch_size}.")
    import tensorflow as tf

    from ..configure import current_plan, plan_for
    from ..plan import require_plan
    from ..probe import probe_hardware

    keras_version = keras_info(tf).version or "unknown"
    unbuilt = "its layers have no weights and no input shape to trace"
    require_model(model, "check_model()", None if inputs is not None else unbuilt)
    if plan is not None:
        require_plan(plan, "check_model(plan=...)")
    else:
        plan = current_plan() or plan_for(hardware=hardware if hardware is not None else probe_hardware(
            use_tensorflow=False))  # (the hardware is probed only where no plan is applied)
    structure = input_structure(model)
    built_here = inputs is not None and not model.built
    if inputs is not None:
        given = built_by_inputs(model, inputs, "check_model()", unbuilt)
        batch = batch_size or _batch(given, None)  # batch_size wins over the batch of the given inputs
        if structure is not None:  # the model's own fixed batch, unless it contradicts
            batch = _batch(structure, batch, "batch_size={}" if batch_size else "inputs= of batch {}")
        structure = given
    elif structure is None:
        raise AmpConfigError(
            f"Cannot tell the input shape of the model {model.name!r} (a subclassed model built without an input "
            "shape). Expected a model built with keras.Input, or by model.build(input_shape) / a call on a batch, or "
            "inputs= giving the shapes. Fix: pass inputs=<one batch> (or call model.build((None, ...)) first)."
        )
    else:
        batch = _batch(structure, batch_size)
    open_dims = len(dynamic_dims(structure))
    target = make_target(plan)
    try:
        graph = trace_model(model, batch or DEFAULT_TRACE_BATCH, structure)
    except ModelCallError as exc:
        if exc.layer is None:  # the model as a whole does not run on these inputs: the caller's error
            raise
        return _layer_fails(model, plan, target, batch, exc, keras_version)
    if inputs is not None and run and not built_here:  # (the building call ran it on these shapes already)
        run_once(model, structure)  # the caller's error too: shapes the model cannot take
    if layer_plan is None:
        from ..layer_plan import decide

        layer_plan = decide(model, plan)
    rules = Rules(graph, target, batch, layer_plan)
    findings = tuple(rules.run())
    fp8 = fp8_layers(graph, rules.dims)
    notes = []
    if batch is None:
        notes.append(f"batch size not given: FLOPs are per image and Dense rows are assumed aligned (traced at batch "
                     f"{DEFAULT_TRACE_BATCH}); pass batch_size= (amp-backends check --batch-size) to check it")
    if open_dims and rules.sized:
        notes.append(f"{open_dims} input dimension(s) after the batch are open (dynamic); give inputs= (amp-backends "
                     "check --seq-len / --input-shape) to size them")
    if graph.uncounted:
        notes.append("not counted: the matmuls inside a function call of " + ", ".join(
            graph.layer(i).path for i in graph.uncounted) + " (Keras 2 runs a recurrent layer's loop in one, which the "
            "check does not read into): the FLOPs and shares above leave them out")
    if target.graph_amp:
        notes.append(f"the plan rewrites the float32 graph to {target.graph_amp} itself (graph-level AMP): the "
                     "float32 layers are expected and not reported")
    return ModelCheck(model.name, keras_version, _plan_dict(plan, target), batch, findings, rules.summary(),
                      fp8_eligible_layers=tuple(layer.path for layer in fp8 if layer.eligible), notes=tuple(notes),
                      fp8_ineligible_layers=tuple((layer.path, layer.why) for layer in fp8 if not layer.eligible),
                      fp8_layers=tuple(fp8), open_dims=open_dims)


def _plan_dict(plan: Any, target: Any) -> dict[str, Any]:
    """The plan as a check's JSON records it: backend, devices, TF32, XLA and the target's precision."""
    return {"backend": plan.backend, "devices": list(getattr(plan, "devices", ())), "tf32": bool(plan.tf32),
            "xla": bool(plan.xla), **target.to_dict()}


def _layer_fails(model: Any, plan: Any, target: Any, batch: int | None, exc: ModelCallError,
                 keras_version: str) -> ModelCheck:
    """The check of a model one of whose layers raises under the plan's policy: that layer, as an error finding
    (nothing after it could be traced, so the model is unsized)."""
    dtype = target.compute_dtype
    why = (f"the layer's own code raises in {dtype} (a float32 tensor mixed into {dtype} ones, say, or a shape it "
           f"cannot take), so the model cannot train under this plan: {exc.why}" if dtype != "float32" else
           f"the layer's own code raises, so the model cannot run at all: {exc.why}")
    finding = Finding("error", "layer-call-fails", exc.layer or model.name, exc.what, why, exc.fix)
    summary = Summary(0.0, {}, None, None, {d: u for d, (u, _) in target.units.items()}, sized=False)
    return ModelCheck(model=model.name, keras_version=keras_version, plan=_plan_dict(plan, target), batch_size=batch,
                      findings=(finding,), summary=summary,
                      notes=("the model was traced up to the layer that raised: nothing after it is checked",))


def call_failure(model: Any, plan: Plan, inputs: Any, layer_plan: LayerPlan | None = None) -> ModelCallError | None:
    """Why ``model`` cannot run on ``inputs`` (its check, the model called once on them), for a caller whose own call
    of it failed inside TensorFlow: the `ModelCallError` naming the layer that raised, or ``None`` where the check
    finds none or cannot run (the caller's own error then stands).

    Args:
        model: The Keras model.
        plan: The plan it runs under.
        inputs: A batch of its inputs, as `check_model` takes them.
        layer_plan: Its layer plan, where it has one.

    Returns:
        The error, or ``None``.
    """
    try:
        checked = check_model(model, plan, inputs=inputs, layer_plan=layer_plan)
    except ModelCallError as exc:
        return exc
    except Exception:  # noqa: BLE001  # (what the check cannot say, it does not say)
        return None
    for f in checked.findings:  # a layer that raised in the check's trace: a finding there, the caller's error here
        if f.code == "layer-call-fails":
            return ModelCallError(f"{f.what[:1].upper()}{f.what[1:]}. {f.why[:1].upper()}{f.why[1:]} Fix: {f.fix}",
                                  layer=f.layer, what=f.what, why=f.why, fix=f.fix)
    return None
