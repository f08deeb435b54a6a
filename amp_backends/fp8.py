"""float8 training of a model's eligible layers: :func:`prepare_model`, behind ``plan.prepare_model(model)``.

Keras 3 (3.3 and later) trains a Dense or EinsumDense layer in float8 once ``layer.quantize("float8")``
has given it a ``float8_from_<policy>`` dtype policy: its inputs, kernel and output gradients are
quantized with delayed scaling (an amax history per tensor; e4m3 forward, e5m2 gradients) around the
matmul, which XLA lowers to fp8 GEMMs on GPUs with fp8 Tensor Cores (NVIDIA CC >= 8.9). Elsewhere the same
ops run emulated: the numerics of float8, without its speed.

Only some layers are worth it, and safe: the precision check (:func:`amp_backends.check_model`) names them
— Dense and EinsumDense layers that are neither the first (it reads the data) nor the last (its output is
the model's), with every dimension a multiple of 16, and large enough to gain (torchao's filter for
per-tensor scaling: a layer with at most 4096 units and 1024 input features is skipped; see
:mod:`amp_backends.model_check.fp8_choice`). A model with dynamic dimensions (a sequence length) is sized
from ``inputs=``, as the check is. A float8 policy cannot be set globally (keras-team/keras#23479), so the
layers are quantized one by one.

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
class Preparation:
    """What :func:`prepare_model` did to a model: the layers quantized to float8, and the others with why.

    ``quantized`` and the paths in ``skipped`` are layer paths from the model (``model/block/dense``), as
    the precision check names them; ``skipped`` holds the model's other Dense/EinsumDense layers with the
    reason each keeps the policy's precision. ``layers`` lists every Dense/EinsumDense layer in the
    model's graph order as ``(path, quantized, why)``. ``note`` says why nothing was done, when nothing was.
    """

    quantized: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    note: str = ""
    layers: tuple[tuple[str, bool, str], ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.quantized)

    def to_dict(self) -> dict[str, Any]:
        return {"quantized": list(self.quantized), "skipped": {path: why for path, why in self.skipped},
                "note": self.note,
                "layers": [{"layer": path, "quantized": done, "why": why} for path, done, why in self.layers]}

    def __str__(self) -> str:
        lines = []
        if self.note:
            lines.append(self.note)
        if self.quantized:
            lines.append("float8: " + ", ".join(self.quantized))
        lines += [f"kept: {path}: {why}" for path, why in self.skipped]
        return "\n".join(lines) or "nothing to do"


def fp8_forced(plan: Any) -> bool:
    """Whether the plan's fp8 is on only because ``force`` honoured it where float8 is emulated."""
    return any(w.startswith("fp8=") and "because force is on" in w for w in getattr(plan, "warnings", ()))


def prepare_model(model: Any, plan: Any, *, inputs: Any = None, skip_small: bool | None = None) -> Preparation:
    """Quantize ``model``'s float8-eligible layers as ``plan`` says (``plan.fp8``), in place.

    Call it on a built model, before ``model.compile``. With ``plan.fp8`` off — the default — or on a
    Keras without float8 layers (Keras 2, Keras < 3.3) nothing changes and :attr:`Preparation.note` says
    why. Layers already in float8 are left as they are.

    Args:
        model: a built Keras model.
        plan: the :class:`~amp_backends.plan.Plan`.
        inputs: the shapes to size the model's layers by, as :func:`amp_backends.check_model` takes them
            (one batch, a ``tf.data`` element spec or shapes): needed where the model leaves dimensions
            open (a keras_hub backbone's sequence length), else its Dense rows are unknown and nothing is
            quantized.
        skip_small: skip layers too small to gain from float8. ``None``: yes, unless the plan's fp8 is
            forced where float8 is emulated (there no layer gains, and the point is to test float8's numerics).
    """
    if not getattr(plan, "fp8", False):
        why = getattr(plan, "reasons", {}).get("fp8", "")
        return Preparation(note=f"fp8 is off in this plan, nothing changed{': ' + why if why else ''}")
    from .keras_compat import KerasInfo, float8_training, generation_of, keras_of

    keras = keras_of(model)
    version = str(getattr(keras, "__version__", "") or "") or None
    able, why = float8_training(KerasInfo(version, generation_of(version), keras.__name__))
    if not able:
        return Preparation(note=f"nothing changed: the model's {why}")
    if not getattr(model, "built", False):
        raise ValueError(
            f"prepare_model() needs a built model: float8 quantization replaces the layers' weights. The model "
            f"{getattr(model, 'name', model)!r} is not built. Fix: build it with keras.Input(...), or call "
            "model.build(input_shape) first, then prepare_model(), then compile()."
        )
    from .model_check import check_model
    from .model_check._keras import policy_name, walk

    check = check_model(model, plan=plan, inputs=inputs)
    skip = (not fp8_forced(plan)) if skip_small is None else skip_small
    layers = dict(walk(model, model.name))
    quantized: list[str] = []
    skipped: list[tuple[str, str]] = []
    decisions: list[tuple[str, bool, str]] = []
    for choice in check.fp8_layers:
        layer = layers[choice.path]
        why = choice.why
        if policy_name(layer).startswith(FLOAT8):
            skipped.append((choice.path, f"already {policy_name(layer)}"))
            decisions.append((choice.path, False, f"already {policy_name(layer)}"))
            continue
        if choice.small and not skip:
            why = (f"float8 although small ({choice.size}): " + ("fp8 is forced here, where no layer gains speed"
                                                                  if skip_small is None else "skip_small=False"))
        elif not choice.eligible:
            skipped.append((choice.path, why))
            decisions.append((choice.path, False, why))
            continue
        layer.quantize(FLOAT8)
        quantized.append(choice.path)
        decisions.append((choice.path, True, why))
    note = ""
    if not quantized:
        note = "no layer is eligible for float8"
        if not check.sized:
            note += f": {check.unsized_line()}"
    return Preparation(tuple(quantized), tuple(skipped), note, tuple(decisions))
