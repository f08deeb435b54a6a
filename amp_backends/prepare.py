"""What a plan does to a built model: :func:`prepare_model`, called once between building and compiling it.

Two things a global Keras dtype policy cannot say layer by layer:

* **float32 layers** (``plan.float32_layers``): layers this hardware trains slower in the policy's low
  precision than in float32, with the casts into and out of them counted — on CPUs with AVX512-BF16 and no
  AMX, depthwise convolutions with a stride or a kernel above 3, whose bfloat16 gradients oneDNN runs with
  slow kernels, and LSTM layers (see ``benchmarks/cpu_layers.py`` and the plan's reason). Every such layer
  that computes in the policy's dtype gets the ``float32`` policy: its variables were float32 already (mixed
  policies keep them so), so only its arithmetic changes, from its next call on. Layers the user set to
  another dtype are left alone.
* **float8** (``plan.fp8``, off by default): the eligible Dense/EinsumDense layers quantized
  (:mod:`amp_backends.fp8`).

The :class:`~amp_backends.training.Trainer` applies the float32 layers itself to the models it trains; with
Keras ``fit``, call it before ``model.compile``::

    plan = amp_backends.auto_configure()
    model = build_model()
    print(amp_backends.prepare_model(model, plan))
    model.compile(optimizer=plan.wrap_optimizer(opt), loss=..., **plan.compile_kwargs())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fp8 import quantize
from .policy_choice import PolicyChoice, measure, not_measurable, worth_measuring


@dataclass(frozen=True)
class Preparation:
    """What :func:`prepare_model` did to a model.

    ``float32`` are the paths of the layers it set to float32 (``plan.float32_layers``), ``float32_why`` the
    plan's reason. ``quantized`` and the paths in ``skipped`` are float8's: layer paths from the model
    (``model/block/dense``), as the precision check names them; ``skipped`` holds the model's other
    Dense/EinsumDense layers with the reason each keeps the policy's precision, ``layers`` every Dense/EinsumDense
    layer in graph order as ``(path, quantized, why)``. ``note`` says why float8 changed nothing, when it did not.
    """

    quantized: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    note: str = ""
    layers: tuple[tuple[str, bool, str], ...] = ()
    float32: tuple[str, ...] = ()
    float32_why: str = ""
    choice: PolicyChoice | None = None
    choice_note: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.quantized or self.float32 or (self.choice and self.choice.float32))

    def to_dict(self) -> dict[str, Any]:
        return {"float32": list(self.float32), "float32_why": self.float32_why,
                "measured": self.choice.to_dict() if self.choice else self.choice_note,
                "quantized": list(self.quantized), "skipped": {path: why for path, why in self.skipped},
                "note": self.note,
                "layers": [{"layer": path, "quantized": done, "why": why} for path, done, why in self.layers]}

    def __str__(self) -> str:
        lines = []
        if self.float32:
            lines.append(f"float32 ({len(self.float32)} layers; {self.float32_why}): {', '.join(self.float32)}")
        if self.choice or self.choice_note:
            lines.append(f"measured: {self.choice or self.choice_note}")
        if self.note and (self.quantized or self.skipped or not lines):  # float8's note, where it has a say
            lines.append(self.note)
        if self.quantized:
            lines.append("float8: " + ", ".join(self.quantized))
        lines += [f"kept: {path}: {why}" for path, why in self.skipped]
        return "\n".join(lines) or "nothing to do"


def float32_layers(model: Any, plan: Any) -> tuple[str, ...]:
    """Set the plan's float32 layer kinds in ``model`` to float32, in place; the paths of the layers changed.

    A layer matches one of the plan's :class:`~amp_backends.assessment.Float32Layer` entries by its class (or a
    base class), strides and kernel size, and computes in the plan's low-precision dtype (a layer the user gave
    another dtype is left as it is); its sublayers follow it. Calling it again changes nothing.
    """
    rules = tuple(getattr(plan, "float32_layers", ()) or ())
    dtype = getattr(plan, "compute_dtype", "float32")
    if not rules or dtype == "float32":
        return ()
    from .assessment import kept_in_float32
    from .keras_compat import set_layer_policy
    from .model_check._keras import compute_dtype, walk

    changed: list[str] = []
    done: set[int] = set()
    for path, layer in walk(model, getattr(model, "name", "model")):
        if id(layer) in done or layer is model or not kept_in_float32(rules, layer):
            continue
        for sub_path, sub in walk(layer, path):
            done.add(id(sub))
            if compute_dtype(sub) == dtype:
                set_layer_policy(sub, "float32")
                changed.append(sub_path)
    return tuple(changed)


def is_batch(inputs: Any) -> bool:
    """Whether ``inputs`` holds values (arrays or tensors, alone or in a tuple, list or dict), not shapes."""
    import numpy as np

    leaves = list(inputs.values()) if isinstance(inputs, dict) else list(inputs) if isinstance(
        inputs, (tuple, list)) else [inputs]
    return bool(leaves) and all(isinstance(v, np.ndarray) or (hasattr(v, "numpy") and hasattr(v, "dtype"))
                                for v in leaves)


def prepare_model(model: Any, plan: Any, *, inputs: Any = None, skip_small: bool | None = None,
                  measure_float32: bool | None = None) -> Preparation:
    """Apply ``plan`` to ``model`` in place: its float32 layers, then, where the model has such layers and
    ``inputs`` is a batch, whether every layer should be float32 (measured), then float8 where the plan's fp8
    is on.

    Call it after building the model and before ``model.compile`` (a compiled step keeps the dtypes it was
    traced with). With nothing to do — no float32 layers in the plan or the model, fp8 off — nothing changes
    and the result says why.

    Args:
        model: a Keras model (built, when the plan's fp8 is on).
        plan: the :class:`~amp_backends.plan.Plan`.
        inputs: the shapes to size the model's layers by, as :func:`amp_backends.check_model` takes them
            (one batch, a ``tf.data`` element spec or shapes): float8 needs it where the model leaves dimensions
            open (a keras_hub backbone's sequence length), else its Dense rows are unknown and nothing is
            quantized.
            A batch (values, not shapes) also lets it measure whether the model trains faster in float32.
        skip_small: skip layers too small to gain from float8. ``None``: yes, unless the plan's fp8 is
            forced where float8 is emulated (there no layer gains, and the point is to test float8's numerics).
        measure_float32: time the model's forward and backward pass on ``inputs`` as planned and all in
            float32, and keep float32 if faster (:mod:`amp_backends.policy_choice`). ``None``: where the plan
            keeps layers in float32, the model has such layers and ``inputs`` is a batch; ``True`` requires a
            batch; ``False`` never.
    """
    kept = float32_layers(model, plan)
    why = getattr(plan, "reasons", {}).get("float32_layers", "") if kept else ""
    choice, note = None, ""
    worth = worth_measuring(model, plan)
    if measure_float32 or (measure_float32 is None and worth):
        if inputs is None or not is_batch(inputs):
            if measure_float32:
                raise ValueError(
                    "prepare_model(measure_float32=True) needs one batch of the model's inputs as inputs= (arrays "
                    f"or tensors), to time the model on. Received: inputs={type(inputs).__name__}. Fix: pass "
                    "inputs=x[:batch_size]."
                )
            note = ("not measured whether every layer in float32 is faster for this model (it has layers the plan "
                    "keeps in float32): give one batch as inputs= to let it measure")
        elif why_not := not_measurable(model, plan):
            note = f"not measured whether every layer in float32 is faster: {why_not}"
        else:
            try:
                choice = measure(model, plan, inputs)
            except Exception as exc:
                if measure_float32:
                    raise
                note = (f"could not measure whether every layer in float32 is faster ({type(exc).__name__}: "
                        f"{str(exc)[:200]}): the plan is kept")
    f8 = quantize(model, plan, inputs=inputs, skip_small=skip_small)
    return Preparation(f8.quantized, f8.skipped, f8.note, f8.layers, kept, why, choice, note)
