"""The plan tuner: time the candidate plans on the user's own model and keep the fastest, cached per device and model.

The planner's rules come from chips we have measured, and can be wrong on another (the tutorials found XLA slower on
an A100 for the MNIST CNN). The choice is cached (`cache_path`) under the device's and the model's signatures, so
the next run applies it without timing; ``amp-backends info`` lists the cached choices for this machine.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .. import cache
from ..assessment import FUNCTIONAL, NATIVE
from ..cache import cache_dir, digest, unwritable
from ..configure import auto_configure, reset
from ..errors import AmpWarning, TrainingInterrupted
from ..plan import Plan
from ..probe import probe_hardware
from ..registry import BackendRegistry, registry_or_default
from ..override_sources import keywords_chosen_by
from .timing import MARGIN, ROUNDS, Timings, interleaved

logger = logging.getLogger("amp_backends.autotune")


def cache_path() -> Path:
    """The cache file, absolute: ``$AMP_AUTOTUNE_CACHE``, else ``autotune.json`` in the package's cache folder
    (`amp_backends.cache.cache_dir`)."""
    if os.environ.get("AMP_AUTOTUNE_CACHE"):
        return Path(os.path.abspath(os.path.expanduser(os.environ["AMP_AUTOTUNE_CACHE"])))
    return cache_dir() / "autotune.json"


def device_signature(plan: Plan, hardware: Any) -> str:
    """Backend, each device's name and its backend's facts about it (`Accelerator.signature`: NVIDIA's compute
    capability), or the CPU model, and TensorFlow version.

    Args:
        plan: The `Plan` whose backend's devices are named.
        hardware: The probed machine (`amp_backends.hardware.Hardware`).

    Returns:
        ``backend|devices|tfVERSION``: the devices' signatures comma-separated, or the CPU model (``"?"`` where
        unknown) where the backend probed no device; the first part of a cache key.
    """
    from ..software import tensorflow_version

    probe = hardware.get(plan.backend)
    devices = [d.signature for d in probe.devices] if probe else []
    cpu = hardware.cpu.model if hardware.cpu else "?"
    return f"{plan.backend}|{','.join(devices) or cpu}|tf{tensorflow_version()}"


def model_signature(models: Sequence[Any], batch_size: int) -> str:
    """Layer classes, output shapes and parameter counts of the models, and the batch size.

    Args:
        models: The Keras models trained, their layers in order.
        batch_size: The batch size.

    Returns:
        A short stable hash (16 hexadecimal digits) of those: the second part of a cache key.
    """
    parts = [f"batch={batch_size}"]
    for m in models:
        for layer in m.layers:
            shape = getattr(layer, "output_shape", None)
            if shape is None:
                try:
                    shape = tuple(layer.output.shape)
                except Exception:
                    shape = "?"
            parts.append(f"{type(layer).__name__}:{shape}:{layer.count_params()}")
    return digest("|".join(parts))


def load_cache() -> dict[str, Any]:
    """The cached choices by key (``{}`` where the cache file is missing or unreadable)."""
    return cache.load(cache_path())


def store(key: str, entry: Mapping[str, Any]) -> bool:
    """Cache a choice in `cache_path`, atomically (a temporary file renamed over it).

    Args:
        key: The device's and the model's signatures, ``device_signature#model_signature``.
        entry: The choice, as `tune` writes it (`valid_entry`).

    Returns:
        Whether it was written (not over a file that is no cache's JSON object).
    """
    return cache.store(cache_path(), key, dict(entry))  # atomic: a crash never leaves half a cache


def valid_entry(entry: Any) -> bool:
    """Whether ``entry`` is as `tune` writes it: a policy, ``xla`` a bool, the rate and the date (a hand-edited or
    damaged one is not, and is timed again).

    Args:
        entry: A value of the cache.

    Returns:
        True for an entry `tune` can apply.
    """
    return (isinstance(entry, Mapping) and entry.get("policy") in ("float32", "mixed_float16", "mixed_bfloat16")
            and isinstance(entry.get("xla"), bool) and isinstance(entry.get("img_per_s"), (int, float))
            and isinstance(entry.get("date"), str))


def cached_for_device(signature: str) -> dict[str, Any]:
    """The cache's valid choices (`valid_entry`) for one device.

    Args:
        signature: The device's `device_signature`.

    Returns:
        The entries by key.
    """
    return {k: v for k, v in load_cache().items() if k.startswith(signature + "#") and valid_entry(v)}


@dataclass
class Trial:
    """One candidate plan's outcome in `tune`, as the cache keeps it under ``trials``.

    Attributes:
        policy: The candidate's dtype policy.
        xla: Whether the candidate compiled with XLA.
        img_per_s: Its median rate over the rounds, in samples per second; ``None`` where it failed.
        error: Why it failed (the exception's type and message), or ``None``.
    """

    policy: str
    xla: bool
    img_per_s: float | None
    error: str | None = None


def candidates(plan: Plan) -> list[dict[str, Any]]:
    """Distinct overrides worth timing on ``plan``'s hardware: each natively supported policy, XLA on and off
    where it exists (read from the support table the plan carries).

    Args:
        plan: The rules' `Plan`, with its support table (``assessment``).

    Returns:
        ``{"policy", "xla"}`` per candidate: each policy the table marks native, with ``xla`` True and False where
        XLA is native or functional, else False; the plan's own policy and XLA alone where it carries no table.
    """
    a = plan.assessment
    if a is None:
        return [{"policy": plan.policy, "xla": plan.xla}]
    xlas = [True, False] if a.xla.level in (NATIVE, FUNCTIONAL) else [False]
    return [{"policy": policy, "xla": xla} for policy, support in a.policies.items() if support.level == NATIVE
            for xla in xlas]


def _continue(trainer: Any, x: Any, y: Any, steps: int) -> Callable[[], Any]:
    """One more compiled call of ``steps`` steps of ``trainer`` each time it is called (``max_steps`` ends each
    ``fit``; the epochs never do)."""
    ends = itertools.count(steps, steps)
    return lambda: trainer.fit(x, y, epochs=10**9, max_steps=next(ends))


def _apply_choice(policy: str, xla: bool, registry: BackendRegistry, fixed: Mapping[str, Any]) -> Plan:
    """Apply the plan of the choice: its policy and XLA are autotune's measured choice, not the user's request (the
    plan says ``requested (autotune)``, and their caveats, ``xla=on (from argument) honoured, but ...``, are not
    warned); the user's own overrides (``fixed``) keep theirs."""
    undo = ("let autotune time the candidates again (tune(..., refresh=True), or delete its cached choice in "
            f"{cache_path()}), or train without it")
    with warnings.catch_warnings(), keywords_chosen_by("autotune", {"policy": policy, "xla": xla}, undo):
        warnings.filterwarnings("ignore", message=r"(policy|xla)=", category=AmpWarning)
        return auto_configure(policy=policy, xla=xla, verbose=False, registry=registry, **fixed)


def tune(build: Callable[[], tuple[Sequence[Any], Any, Mapping[str, Any]]], x: Any, y: Any = None, *, batch_size: int,
         images_per_step: int | None = None, steps: int = 10, batch_fn: Any = None, refresh: bool = False,
         registry: BackendRegistry | None = None, overrides: Mapping[str, Any] | None = None) -> Plan:
    """Choose the fastest plan for the model ``build()`` makes, apply it and return it.

    Each candidate (`candidates`) is built and warmed up, then all are timed interleaved, one call of ``steps``
    steps each per round for `ROUNDS` rounds: one is chosen only when it beat every other in every round by
    `MARGIN`, else the rules' plan stays (within noise). A cached choice is applied without timing; a candidate
    that fails loses, and when all fail the rules' plan is applied.

    Args:
        build: Called once per candidate, after its dtype policy is set; returns ``(models, updates,
            checkpoint_objects)`` for a `Trainer`.
        x: The training inputs, as `Trainer.fit` takes them.
        y: The labels, as `Trainer.fit` takes them.
        batch_size: The batch size.
        images_per_step: Samples one step processes, where not ``batch_size`` (the rates count them).
        steps: Steps per timed call.
        batch_fn: The `Trainer`'s ``batch_fn``.
        refresh: Time the candidates even where a choice is cached.
        registry: Replaces the installed backends.
        overrides: ``auto_configure`` keywords kept in every candidate and in the plan chosen (``loss_scale``,
            ``tf32``, ``fp8``, ``force``...); the candidates set ``policy`` and ``xla``.

    Returns:
        The `Plan` applied.

    Raises:
        amp_backends.errors.TrainingInterrupted: Ctrl-C while the candidates were built or timed, or SIGTERM
            while one trained (nothing is cached, and no plan is left applied).
    """
    fixed = {k: v for k, v in (overrides or {}).items() if k not in ("policy", "xla")}
    from ..training import Trainer

    registry = registry_or_default(registry)
    hardware = probe_hardware(registry, use_tensorflow=True)
    base = auto_configure(verbose=False, registry=registry, **fixed)
    try:
        models, _, _ = build()
        key: str | None = f"{device_signature(base, hardware)}#{model_signature(models, batch_size)}"
    except Exception as exc:  # the rules' candidate fails to build: it loses below, and no choice is cached
        key = None
        logger.info(f"autotune: the model did not build under the rules' plan ({type(exc).__name__}: "
                    f"{str(exc)[:200]}); the candidates are timed and the choice is not cached")
    cached = load_cache().get(key) if key else None
    if cached is not None and not valid_entry(cached):
        logger.warning(f"autotune: the cached choice for this device and model in {cache_path()} is not one tune "
                       f"wrote ({str(cached)[:80]}): the candidates are timed again and it is replaced")
        cached = None
    if cached and not refresh:
        reset()
        plan = _apply_choice(cached["policy"], cached["xla"], registry, fixed)
        logger.info(f"autotune: cached choice for this device and model: policy={cached['policy']} xla={cached['xla']} "
                    f"({cached['img_per_s']:.4g} img/s when measured on {cached['date']})")
        return plan
    if key and (why := unwritable(cache_path())):  # said before the timing, not after it
        logger.warning(f"autotune: the cache {cache_path()} cannot be written ({why}): the choice will be timed but "
                       "not kept for the next run. Fix: point AMP_AUTOTUNE_CACHE (a file) or AMP_CACHE_DIR (a folder) "
                       "at a place this user can write.")
    plans = list(candidates(base))
    logger.info(f"autotune: timing {len(plans)} candidate plan{'s' if len(plans) != 1 else ''} on this model: each is "
                f"built and warmed up, then all are timed in {ROUNDS} interleaved rounds of {steps} steps")
    trials: list[Trial] = []
    runs: dict[str, Callable[[], Any]] = {}
    labels: dict[str, dict[str, Any]] = {}  # the candidates still in the running

    def lost(label: str, exc: Exception, cand: Mapping[str, Any]) -> None:
        trials.append(Trial(cand["policy"], cand["xla"], None, f"{type(exc).__name__}: {str(exc)[:200]}"))
        logger.info(f"autotune: {label}: failed ({trials[-1].error})")

    timings = None
    trainers_log = logging.getLogger("amp_backends.train")  # the candidates' trainers say errors only: their
    level = trainers_log.level  # "Training on ...", "Summary: 10 steps" or "Interrupted ... at step 10" lines are
    trainers_log.setLevel(max(level, logging.ERROR))  # not the user's run (a candidate that fails says so below)
    try:
        for cand in plans:  # each built, traced and warmed up first; then timed interleaved, below
            reset()
            with warnings.catch_warnings():  # a candidate's downgrades and caveats are not the user's request
                warnings.simplefilter("ignore", AmpWarning)
                plan = auto_configure(**cand, verbose=False, registry=registry, **fixed)
            label = f"policy={cand['policy']} xla={cand['xla']}"
            try:
                models, updates, objs = build()
                trainer = Trainer(updates, plan, batch_size=batch_size, images_per_step=images_per_step,
                                  checkpoint_objects=objs, steps_per_call=steps, log_every=10**9, progress=False,
                                  batch_fn=batch_fn, check_models=False, measure_float32=False)
                runs[label] = _continue(trainer, x, y, steps)
                for _ in range(Trainer.WARMUP_CALLS):
                    runs[label]()
                labels[label] = cand
                logger.info(f"autotune: {label}: built and warmed up ({len(labels)} of {len(plans)})")
            except Exception as exc:  # a candidate that fails to compile or run simply loses, alone
                runs.pop(label, None)
                lost(label, exc, cand)
        reset()
        if runs:
            try:
                timings = interleaved(runs, rounds=ROUNDS, units=steps * (images_per_step or batch_size),
                                      on_error=lambda label, exc: lost(label, exc, labels.pop(label)))
                timings = Timings({k: v for k, v in timings.rates.items() if k in labels}, timings.steps, timings.units)
            except Exception as exc:
                logger.warning(f"autotune: timing the candidates failed ({type(exc).__name__}: {str(exc)[:200]})")
    except KeyboardInterrupt as exc:  # Ctrl-C (or SIGTERM) in a candidate's trainer: it is not the user's training
        reset()
        signum = getattr(exc, "signum", signal.SIGINT)
        raise TrainingInterrupted(signum, 0, None, f"Interrupted ({signal.Signals(signum).name}) while autotune timed "
                                  "the candidate plans: nothing was trained, saved or cached. Fix: run again to time "
                                  "them, or leave the tuning out (--tune) to train under the rules' plan.") from None
    finally:
        trainers_log.setLevel(level)
    timed: dict[str, Trial] = {}  # by label
    if timings is not None:
        for label, cand in labels.items():
            timed[label] = Trial(cand["policy"], cand["xla"], timings.median(label))
            low, high = timings.spread(label)
            logger.info(f"autotune: {label}: {timings.median(label):.4g} img/s (min-max {low:.4g}-{high:.4g})")
    trials += timed.values()
    if timings is None or not any(t.img_per_s for t in trials):
        logger.warning("autotune: every candidate failed; keeping the rule-based plan")
        return auto_configure(verbose=False, registry=registry, **fixed)
    rules_label = f"policy={base.policy} xla={base.xla}"
    winner = timings.winner(MARGIN)
    stays = winner is None and rules_label in labels  # within noise: no candidate beat all the others every round
    if stays:
        logger.info(f"autotune: no candidate was faster than every other in every one of {ROUNDS} interleaved rounds "
                    f"by more than {MARGIN - 1:.0%}: within noise, the rules' plan stays")
    best = timed[rules_label if stays else winner or max(labels, key=timings.median)]
    kept = key is not None and store(key, {"policy": best.policy, "xla": best.xla, "img_per_s": best.img_per_s,
                                           "date": time.strftime("%Y-%m-%d"), "trials": [t.__dict__ for t in trials],
                                           "within_noise": winner is None, "timings": timings.to_dict()})
    plan = _apply_choice(best.policy, best.xla, registry, fixed)
    rule = timed.get(rules_label)
    logger.info(f"autotune: chose policy={best.policy} xla={best.xla} at {best.img_per_s:.4g} img/s"
                + (f" (the rules' plan: {rule.img_per_s:.4g} img/s)" if rule else "")
                + (f"; cached in {cache_path()}" if kept else "; not cached"
                   + (" (see the warning above)" if key else "")))
    return plan
