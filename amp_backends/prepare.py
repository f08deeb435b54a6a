"""What a plan does to a built model: `prepare_model`, called once between building and compiling it.

It decides the model's `LayerPlan` (float32 layer kinds, a classifier head in float32, every layer float32
where measured faster, float8 where fp8 is on) and applies it (`amp_backends.layer_plan`), as the `Trainer`
does to its models. With Keras ``fit``::

    plan = amp_backends.auto_configure()
    model = build_model()
    print(amp_backends.prepare_model(model, plan, inputs=x_train[:256]))
    model.compile(optimizer=plan.wrap_optimizer(opt), loss=..., **plan.compile_kwargs())
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeGuard

from . import layer_plan as lp
from .autotune import layers
from .autotune.layer_choice import Measurement, remember
from .errors import AmpConfigError, warn
from .fp8 import float8_decisions

if TYPE_CHECKING:
    from .plan import Plan


@dataclass(frozen=True)
class Preparation:
    """What `prepare_model` did to a model (layer paths as the precision check names them).

    Attributes:
        quantized: The layers float8 now trains.
        skipped: The model's other Dense/EinsumDense layers, each with why it keeps the policy's precision.
        note: Why float8 changed nothing, when it did not.
        layers: Every Dense/EinsumDense layer in graph order, ``(path, quantized, why)``.
        float32: The layers the plan's float32 layer kinds and classifier heads keep in float32.
        float32_why: Why they are kept in float32.
        choice: The measured all-float32 choice (measured now, cached or restored), or ``None``.
        choice_note: Why no such choice was made.
        layer_plan: The model's `LayerPlan`, every decision with its reason (the other fields read from it).
        applied: The layers this call changed.
        reset: The layers ``reset_policies`` gave the plan's policy (they had another).
    """

    quantized: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    note: str = ""
    layers: tuple[tuple[str, bool, str], ...] = ()
    float32: tuple[str, ...] = ()
    float32_why: str = ""
    choice: Measurement | None = None
    choice_note: str = ""
    layer_plan: lp.LayerPlan | None = None
    applied: tuple[str, ...] = ()
    reset: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        """Whether this call changed a layer (calling it again changes nothing)."""
        return bool(self.applied)

    def to_dict(self) -> dict[str, Any]:
        """What `prepare_model` did, as JSON-ready data.

        Returns:
            The float8 layers, the float32 layers and why, the measured choice, and the notes.
        """
        return {"layer_plan": self.layer_plan.to_dict() if self.layer_plan else None,
                "float32": list(self.float32), "float32_why": self.float32_why,
                "measured": self.choice.to_dict() if self.choice else self.choice_note,
                "quantized": list(self.quantized), "skipped": {path: why for path, why in self.skipped},
                "note": self.note,
                "layers": [{"layer": path, "quantized": done, "why": why} for path, done, why in self.layers]}

    def __str__(self) -> str:
        lines = []
        if self.reset:
            policy = self.layer_plan.policy if self.layer_plan else "the plan's policy"
            lines.append(f"reset to {policy} ({len(self.reset)} layers): {', '.join(self.reset)}")
        if self.float32:
            lines.append(f"float32 ({len(self.float32)} layers; {self.float32_why}): {', '.join(self.float32)}")
        if self.choice or self.choice_note:
            lines.append(f"measured: {self.choice or self.choice_note}")
        if nothing := not lines and self.layer_plan is not None:  # what the layer plan found, before float8's note
            lines.append(f"nothing changed: the layer plan keeps no layer in float32 under {self.layer_plan.policy} "
                         "(a softmax or sigmoid output that follows the plan, a layer kind the plan keeps in float32)")
        if self.note and (self.quantized or self.skipped or nothing or not lines):  # float8's note, where it has a say
            lines.append(self.note)
        if self.quantized:
            lines.append("float8: " + ", ".join(self.quantized))
        lines += [f"kept: {path}: {why}" for path, why in self.skipped]
        return "\n".join(lines) or "nothing to do"


def is_batch(inputs: Any) -> bool:
    """Whether ``inputs`` holds values (arrays or tensors, alone or in a tuple, list or dict), not shapes."""
    import numpy as np

    leaves = list(inputs.values()) if isinstance(inputs, dict) else list(inputs) if isinstance(
        inputs, (tuple, list)) else [inputs]
    return bool(leaves) and all(isinstance(v, np.ndarray) or (hasattr(v, "numpy") and hasattr(v, "dtype"))
                                for v in leaves)


def prepare_model(model: Any, plan: Plan, *, inputs: Any = None, skip_small: bool | None = None,
                  measure_float32: bool | None = None, layer_plan: lp.LayerPlan | None = None,
                  reset_policies: bool = False) -> Preparation:
    """Decide ``model``'s layer plan under ``plan`` and apply it, in place (`amp_backends.layer_plan`).

    Call it after building the model and before ``model.compile`` (a compiled step keeps the dtypes it was
    traced with). With nothing to do, nothing changes and the result says why; calling it again changes nothing.

    Args:
        model: a Keras model, built (a subclassed model not built yet is built by ``inputs``, as the check does)
            where the plan has work for it (a low-precision policy, fp8).
        plan: the `Plan`.
        inputs: the shapes to size the model's layers by, as `amp_backends.check_model` takes them (one batch, a
            ``tf.data`` element spec or shapes): float8 needs them where the model leaves dimensions open. A
            batch (values, not shapes) also lets it measure whether the model trains faster all in float32.
        skip_small: skip layers too small to gain from float8. ``None``: yes, unless the plan's fp8 is forced
            where float8 is emulated (there no layer gains, and the point is to test float8's numerics).
        measure_float32: time the model's forward and backward pass on ``inputs`` as planned and all in float32
            (`amp_backends.autotune.layers`): float32 is kept only when it won every interleaved round, and the
            answer is cached for this model on this machine. ``None``: where the plan keeps layers in float32,
            the model has such layers and ``inputs`` is a batch; ``True`` requires a batch; ``False`` never, and
            no cached answer either.
        layer_plan: a layer plan to apply as it is (a checkpoint's: `LayerPlan.from_dict`), instead of
            deciding one.
        reset_policies: first give every layer the plan's policy (a model built or saved under another plan
            keeps its layers' policies); float8-quantized layers keep their quantization, and so does a layer in
            float32 inside a model built under a mixed policy (given it on purpose, as a float32 output layer).

    Returns:
        The `Preparation`: the layer plan applied, the layers it changed, and a note.

    Raises:
        TypeError: ``model`` is not a Keras model, ``plan`` not a `Plan`, ``inputs`` none of the forms
            `amp_backends.check_model` takes, or a flag not a bool.
        ValueError: the model is not built, nor can ``inputs`` build it, and the plan has work for it, or
            ``inputs`` do not fit the model's inputs (checked first, as `amp_backends.check_model` checks them).
        AmpConfigError: ``layer_plan`` names layers the model does not have.

    Warns:
        AmpWarning: most of the model computes in float32 under a mixed plan (it was built before
            ``auto_configure()``; ``reset_policies=True`` mends it), or the model's own ``train_step`` scales no
            loss where the plan scales losses.
    """
    from .keras_compat import input_structure
    from .model_check.checker import built_by_inputs, require_model
    from .model_check.shapes import checked_inputs
    from .plan import require_plan

    require_plan(plan, "prepare_model(model, plan)")
    for name, value, none_too in (("skip_small", skip_small, True), ("measure_float32", measure_float32, True),
                                  ("reset_policies", reset_policies, False)):
        if not (isinstance(value, bool) or (none_too and value is None)):
            raise AmpConfigError(
                f"prepare_model({name}=...) takes True or False{' or None' if none_too else ''}. "
                f"Received: {value!r} (of type {type(value).__name__}). Fix: pass {name}=True or False.")
    unbuilt = (f"prepare_model cannot tell its layers' roles (which to keep in float32 under {plan.policy})"
               if plan.policy != "float32" or plan.fp8 else None)
    require_model(model, "prepare_model()", unbuilt if inputs is None else None)
    if inputs is not None:  # refused before anything changes, as the precision check refuses them; they build
        if unbuilt:  # a model not built yet, as the check's inputs= does
            built_by_inputs(model, inputs, "prepare_model()", unbuilt)
        else:
            checked_inputs(model, inputs, input_structure(model))
    reset = _reset_policies(model, plan) if reset_policies else ()
    if layer_plan is not None:
        return preparation(layer_plan, applied=tuple(dict.fromkeys(reset + lp.apply(model, layer_plan))), reset=reset)
    f8_layers, f8_note = float8_decisions(model, plan, inputs=inputs, skip_small=skip_small)
    decided = lp.with_float8(lp.decide(model, plan, use_cache=measure_float32 is not False), f8_layers, f8_note)
    applied = reset + lp.apply(model, decided)
    if dtype := lp.built_in_other_dtype(model, plan, decided):  # (after reset_policies, never)
        warn(f"The model {getattr(model, 'name', '?')!r} computes in {dtype} under the plan's {plan.policy}: "
             "it was built before auto_configure() set the dtype policy, or saved under another plan (a "
             "Keras policy applies to the layers created after it), so it trains without the plan's "
             f"precision{' and its head is left as it is' if dtype != 'float32' else ''}. Fix: build it after "
             "auto_configure(), or "
             "prepare_model(model, plan, reset_policies=True) to give its layers the plan's policy.")
    if said := _unscaled_train_step(model, plan):
        warn(said)
    note = ""
    if decided.measurement is None and (measure_float32 or (measure_float32 is None
                                                           and lp.worth_measuring(model, plan))):
        decided, note = _measured(model, plan, decided, inputs, forced=bool(measure_float32))
        applied += lp.apply(model, decided)
    return preparation(decided, note, tuple(dict.fromkeys(applied)), reset)


def _unscaled_train_step(model: Any, plan: Plan) -> str | None:
    """Why ``model``'s own ``train_step`` would train wrongly under ``plan``'s loss scaling, or ``None``.

    Keras's own step scales the loss; a step of the user's must (``optimizer.scale_loss`` on Keras 3, whose
    optimizer then divides each gradient by the scale; ``get_scaled_loss`` / ``get_unscaled_gradients`` or
    ``minimize`` on Keras 2). A step whose source, with the methods it calls, names none of them nor Keras's step
    (``super().train_step``) is said to scale nothing; a step whose source cannot be read is not judged.

    Args:
        model: A Keras model.
        plan: The `Plan` it trains under.

    Returns:
        The warning's words, or ``None`` where the plan scales no loss or the step is Keras's or scales it.
    """
    from .keras_compat import keras_info

    def users(f: Any) -> TypeGuard[Callable[..., Any]]:  # a function of the user's, not of Keras
        return inspect.isfunction(f) and not f.__module__.startswith(("keras.", "tf_keras.", "tensorflow."))

    step, scale = getattr(type(model), "train_step", None), plan.loss_scale
    if scale.mode == "none" or scale.initial == 1 or not users(step):
        return None
    try:  # the step's code, and of the methods of the user's it calls (self._step(data)): one of them may scale
        source = inspect.getsource(step)
        called = (getattr(type(model), name, None) for name in set(re.findall(r"self\.(\w+)\(", source)))
        source += "".join(inspect.getsource(f) for f in called if users(f))
    except (OSError, TypeError):
        return None
    if re.search(r"scale_loss|get_scaled_loss|get_unscaled_gradients|\.minimize\(|super\([^)]*\)\.train_step|"
                 r"Model\.train_step\(", source):
        return None
    keras3 = (keras_info().generation or 3) >= 3
    harm = ("Keras's optimizer divides every gradient by the scale when it applies them, so each update comes out "
            f"as many times too small as the scale ({scale.initial:g}{' at first' if scale.mode == 'dynamic' else ''})"
            if keras3 else "its float16 gradients are not scaled, so small ones flush to zero")
    fix = ("loss = self.optimizer.scale_loss(loss) before tape.gradient" if keras3 else
           "loss = self.optimizer.get_scaled_loss(loss) before tape.gradient and grads = "
           "self.optimizer.get_unscaled_gradients(grads) after it")
    return (f"The model {getattr(model, 'name', '?')!r} trains with its own train_step "
            f"({type(model).__qualname__}.train_step), which does not scale its loss, and the plan scales losses "
            f"({scale}): {harm}. Fix: in train_step, {fix} (as Keras's own step does).")


def _reset_policies(model: Any, plan: Plan) -> tuple[str, ...]:
    """Every layer of ``model`` (the model itself included, input layers and float8 layers left out) set to the
    plan's policy, and Keras's compiled functions dropped if any changed; the paths of the layers changed. In a model
    built under a mixed policy, a layer in float32 was given it on purpose (a float32 output layer): it keeps it."""
    from .keras_compat import policy_name, walk

    walked = [(path, layer) for path, layer in walk(model, getattr(model, "name", "model"))
              if type(layer).__name__ != "InputLayer" and not policy_name(layer).startswith(lp.FLOAT8)]
    pinned = any(policy_name(layer).startswith("mixed_") for _, layer in walked  # (a model loaded under a mixed
                 if not hasattr(layer, "layers"))  # policy takes it: its layers, as saved, tell how it was built)
    return lp.set_policies(model, ((path, layer, plan.policy) for path, layer in walked
                                   if not (pinned and policy_name(layer) == "float32")))


def _measured(model: Any, plan: Plan, decided: lp.LayerPlan, inputs: Any,
              forced: bool) -> tuple[lp.LayerPlan, str]:
    """``decided`` with the all-float32 choice measured on ``inputs`` (applied, cached), or a note saying why not."""
    if inputs is None or not is_batch(inputs):
        if forced:
            raise AmpConfigError(
                "prepare_model(measure_float32=True) needs one batch of the model's inputs as inputs= (arrays "
                f"or tensors), to time the model on. Received: inputs={type(inputs).__name__}. Fix: pass "
                "inputs=x[:batch_size].")
        return decided, ("not measured whether every layer in float32 is faster for this model (it has layers the "
                         "plan keeps in float32): give one batch as inputs= to let it measure")
    if why_not := layers.not_measurable(model, plan):
        return decided, f"not measured whether every layer in float32 is faster: {why_not}"
    try:
        measurement = layers.measure(model, plan, decided, inputs)
    except Exception as exc:
        if forced:
            raise
        return decided, (f"could not measure whether every layer in float32 is faster ({type(exc).__name__}: "
                         f"{str(exc)[:200]}): the plan is kept")
    remember(model, plan, measurement)
    return lp.with_measurement(decided, model, plan, measurement), ""


def preparation(layer_plan: lp.LayerPlan, note: str = "", applied: tuple[str, ...] = (),
                reset: tuple[str, ...] = ()) -> Preparation:
    """The `Preparation` that reports ``layer_plan``."""
    kept = tuple(d for d in layer_plan.decisions if d.dtype == lp.FLOAT32 and d.source in (lp.RULE, lp.HEAD))
    f8 = layer_plan.considered
    return Preparation(quantized=tuple(p for p, done, _ in f8 if done),
                       skipped=tuple((p, why) for p, done, why in f8 if not done),
                       note=layer_plan.float8_note, layers=f8, float32=tuple(d.path for d in kept),
                       float32_why="; ".join(dict.fromkeys(d.reason for d in kept)), choice=layer_plan.measurement,
                       choice_note=note, layer_plan=layer_plan, applied=applied, reset=reset)
