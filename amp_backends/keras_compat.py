"""Every Keras 2 / Keras 3 difference amp_backends meets, handled once.

``tf.keras`` follows TensorFlow's lazy loader: Keras 2 up to TensorFlow 2.15; from 2.16 Keras 3, unless
``TF_USE_LEGACY_KERAS`` selects ``tf-keras`` (Keras 2), beside which standalone ``keras`` is another library with
its own global dtype policy (so the policy is set on both). Handled here: the Keras in use (`keras_info`; without
TensorFlow, `amp_backends.software.expected_keras` reads it from metadata); dtype policies; a model's structure
(sublayers, inputs, collected losses); ``LossScaleOptimizer`` (Keras 3: dynamic only, ``scale_loss``; Keras 2:
``get_scaled_loss`` / ``get_unscaled_gradients``); loss scaling in ``Model.fit`` (`wrap_optimizer`,
`compile_kwargs`); float8 training (Keras >= 3.3). Nothing here imports TensorFlow unless a function is given it or
needs it to act.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import AmpConfigError, AmpError, moved_names, warn
from .request import LossScale
from .software import KerasInfo, expected_keras, generation_of, minor_version, tensorflow_version


def keras_info(tf: Any = None) -> KerasInfo:
    """The Keras in use: from ``tf.keras`` if TensorFlow is given or already imported, else from metadata."""
    tf = tf if tf is not None else sys.modules.get("tensorflow")
    if tf is None:
        return expected_keras(tensorflow_version())
    expected = expected_keras(getattr(tf, "__version__", None) or tensorflow_version())
    version = getattr(tf.keras, "__version__", None)
    if not version:  # TF 2.15's lazy loader hides it: the module it loaded tells
        name = "tf_keras" if expected.distribution == "tf-keras" else "keras"
        version = getattr(sys.modules.get(name), "__version__", None) or expected.version
    return KerasInfo(str(version) if version else None, generation_of(version), expected.distribution)


_ROOT = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*$")  # the names TensorFlow takes for a root name scope
_NO_SCOPE = contextlib.nullcontext()


def _tensorflow(tf: Any = None) -> Any:
    """``tf`` if given, else TensorFlow, imported now."""
    return tf if tf is not None else importlib.import_module("tensorflow")


def is_keras_model(obj: Any) -> bool:
    """True for a ``keras.Model`` (functional, Sequential or subclassed) of the Keras that ``tf.keras`` is."""
    return isinstance(obj, _tensorflow().keras.Model)


# ---------------------------------------------------------------------------------------------- dtype policy
def set_global_policy(policy: str, tf: Any = None) -> None:
    """Set the global dtype policy on ``tf.keras`` and, when it is another library and imported, on ``keras``."""
    _tensorflow(tf).keras.mixed_precision.set_global_policy(policy)
    standalone = sys.modules.get("keras")
    if standalone is not None and hasattr(standalone, "mixed_precision"):
        try:
            if standalone.mixed_precision.global_policy().name != policy:
                standalone.mixed_precision.set_global_policy(policy)
        except Exception:  # a partially imported or unrelated 'keras' module: tf.keras is what matters
            pass


def global_policy_name(tf: Any = None) -> str:
    """The name of ``tf.keras``'s global dtype policy (``"float32"``, ``"mixed_float16"``, ...)."""
    return _tensorflow(tf).keras.mixed_precision.global_policy().name


def set_layer_policy(layer: Any, policy: str) -> None:
    """Give one built or unbuilt layer another dtype policy (its later calls compute in it): Keras 3's
    ``dtype_policy`` setter, Keras 2's ``_set_dtype_policy`` (the method its constructor uses).

    Raises:
        TypeError: the layer has neither.
    """
    prop = getattr(type(layer), "dtype_policy", None)
    if isinstance(prop, property) and prop.fset is not None:
        layer.dtype_policy = policy
    elif hasattr(layer, "_set_dtype_policy"):
        old = layer._dtype_policy  # (built under a mixed policy, its weights are as Keras left them on purpose)
        layer._set_dtype_policy(policy)
        if old.compute_dtype == old.variable_dtype:
            _autocast_weights(layer)
    else:
        raise AmpConfigError(
            f"{type(layer).__name__} has no dtype policy to set (neither Keras 3's dtype_policy setter "
            "nor Keras 2's _set_dtype_policy)")


def _autocast_weights(layer: Any) -> None:
    """Keras 2: a layer's float weights read in its compute dtype, as ``add_weight`` wraps them under a mixed policy
    (the same variables); normalization and embedding weights are left as Keras leaves them."""
    keras, policy = keras_of(layer), layer._dtype_policy
    if policy.compute_dtype != policy.variable_dtype and not {c.__name__ for c in type(layer).__mro__} & {
            "BatchNormalizationBase", "BatchNormalization", "LayerNormalization", "Embedding"}:
        autocast = importlib.import_module(f"{keras.__name__}.src.mixed_precision.autocast_variable")
        for weights in (layer._trainable_weights, layer._non_trainable_weights):
            for i, variable in enumerate(weights):
                if variable.dtype.is_floating and not isinstance(variable, autocast.AutoCastVariable):
                    weights[i] = autocast.create_autocast_variable(variable)
                    for name in [k for k, v in vars(layer).items() if v is variable]:  # (the checkpoint's
                        object.__setattr__(layer, name, weights[i])  # dependency stays the variable itself)


def policy_name(layer: Any) -> str:
    """The layer's dtype policy name (``mixed_float16``, ``float32``, ``float8_from_mixed_float16``...)."""
    policy = getattr(layer, "dtype_policy", None) or getattr(layer, "_dtype_policy", None)
    name = getattr(policy, "name", None)
    return str(name) if name else str(getattr(layer, "dtype", "float32"))


def compute_dtype(layer: Any) -> str:
    """The name of the dtype the layer computes in (``"float32"`` if it does not say)."""
    dtype = getattr(layer, "compute_dtype", None) or "float32"
    return getattr(dtype, "name", str(dtype))


def user_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, the user's code (a model, a loss, an update's ``loss_fn``), as AutoGraph converts it in a traced call.

    amp_backends traces its own compiled calls without AutoGraph (their control flow is TensorFlow's ops; converting
    them cost a second or two at every start). What they call of the user's still gets Python ``if``/``for`` on
    tensors, and Keras 2 layers still convert their ``call``: as TensorFlow's own ``strategy.run`` does.

    Args:
        fn: Any callable; Keras's and TensorFlow's own are called as they are.

    Returns:
        A function that calls ``fn`` as AutoGraph converts it (``fn`` unconverted where it is marked not to be).
    """
    tf = _tensorflow()
    autograph, autograph_off = tf.__internal__.autograph, tf.autograph.experimental.do_not_convert
    now = autograph.control_status_ctx()  # (its type and status enum are not public)
    enabled = type(now)(status=type(now.status).ENABLED)
    # TensorFlow's and Keras's own wrappers (Keras 2's metric update_state) convert what they wrap themselves, in an
    # enabled context; tf_convert would swap the target inside them, which they do not call
    target = fn if getattr(fn, "_tf_decorator", None) is not None else autograph.tf_convert(fn, enabled)
    # a model named "_net" (Keras names a class _Net "__net") opens its name scope at a function's root, where
    # TensorFlow takes no such name: it is opened inside one named without the "_"
    name = getattr(fn, "name", None) if hasattr(fn, "weights") else None
    outer = re.sub(r"^[^A-Za-z0-9.]+", "", name) or "model" if isinstance(name, str) and not _ROOT.match(name) else None

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            with enabled, (tf.name_scope(outer) if outer and not tf.get_current_name_scope() else _NO_SCOPE):
                return target(*args, **kwargs)
        except Exception as exc:  # the library's own error as raised: AutoGraph re-raises a copy listing the
            # frames, or a StagingError where the error's own __init__ takes other arguments (NonFiniteError)
            meta, raised = getattr(exc, "ag_error_metadata", None), exc.__context__
            if meta is not None and isinstance(raised, AmpError) and getattr(raised, "ag_error_metadata", None) is meta:
                raise raised from None
            raise

    return autograph_off(call)  # (not converted itself, where converted code calls it)


# ---------------------------------------------------------------------------------------------- model structure
def children(layer: Any) -> list[Any]:
    """The direct sublayers of ``layer`` (nested models and layers a custom layer owns), in creation order
    (``_flatten_layers(include_self=False, recursive=False)``, which Keras 2 and 3 both have)."""
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=False, recursive=False))
    return list(getattr(layer, "layers", []) or [])


def walk(layer: Any, path: str) -> Iterator[tuple[str, Any]]:
    """``(path, layer)`` for ``layer`` and every sublayer below it, depth first, each layer once."""
    seen: set[int] = set()
    stack = [(path, layer)]
    while stack:
        p, layer_ = stack.pop()
        if id(layer_) in seen:
            continue
        seen.add(id(layer_))
        yield p, layer_
        stack.extend(reversed([(f"{p}/{c.name}", c) for c in children(layer_)]))


@dataclass(frozen=True)
class InputLeaf:
    """One model input: its shape (batch first, ``None`` where unknown) and its ``tf.DType``."""

    shape: tuple[int | None, ...]
    dtype: Any


def _build_leaves(shape: Any) -> Any:
    """`InputLeaf` (float32, any batch) for a build shape, or a dict of them for a dict of shapes; else ``None``."""
    if isinstance(shape, dict) and shape:
        return None if None in (leaves := {k: _build_leaves(v) for k, v in shape.items()}).values() else leaves
    if isinstance(shape, (tuple, list)) and shape and all(d is None or isinstance(d, int) for d in shape):
        return InputLeaf((None, *shape[1:]), _tensorflow().float32)
    return None


def input_structure(model: Any) -> Any:
    """The nested structure of `InputLeaf` the model is called with, or ``None`` if it cannot be told: a
    functional or Sequential model's inputs, else a built subclassed model's build shape."""
    tf = _tensorflow()

    def leaf(t: Any) -> InputLeaf:
        return InputLeaf(tuple(tf.TensorShape(t.shape).as_list()), tf.as_dtype(getattr(t, "dtype", None) or "float32"))

    functional = getattr(model, "_functional", None)
    found = (getattr(model, "_inputs_struct", None), getattr(functional, "_inputs_struct", None),
             getattr(model, "_nested_inputs", None))
    struct = next((s for s in found if s is not None), None)
    if struct is None:
        try:
            inputs = model.inputs
        except (AttributeError, ValueError):
            inputs = None
        if inputs:
            struct = inputs[0] if len(inputs) == 1 else list(inputs)
    if struct is not None:
        return tf.nest.map_structure(leaf, struct)
    save_spec = getattr(model, "save_spec", None)
    if callable(save_spec):
        try:
            spec = save_spec(dynamic_batch=True)
        except Exception:
            spec = None
        if spec and spec[0] and not spec[1]:
            return tf.nest.map_structure(leaf, spec[0][0] if len(spec[0]) == 1 else list(spec[0]))
    # A subclassed model's build shape (or a dict of them) holds the batch of the call that built it, not a batch.
    shapes = getattr(model, "_build_shapes_dict", None)
    if isinstance(shapes, dict) and len(shapes) == 1 and (struct := _build_leaves(next(iter(shapes.values())))):
        return struct
    try:  # Keras 2's
        dims = tf.TensorShape(getattr(model, "_build_input_shape", None)).as_list()
    except (TypeError, ValueError):  # (an unknown shape has no list)
        return None
    return InputLeaf((None, *dims[1:]), tf.float32) if dims else None


def model_losses(model: Any, added_to: Any = None) -> Any:
    """A model's own losses (``model.losses``: regularizers, ``add_loss``) summed, as Keras's ``fit`` and ``evaluate``
    add them, read in the trace of the call that made them (a model called twice in a step: its last call's terms).

    Args:
        model: A Keras model.
        added_to: A float32 loss to add them to, or ``None``.

    Returns:
        A float32 scalar: ``added_to`` plus them, or their sum; ``added_to`` itself for a model without any.
    """
    tf = _tensorflow()
    terms = [tf.reduce_sum(tf.cast(term, tf.float32)) for term in getattr(model, "losses", None) or ()]
    return tf.add_n(([] if added_to is None else [added_to]) + terms) if terms else added_to


def snapshot_losses(layers: list[Any]) -> list[tuple[Any, str, list[Any]]]:
    """Copies of each layer's collected-loss lists (``_losses``, ``_eager_losses``: the Python-side losses ``add_loss``
    collects during a call): tracing a call may append graph tensors to them."""
    return [(layer, attr, list(value)) for layer in layers for attr in ("_losses", "_eager_losses")
            if isinstance(value := layer.__dict__.get(attr), list)]


def restore_losses(saved: list[tuple[Any, str, list[Any]]]) -> None:
    """Put back the loss lists `snapshot_losses` copied (in place: the layers keep their list objects)."""
    for layer, attr, items in saved:
        layer.__dict__[attr][:] = items


# ---------------------------------------------------------------------------------------------- optimizers
def build_optimizer(optimizer: Any, variables: Sequence[Any]) -> None:
    """Create the optimizer's slot variables now (both generations' optimizers have ``build``); `AmpConfigError` where
    a ``tf.distribute`` strategy is in scope and the model or the optimizer was made outside it."""
    if not hasattr(optimizer, "build"):
        return
    try:
        optimizer.build(list(variables))
    except RuntimeError as exc:  # (TensorFlow's words for variables of two strategies)
        if "Mixing different tf.distribute.Strategy" not in str(exc):
            raise
        raise AmpConfigError(f"The model and the optimizer ({type(optimizer).__name__}) train under a tf.distribute "
                             "strategy, and some of their variables were made outside its scope. Fix: make the models "
                             "and optimizers inside `with strategy.scope():`, with strategy= given to the Trainer.") \
            from None


def dynamic_loss_scale_optimizer(optimizer: Any, tf: Any = None) -> Any:
    """``optimizer`` wrapped in Keras's dynamic ``LossScaleOptimizer`` (the only kind both generations have)."""
    return _tensorflow(tf).keras.mixed_precision.LossScaleOptimizer(optimizer)


def scale_loss(optimizer: Any, loss: Any) -> Any:
    """The loss multiplied by a ``LossScaleOptimizer``'s current scale (Keras 3 ``scale_loss``, Keras 2
    ``get_scaled_loss``)."""
    return optimizer.scale_loss(loss) if hasattr(optimizer, "scale_loss") else optimizer.get_scaled_loss(loss)


def unscale_gradients(optimizer: Any, grads: Sequence[Any]) -> list[Any]:
    """Gradients ready for ``optimizer.apply_gradients`` after `scale_loss`: Keras 2 unscales explicitly; Keras 3's
    ``apply_gradients`` unscales (and skips non-finite steps) itself."""
    return list(grads) if hasattr(optimizer, "scale_loss") else optimizer.get_unscaled_gradients(grads)


# ---------------------------------------------------------------------------------------------- Keras fit
def keras_of(obj: Any) -> Any:
    """The Keras package (``keras`` or ``tf_keras``) that defined ``obj``'s class, else ``tf.keras``: an optimizer
    must be wrapped by its own library's ``LossScaleOptimizer``."""
    for cls in type(obj).__mro__:
        root = cls.__module__.split(".")[0]
        if root in ("keras", "tf_keras"):
            return importlib.import_module(root)
    return _tensorflow().keras


def not_an_optimizer(value: Any) -> str | None:
    """What ``value`` is, as an error quotes it, where it is no optimizer object (its class, anything else);
    ``None`` for an optimizer."""
    if isinstance(value, type):
        return f"the class {value.__name__}, not an optimizer made from it"
    is_one = callable(getattr(value, "apply_gradients", None))
    return None if is_one else f"{value!r:.80} (of type {type(value).__name__})"


def is_loss_scale_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is its Keras's ``LossScaleOptimizer`` (Keras 2: either of its two classes)."""
    return isinstance(optimizer, keras_of(optimizer).mixed_precision.LossScaleOptimizer)


def loss_scale_of(optimizer: Any) -> tuple[str, float | None]:
    """How ``optimizer`` scales losses in ``fit``: ``("dynamic", scale)``, ``("fixed", scale)`` or ``("none", None)``,
    with the current scale."""
    if is_loss_scale_optimizer(optimizer):
        if (generation_of(getattr(keras_of(optimizer), "__version__", None)) or 2) >= 3:
            return "dynamic", float(optimizer.dynamic_scale if optimizer.built else optimizer.initial_scale)
        return ("dynamic" if optimizer.dynamic else "fixed"), float(optimizer.loss_scale)
    factor = getattr(optimizer, "loss_scale_factor", None)
    return ("fixed", float(factor)) if factor is not None else ("none", None)


def wrap_optimizer(optimizer: Any, loss_scale: LossScale, compute_dtype: str) -> Any:
    """``optimizer`` as ``loss_scale`` says, for ``Model.compile`` (see `amp_backends.plan.Plan.wrap_optimizer`).

    ``dynamic``: a ``LossScaleOptimizer``; ``fixed``: Keras 3's ``loss_scale_factor``, Keras 2's
    ``LossScaleOptimizer(dynamic=False)`` (neither skips an overflowing step: an `AmpWarning` says so under
    float16); ``none``: the optimizer, except on Keras 2 under float16 a fixed scale of 1, as Keras 2's ``compile``
    wraps any other optimizer in dynamic scaling. An optimizer already scaling as the plan says is returned as it is.

    Raises:
        TypeError: ``optimizer`` is not a Keras optimizer or the name of one.
        ValueError: it already scales losses otherwise: it would be scaled twice or against the plan.
    """
    if isinstance(optimizer, (str, dict)):
        optimizer = _tensorflow().keras.optimizers.get(optimizer)
    if (got := not_an_optimizer(optimizer)) is not None:
        raise AmpConfigError(
            "wrap_optimizer() takes a Keras optimizer, such as keras.optimizers.Adam(1e-3), or its name "
            f"('adam'). Received: {got}. Fix: pass the optimizer you would give model.compile.")
    mode, scale = loss_scale_of(optimizer)
    if mode == loss_scale.mode == "dynamic" or (mode == loss_scale.mode == "fixed" and scale == loss_scale.initial):
        return optimizer
    if loss_scale.mode == "none" and mode == "fixed" and scale == 1.0 and is_loss_scale_optimizer(optimizer):
        return optimizer  # Keras 2's stand-in for no scaling, from an earlier call
    if mode != "none":
        raise AmpConfigError(
            f"wrap_optimizer() takes an optimizer that does not scale losses yet, or scales them as the "
            f"plan does ({loss_scale}). Received {type(optimizer).__name__} with {mode} loss scaling "
            f"(scale {scale:g}). Fix: pass the plain optimizer (a LossScaleOptimizer's inner_optimizer, "
            "or one without loss_scale_factor), and choose the scaling with loss_scale= / AMP_LOSS_SCALE.")
    keras = keras_of(optimizer)
    lso = keras.mixed_precision.LossScaleOptimizer
    keras3 = (generation_of(getattr(keras, "__version__", None)) or 2) >= 3
    if loss_scale.mode == "dynamic":  # Keras 2's dynamic=True is Keras 3's only kind
        return lso(optimizer, **({} if keras3 else {"dynamic": True}), initial_scale=loss_scale.initial,
                   dynamic_growth_steps=loss_scale.growth_interval)
    if loss_scale.mode == "fixed":
        if compute_dtype == "float16":
            warn(
                f"loss_scale={loss_scale} in Keras fit: the loss is multiplied and the gradients divided by the fixed "
                "scale, but a step whose scaled gradients overflow is applied, not skipped (neither Keras 3's "
                "loss_scale_factor nor Keras 2's LossScaleOptimizer(dynamic=False) skips it): inf/NaN would reach "
                "the weights. Use dynamic loss scaling, or amp_backends' Trainer, which skips such steps.")
        if keras3:
            optimizer.loss_scale_factor = loss_scale.initial
            return optimizer
        return lso(optimizer, dynamic=False, initial_scale=loss_scale.initial)
    if not keras3 and compute_dtype == "float16":
        return lso(optimizer, dynamic=False, initial_scale=1.0)
    return optimizer


def compile_kwargs(xla: bool, steps_per_execution: int, generation: int | None = None) -> dict[str, Any]:
    """``Model.compile`` keywords for a plan, on the Keras ``tf.keras`` is (or API ``generation``); on Keras 3,
    ``auto_scale_loss=False`` keeps ``compile`` from adding loss scaling to what `wrap_optimizer` decided."""
    kwargs: dict[str, Any] = {"jit_compile": bool(xla), "steps_per_execution": int(steps_per_execution)}
    if (generation if generation is not None else keras_info().generation or 2) >= 3:
        kwargs["auto_scale_loss"] = False
    return kwargs


# ---------------------------------------------------------------------------------------------- float8
FLOAT8_SINCE, _FLOAT8_NEEDS = (3, 3), "needs Keras >= 3.3"


def float8_training(keras: KerasInfo | None) -> tuple[bool, str]:
    """Whether this Keras trains layers in float8 (``layer.quantize("float8")``, Keras >= 3.3), and why (not)."""
    if keras is None or keras.version is None:
        return False, ("the Keras version is unknown (not installed, or not given to the planner): float8 training "
                       "needs Keras >= 3.3")
    version = minor_version(keras.version)
    if version == (-1, -1):
        return False, f"Keras {keras.version} is not a version this library can read: float8 training {_FLOAT8_NEEDS}"
    if version < FLOAT8_SINCE:
        extra = (" (Keras 2 has no float8 layers; TensorFlow 2.15, which ITEX needs, comes with Keras 2)"
                 if version[0] < 3 else "")
        return False, f"Keras {keras.version} cannot train in float8: layer.quantize('float8') {_FLOAT8_NEEDS}{extra}"
    return True, f"Keras {keras.version} trains Dense and EinsumDense layers in float8 (layer.quantize('float8'))"


# Names that moved to amp_backends.software (the readers of installed software), kept here for one release
__getattr__ = moved_names(__name__, "amp_backends.software", ("LEGACY_KERAS_VALUES", "uses_legacy_keras"))
