"""Apply a `Plan` to TensorFlow and whichever Keras is in use: the core sets the Keras global dtype policy, TF32 and
XLA auto-clustering, then the plan's backend its own settings (`Backend.apply`).
"""

from __future__ import annotations

from .errors import BackendError
from .keras_compat import set_global_policy
from .plan import Plan
from .registry import BackendRegistry


def apply_plan(plan: Plan, registry: BackendRegistry) -> list[str]:
    """Apply the plan; returns notes for the log. Import TensorFlow as late as here."""
    import tensorflow as tf

    set_global_policy(plan.policy, tf)
    tf.config.experimental.enable_tensor_float_32_execution(plan.tf32)
    if not plan.xla:
        # Global auto-clustering off too, so nothing compiles behind the plan's back.
        tf.config.optimizer.set_jit(False)
    try:
        return list(registry.get(plan.backend).apply(plan, tf))
    except Exception as exc:
        settings = ", ".join(f"{s.name}={s.value}" for s in plan.vendor_settings) or "none"
        raise BackendError(
            f"backend {plan.backend!r} failed to apply its settings ({settings}): "
            f"{type(exc).__name__}: {exc}. The Keras policy ({plan.policy}), TF32 and XLA settings are applied. Fix: "
            f"choose another backend (AMP_BACKEND=...), or repair the backend's software."
        ) from exc
