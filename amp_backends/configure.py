"""``auto_configure()``: probe, plan, apply, explain — once per process and set of overrides."""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

from .errors import AmpWarning
from .hardware import Hardware
from .options import LossScale, Request, build_request
from .plan import Plan, make_plan
from .registry import BackendRegistry, default_registry

logger = logging.getLogger("amp_backends")


class _State:
    """The plan applied in this process (kept in an object, so tests can reset it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.request: Request | None = None
        self.plan: Plan | None = None

    def reset(self) -> None:
        with self.lock:
            self.request = None
            self.plan = None


_state = _State()


def current_plan() -> Plan | None:
    """The plan applied by the last :func:`auto_configure` in this process, if any."""
    return _state.plan


def _ensure_visible_logging() -> None:
    """Show our INFO summary when the program configured no logging at all (as TensorFlow does)."""
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def plan_for(
    hardware: Hardware | None = None,
    *,
    registry: BackendRegistry | None = None,
    environ: dict[str, str] | None = None,
    **overrides: Any,
) -> Plan:
    """The plan for ``hardware`` (probed now if ``None``) under the overrides, without applying it."""
    registry = registry or default_registry()
    request = build_request(registry.names(), environ=environ, **overrides)
    hardware = hardware or _probe(registry, use_tensorflow=False)
    return make_plan(hardware, request, registry)


def _probe(registry: BackendRegistry, use_tensorflow: bool) -> Hardware:
    from .probe import probe_hardware

    return probe_hardware(registry, use_tensorflow=use_tensorflow)


def auto_configure(
    *,
    backend: str | None = None,
    policy: str | None = None,
    xla: bool | str | None = None,
    tf32: bool | str | None = None,
    loss_scale: str | float | LossScale | None = None,
    itex_amp: bool | str | None = None,
    strict: bool | None = None,
    force: bool | None = None,
    apply: bool = True,
    verbose: bool = True,
) -> Plan:
    """Detect the hardware, choose the fastest safe mixed-precision plan, apply it and return it.

    Call it at the top of a training script, before building models: the Keras dtype policy applies
    to layers created afterwards. Each keyword overrides the automatic choice and defaults to the
    matching ``AMP_*`` environment variable (see :mod:`amp_backends.options`); an invalid value raises
    :class:`~amp_backends.errors.AmpConfigError` naming the valid ones. A request the hardware cannot
    honour is downgraded with an :class:`~amp_backends.errors.AmpWarning` (or raises with
    ``strict=True``).

    Applying sets the Keras global dtype policy, TF32 execution (``tf.config``), turns global XLA
    auto-clustering off when the plan has XLA off, and vendor settings (ITEX's math mode and auto mixed
    precision). Training code reads ``plan.xla`` (``jit_compile``) and ``plan.loss_scale``; the
    trainer in :mod:`amp_backends.train` does so. Calling again with the same overrides returns the
    same plan without re-applying it.
    """
    registry = default_registry()
    request = build_request(
        registry.names(),
        backend=backend, policy=policy, xla=xla, tf32=tf32, loss_scale=loss_scale,
        itex_amp=itex_amp, strict=strict, force=force,
    )
    with _state.lock:
        if apply and _state.plan is not None and _state.request == request:
            return _state.plan
        hardware = _probe(registry, use_tensorflow=apply)
        plan = make_plan(hardware, request, registry)
        notes: list[str] = []
        if apply:
            from .apply import apply_plan

            notes = apply_plan(plan, registry)
            if _state.plan is not None and _state.plan.policy != plan.policy:
                notes.append(f"the dtype policy changed from {_state.plan.policy}: layers built before keep the old one")
            _state.request, _state.plan = request, plan
    for w in plan.warnings:
        warnings.warn(w, AmpWarning, stacklevel=2)
    if verbose:
        _ensure_visible_logging()
        logger.info(plan.summary() + (f" [{'; '.join(notes)}]" if notes else ""))
    return plan
