"""``auto_configure()``: probe, plan, apply, explain — once per process and set of overrides.

The plan applied in this process is kept in one object; `reset` forgets it (for tests and tools
that configure several plans in one process, such as the benchmark and autotune).
"""

from __future__ import annotations

import logging
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

from .errors import AmpConfigError, AmpWarning, warn
from .hardware import Hardware
from .keras_compat import keras_info
from .plan import Plan
from .planner import make_plan
from .registry import BackendRegistry, registry_or_default
from .request import LossScale, Request, build_request
from .software import KerasInfo, tensorflow_version

logger = logging.getLogger("amp_backends")


@dataclass
class _State:
    """The plan applied in this process, and the request and registry it answered."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    request: Request | None = None
    registry: BackendRegistry | None = None
    plan: Plan | None = None


_state = _State()


def reset() -> None:
    """Forget the plan applied in this process, so the next `auto_configure` plans and applies again (settings
    already applied stay as they are)."""
    with _state.lock:
        _state.request = _state.registry = _state.plan = None


def current_plan() -> Plan | None:
    """The plan applied by the last `auto_configure` in this process, if any.

    Returns:
        The `Plan`, or ``None`` before the first `auto_configure` (or after `reset`).
    """
    return _state.plan


def ensure_visible_logging() -> None:
    """Show the package's INFO lines (the plan's summary, the trainer's log) where the program configured no
    logging at all, as TensorFlow does; a program's own logging configuration is left as it is."""
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def plan_for(hardware: Hardware | None = None, *, device: str | None = None, registry: BackendRegistry | None = None,
             environ: dict[str, str] | None = None, keras: KerasInfo | None = None, **overrides: Any) -> Plan:
    """The plan for ``hardware`` (probed now if ``None``) under the overrides, without applying it.

    This machine is probed without importing TensorFlow: until it is imported, a GPU backend is planned from its
    own probe alone, where `auto_configure` and ``amp-backends info`` also check that TensorFlow lists the GPU (a
    CPU-only TensorFlow build does not).

    Args:
        hardware: The machine to plan for, as the probes describe it; ``None`` probes this one.
        device: A catalogue device to plan for instead of ``hardware`` (a name from `known_devices`, such as
            ``"h100"`` or ``"sapphire-rapids"``; any case): hardware you do not have.
        registry: The backends to plan with (default: the installed ones).
        environ: The environment the ``AMP_*`` overrides are read from (default: ``os.environ``).
        keras: The Keras version to plan for (default: the installed one).
        **overrides: `auto_configure`'s keywords (``policy="bf16"``, ``xla="off"``, ...).

    Returns:
        The plan, not applied. A request it downgrades or honours with a caveat is also an `AmpWarning`, as
        `auto_configure` gives it.

    Raises:
        AmpConfigError: An override has an invalid value, ``device`` is unknown, or both ``hardware`` and
            ``device`` were given.
        UnsupportedRequestError: ``strict`` is on and a request cannot be honoured on this hardware.
        BackendError: A backend asked for by name failed, or none is left.
    """
    if device is not None and hardware is not None:
        raise AmpConfigError(f"plan_for() takes hardware or device, not both. Received: hardware and "
                             f"device={device!r}. Fix: pass one of them.")
    registry = registry_or_default(registry)
    if device is not None and (registry.names() or registry.load_errors):  # (an empty one: the planner says so)
        from .devices import device_hardware

        hardware = device_hardware(device, registry)
    request = build_request(registry.known_names(), environ=environ, **overrides)
    hardware = hardware or _probe(registry, use_tensorflow=False)
    plan = make_plan(hardware, request, registry, keras if keras is not None else keras_info(), tensorflow_version())
    for w in plan.warnings:
        warn(w)
    return plan


def quiet_plan_for(hardware: Hardware | None = None, **kwargs: Any) -> Plan:
    """`plan_for` (``hardware`` and its other keywords) without its `AmpWarning`, for a report that shows the
    plan's warnings itself; other warnings and errors pass as they come."""
    plan: Plan | None = None
    error: BaseException | None = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            plan = plan_for(hardware, **kwargs)
        except BaseException as exc:  # (raised below, after the warnings)
            error = exc
    for w in caught:  # every other warning (an old keyword's, a failing backend's) as it came
        if plan is None or not (w.category is AmpWarning and str(w.message) in plan.warnings):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if error is not None:
        raise error
    assert plan is not None
    return plan


def configure_for_device(device: str, *, registry: BackendRegistry | None = None, environ: dict[str, str] | None = None,
                         **overrides: Any) -> Plan:
    """Plan for a catalogue device and set that plan's Keras dtype policy in this process, so that models built
    next compute as they would on the device (``check_model``); nothing else is applied, and `current_plan` stays
    this machine's.

    Args:
        device: A catalogue device name or alias (``"h100"``, ``"zen3"``).
        registry: The backends to plan with (default: the installed ones).
        environ: The environment the ``AMP_*`` overrides are read from (default: ``os.environ``).
        **overrides: `auto_configure`'s keywords.

    Returns:
        The device's plan; only its dtype policy is set here.

    Raises:
        AmpConfigError: ``device`` is unknown or an override is invalid.
    """
    plan = plan_for(device=device, registry=registry, environ=environ, **overrides)
    from .keras_compat import set_global_policy

    set_global_policy(plan.policy)
    return plan


def known_devices() -> tuple[str, ...]:
    """The names `plan_for` accepts as ``device`` (it takes their aliases too, such as ``"spr"``, in any case; the
    [device catalogue](../devices.md) lists them with their figures).

    Returns:
        The catalogue's device names, the highest-priority backend's first.
    """
    from .devices import known_devices as names

    return names()


def _restore_policy(plan: Plan) -> None:
    """The applied plan's Keras dtype policy again, where something set another since (`configure_for_device`, a
    ``keras.mixed_precision.set_global_policy`` of the program's): models built next follow this machine's plan."""
    from .keras_compat import global_policy_name, set_global_policy

    if (was := global_policy_name()) != plan.policy:
        set_global_policy(plan.policy)
        logger.info(f"auto_configure: the Keras dtype policy is {plan.policy} again, this machine's plan's (it was "
                    f"{was}: layers built since keep it)")


def _probe(registry: BackendRegistry, use_tensorflow: bool) -> Hardware:
    from .probe import probe_hardware

    return probe_hardware(registry, use_tensorflow=use_tensorflow)


def auto_configure(*, backend: str | None = None, policy: str | None = None, xla: bool | str | None = None,
                   tf32: bool | str | None = None, loss_scale: str | float | LossScale | None = None,
                   graph_amp: bool | str | None = None, fp8: bool | str | None = None,
                   float32_layers: str | Sequence[str] | None = None, strict: bool | None = None,
                   force: bool | None = None, apply: bool = True, verbose: bool = True,
                   registry: BackendRegistry | None = None, itex_amp: bool | str | None = None) -> Plan:
    """Detect the hardware, choose the fastest safe mixed-precision plan, apply it and return it.

    Call it at the top of a training script, before building models: the Keras dtype policy applies to layers
    created afterwards. Each keyword defaults to its ``AMP_*`` environment variable (`amp_backends.request`). A
    request the hardware cannot honour is downgraded with an `AmpWarning` (or raises with ``strict=True``); a
    backend that fails is skipped with a warning. Applying sets the Keras global dtype policy, TF32, XLA
    auto-clustering (off when the plan's XLA is) and the backend's own settings; Keras ``fit`` follows the rest
    through ``plan.wrap_optimizer`` and ``plan.compile_kwargs``. Calling again with the same overrides returns the
    same plan (its dtype policy set again if something changed it); `reset` forgets it.

    Args:
        backend: ``"auto"`` or a backend's name (``"nvidia"``, ``"intel"``, ``"cpu"``, or any registered one).
        policy: ``"auto"``, ``"float32"``, ``"mixed_float16"`` or ``"mixed_bfloat16"`` (or ``"fp16"``...).
        xla: ``"auto"``, ``"on"`` or ``"off"`` (also ``True``/``False``, ``1``/``0``).
        tf32: ``"auto"``, ``"on"`` or ``"off"``: TF32 (or ITEX's BF32) for the float32 parts.
        loss_scale: ``"auto"``, ``"dynamic"``, ``"none"``, a fixed scale (``1024``), or a `LossScale`.
        graph_amp: ``"on"``/``"off"``: the backend rewrites the float32 graph to low precision itself instead of
            a Keras policy, where it has such a rewrite (the plan's ``graph_amp`` reason names it).
        fp8: ``"auto"``, ``"on"`` or ``"off"``: float8 training of the eligible Dense layers (off by default).
        float32_layers: ``"auto"``, ``"none"``, or Keras layer class names to keep in float32.
        strict: Raise `UnsupportedRequestError` instead of downgrading a request.
        force: Run a slow (emulated) request anyway; an unsafe one is still refused.
        apply: Apply the plan (``False``: plan only, like `plan_for`).
        verbose: Log the plan's summary.
        registry: The backends to plan with (default: the installed ones).
        itex_amp: Deprecated: the old name of ``graph_amp`` (a ``DeprecationWarning``); it goes in the next release.

    Returns:
        The plan, applied (unless ``apply=False``).

    Raises:
        AmpConfigError: An override has an invalid value; the message names the valid ones.
        UnsupportedRequestError: ``strict`` is on and a request cannot be honoured on this hardware.
        BackendError: A backend asked for by name failed, or none is left.
    """
    registry = registry_or_default(registry)
    request = build_request(registry.known_names(), backend=backend, policy=policy, xla=xla, tf32=tf32,
                            loss_scale=loss_scale, graph_amp=graph_amp, fp8=fp8, float32_layers=float32_layers,
                            strict=strict, force=force, itex_amp=itex_amp)
    with _state.lock:
        if apply and _state.plan is not None and _state.request == request and _state.registry is registry:
            _restore_policy(_state.plan)
            return _state.plan
        hardware = _probe(registry, use_tensorflow=apply)
        plan = make_plan(hardware, request, registry, keras_info(), tensorflow_version())
        notes: list[str] = []
        if apply:
            from .apply import apply_plan

            notes = apply_plan(plan, registry)
            if _state.plan is not None and _state.plan.policy != plan.policy:
                notes.append(f"the dtype policy changed from {_state.plan.policy}: "
                             "layers built before keep the old one")
            _state.request, _state.registry, _state.plan = request, registry, plan
    for w in plan.warnings:
        warn(w)
    if verbose:
        ensure_visible_logging()
        logger.info(plan.summary() + (f" [{'; '.join(notes)}]" if notes else ""))
    return plan
