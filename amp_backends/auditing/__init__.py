"""The audit: what actually ran (the kernels' dtypes, their share of the time, the float32 islands).

The precision check (`amp_backends.model_check`) reads the graph: what *should* run; the audit runs a few training
steps and reads what *did*: ``print(amp_backends.audit("amp_backends.models:mnist_cnn"))`` (``.to_json()`` for
machines). The model is built from its factory (``MODULE:FACTORY`` or a top-level function) in a child process
(`child`) started with the variables the kernels' libraries read once, at start: a model object cannot be audited.
The plan's backend reads what ran (`amp_backends.kernel_audit.KernelAudit`): oneDNN's verbose records on a CPU, a
profiler trace on NVIDIA (`audit_trace` reads one you recorded); a backend without a kernel audit is reported as not
measured. The result is `audit_result.Audit` (built in `build`, layers matched in `match`).
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

from ..factory import factory_spec
from .build import from_reading, not_measured, plan_data
from .audit_result import Audit
from .child import PLAN_BACKEND
from .runner import overrides_env, run_child
from ..errors import AmpConfigError, BackendError
from ..request import ENV_VARS

__all__ = ["Audit", "AuditObserver", "audit", "audit_trace"]

if TYPE_CHECKING:
    from ..plan import Plan
    from .observer import AuditObserver

DEFAULT_BATCH = 32
DEFAULT_STEPS = 3
DEFAULT_WARMUP = 2


def audit(model_or_factory: Any, plan: Plan | None = None, *, batch_size: int = DEFAULT_BATCH,
          steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP, timeout: float = 600.0, seq_len: int | None = None,
          input_shape: Any = None, **overrides: Any) -> Audit:
    """Train ``steps`` steps of the model after ``warmup`` in a child process and report what ran.

    Args:
        model_or_factory: ``"MODULE:FACTORY"`` or a top-level function of an importable module that returns
            a Keras model (see the module documentation for why a model object is refused).
        plan: A `Plan` to run under: passed to the child as ``AMP_*`` overrides, and its backend's kernel audit
            reads what ran, even where that backend is not available here (a note then says the model computed on
            this machine's devices under the plan they give); a plan whose backend reads nothing (an Intel XPU's) is
            reported as not measured without running anything. ``None``: the child plans under ``overrides``.
        batch_size: The synthetic batch's size (32 by default).
        steps: The measured steps (3 by default).
        warmup: The steps run before them: tracing, compilation (2 by default).
        timeout: Seconds the child may run before it is stopped.
        seq_len: Train with every open input dimension after the batch (a sequence length) set to this; ``None``:
            open dimensions are set to 8 (the audit's notes say so).
        input_shape: The input shape(s) to train at instead: ``(None, 128)`` (the batch first, as ``None``), a
            list of them or a dict of them by input name; or one example's as ``--input-shape`` takes it
            (``"64x64x3"``, ``"token_ids=128,padding_mask=128"``). Checked against the model once it is built.
        **overrides: Plan overrides as in `amp_backends.auto_configure` (``policy="float32"``...).

    Returns:
        What ran (`Audit`).

    Raises:
        FactoryError: The factory is not ``MODULE:FACTORY`` or an importable function (before anything runs), or
            the child process could not import it, or it raised or returned no Keras model.
        TypeError: A model object was given instead of its factory, or an override is not one of the plan's.
        ValueError: A size is not a positive integer, both ``seq_len`` and ``input_shape`` are given, or the input
            shape does not fit the model (its rank, fixed sizes or input names).
        ModelCallError: The model does not run at the shapes audited; the message names the layer that raised.
        RuntimeError: The child process failed or ran past its time.
        KeyboardInterrupt: Ctrl-C, or SIGTERM (`amp_backends.errors.TrainingInterrupted`, exit code 143), stopped
            the audit; the child process was stopped first.
    """
    for name, value, expected in (("batch_size", batch_size, "a positive int"), ("steps", steps, "a positive int"),
                                  ("warmup", warmup, "an int >= 1 (the first step traces and compiles)")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise AmpConfigError(f"{name} must be {expected}. Received: {value!r}")
    inputs = _input_request(seq_len, input_shape)
    if hasattr(model_or_factory, "layers") or not (callable(model_or_factory) or isinstance(model_or_factory, str)):
        raise AmpConfigError(
            "audit() takes a factory (a function that builds the model, or its 'MODULE:FACTORY' string), not a model: "
            "oneDNN reads ONEDNN_VERBOSE once, when it starts, so the model must be built in a fresh child process. "
            f"Received {type(model_or_factory).__name__}. Fix: pass the function that builds it, such as "
            "audit(build_model) or audit('mymodels:build')")
    from ..registry import default_registry

    target = factory_spec(model_or_factory)
    env, registry = overrides_env(plan, **overrides), default_registry()  # the child's variables beyond ours
    if plan is None:  # the child plans: every backend's kernel audit may read it
        env.update(registry.audit_environment())
    else:
        kernel_audit = registry.kernel_audit(plan.backend)
        if kernel_audit is None or kernel_audit.unavailable:
            return not_measured(target, plan_data(plan), kernel_audit)
        env.update({PLAN_BACKEND: str(plan.backend), **dict(kernel_audit.environment)})
        if not overrides.get("strict"):  # the given plan's policy, though slow here (another machine's plan)
            env.setdefault(ENV_VARS["force"], "1")
    return run_child(target, batch_size=batch_size, steps=steps, warmup=warmup, env=env, timeout=timeout,
                     inputs=inputs)


def _input_request(seq_len: int | None, input_shape: Any) -> dict[str, Any]:
    """``audit``'s shapes, checked for their form before anything runs, as the child takes them (JSON)."""
    if seq_len is not None and input_shape is not None:
        raise AmpConfigError("expected at most one of seq_len and input_shape, received both. Fix: seq_len=N for the "
                             "open dimensions, or the full shapes with input_shape=")
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
        raise AmpConfigError(f"seq_len must be a positive int, such as 128. Received: {seq_len!r}. Fix: the sequence "
                             "length to train at")

    def shape(value: Any) -> list[int | None]:
        if not isinstance(value, (tuple, list)) or not all(d is None or (isinstance(d, int) and not isinstance(
                d, bool) and d > 0) for d in value):
            raise AmpConfigError(f"input_shape takes an input's shape with the batch first, such as (None, 128), or a "
                                 f"list or dict (by input name) of them. Received: {input_shape!r}. Fix: give positive "
                                 "sizes, the batch as None")
        return list(value)

    if input_shape is None:
        return {"seq_len": seq_len}
    if isinstance(input_shape, str):  # as --input-shape takes it; errors in its words
        from ..model_check.shapes import parse_input_shape

        return {**_input_request(None, parse_input_shape(input_shape)), "flag": input_shape}
    if isinstance(input_shape, dict):
        return {"input_shape": {str(k): shape(v) for k, v in input_shape.items()}}
    several = isinstance(input_shape, (tuple, list)) and bool(input_shape) and all(
        isinstance(v, (tuple, list)) for v in input_shape)
    return {"input_shape": [shape(v) for v in input_shape] if several else shape(input_shape)}


def audit_trace(path: str | os.PathLike[str], plan: Plan | None = None, *, model: str = "?") -> Audit:
    """Classify the GPU kernels of a TensorFlow profiler trace, read by the plan's backend where it reads traces
    (`KernelAudit.read_trace`), else by the first registered backend that does.

    Args:
        path: A ``*.trace.json.gz``, a ``*.xplane.pb``, or the logdir that holds one (relative or absolute).
        plan: The plan the trace ran under, to judge the kernels against; ``None``: none.
        model: The model's name, for the report.

    Returns:
        What ran (`Audit`).

    Raises:
        ValueError: ``path`` holds no trace TensorFlow's profiler wrote, or one it cannot read, or no installed
            backend reads profiler traces.
    """
    from ..registry import default_registry

    registry = default_registry()
    readers = [registry.kernel_audit(plan.backend)] if plan is not None else []
    for name in registry.names():
        with contextlib.suppress(BackendError):  # a broken third-party backend must not break the others' audits
            readers.append(registry.kernel_audit(name))
    reader = next((r for r in readers if r is not None and r.reads_traces), None)
    if reader is None:
        raise AmpConfigError(f"expected an installed backend that reads profiler traces, but none of "
                             f"{', '.join(registry.names())} does. Fix: install the backend of the trace's devices")
    return from_reading(reader.read_trace(path), {"model": model, "plan": {} if plan is None else plan_data(plan)})


def __getattr__(name: str) -> Any:
    if name == "AuditObserver":
        from .observer import AuditObserver

        return AuditObserver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
