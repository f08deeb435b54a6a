"""Apply a :class:`~amp_backends.plan.Plan` to TensorFlow and whichever Keras is in use (2 or 3)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from .plan import Plan
from .registry import BackendRegistry


@dataclass(frozen=True)
class KerasInfo:
    module: Any
    version: str
    generation: int  # 2 (tf.keras of TF <= 2.15, or tf-keras) or 3


def keras_info(tf: Any) -> KerasInfo:
    """The Keras that ``tf.keras`` resolves to (Keras 3 on TF >= 2.16 unless TF_USE_LEGACY_KERAS=1)."""
    k = tf.keras
    version = getattr(k, "__version__", None)
    if not version:
        # TF 2.15's lazy loader hides __version__; the loaded module is keras 2.15 or tf_keras.
        mod = sys.modules.get("tf_keras") if os.environ.get("TF_USE_LEGACY_KERAS") == "1" else sys.modules.get("keras")
        version = getattr(mod, "__version__", None) or "unknown"
    try:
        generation = int(str(version).split(".")[0])
    except ValueError:
        generation = 2
    return KerasInfo(k, str(version), generation)


def set_keras_policy(tf: Any, policy: str) -> None:
    """Set the global dtype policy on tf.keras and, if different and imported, on standalone ``keras``."""
    tf.keras.mixed_precision.set_global_policy(policy)
    standalone = sys.modules.get("keras")
    if standalone is not None and hasattr(standalone, "mixed_precision"):
        try:
            if standalone.mixed_precision.global_policy().name != policy:
                standalone.mixed_precision.set_global_policy(policy)
        except Exception:
            pass


def get_keras_policy(tf: Any) -> str:
    return tf.keras.mixed_precision.global_policy().name


def apply_plan(plan: Plan, registry: BackendRegistry) -> list[str]:
    """Apply the plan; returns notes for the log. Import TensorFlow as late as here."""
    notes: list[str] = []
    if plan.math_mode:
        # ITEX reads ITEX_FP32_MATH_MODE from the environment when it builds its kernels.
        current = os.environ.get("ITEX_FP32_MATH_MODE")
        if current and current.upper() != plan.math_mode:
            notes.append(f"ITEX_FP32_MATH_MODE={current} set by the user is kept (the plan would use {plan.math_mode})")
        else:
            os.environ["ITEX_FP32_MATH_MODE"] = plan.math_mode
            notes.append(f"ITEX_FP32_MATH_MODE={plan.math_mode}")
    import tensorflow as tf

    set_keras_policy(tf, plan.policy)
    tf.config.experimental.enable_tensor_float_32_execution(plan.tf32)
    if not plan.xla:
        # Global auto-clustering off too, so nothing compiles behind the plan's back.
        tf.config.optimizer.set_jit(False)
    if plan.backend == "cpu":
        hidden = _hide_accelerators(tf)
        if hidden:
            notes.append(hidden)
    notes += registry.get(plan.backend).apply(plan, tf)
    return notes


def _hide_accelerators(tf: Any) -> str | None:
    """On a CPU plan, hide GPUs/XPUs from TensorFlow if it still can (before its runtime starts)."""
    hidden = []
    for kind in ("GPU", "XPU"):
        try:
            if tf.config.list_physical_devices(kind):
                tf.config.set_visible_devices([], kind)
                hidden.append(kind)
        except RuntimeError:
            return (f"TensorFlow already started its {kind} runtime: the CPU plan cannot hide it; place ops with "
                    "tf.device(plan.device)")
        except Exception:
            continue
    return f"hid {', '.join(hidden)} devices from TensorFlow for the CPU plan" if hidden else None
