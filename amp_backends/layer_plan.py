"""A model's layer plan: which layers compute in another dtype than the plan's policy, and why.

`decide` makes a `LayerPlan` (layer path -> ``float32``/``float8``, with reason and source) from the model's
structure and the `Plan`; `apply` is the only code that sets a layer's dtype policy or quantizes it, so the model
that trains, is audited and is checked is one model. Decisions, in order: the plan's float32 layer kinds (their
sublayers follow them); a softmax/sigmoid classifier head in float32 (as Keras's mixed precision guide does);
every layer float32 where measured faster on this model (`amp_backends.autotune.layers`, cached per model and
machine); float8 for eligible Dense/EinsumDense layers (`amp_backends.fp8`). A layer the user gave another dtype
keeps it; checkpoints keep the layer plan (`LayerPlan.from_dict`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .assessment import REQUESTED_FLOAT32

if TYPE_CHECKING:
    from .plan import Plan
    from .assessment import Float32Layer

FLOAT32 = "float32"
FLOAT8 = "float8"
# where a decision came from
RULE = "float32_layers"  # the plan's float32 layer kinds
HEAD = "head"  # a classifier's final softmax or sigmoid
MEASURED = "measured"  # every layer float32: measured faster on this model
FP8 = "fp8"  # the plan's float8
HEAD_ACTIVATIONS = ("softmax", "sigmoid", "log_softmax")


@dataclass(frozen=True)
class LayerDecision:
    """One layer's dtype policy where it differs from the plan's: its path (``model/block/dense``), the policy
    (``float32`` or ``float8``), why, and which rule decided it (``float32_layers``, ``head``, ``measured``,
    ``fp8``)."""

    path: str
    dtype: str
    reason: str
    source: str

    def to_dict(self) -> dict[str, str]:
        """The LayerDecision as JSON-ready data."""
        return {"path": self.path, "dtype": self.dtype, "reason": self.reason, "source": self.source}


@dataclass(frozen=True)
class LayerPlan:
    """One model's per-layer precision under a plan (see the module docstring).

    Attributes:
        model: The model's name.
        policy: The plan's dtype policy, which every layer not in ``decisions`` follows.
        decisions: Each layer given another dtype than ``policy``, with why (`LayerDecision`).
        measurement: The measured all-float32 choice (`Measurement`: made, cached or restored), or ``None``.
        notes: What was not decided, and why.
        considered: The float8 candidates in graph order, ``(path, quantized, why)``.
        float8_note: Why no layer is float8, where none is.
    """

    model: str
    policy: str
    decisions: tuple[LayerDecision, ...] = ()
    measurement: Any = None
    notes: tuple[str, ...] = ()
    considered: tuple[tuple[str, bool, str], ...] = ()
    float8_note: str = ""

    def dtype(self, path: str) -> str:
        """The dtype policy the plan gives a layer (its own, or that of a layer it belongs to).

        Args:
            path: The layer's path in the model (``"model/block_1/conv"``).

        Returns:
            The dtype policy's name.
        """
        for decision in self.decisions:
            if path == decision.path or path.startswith(decision.path + "/"):
                return decision.dtype
        return self.policy

    def keeps_float32(self, path: str) -> bool:
        """Whether a layer computes in float32 under this layer plan.

        Args:
            path: The layer's path in the model.

        Returns:
            True where it is kept in float32 (or the plan's policy is float32).
        """
        return self.dtype(path) == FLOAT32

    def paths(self, dtype: str, source: str | None = None) -> tuple[str, ...]:
        """The layers the plan gives one dtype.

        Args:
            dtype: ``"float32"``, ``"float8"``, or a policy's name.
            source: Only the decisions of this origin (``"float32_layers"``, ``"head"``, ``"measured"``,
                ``"fp8"``); ``None``: all.

        Returns:
            Their paths, in the order decided.
        """
        return tuple(d.path for d in self.decisions if d.dtype == dtype and source in (None, d.source))

    @property
    def float32(self) -> tuple[str, ...]:
        """The layers planned in float32."""
        return self.paths(FLOAT32)

    @property
    def float8(self) -> tuple[str, ...]:
        """The paths of the layers that train in float8."""
        return self.paths(FLOAT8)

    @property
    def all_float32(self) -> bool:
        """Whether a measurement set every layer to float32."""
        return bool(self.measurement is not None and self.measurement.float32)

    def to_dict(self) -> dict[str, Any]:
        """The layer plan as JSON-ready data (kept in checkpoints and shown by ``amp-backends check``).

        Returns:
            Each layer kept in float32 with its reason, and the measured choice.
        """
        return {"model": self.model, "policy": self.policy, "layers": [d.to_dict() for d in self.decisions],
                "measured": self.measurement.to_dict() if self.measurement is not None else None,
                "notes": list(self.notes)}  # (the float8 candidates are the report's, not the plan's)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerPlan:
        """The layer plan `to_dict` wrote (a checkpoint's, a report's).

        Args:
            data: What `to_dict` returned.

        Returns:
            The layer plan.
        """
        from .autotune.layer_choice import Measurement

        try:
            decisions = tuple(LayerDecision(str(d["path"]), str(d["dtype"]), str(d.get("reason", "")),
                                            str(d.get("source", ""))) for d in data.get("layers", ()))
            measured = data.get("measured")
            return cls(str(data["model"]), str(data["policy"]), decisions,
                       Measurement.from_dict(measured) if isinstance(measured, Mapping) else None,
                       tuple(str(n) for n in data.get("notes", ())))
        except (KeyError, TypeError, ValueError) as exc:
            from .errors import AmpConfigError

            raise AmpConfigError(
                f"A stored layer plan could not be read ({type(exc).__name__}: {exc}). Expected the dictionary "
                "LayerPlan.to_dict() writes. Fix: start the run afresh, or pass the layer plan as it was saved."
            ) from exc

    def summary(self) -> str:
        """The layer plan in one line.

        Returns:
            How many layers compute in each dtype, and by which rule.
        """
        if not self.decisions:
            return f"{self.model}: every layer follows {self.policy}"
        counts = Counter((d.dtype, d.source) for d in self.decisions)
        parts = [f"{n} {dtype} ({source})" for (dtype, source), n in counts.items()]
        return f"{self.model}: {', '.join(parts)}; the other layers follow {self.policy}"

    def __str__(self) -> str:
        lines = [self.summary()]
        reasons: dict[str, list[str]] = {}
        for d in self.decisions:
            reasons.setdefault(d.reason, []).append(d.path)
        for reason, paths in reasons.items():
            shown = ", ".join(paths[:6]) + (f" and {len(paths) - 6} more" if len(paths) > 6 else "")
            lines.append(f"  {shown}: {reason}")
        if self.measurement is not None:
            lines.append(f"  measured: {self.measurement}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _float32_rules(plan: Plan) -> tuple[Any, ...]:
    return tuple(getattr(plan, "float32_layers", ()) or ())


def worth_measuring(model: Any, plan: Plan) -> bool:
    """Whether the plan keeps some layers in float32 and ``model`` has such layers (in either dtype)."""
    from .layer_names import kept_in_float32

    rules = _float32_rules(plan)
    if not rules or getattr(plan, "compute_dtype", "float32") == "float32":
        return False
    return any(kept_in_float32(rules, layer) for _, layer in _walk(model))


def _walk(model: Any) -> Iterator[tuple[str, Any]]:
    from .keras_compat import walk

    for path, layer in walk(model, getattr(model, "name", "model")):
        if layer is not model:
            yield path, layer


def _follows(layer: Any, plan: Plan) -> bool:
    """Whether the layer computes as the plan's policy has it (or in float32 where the plan may have set it)."""
    from .keras_compat import policy_name

    return policy_name(layer) in (plan.policy, FLOAT32)


def _extended(decisions: tuple[LayerDecision, ...], extra: Iterable[LayerDecision]) -> tuple[LayerDecision, ...]:
    """``decisions`` and those of ``extra`` for layers not yet decided."""
    taken = {d.path for d in decisions}
    return decisions + tuple(d for d in extra if d.path not in taken)


def _rule_decisions(model: Any, plan: Plan) -> list[LayerDecision]:
    from .keras_compat import walk
    from .layer_names import kept_in_float32

    rules = _float32_rules(plan)
    if not rules:
        return []
    out: list[LayerDecision] = []
    done: set[int] = set()
    for path, layer in _walk(model):
        if id(layer) in done or not kept_in_float32(rules, layer) or not _follows(layer, plan):
            continue
        why = short_reason(plan, [rule for rule in rules if kept_in_float32([rule], layer)])
        for sub_path, sub in walk(layer, path):
            done.add(id(sub))
            if _follows(sub, plan):
                out.append(LayerDecision(sub_path, FLOAT32, why, RULE))
    return out


def short_reason(plan: Plan, rules: Iterable[Float32Layer] | None = None) -> str:
    """The float32 layers' reason in one short clause (the plan's reason holds the figures): of ``rules``, the
    plan's layer kinds that keep a layer in float32 (default: all of them)."""
    rules = list(_float32_rules(plan) if rules is None else rules)
    asked = [k.describe() for k in rules if k.why == REQUESTED_FLOAT32]  # float32_layers= (nothing measured)
    measured = ", ".join(k.describe() for k in rules if k.why != REQUESTED_FLOAT32)
    return "; ".join(([f"{', '.join(asked)} in float32 as requested (float32_layers)"] if asked else []) + (
        [f"the plan keeps {measured} in float32 here: faster than {plan.compute_dtype} on this hardware "
         "(plan.explain() has the figures)"] if measured or not asked else []))


def _wrapped(layer: Any) -> list[Any]:
    """The layers a ``TimeDistributed`` or ``Bidirectional`` wrapper applies (its ``layer``, its two directions),
    the first the one it wraps; none for another layer."""
    if type(layer).__name__ not in ("TimeDistributed", "Bidirectional"):
        return []
    return [w for w in (getattr(layer, a, None) for a in ("layer", "forward_layer", "backward_layer")) if w]


def head_activation(layer: Any) -> str | None:
    """``softmax``/``sigmoid``/``log_softmax`` where the layer ends in one, else ``None`` (a ``TimeDistributed`` or
    ``Bidirectional`` wrapper: its layer's)."""
    if inner := _wrapped(layer):
        return head_activation(inner[0])
    if type(layer).__name__ == "Softmax":
        return "softmax"
    activation = getattr(layer, "activation", None)
    name = getattr(activation, "__name__", None) or (activation if isinstance(activation, str) else None)
    name = name.removesuffix("_v2") if isinstance(name, str) else None  # tf.nn.softmax is softmax_v2
    return name if name in HEAD_ACTIVATIONS else None


def low_precision_paths(model: Any, plan: Plan) -> list[str]:
    """The layers that compute as the plan's policy has it (or in float32 where the plan set them)."""
    return [path for path, layer in _walk(model) if _follows(layer, plan)]


def decide(model: Any, plan: Plan, *, measurement: Any = None, use_cache: bool = True) -> LayerPlan:
    """The float32 part of ``model``'s layer plan under ``plan``, from the model's structure (nothing in the model
    changes; float8 joins it through `with_float8`).

    ``measurement``: an all-float32 choice to follow (from a checkpoint); else the cached one for this model,
    machine and versions, if any (`amp_backends.autotune.layer_choice.cached`; not with ``use_cache=False``).
    Nothing is timed here: measuring is `amp_backends.prepare_model`'s and the trainer's, where asked.
    """
    from .autotune.layer_choice import cached
    from .model_outputs import output_layers

    decisions: tuple[LayerDecision, ...] = ()
    low = getattr(plan, "compute_dtype", FLOAT32)
    if low != FLOAT32 and not getattr(plan, "graph_amp", None):
        heads = [LayerDecision(path, FLOAT32, f"the model's output is a {act}: computed in float32, as Keras's mixed "
                               f"precision guide does (in {low} its probabilities round off near 0 and 1)", HEAD)
                 for path, layer in output_layers(model) if (act := head_activation(layer)) and _follows(layer, plan)]
        decisions = _extended(tuple(_rule_decisions(model, plan)), heads)
        if measurement is None and use_cache and worth_measuring(model, plan):
            measurement = cached(model, plan)
        decisions = _extended(decisions, _measured(model, plan, measurement))
    return LayerPlan(str(getattr(model, "name", "model")), str(plan.policy), decisions, measurement)


def with_float8(layer_plan: LayerPlan, layers: tuple[tuple[str, bool, str], ...], note: str) -> LayerPlan:
    """``layer_plan`` with the float8 decisions of `amp_backends.fp8.float8_decisions` (``layers``: every
    candidate as ``(path, quantized, why)``; ``note``: why none is)."""
    extra = (LayerDecision(p, FLOAT8, why, FP8) for p, done, why in layers if done)
    return replace(layer_plan, decisions=_extended(layer_plan.decisions, extra), considered=layers, float8_note=note)


def _measured(model: Any, plan: Plan, measurement: Any) -> list[LayerDecision]:
    if measurement is None or not measurement.float32:
        return []
    why = f"every layer float32: this model trained faster in float32 here ({measurement.brief()})"
    return [LayerDecision(p, FLOAT32, why, MEASURED) for p in low_precision_paths(model, plan)]


def with_measurement(layer_plan: LayerPlan, model: Any, plan: Plan, measurement: Any) -> LayerPlan:
    """``layer_plan`` with ``measurement``'s choice added (every layer float32, where it chose so)."""
    return replace(layer_plan, decisions=_extended(layer_plan.decisions, _measured(model, plan, measurement)),
                   measurement=measurement)


def apply(model: Any, layer_plan: LayerPlan) -> tuple[str, ...]:
    """Give each layer of ``model`` its policy in ``layer_plan``, in place; the paths of the layers changed.

    A policy name is set on the layer (only its arithmetic changes: compile after this); float8 quantizes it
    (``layer.quantize("float8")``, Keras >= 3.3). A path the model lacks is an error; applying the same plan again
    changes nothing. Where a layer changed, Keras's compiled ``fit``/``evaluate``/``predict`` are rebuilt.
    """
    layers = dict(_walk(model))
    missing = [d.path for d in layer_plan.decisions if d.path not in layers]
    if missing:
        from .errors import AmpConfigError

        raise AmpConfigError(
            f"The layer plan names layers the model {getattr(model, 'name', model)!r} does not have: "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}. Expected the layer plan of this model "
            "(layer paths as model/block/layer). Fix: decide it for this model (amp_backends.prepare_model(model, "
            "plan)), or build the model with the names it was saved with.")
    return set_policies(model, ((d.path, layers[d.path], d.dtype) for d in layer_plan.decisions))


def set_policies(model: Any, targets: Iterable[tuple[str, Any, str]]) -> tuple[str, ...]:
    """Give each ``(path, layer, dtype)`` of ``model`` that policy (float8: quantized) where it has another, and drop
    Keras's compiled functions if any changed (rebuilt at their next call); the paths of the layers changed."""
    from .keras_compat import policy_name, set_layer_policy

    changed = []
    for path, layer, dtype in targets:
        current = policy_name(layer)
        if dtype == FLOAT8:
            if not current.startswith(FLOAT8):
                layer.quantize(FLOAT8)
                changed.append(path)
        else:  # a wrapper's layers too: Keras 2 keeps their own policies under the wrapper's
            if outdated := [one for one in (layer, *_wrapped(layer)) if policy_name(one) != dtype]:
                for one in outdated:
                    set_layer_policy(one, dtype)
                changed.append(path)
    for attr in ("train_function", "test_function", "predict_function") if changed else ():
        if getattr(model, attr, None) is not None:  # (traced before: it keeps the dtypes it was traced with)
            setattr(model, attr, None)
    return tuple(changed)


def restore(model: Any, policies: Mapping[str, str]) -> None:
    """Put back the policies of `policies` (a measurement's variants): the inverse of `apply`."""
    apply(model, LayerPlan(str(getattr(model, "name", "model")), "",
                           tuple(LayerDecision(p, dtype, "restored", "") for p, dtype in policies.items())))


def policies(model: Any) -> dict[str, str]:
    """Each layer's dtype policy name, by path (what `restore` puts back)."""
    from .keras_compat import policy_name

    return {path: policy_name(layer) for path, layer in _walk(model) if not policy_name(layer).startswith(FLOAT8)}


def built_in_other_dtype(model: Any, plan: Plan, layer_plan: LayerPlan | None = None) -> str | None:
    """The dtype most of the model's weights compute in, where it is not the plan's: the model was built before
    ``auto_configure()`` set the policy, or saved under another plan (a layer keeps the policy it was made with).
    The layers the plan's rules or the model's layer plan keep in float32 (its classifier head, say) are not
    counted; a layer plan that keeps every layer in float32 is as planned. ``None`` where the model is as planned."""
    if layer_plan is not None and layer_plan.all_float32:
        return None
    from .keras_compat import children
    from .layer_names import kept_in_float32

    weights: dict[str, int] = {}
    kept = _float32_rules(plan)
    planned = set(layer_plan.float32) if layer_plan is not None else set()
    for path, layer in _walk(model):
        if list(children(layer)) or path in planned or (kept and kept_in_float32(kept, layer)):
            continue  # (the weights are counted in the leaves)
        dtype = str(getattr(layer, "compute_dtype", FLOAT32))
        weights[dtype] = weights.get(dtype, 0) + sum(math.prod(int(d or 0) for d in v.shape)
                                                     for v in getattr(layer, "trainable_weights", []))
    total = sum(weights.values())
    if not total:
        return None
    most = max(weights, key=weights.__getitem__)
    plan_dtype = most in ("float16", "bfloat16", FLOAT32)  # a dtype a plan has (float64 is the model's own choice)
    return most if plan_dtype and most != plan.compute_dtype and weights[most] / total >= 0.5 else None
