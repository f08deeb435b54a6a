"""float8 training of a model's eligible layers: `float8_decisions`, part of a model's layer plan.

Keras 3 (3.3 and later) trains a Dense or EinsumDense layer in float8 once ``layer.quantize("float8")``
has given it a ``float8_from_<policy>`` dtype policy: its inputs, kernel and output gradients are
quantized with delayed scaling (an amax history per tensor; e4m3 forward, e5m2 gradients) around the
matmul, which XLA lowers to fp8 GEMMs on GPUs with fp8 Tensor Cores (NVIDIA CC >= 8.9). Elsewhere the same
ops run emulated: the numerics of float8, without its speed.

Only some layers are worth it, and safe: the precision check (`amp_backends.check_model`) names them
(`amp_backends.model_check.fp8_choice`: middle Dense/EinsumDense layers, multiples of 16, large enough to
gain), sized from ``inputs=`` as the check is. A float8 policy cannot be set globally
(keras-team/keras#23479), so the layers are quantized one by one.

Small layers under forced fp8: a plan whose fp8 was forced (``fp8=on`` with ``force`` where float8 is only
emulated) gains no speed on any layer — it is there to test float8's numerics — so the size filter, a speed
rule, is waived and small layers are quantized too (``skip_small=None``, the default, decides so;
``True``/``False`` decide for the caller).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FLOAT8 = "float8"


@dataclass(frozen=True)
class Float8Result:
    """What `float8_decisions` chose: the layers to quantize, the others with why, every decision, or a note."""

    quantized: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    note: str = ""
    layers: tuple[tuple[str, bool, str], ...] = ()


def fp8_forced(plan: Any) -> bool:
    """Whether the plan's fp8 is on only because ``force`` honoured it where float8 is emulated."""
    from .assessment import EMULATED

    return bool(getattr(plan, "fp8", False)) and dict(getattr(plan, "honoured", {}) or {}).get("fp8") == EMULATED


def float8_decisions(model: Any, plan: Any, *, inputs: Any = None, skip_small: bool | None = None) -> Float8Result:
    """Which of ``model``'s layers train in float8 as ``plan`` says (``plan.fp8``): the float8 part of a model's
    layer plan (`amp_backends.layer_plan.decide`, which `amp_backends.layer_plan.apply` quantizes).
    Nothing in the model changes here.

    With ``plan.fp8`` off — the default — or on a Keras without float8 layers (Keras 2, Keras < 3.3) no layer is
    chosen and the note says why. Layers already in float8 are listed as such.
    """
    if not getattr(plan, "fp8", False):
        why = getattr(plan, "reasons", {}).get("fp8", "")
        return Float8Result(note=f"fp8 is off in this plan, nothing changed{': ' + why if why else ''}")
    from .keras_compat import KerasInfo, float8_training, generation_of, keras_of

    keras = keras_of(model)
    version = str(getattr(keras, "__version__", "") or "") or None
    able, why = float8_training(KerasInfo(version, generation_of(version), keras.__name__))
    if not able:
        return Float8Result(note=f"nothing changed: the model's {why}")
    if not getattr(model, "built", False):
        raise ValueError(
            "prepare_model() needs a built model when the plan's fp8 is on: float8 quantization replaces the "
            f"layers' weights. The model "
            f"{getattr(model, 'name', model)!r} is not built. Fix: build it with keras.Input(...), or call "
            "model.build(input_shape) first, then prepare_model(), then compile()."
        )
    from .model_check import check_model
    from .keras_compat import policy_name, walk

    check = check_model(model, plan=plan, inputs=inputs)
    skip = (not fp8_forced(plan)) if skip_small is None else skip_small
    layers = dict(walk(model, model.name))
    decisions: list[tuple[str, bool, str]] = []
    for choice in check.fp8_layers:
        if (current := policy_name(layers[choice.path])).startswith(FLOAT8):
            decisions.append((choice.path, False, f"already {current}"))
        elif choice.small and not skip:
            decisions.append((choice.path, True, f"float8 although small ({choice.size}): " + (
                "fp8 is forced here, where no layer gains speed" if skip_small is None else "skip_small=False")))
        else:
            decisions.append((choice.path, choice.eligible, choice.why))
    quantized = tuple(path for path, done, _ in decisions if done)
    skipped = tuple((path, why) for path, done, why in decisions if not done)
    note = ""
    if not quantized:
        note = "no layer is eligible for float8"
        if not check.sized:
            note += f": {check.unsized_line()}"
    return Float8Result(quantized, skipped, note, tuple(decisions))

