"""The layer plans and the precision check of the models a trainer trains, once, before the first step.

The trainer knows the variables it trains, not the models: `trained_models` finds the Keras models that own them
(among ``checkpoint_objects`` and what the updates' loss functions hold), and `evaluated_update` the update whose
model validation, metrics and predictions run.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

from ..errors import AmpConfigError, AmpWarning, warn
from ..layer_plan import FLOAT8, LayerPlan, LayerDecision, apply, built_in_other_dtype, decide, with_float8
from ..plan import Plan
from .checkpoints import CheckpointStore
from .inputs import Source
from .observers import WARMUP_CALLS
from .step import Update

if TYPE_CHECKING:  # pragma: no cover
    from ..auditing.observer import AuditObserver

logger = logging.getLogger("amp_backends.train")
KERAS_MODULES = ("keras.", "tf_keras.", "keras_hub.", "keras_nlp.", "keras_cv.", "tensorflow.")  # (their own hooks)

_SEARCH_DEPTH = 4
_SEARCH_LIMIT = 500


def _is_model(obj: Any) -> bool:
    return hasattr(obj, "layers") and hasattr(obj, "variables") and hasattr(obj, "trainable_variables") \
        and not isinstance(obj, type)


def _referenced(obj: Any) -> list[Any]:
    """What a function, partial, bound method, update or container refers to (not inside models or tensors)."""
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if isinstance(obj, (list, tuple, set, dict)):
        return list(obj.values() if isinstance(obj, dict) else obj)[:64]
    chain: list[Any] = [obj]  # a decorator's wrapper (functools.wraps) and what it wraps, at one depth: both closures
    while inspect.isfunction(chain[-1]) and len(chain) < 16:
        inner = getattr(chain[-1], "__wrapped__", None)
        if not inspect.isfunction(inner):
            break
        chain.append(inner)
    found = []
    for cell in (cell for fn in chain for cell in getattr(fn, "__closure__", None) or ()):
        with contextlib.suppress(ValueError):  # an empty cell
            found.append(cell.cell_contents)
    attrs = (getattr(obj, attr, None) for attr in ("__self__", "__wrapped__", "loss_fn", "groups", "state"))
    found += [value for value in attrs if value is not None and not callable(getattr(value, "numpy", None))]
    module = getattr(type(obj), "__module__", "") or ""
    if hasattr(obj, "__dict__") and not callable(obj) and module.split(".")[0] not in (
            "tensorflow", "keras", "tf_keras", "numpy", "builtins"):
        found += list(vars(obj).values())[:64]  # a user's object holding its models
    return found


def trained_models(updates: Sequence[Update], objects: Mapping[str, Any] | None) -> list[Any]:
    """The outermost Keras models owning variables the updates train (see the module docstring)."""
    found: dict[int, Any] = {id(m): m for m in (objects or {}).values() if _is_model(m)}
    seen: set[int] = set()
    frontier: list[Any] = list(updates)
    for _ in range(_SEARCH_DEPTH):
        nxt: list[Any] = []
        for obj in frontier:
            if id(obj) in seen or len(seen) > _SEARCH_LIMIT:
                continue
            seen.add(id(obj))
            if _is_model(obj):
                found.setdefault(id(obj), obj)
                continue
            nxt.extend(_referenced(obj))
        frontier = nxt
    trained = {id(v) for u in updates for v in u.variables}
    owners = [m for m in found.values() if trained & {id(v) for v in m.trainable_variables}]
    variables = {id(m): {id(v) for v in m.variables} for m in owners}
    return [m for m in owners  # a model inside another one found is checked as part of it
            if not any(o is not m and variables[id(m)] < variables[id(o)] for o in owners)]


def evaluated_update(updates: Sequence[Update], what: str) -> Update:
    """The update that validation, metrics and predictions use: the first with an `Evaluation`.

    Args:
        updates: The trainer's updates.
        what: What needs it, as the error says it (``"metrics="``, ``"evaluate()"``).

    Returns:
        That update.

    Raises:
        AmpConfigError: No update has an `Evaluation` (the GAN's updates have no labels to evaluate).
    """
    for u in updates:
        if u.evaluation is not None:
            return u
    raise AmpConfigError(
        f"{what} needs a model to evaluate, and none of the updates ({', '.join(u.name for u in updates)}) says how "
        "to run one: Update.evaluation is not set (classifier_updates sets it; the GAN's updates have no labels to "
        "evaluate). Fix: train with classifier_updates(model, optimizer, loss), or give your Update an "
        "evaluation=amp_backends.training.Evaluation(predict=..., loss=...).")


def model_inputs(model: Any, x: Any) -> Any:
    """``x`` (the x part of a real batch) if ``model`` takes it, else ``None`` (the GAN's generator takes noise)."""
    from ..keras_compat import input_structure
    from ..model_check.shapes import checked_inputs

    inputs = getattr(model, "inputs", None) or []
    leaves = x if isinstance(x, (tuple, list)) else list(x.values()) if isinstance(x, dict) else [x]
    if len(inputs) != len(leaves):
        return None
    try:
        if len(inputs) == 1 and not isinstance(x, (dict, tuple, list)):
            from ..model_inputs import check_model_inputs

            check_model_inputs(model, x)
        checked_inputs(model, x, input_structure(model))
    except (TypeError, ValueError):
        return None
    return x


def check_models(models: Sequence[Any], plan: Plan, source: Source | FirstBatch, *, batch_size: int,
                 layer_plans: Mapping[str, LayerPlan] | None = None, said: Collection[str] = ()) -> None:
    """Check each model against its layer plan at one replica's batch of ``source`` and log (warnings also raised as
    `AmpWarning`) what it found; a check that fails never stops training. A model in ``said`` was already said to be
    built in another dtype (`TrainedModels.say_dtype`): its ``policy-mismatch`` finding is logged as information."""
    from .. import model_check

    x = _first_x(source, batch_size) if models else None
    for model in models:
        name = getattr(model, "name", model)
        layer_plan = (layer_plans or {}).get(str(name))
        inputs = None if x is None else model_inputs(model, x)
        check = functools.partial(model_check.check_model, model, plan, batch_size=batch_size, layer_plan=layer_plan)
        try:
            try:
                result = check(inputs=inputs, run=False)
            except (TypeError, ValueError) as exc:
                if inputs is None and x is not None and not getattr(model, "inputs", None):
                    result = check(inputs=x, run=False)  # a subclassed model keeping no input shape: the batch's
                elif inputs is None:
                    raise
                else:  # the batch is not what the model's own inputs say (a loss that reshapes it): its own shapes
                    logger.info(f"The precision check of {name!r} could not use the training batch ({exc}); it "
                                "checks the model at its own input shapes.")
                    result = check()
        except Exception as exc:
            logger.warning(f"The precision check of {name!r} failed ({type(exc).__name__}: {str(exc)[:200]}); "
                           "training goes on.")
            continue
        findings = list(result.findings)
        for i, line in enumerate(result.log_lines()):  # a head line, a line per finding, then the rest
            if 0 < i <= len(findings) and findings[i - 1].severity in ("warning", "error") and not (
                    findings[i - 1].code == "policy-mismatch" and str(name) in said):
                logger.warning(line)
                warn(f"{name}: {line}")
            else:
                logger.info(line)


def prepare_models(models: Sequence[Any], plan: Plan, source: Source | FirstBatch, *, batch_size: int,
                   stored: Mapping[str, Any] | None, say: bool, measure: bool | None) -> dict[str, LayerPlan]:
    """Each model's layer plan applied before its first step (`amp_backends.prepare_model`): the checkpoint's for a
    resumed run (whatever the flags), else decided on the first batch, measured where ``measure`` allows it
    (``Trainer(measure_float32=...)``). Each is said once; returns them by model name."""
    from ..autotune.layer_choice import FLOAT32, Measurement
    from ..prepare import prepare_model

    plans: dict[str, LayerPlan] = {}
    x: Any = None
    for model in models:
        name = str(getattr(model, "name", model))
        kept = stored_layer_plan(stored, model, len(models))
        try:
            if kept is not None:  # the checkpoint's choice and float8 layers (its float32 layers: the model's)
                measured = LayerPlan.from_dict(kept).measurement if isinstance(kept, Mapping) else Measurement(
                    FLOAT32 if kept else "plan", plan.policy)  # (an earlier release kept the choice alone)
                if measured is not None:
                    measured = replace(measured, origin="checkpoint")
                decided = decide(model, plan, measurement=measured, use_cache=False)
                prep = prepare_model(model, plan, layer_plan=with_float8(decided, stored_float8(model, kept), ""))
                origin = "the checkpoint's layer plan"
            else:
                if x is None and measure is not False:
                    x = _first_x(source, batch_size)
                inputs = model_inputs(model, x) if x is not None else None
                wanted = measure if inputs is not None else (False if measure is False else None)
                prep = prepare_model(model, plan, inputs=inputs, measure_float32=wanted)
                origin = ""
        except TypeError as exc:  # a Keras whose layers take no new dtype policy
            logger.warning(f"{name}: the layer plan could not be applied ({exc}); it trains in the plan's policy.")
            continue
        except Exception as exc:
            logger.warning(f"{name}: whether float32 trains faster could not be measured ({type(exc).__name__}: "
                           f"{str(exc)[:200]}); the plan is kept.")
            continue
        if (layer_plan := prep.layer_plan) is None:  # (prepare_model always gives one)
            continue
        plans[name] = layer_plan
        if say and (layer_plan.decisions or layer_plan.measurement or prep.choice_note):
            other = built_in_other_dtype(model, plan, layer_plan)  # (said as a warning next: `say_dtype`)
            logger.info(f"{layer_plan.summary()}{' (' + origin + ')' if origin else ''}" + (
                f", planned, but compute in {other}: the model was built before the plan" if other else ""))
            if layer_plan.measurement is not None:
                logger.info(f"{name}: {layer_plan.measurement}")
            elif prep.choice_note:
                logger.info(f"{name}: {prep.choice_note}")
    return plans


def stored_layer_plan(stored: Mapping[str, Any] | None, model: Any, count: int) -> Any:
    """The layer plan of ``stored`` (by model name) for ``model``, one of ``count`` models trained, or ``None``."""
    kept = (stored or {}).get(str(getattr(model, "name", model)))
    if kept is None and stored and len(stored) == 1 and count == 1:
        kept = next(iter(stored.values()))  # the one model, named anew (Keras's automatic names count up)
    return kept


def stored_float8(model: Any, kept: Any) -> tuple[tuple[str, bool, str], ...]:
    """The float8 layers of a checkpoint's layer plan ``kept`` (`LayerPlan.to_dict`'s), as `with_float8` takes them:
    ``(path, True, why)``, each path in ``model`` (a model named anew: its new name)."""
    if not isinstance(kept, Mapping):  # (an earlier release kept the float32 choice alone)
        return ()
    then, name = LayerPlan.from_dict(kept), str(getattr(model, "name", model))
    return tuple((name + d.path[len(then.model):] if d.path.startswith(then.model + "/") else d.path, True, d.reason)
                 for d in then.decisions if d.dtype == FLOAT8)


def _first_x(source: Source | FirstBatch, batch_size: int) -> Any:
    batch = source.first_batch(batch_size)
    return batch[0] if isinstance(batch, (tuple, list)) else batch


class TrainedModels:
    """The Keras models a trainer trains: each gets its layer plan before the first step (`prepare_models`; measured
    on one replica only, since workers measuring apart could choose apart), then the precision check once (by the
    chief). ``layer_plans``: by name, kept in ``store``'s checkpoints; ``audit``: ``Trainer(audit=...)``'s observer;
    ``on_applied``: called when a layer plan was applied (what was compiled before used the old policies)."""

    def __init__(self, models: Sequence[Any], plan: Plan, *, check: bool, measure: bool | None, batch_size: int,
                 replicas: int, is_chief: bool, store: CheckpointStore | None, audit: bool | tuple[int, int] = False,
                 steps_per_call: int = 1, on_applied: Callable[[], None] = lambda: None) -> None:
        self.plan, self.models, self.on_applied = plan, list(models), on_applied
        self.to_prepare, self.to_check = list(models), list(models) if check else []
        self.measure = False if replicas > 1 else measure
        self.batch_size, self.replicas, self.is_chief, self.store = batch_size, replicas, is_chief, store
        self.layer_plans: dict[str, LayerPlan] = {}
        self.said: set[str] = set()  # the models said to compute in another dtype (`say_dtype`)
        self.stored: Any = None  # the layer plans of the checkpoint a run resumes
        self.audit: AuditObserver | None = None
        if audit and is_chief:
            from ..auditing.observer import AuditObserver

            first = WARMUP_CALLS * steps_per_call
            window = audit if isinstance(audit, tuple) else (first, first + max(3, steps_per_call))
            self.audit = AuditObserver(list(models), plan, window, batch_size)

    def restored(self, stored: Any) -> None:
        """A resumed run's layer plans (``stored``): applied before the next step, over any decided before."""
        self.stored = stored
        if stored:
            self.to_prepare = list(self.models)

    def quantize(self, stored: Mapping[str, Any] | None) -> None:
        """Quantize the float8 layers of a checkpoint's layer plans (its signature: ``stored``) before it is restored,
        so that their scales and amax histories are restored with it (the rest is applied by `prepare`)."""
        plans = (stored or {}).get("layer_plans")
        for model in self.models if isinstance(plans, Mapping) else ():
            name, float8 = str(getattr(model, "name", model)), stored_float8(model, stored_layer_plan(
                plans, model, len(self.models)))
            try:
                apply(model, LayerPlan(name, self.plan.policy, tuple(LayerDecision(p, FLOAT8, why, "fp8")
                                                                     for p, _, why in float8)))
            except Exception as exc:  # (a Keras without float8 layers; a model without those layers)
                logger.warning(f"{name}: the checkpoint's float8 layers could not be quantized ({type(exc).__name__}: "
                               f"{str(exc)[:200]}); they train in the plan's policy.")

    def prepare(self, source: Source | FirstBatch) -> None:
        """Apply the layer plan of each model not yet prepared (decided on the first batch)."""
        prepared, self.to_prepare = self.to_prepare, []
        if not prepared:
            return
        with warnings.catch_warnings():  # (prepare_model's warning of another dtype: said once a model, `say_dtype`)
            warnings.filterwarnings("ignore", message=r"The model .* computes in \S+ under the plan's",
                                    category=AmpWarning)
            warnings.filterwarnings("ignore", message=r"The model .* trains with its own train_step",
                                    category=AmpWarning)  # (the trainer's step is its own, never the model's)
            self.layer_plans.update(prepare_models(prepared, self.plan, source, batch_size=self.batch_size,
                                                   stored=self.stored, say=self.is_chief, measure=self.measure))
        if self.is_chief:
            self.say_dtype(prepared)
        if self.store and self.layer_plans:
            self.store.annotate("layer_plans", {n: lp.to_dict() for n, lp in self.layer_plans.items()})
        if self.audit is not None:
            self.audit.layer_plans = self.layer_plans
        self.on_applied()

    def say_dtype(self, models: Sequence[Any]) -> None:
        """Say (logged, and an `AmpWarning`) once a model that a model computes in another dtype than the plan's, or
        defines a ``train_step`` the trainer does not call."""
        for model in models:
            name = str(getattr(model, "name", model))
            for hook in ("train_step", "compute_loss"):  # (a tf.function's Python function is the user's code)
                f = getattr(getattr(type(model), hook, None), "python_function", getattr(type(model), hook, None))
                if inspect.isfunction(f) and not f.__module__.startswith(KERAS_MODULES):
                    warn(f"The model {name!r} defines its own {hook} ({type(model).__qualname__}.{hook}), and the "
                         "trainer never calls it: its step is the update's loss_fn, so what it adds (a loss term, "
                         "gradient clipping, a metric) does not happen. Fix: put it in the loss_fn of an Update of "
                         f"your own (or a loss= of classifier_updates), or train with model.fit, which calls {hook}.",
                         log=logger)
            if name not in self.said and (dtype := built_in_other_dtype(model, self.plan, self.layer_plans.get(name))):
                self.said.add(name)
                warn(f"The model {name!r} computes in {dtype} under the plan's {self.plan.policy}: it was built "
                     "before auto_configure() set the dtype policy, or saved under another plan (a Keras policy "
                     "applies to the layers created after it), so it trains without the plan's precision. Fix: "
                     "build it after auto_configure(), or give a model loaded from a file the plan's policy first: "
                     "amp_backends.prepare_model(model, plan, reset_policies=True).", log=logger)

    def diagnose(self, source: Source) -> Exception | None:
        """Where a training call failed inside TensorFlow: why the models cannot run on its batches, from each one's
        precision check at the first batch's shapes with the model called once, eagerly (`ModelCallError` naming
        the layer that raised), or ``None`` where they can."""
        from ..model_check.checker import call_failure

        try:
            x = _first_x(source, self.batch_size // self.replicas)
            failures = (call_failure(m, self.plan, model_inputs(m, x), self.layer_plans.get(m.name))
                        for m in self.models if x is not None)
            return next((f for f in failures if f is not None), None)
        except Exception:  # (what cannot be diagnosed says nothing here: the call's own error stands)
            return None

    def before_first_step(self, source: Source) -> None:
        """The layer plans (`prepare`), then the precision check, once."""
        self.prepare(source)
        checked, self.to_check = self.to_check, []
        if self.is_chief:
            check_models(checked, self.plan, source, batch_size=self.batch_size // self.replicas,
                         layer_plans=self.layer_plans, said=self.said)


@dataclass(frozen=True)
class FirstBatch:
    """What `TrainedModels.prepare` needs of the data ``x`` given to ``evaluate`` or ``predict``: its first batch."""

    x: Any

    def first_batch(self, batch_size: int) -> Any:
        """The first batch of ``x``: a dataset's first element, or the first ``batch_size`` rows of arrays.

        Args:
            batch_size: The rows of arrays to take.

        Returns:
            ``(x, None)`` for arrays; the dataset's first element as it is.
        """
        import tensorflow as tf

        if isinstance(self.x, tf.data.Dataset):
            return next(iter(self.x))
        return (tf.nest.map_structure(lambda a: a[:batch_size], self.x), None)

