"""The planner: a pure decision (no I/O) from probe data and the user's request.

`make_plan` picks the backend (the highest-priority one available, or the one asked for), has it `assess` its
hardware, and resolves each setting against that assessment and the request: ``auto`` takes the first *native*
choice; a *native* request is honoured, a *functional* one with a warning; an *emulated* or *unsupported* one is
downgraded with a warning (honoured with ``force``, an error with ``strict``); an *unsafe* one is always refused.
A backend that raises or breaks the contract is recorded in `Plan.backends` and the next one planned with; only
a request for it by name raises `BackendError`. float8 is off by default everywhere: no measurement has shown it
faster than float16.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from .assessment import (EMULATED, FUNCTIONAL, NATIVE, REQUESTED_FLOAT32, UNSAFE, UNSUPPORTED, Assessment,
                         Float32Layer, Support, VendorSetting, describe_layers, first_clause)
from .errors import BackendError, UnsupportedRequestError
from .hardware import BackendProbe, Hardware
from .keras_compat import float8_training
from .plan import COMPUTE_DTYPES, BackendStatus, Decisions, Plan, Rejected
from .registry import Backend, BackendRegistry
from .override_sources import undo_of
from .request import LossScale, Request
from .software import KerasInfo


class _BackendFailed(Exception):
    """A backend raised, or answered outside its contract, while being planned with."""


class _Resolver:
    """Applies the downgrade / strict / force rules uniformly, collecting warnings."""

    def __init__(self, request: Request, backend: str) -> None:
        self.request = request
        self.backend = backend
        self.warnings: list[str] = []
        self.honoured: dict[str, str] = {}  # setting -> support level, for those honoured below native

    def check(self, setting: str, value: str, support: Support, fallback: str) -> bool:
        """True if ``value`` is honoured; otherwise a warning is recorded (or strict raises)."""
        source = self.request.sources.get(setting, "argument")
        asked = f"{setting}={value} (from {source})"
        if support.level == NATIVE:
            return True
        if support.level == FUNCTIONAL:
            self.warnings.append(f"{asked} honoured, but expect little or no speed-up: {support.why}")
            self.honoured[setting] = FUNCTIONAL
            return True
        if support.level == EMULATED and self.request.force:
            self.warnings.append(f"{asked} honoured because force is on, although it is slow here: {support.why}")
            self.honoured[setting] = EMULATED
            return True
        kind = "unsafe" if support.level == UNSAFE else "not supported" if support.level == UNSUPPORTED else "slow"
        fix = self._remove(setting) + (f", or {self._force()} to run it anyway" if support.level == EMULATED else "")
        if support.level == UNSAFE and self.request.force:
            fix += " (force cannot enable an unsafe setting)"
        if self.request.strict:
            raise UnsupportedRequestError(f"{asked} is {kind} on backend {self.backend!r}: {support.why}. Expected a "
                                          f"setting this hardware supports (the automatic choice is {setting}="
                                          f"{fallback}). Fix: {fix}, or {self._unstrict()} to downgrade with a "
                                          "warning.")
        self.warnings.append(f"{asked} is {kind} here and was downgraded to {setting}={fallback}: {support.why}")
        return False

    def refuse(self, setting: str, value: str, why: str) -> None:
        """A request the backend supports but this plan cannot take (``why``): a warning, or an error with strict."""
        asked = f"{setting}={value} (from {self.request.sources.get(setting, 'argument')})"
        if self.request.strict:
            raise UnsupportedRequestError(f"{asked} cannot be honoured on backend {self.backend!r}: {why}. Fix: "
                                          f"{self._remove(setting)}, or {self._unstrict()} to drop it with a warning.")
        self.warnings.append(f"{asked} ignored: {why}")

    def _remove(self, setting: str) -> str:
        return undo_of(self.request.sources.get(setting, "argument"))

    def _force(self) -> str:
        """Force in place of strict (the two contradict), in the words strict was given in."""
        strict = self.request.sources.get("strict", "argument")
        return ("pass force=True instead of strict=True" if strict == "argument" else
                "pass --force instead of --strict" if strict.startswith("--") else
                f"set AMP_FORCE=1 instead of {strict}")

    def _unstrict(self) -> str:
        source = self.request.sources.get("strict", "argument")
        return "turn strict off" if source == "argument" else undo_of(source)


# ---------------------------------------------------------------------------------------------- backends
def _statuses(hardware: Hardware, registry: BackendRegistry) -> dict[str, BackendStatus]:
    """Every backend's status before planning: usable per its probe (and TensorFlow's device list), or why not."""
    statuses: dict[str, BackendStatus] = {}
    for backend in registry:
        probe = hardware.get(backend.name)
        failed = False
        if probe is None:
            ok, reason = False, "not probed"
        elif probe.error is not None:
            ok, reason, failed = False, f"probe failed: {probe.error}", True
        else:
            ok, reason = probe.available, probe.reason
            device_type = backend.tf_device_type
            if (ok and device_type and hardware.tf_device_types is not None
                    and device_type not in hardware.tf_device_types):
                ok = False
                reason = (f"{reason}, but TensorFlow lists no {device_type} device (a CPU-only TensorFlow build, "
                          "missing device libraries or a plugin that did not load): check that TensorFlow "
                          f"lists it, with tf.config.list_physical_devices('{device_type}')")
        statuses[backend.name] = BackendStatus(backend.name, ok, reason, False, failed)
    for name, err in registry.load_errors.items():
        statuses[name] = BackendStatus(name, False, f"failed to load: {err}", False, True)
    return statuses


def _call(method: str, call: Callable[[], Any]) -> Any:
    """What a backend's ``method`` returns (``call()``): an exception it raises is the backend failing."""
    try:
        return call()
    except Exception as exc:  # a backend's bug must not break the others
        raise _BackendFailed(f"{method}() raised {type(exc).__name__}: {exc}") from exc


def _plan_with(backend: Backend, probe: BackendProbe, hardware: Hardware, request: Request,
               keras: KerasInfo | None) -> tuple[Plan, tuple[VendorSetting, ...]]:
    """One backend's plan and vendor settings, or `_BackendFailed` where it raises or breaks the contract."""
    a = _call("assess", lambda: backend.assess(probe, hardware))
    if not isinstance(a, Assessment):
        raise _BackendFailed(f"assess() returned {type(a).__name__}, expected an Assessment")
    errors = a.contract_errors()
    if errors:
        raise _BackendFailed("its assessment breaks the backend contract: " + "; ".join(errors))
    plan = _resolve(a, request, backend.name, keras)
    settings = _call("vendor_settings", lambda: tuple(backend.vendor_settings(plan)))
    bad = [s for s in settings if not isinstance(s, VendorSetting)]
    if bad:
        raise _BackendFailed(f"vendor_settings() returned {bad[0]!r}, expected VendorSetting instances")
    return plan, settings


def _order(statuses: dict[str, BackendStatus], request: Request, requested: str | None,
           source: str) -> tuple[list[str], str | None]:
    """The available backends to try, best first (the one asked for first), and why an asked-for one is not
    available (``None`` if it is, or none was asked for)."""
    if requested and requested in statuses and statuses[requested].failed:
        raise BackendError(f"backend={requested} (from {source}) failed: {statuses[requested].reason}. Expected a "
                           f"backend that loads, probes and assesses its hardware. Fix: {undo_of(source)} to plan "
                           f"with the next available backend, or repair or uninstall the distribution that provides "
                           f"{requested!r}.")
    order = [name for name, s in statuses.items() if s.available]
    if not requested or requested in order:
        return sorted(order, key=lambda name: name != requested), None
    why = statuses[requested].reason if requested in statuses else "not registered"
    if request.strict:
        raise UnsupportedRequestError(f"backend={requested} (from {source}) is not available: {why}. Available: "
                                      f"{', '.join(order) or 'none'}. Fix: choose one of those, or "
                                      f"{undo_of(source)}.")
    return order, why


def make_plan(hardware: Hardware, request: Request, registry: BackendRegistry, keras: KerasInfo | None = None,
              tensorflow: str | None = None) -> Plan:
    """Decide the plan for ``hardware`` under ``request``. Pure: no TensorFlow, no I/O.

    Args:
        hardware: What the probes saw.
        request: The user's overrides.
        registry: The backends to plan with.
        keras: The Keras ``tf.keras`` is (``None``: unknown, so no float8 training).
        tensorflow: The TensorFlow version the plan is for (shown with it).

    Returns:
        The plan.

    Raises:
        UnsupportedRequestError: ``strict`` refuses a request.
        BackendError: The backend asked for by name failed, or no backend is usable.
    """
    if not registry.names() and not registry.load_errors:
        raise BackendError("The backend registry given holds no backend, so there is nothing to plan with. Expected "
                           "a registry with at least one backend. Fix: leave registry out to plan with the installed "
                           "backends, or register one: BackendRegistry([CpuBackend()]).")
    statuses = _statuses(hardware, registry)
    source = request.sources.get("backend", "argument")
    requested = request.backend if request.backend != "auto" else None
    order, unavailable_request = _order(statuses, request, requested, source)
    for name in order:
        probe = hardware.get(name)
        assert probe is not None  # available statuses come from probes
        try:
            plan, settings = _plan_with(registry.get(name), probe, hardware, request, keras)
        except _BackendFailed as exc:
            statuses[name] = BackendStatus(name, False, f"failed: {exc}", False, True)
            if name == requested:
                raise BackendError(
                    f"backend={requested} (from {source}) failed: {exc}. Fix: {undo_of(source)} to plan with the "
                    f"next available backend, or repair or uninstall the distribution that provides {requested!r}."
                ) from exc.__cause__
            continue
        warnings = []
        if unavailable_request is not None:
            warnings.append(f"backend={requested} (from {source}) is not available ({unavailable_request}); "
                            f"using {name} instead")
        warnings += [f"backend {s.name!r} {s.reason}; planned with {name} instead"
                     for s in statuses.values() if s.failed]
        final = tuple(replace(s, selected=s.name == name) for s in statuses.values())
        return replace(plan, backends=final, vendor_settings=settings, warnings=tuple(warnings) + plan.warnings,
                       device_names=tuple(d.name for d in probe.devices), tensorflow=tensorflow,
                       keras=keras.version if keras else None)
    failed = ", ".join(repr(s.name) for s in statuses.values() if s.failed)
    raise BackendError("No backend could plan for this machine: "
                       + "; ".join(f"{s.name}: {s.reason}" for s in statuses.values())
                       + (f". Fix: repair or uninstall the distribution providing {failed}, whose backend failed"
                          if failed else ". Fix: reinstall the package if its cpu backend is missing")
                       + " (`python -m amp_backends.info` shows each backend).")


# ---------------------------------------------------------------------------------------------- settings
def _resolve_switch(r: _Resolver, name: str, requested: bool | None, auto: bool, support: Support,
                    decide: Decisions) -> bool:
    """An on/off setting: the automatic value, or the request if the hardware honours it (off always can)."""
    value = auto
    if requested is not None and requested != auto:
        value = False if requested is False else r.check(name, "on", support, "off")
    state = "on" if value else "off"
    source = r.request.sources.get(name, "argument")
    if requested is None:
        decide.supported(name, state, support, f"{state}: ")
    elif value == requested:
        decide.supported(name, state, support, f"{state} as requested ({source}); ", f"as requested ({source})")
    else:
        asked = f"the requested {'on' if requested else 'off'} ({source}) was downgraded"
        decide.supported(name, state, support, f"{state}: {asked}; ", f"{asked}: {support.short}")
    return value


def _resolve_policy(r: _Resolver, a: Assessment, decide: Decisions,
                    rejected: list[Rejected]) -> tuple[str, str | None]:
    """The Keras dtype policy, and the type the backend's own graph rewrite targets if one was requested."""
    request = r.request
    auto_policy = next(p for p in a.preference if a.policies[p].level == NATIVE)
    policy = auto_policy
    if request.policy not in ("auto", auto_policy) and r.check("policy", request.policy, a.policies[request.policy],
                                                               auto_policy):
        policy = request.policy
    if policy == request.policy and request.policy != "auto":
        asked = f"requested ({request.sources.get('policy', 'argument')})"
        decide.supported("policy", policy, a.policies[policy], f"{asked}; ", asked)
    else:
        decide.supported("policy", policy, a.policies[policy])
    rejected += [Rejected("policy", p, a.policies[p].why, a.policies[p].evidence) for p in a.preference if p != policy]

    if not (request.graph_amp and r.check("graph_amp", "on", a.graph_amp, "off")):
        return policy, None
    # the rewrite needs a low-precision type it can target: the policy's, or the backend's best one
    if policy != "float32" and COMPUTE_DTYPES[policy] not in a.graph_amp_dtypes:
        r.refuse("graph_amp", "on", f"the backend's graph rewrite targets {' or '.join(a.graph_amp_dtypes)}, not the "
                 f"policy's {COMPUTE_DTYPES[policy]} ({first_clause(a.graph_amp.why)})")
        return policy, None
    graph_amp = COMPUTE_DTYPES[policy] if policy != "float32" else next(
        (COMPUTE_DTYPES[p] for p in a.preference
         if p != "float32" and a.policies[p].level == NATIVE and COMPUTE_DTYPES[p] in a.graph_amp_dtypes), None)
    if graph_amp is None:
        r.refuse("graph_amp", "on", f"this device has no native {' or '.join(a.graph_amp_dtypes)}")
        return policy, None
    decide.add("graph_amp", graph_amp, f"{graph_amp} as requested (graph_amp): the backend rewrites the float32 graph "
               f"to {graph_amp}; the Keras policy stays float32 so the two do not cast twice. {a.graph_amp.why}",
               f"as requested (graph_amp): the backend rewrites the float32 graph to {graph_amp}", a.graph_amp.evidence)
    decide.add("policy", "float32", "float32 for Keras: the backend's graph rewrite does the casting (graph_amp=on)",
               "for Keras; the backend's graph rewrite does the casting (graph_amp=on)")
    return "float32", graph_amp


def _resolve_loss_scale(r: _Resolver, effective: str, decide: Decisions, rejected: list[Rejected]) -> LossScale:
    """Loss scaling for the effective compute type: dynamic for float16, none otherwise, or as requested."""
    request = r.request
    if request.loss_scale is None:
        if effective == "mixed_float16":
            decide.add("loss_scale", "dynamic", "dynamic: float16 gradients underflow without scaling; dynamic "
                       "scaling finds the largest safe scale and skips overflowing steps",
                       "float16 gradients underflow without scaling")
            rejected.append(Rejected("loss_scale", "fixed", "a fixed scale can overflow (every step skipped) or "
                                     "underflow; dynamic adapts at no measurable cost in the trainer"))
            return LossScale.dynamic()
        range_ = "bfloat16 has float32's" if effective == "mixed_bfloat16" else "float32 has its full"
        decide.add("loss_scale", "none", f"none: {range_} exponent range, so gradients do not underflow",
                   f"{range_} exponent range")
        return LossScale.none()
    loss_scale = request.loss_scale
    asked = f"requested ({request.sources.get('loss_scale', 'argument')})"
    decide.add("loss_scale", str(loss_scale.mode if loss_scale.mode != "fixed" else loss_scale), asked, asked)
    if loss_scale.mode == "none" and effective == "mixed_float16":
        r.warnings.append("loss_scale=none with float16: small gradients may flush to zero and training may stall; "
                          "use dynamic (the default) unless you know the gradients' range")
    elif loss_scale.mode != "none" and effective != "mixed_float16":
        r.warnings.append(f"loss_scale={loss_scale.mode} with {effective}: not needed (no float16 underflow), "
                          "honoured anyway")
    return loss_scale


def fp8_support(hardware: Support, keras: KerasInfo | None, xla: bool) -> Support:
    """How float8 training runs: the devices' support (``hardware``, with XLA), given the Keras and XLA in use
    (unsupported without Keras's float8 layers, emulated without XLA)."""
    keras_ok, keras_why = float8_training(keras)
    if not keras_ok:
        return Support(UNSUPPORTED, keras_why)
    if hardware.level != NATIVE:
        return hardware
    if not xla:
        return Support(EMULATED, "XLA is off: without it TensorFlow runs Keras's float8 layers as quantize-dequantize "
                                 "ops around ordinary matmuls (emulated, slower); XLA fuses them into fp8 GEMMs")
    return Support(NATIVE, f"{hardware.why}; {keras_why}")


def _resolve_fp8(r: _Resolver, a: Assessment, keras: KerasInfo | None, xla: bool, decide: Decisions) -> bool:
    """float8 training: off unless asked for (not measured faster yet), on where native, forced, or refused."""
    support = fp8_support(a.fp8, keras, xla)
    value = _resolve_switch(r, "fp8", r.request.fp8, False, support, decide)
    if r.request.fp8 is None and support.level == NATIVE:
        decide.add("fp8", "off", "off by default until a measurement shows float8 faster than float16, "
                   f"although native here ({support.why}). "
                   "Turn it on with fp8=on / AMP_FP8=on, then amp_backends.prepare_model(model, plan)",
                   "native here, but off until measured faster than float16 (fp8=on to try it)")
    return value


def _resolve_float32_layers(a: Assessment, request: Request, policy: str,
                            decide: Decisions) -> tuple[Float32Layer, ...]:
    """The Keras layer classes kept in float32 inside the low-precision model: those the backend measured slower
    in the policy's compute dtype (with the casts an island costs), or the request's own list."""
    dtype = COMPUTE_DTYPES[policy]
    requested = request.float32_layers
    name = "float32_layers"
    if dtype == "float32":
        decide.add(name, "none", "none: the policy computes every layer in float32" + (
            f" (float32_layers={','.join(requested) or 'none'} changes nothing)" if requested else ""),
            "the policy computes every layer in float32")
        return ()
    if requested is not None:
        decide.add(name, ", ".join(requested) or "none", f"{', '.join(requested)}: requested (float32_layers)"
                   if requested else "none: requested (float32_layers=none)", "requested (float32_layers)")
        return tuple(Float32Layer(layer, (dtype,), REQUESTED_FLOAT32) for layer in requested)
    kept = tuple(k for k in a.float32_layers if dtype in k.dtypes)
    if not kept:
        measured = sorted({d for k in a.float32_layers for d in k.dtypes})
        why = (f"no layer was measured slower in {dtype} than in float32 here (the measured float32 layers are for "
               f"{', '.join(measured)})" if measured else a.float32_layers_why)
        decide.add(name, "none", f"none: {why}", first_clause(why))
        return ()
    by_why: dict[str, list[str]] = {}
    for k in kept:
        by_why.setdefault(k.why, []).append(k.describe())
    evidence = tuple(dict.fromkeys(e for k in kept for e in k.evidence))
    decide.add(name, describe_layers(kept), "; ".join(f"{', '.join(names)}: {why}" for why, names in by_why.items()),
               f"slower in {dtype}", evidence)
    return kept


def _resolve(a: Assessment, request: Request, chosen: str, keras: KerasInfo | None = None) -> Plan:
    """Resolve every setting of the request against one backend's assessment."""
    r = _Resolver(request, chosen)
    decide = Decisions()
    rejected: list[Rejected] = []

    policy, graph_amp = _resolve_policy(r, a, decide, rejected)
    effective = next((p for p, dtype in COMPUTE_DTYPES.items() if dtype == graph_amp), policy)
    loss_scale = _resolve_loss_scale(r, effective, decide, rejected)

    # --- TF32 and XLA -------------------------------------------------------------------------
    tf32 = _resolve_switch(r, "tf32", request.tf32, a.tf32.level == NATIVE and a.tf32_default, a.tf32, decide)
    xla = _resolve_switch(r, "xla", request.xla, a.xla_default and a.xla.level == NATIVE, a.xla, decide)
    fp8 = _resolve_fp8(r, a, keras, xla, decide)
    decide.add("steps_per_execution", str(a.steps_per_execution),
               f"{a.steps_per_execution}: {a.steps_per_execution_why}", first_clause(a.steps_per_execution_why),
               a.steps_per_execution_evidence)
    float32_layers = _resolve_float32_layers(a, request, policy, decide)
    for peer in a.peers:  # what a user would pick instead, judged from committed runs on this kind of machine
        if peer.graph_rewrite and graph_amp:
            continue  # the plan is that peer
        if peer.won:
            take = "; graph_amp=on takes it" if peer.graph_rewrite else ""
            r.warnings.append(f"{peer.name} was measured faster than the automatic plan on a machine of this kind, "
                              f"and the plan does not take it by itself{take}: {peer.why}")
        else:
            rejected.append(Rejected("peer", peer.name, peer.why, peer.evidence))

    return Plan(backend=chosen, devices=a.devices, policy=policy, loss_scale=loss_scale, tf32=tf32, xla=xla,
                decisions=tuple(decide.values()), rejected=tuple(rejected), warnings=tuple(r.warnings),
                honoured=dict(r.honoured), backends=(), request=request, notes=a.notes, graph_amp=graph_amp,
                assessment=a, fp8=fp8, steps_per_execution=a.steps_per_execution, float32_layers=float32_layers)
