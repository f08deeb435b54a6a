"""The audit: what actually ran — the kernels' dtypes, their share of the time, the float32 islands.

The precision check (`amp_backends.model_check`) reads the graph: what *should* run. The audit runs a
few training steps and reads what *did*::

    from amp_backends.audit import audit
    print(audit("amp_backends.models:mnist_cnn", batch_size=256))      # a table; .to_json() for machines

- **CPU**: oneDNN prints every primitive it executes (``ONEDNN_VERBOSE=1``: implementation, ISA, data types,
  time; `onednn`). oneDNN reads that variable once, when it starts, so the model runs in a child
  process (`child`) built from a factory: ``MODULE:FACTORY`` (the convention of ``amp-backends
  check``) or a top-level function of an importable module. A model *object* cannot be audited: the
  oneDNN of this process has already started without verbose output, and a model does not cross into
  another process. Kernels TensorFlow runs outside oneDNN (Eigen, with ``TF_ENABLE_ONEDNN_OPTS=0`` or on
  CPUs where TensorFlow leaves oneDNN off; XLA's own kernels) are invisible to it: the audit says so and
  reports no dtypes for them.
- **NVIDIA**: the measured steps are traced with TensorFlow's profiler and every GPU kernel classified by
  its name (`nvidia`: cuBLAS, cuDNN, CUTLASS, nvjet, XLA fusions by their HLO); `audit_trace`
  reads a trace you recorded yourself (``Trainer(profile=...)``, TensorBoard's profiler).
- **Intel XPU**: not measured (the reason is in the result's notes).

The result (`report.Audit`): ``time_share_by_dtype``, the share on matrix units, the float32
islands with the layers they belong to (oneDNN records carry shapes and dtypes, not names: matched to the
ops of the child's traced step of their dtype and shape, each owned by the layer whose call created it,
else by kernel shape; `match`) joined with the precision check's findings, contradictions with the
plan as warnings with their fix, and the unknown share. JSON schema in `report`.
"""

from __future__ import annotations

import os
import sys
import types
from typing import TYPE_CHECKING, Any

from ..factory import factory_spec
from .build import from_onednn, from_trace
from .nvidia import classify, read_trace
from .onednn import parse, parse_line
from .report import Audit
from .runner import not_measured_on_xpu, overrides_env, run_child

__all__ = [
    "Audit",
    "AuditObserver",
    "audit",
    "audit_trace",
    "classify",
    "from_onednn",
    "from_trace",
    "parse",
    "parse_line",
    "read_trace",
]

if TYPE_CHECKING:
    from ..plan import Plan

DEFAULT_BATCH = 32
DEFAULT_STEPS = 3
DEFAULT_WARMUP = 2


def _target(model_or_factory: Any) -> str:
    if hasattr(model_or_factory, "layers") or not (callable(model_or_factory) or isinstance(model_or_factory, str)):
        raise TypeError(
            "audit() takes a factory (a function that builds the model, or its 'MODULE:FACTORY' string), not a model: "
            "oneDNN reads ONEDNN_VERBOSE once, when it starts, so the model must be built in a fresh child process. "
            f"Received {type(model_or_factory).__name__}. Fix: pass the function that builds it, such as "
            "audit(build_model) or audit('mymodels:build')")
    return factory_spec(model_or_factory)


def audit(model_or_factory: Any, plan: Plan | None = None, *, batch_size: int = DEFAULT_BATCH,
          steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP, timeout: float = 600.0, **overrides: Any) -> Audit:
    """Train ``steps`` steps of the model after ``warmup`` in a child process and report what ran.

    Args:
        model_or_factory: ``"MODULE:FACTORY"`` or a top-level function of an importable module that returns
            a Keras model (see the module documentation for why a model object is refused).
        plan: a `Plan` to run under (its backend, policy and XLA are passed to the
            child as ``AMP_*`` variables); ``None``: the child plans for this machine under ``overrides``.
        batch_size: The synthetic batch's size.
        steps: The measured steps.
        warmup: The steps run before them (tracing, compilation).
        timeout: Seconds the child may run before it is stopped.
        **overrides: Plan overrides as in `amp_backends.auto_configure` (``policy="float32"``...).

    Returns:
        What ran (`Audit`).

    Raises:
        FactoryError: The factory is not ``MODULE:FACTORY`` or an importable function (before anything runs).
        TypeError: A model object was given instead of its factory.
        ValueError: A size is not a positive integer.
        RuntimeError: The child process failed.
    """
    for name, value in (("batch_size", batch_size), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int. Received: {value!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup must be an int >= 1 (the first step traces and compiles). Received: {warmup!r}")
    target = _target(model_or_factory)
    env = overrides_env(plan, **overrides)
    if plan is not None and any("XPU" in str(d).upper() for d in getattr(plan, "devices", ())):
        return not_measured_on_xpu(target, plan)
    return run_child(target, batch_size=batch_size, steps=steps, warmup=warmup, env=env, timeout=timeout)


def audit_trace(path: str | os.PathLike[str], plan: Plan | None = None, *, model: str = "?") -> Audit:
    """Classify the GPU kernels of a TensorFlow profiler trace.

    Args:
        path: A ``*.trace.json.gz``, a ``*.xplane.pb``, or the logdir that holds one (relative or absolute).
        plan: The plan the trace ran under, to judge the kernels against; ``None``: none.
        model: The model's name, for the report.

    Returns:
        What ran (`Audit`).

    Raises:
        ValueError: ``path`` holds no trace TensorFlow's profiler wrote, or one it cannot read.
    """
    plan_dict = {} if plan is None else {"backend": plan.backend, "policy": plan.policy,
                                         "compute_dtype": plan.compute_dtype, "xla": bool(plan.xla)}
    return from_trace(read_trace(path), plan_dict, model)


def __getattr__(name: str) -> Any:
    if name == "AuditObserver":
        from .observer import AuditObserver

        return AuditObserver
    raise AttributeError(name)


class _CallableModule(types.ModuleType):
    """``amp_backends.audit`` is both this package and the function: once the package is imported, Python binds
    the name ``audit`` on ``amp_backends`` to the module, so calling the module calls `audit`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Audit:
        return audit(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
