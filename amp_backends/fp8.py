"""float8 training of a model's eligible layers: `float8_decisions`, part of a model's layer plan.

Keras >= 3.3 trains a Dense/EinsumDense layer in float8 after ``layer.quantize("float8")`` (delayed scaling;
fp8 GEMMs under XLA on GPUs of CC >= 8.9, emulated elsewhere). Only some layers gain: the precision check names
them (`amp_backends.model_check.fp8_choice`), sized from ``inputs=``; a float8 policy cannot be set globally
(keras-team/keras#23479), so layers are quantized one by one. Where fp8 is forced on emulated hardware (to
test its numerics; no layer gains speed) the size filter is waived by default (``skip_small``).
"""

from __future__ import annotations

from typing import Any
from .errors import AmpConfigError

FLOAT8 = "float8"


def fp8_forced(plan: Any) -> bool:
    """Whether the plan's fp8 is on only because ``force`` honoured it where float8 is emulated."""
    from .assessment import EMULATED

    return bool(getattr(plan, "fp8", False)) and dict(getattr(plan, "honoured", {}) or {}).get("fp8") == EMULATED


def float8_decisions(model: Any, plan: Any, *, inputs: Any = None,
                     skip_small: bool | None = None) -> tuple[tuple[tuple[str, bool, str], ...], str]:
    """Which of ``model``'s layers train in float8 as ``plan.fp8`` says (nothing in the model changes here):
    every candidate as ``(path, quantized, why)``, and a note where none is (fp8 off, a Keras without float8
    layers, no layer eligible). Layers already in float8 are listed as such."""
    if not getattr(plan, "fp8", False):
        why = getattr(plan, "reasons", {}).get("fp8", "")
        return (), f"fp8 is off in this plan, nothing changed{': ' + why if why else ''}"
    from .keras_compat import float8_training, keras_of, policy_name, walk
    from .software import KerasInfo, generation_of

    keras = keras_of(model)
    version = str(getattr(keras, "__version__", "") or "") or None
    able, why = float8_training(KerasInfo(version, generation_of(version), keras.__name__))
    if not able:
        return (), f"nothing changed: the model's {why}"
    if not getattr(model, "built", False):
        raise AmpConfigError(
            "prepare_model() needs a built model when the plan's fp8 is on: float8 quantization replaces the "
            f"layers' weights. The model {getattr(model, 'name', model)!r} is not built. Fix: build it with "
            "keras.Input(...), or call model.build(input_shape) first, then prepare_model(), then compile().")
    from .model_check import check_model

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
    note = ""
    if not any(done for _, done, _ in decisions):
        note = "no layer is eligible for float8" + ("" if check.sized else f": {check.unsized_line()}")
    return tuple(decisions), note
