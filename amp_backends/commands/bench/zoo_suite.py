"""The model-zoo benchmark: every zoo model under the float32 ``fit`` baseline, the manual configurations this
hardware runs, ``fit`` and the trainer under the auto plan, each configuration in a worker process of its own
(`zoo_worker`). Repetitions are interleaved, the order rotated each round; each figure is the median repetition with
its min-max spread (``docs/benchmarks.md``). ``zoo.json``'s schema is ``amp_backends/schemas/zoo.schema.json``.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any

from ...configure import plan_for
from ...registry import Peer, default_registry
from ...autotune.timing import Sample, Timings, interleaved
from ...zoo import ZOO, unavailable
from .output import environment, interrupted, run_header, write_json, zoo_markdown, zoo_table
from .supervisor import JsonWorker, WorkerFailed, child_env, terminate_as_exit
from ...errors import AmpConfigError


@dataclass(frozen=True)
class ZooConfig:
    """One configuration of the model zoo, run in a worker process of its own.

    Attributes:
        name: The configuration's name in the results (``"fp16+XLA"``, ``"auto plan, trainer"``).
        kind: ``"baseline"`` (``fit``, compile defaults), ``"manual"`` (``fit``, policy and XLA by hand), ``"peer"``
            (a float32 ``fit`` the way a user of this hardware would run it instead: another math library, a graph
            rewrite), ``"auto_fit"`` or ``"trainer"`` (``fit`` or the trainer under the auto plan).
        policy: The Keras dtype policy (the auto plan's for ``auto_fit`` and ``trainer``).
        xla: ``compile``'s ``jit_compile``; ``None``: Keras's default.
        tf32: Whether float32 matmuls may use TF32; ``None``: TensorFlow's default.
        seed: The initial weights' and the step's random seed (the data are the same in every configuration).
        env: A peer's environment variables, set before its process starts.
        rewrite: A peer's grappler rewrite (a ``tf.config.optimizer`` option), or ``None``.
    """

    name: str
    kind: str
    policy: str = "float32"
    xla: bool | None = None
    tf32: bool | None = None
    seed: int = 0
    env: tuple[tuple[str, str], ...] = ()
    rewrite: str | None = None

    @property
    def compute_dtype(self) -> str:
        """The dtype the matrix work runs in: the policy's, or bfloat16 for a peer that rewrites to it."""
        if "bfloat16" in (self.rewrite or "") or any(k.endswith("_BF16") and v == "1" for k, v in self.env):
            return "bfloat16"
        return {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}.get(self.policy, "float32")


BASELINE = ZooConfig("float32 fit (defaults)", "baseline")
# from other initial weights: the float32 run-to-run spread a loss parity is judged against
BASELINE_SEED1 = ZooConfig("float32 fit (defaults), seed 1", "baseline", seed=1)


def configurations(plan: Any, peers: Sequence[Peer] = ()) -> list[ZooConfig]:
    """The baselines, the manual configurations this hardware runs natively (without and with XLA; TF32 too where
    the plan uses it), the backend's peers (XLA off), ``fit`` and the trainer under the plan."""
    native = [p for p, s in (plan.assessment.policies.items() if plan.assessment else []) if s.level == "native"]
    manual: list[ZooConfig] = []
    for policy, short in (("float32", "fp32"), ("mixed_float16", "fp16"), ("mixed_bfloat16", "bf16")):
        if policy != "float32" and policy not in native:
            continue
        for xla in (False, True):
            tf32 = False if policy == "float32" else None
            manual.append(ZooConfig(short + ("+XLA" if xla else ""), "manual", policy, xla, tf32))
            if policy == "float32" and plan.tf32:
                manual.append(ZooConfig("TF32" + ("+XLA" if xla else ""), "manual", policy, xla, True))
    manual += [ZooConfig(p.name, "peer", "float32", False, None, env=p.env, rewrite=p.rewrite) for p in peers]
    auto = plan.policy
    return [BASELINE, BASELINE_SEED1, *manual, ZooConfig("auto plan, fit", "auto_fit", auto),
            ZooConfig("auto plan, trainer", "trainer", auto)]


def backend_peers(backend: str) -> tuple[Peer, ...]:
    """The planned backend's peers on this machine (none where its probe or its peers fail)."""
    try:
        chosen = default_registry().get(backend)
        return tuple(chosen.peers(chosen.probe()))
    except Exception:  # noqa: BLE001  # the benchmark still runs, without peers
        return ()


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "reps": [round(v, 2) for v in values]}


class ZooRun:
    """A model zoo run: a worker process for each configuration, the models timed one after another.

    Args:
        configs: The configurations, one worker each.
        reps: Timed repetitions per configuration, interleaved.
        steps: Training steps per repetition.
        batch: One batch size for every model; ``None``: each model's own (its ``gpu_batch`` on a GPU).
        out: The results folder; the workers' output goes to its ``zoo_workers.log``.
        timeout_s: Seconds a worker may take over one request before it is stopped.
        peak_n: The size of the square matmuls that measure the peak.
        gpu: Whether the plan trains on a GPU.
    """

    def __init__(self, configs: list[ZooConfig], reps: int, steps: int, batch: int | None, out: Path,
                 timeout_s: float, peak_n: int, gpu: bool) -> None:
        self.configs, self.reps, self.steps, self.batch, self.gpu = configs, reps, steps, batch, gpu
        self.timeout_s, self.peak_n = timeout_s, peak_n
        self.parallel = max(1, min(len(configs), os.cpu_count() or 1))
        out.mkdir(parents=True, exist_ok=True)
        self.log = open(out / "zoo_workers.log", "a", buffering=1, encoding="utf-8")
        self.workers: dict[str, JsonWorker | None] = {}
        self.errors: dict[str, str] = {}

    def say(self, text: str) -> None:
        """Print a line of the run's progress, with the time.

        Args:
            text: The line.
        """
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    def spawn(self, cfg: ZooConfig) -> JsonWorker | None:
        """Start the configuration's worker, without waiting for it to be ready (`ready` does).

        Args:
            cfg: The configuration.

        Returns:
            The worker, or ``None`` where it could not start (the error kept in ``errors``).
        """
        cmd = [sys.executable, "-m", "amp_backends.commands.bench.zoo_worker", "--config", json.dumps(asdict(cfg))]
        env = {**child_env(), **dict(cfg.env)}
        if self.gpu and len(self.configs) > 1:
            # the workers share one GPU: TensorFlow's default reserves all of its memory for the first process to
            # allocate, and the others fail with out of memory (a value the user set stays)
            env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
        try:
            return JsonWorker(cmd, self.log, cfg.name, env=env)
        except OSError as exc:
            self.errors[cfg.name] = f"the {cfg.name} worker could not start: {exc}"
            return None

    def ready(self, cfg: ZooConfig, w: JsonWorker | None) -> JsonWorker | None:
        """``w`` once it has imported TensorFlow and set its configuration up, else None (the error kept)."""
        if w is None:
            return None
        try:
            if not (r := w.receive(self.timeout_s)).get("ok"):
                raise WorkerFailed(f"the {cfg.name} worker could not start: {r.get('error')}")
            return w
        except WorkerFailed as exc:
            self.errors[cfg.name] = str(exc)
            self.say(f"  {cfg.name}: {exc}")
            w.close()
            return None

    def start_all(self) -> None:
        """All workers at once: their start-up (importing TensorFlow) overlaps."""
        spawned = {c.name: self.spawn(c) for c in self.configs}
        for c in self.configs:
            self.workers[c.name] = self.ready(c, spawned[c.name])

    def _call(self, cfg: ZooConfig, call: Callable[[JsonWorker], Any], fresh: bool = True) -> Any:
        """``call`` on the configuration's worker (with ``fresh``, a new one for a worker that failed); a worker
        that cannot start or fails gives ``{"ok": False, "error": ...}``, and a failed one is dropped."""
        w = self.workers.get(cfg.name)
        if fresh and (w is None or not w.alive()):
            w = self.workers[cfg.name] = self.ready(cfg, self.spawn(cfg))
        if w is None:
            return {"ok": False, "error": self.errors.get(cfg.name, "the worker could not start")}
        try:
            return call(w)
        except WorkerFailed as exc:
            self.workers[cfg.name] = None
            return {"ok": False, "error": str(exc)}

    def ask(self, cfg: ZooConfig, **req: Any) -> dict[str, Any]:
        """One request to the configuration's worker (a new worker where the last one failed).

        Args:
            cfg: The configuration.
            **req: The request's fields (``op``: what the worker is asked to do, as `zoo_worker` lists).

        Returns:
            The answer; ``{"ok": False, "error": ...}`` where the worker could not start or failed.
        """
        return self._call(cfg, lambda w: w.request(self.timeout_s, **req))

    def peaks(self, dtypes: list[str]) -> dict[str, Any]:
        """Measure the matmul peak of each dtype in a plain float32 worker, and TF32's where a configuration asks for it
        or on a GPU.

        Args:
            dtypes: The dtypes to measure (``"float32"``, ``"bfloat16"``...).

        Returns:
            GFLOP/s by dtype (``tf32`` too, where measured), or ``{"error": ...}``.
        """
        # a plain float32 worker, never a peer (its math library would set the peak the models are held against)
        plain = [c for c in self.configs if c.kind != "peer"] or self.configs
        ref = next((c for c in plain if c.kind == "manual" and c.policy == "float32"), plain[0])
        r = self.ask(ref, op="peak", dtypes=dtypes, n=self.peak_n, repeats=5)  # float32: TF32 off
        peaks = {k: v for k, v in r.items() if k != "ok"} if r.get("ok") else {"error": r.get("error")}
        # TF32: where a configuration asks for it, and on a GPU, where TensorFlow's default turns it on
        if self.gpu or any(c.tf32 for c in self.configs):
            r = self.ask(ref, op="peak", dtypes=["float32"], n=self.peak_n, repeats=5, tf32=True)
            peaks["tf32"] = r.get("float32") if r.get("ok") else r.get("error")
        self.say("matmul peak, GFLOP/s: " + json.dumps(peaks))
        return peaks

    def model(self, name: str) -> dict[str, Any]:
        """Time one model in every configuration: the workers build and compile it side by side, the repetitions run
        interleaved, then each worker gives the model's loss.

        Args:
            name: A model of `amp_backends.zoo.ZOO`.

        Returns:
            The model's entry of ``zoo.json``'s ``models`` (``skipped``, with why, where it cannot be built here).
        """
        entry = ZOO[name]
        why = unavailable(entry)
        if why:
            self.say(f"{name}: skipped: {why}")
            return {"model": name, "title": entry.title, "skipped": why}
        batch = self.batch or (entry.gpu_batch if self.gpu else entry.batch)
        rec: dict[str, Any] = {"model": name, "title": entry.title, "unit": entry.unit, "batch": batch,
                               "steps_per_rep": self.steps, "configs": {}}
        configs = rec["configs"]
        self.say(f"{name}: {entry.title}, batch {batch}: building and compiling in every configuration")
        # workers prepare side by side, as many at a time as there are cores (untimed: XLA compiles mostly on one)
        def prepare(i: int) -> dict[str, Any] | None:  # sent without waiting: None, else the failure
            return self._call(self.configs[i], lambda w: w.send(op="prepare", model=name, batch=batch,
                                                                steps=self.steps, flops=i == 0))

        sent = [prepare(i) for i in range(self.parallel)]
        live = []
        for i, cfg in enumerate(self.configs):
            r = sent[i] or self._call(cfg, lambda w: w.receive(self.timeout_s), fresh=False)
            if i + self.parallel < len(self.configs):
                sent.append(prepare(i + self.parallel))
            c = configs[cfg.name] = {"kind": cfg.kind, "compute_dtype": cfg.compute_dtype,
                                     **{k: v for k, v in r.items() if k != "ok"}}
            if r.get("ok"):
                live.append(cfg)
                if "flops_per_sample" in r:
                    rec["flops_per_sample"], rec["flops_note"] = r["flops_per_sample"], r["flops_note"]
            outcome = f"ready (warm-up {r['warmup_s']} s)" if r.get("ok") else f"failed: {c['error']}"
            self.say(f"  {cfg.name:24s} {outcome}")
        calls: dict[str, list[float]] = {c.name: [] for c in live}
        predicts: dict[str, list[float]] = {c.name: [] for c in live}  # inference after each repetition

        def rep(cfg: ZooConfig) -> Sample:  # the worker times its own steps; the whole fit() call is kept beside
            r = self.ask(cfg, op="rep")
            if not r.get("ok"):
                raise WorkerFailed(r["error"])
            calls[cfg.name].append(r["samples"] / r["call_seconds"])
            if r.get("predict_seconds"):
                predicts[cfg.name].append(r["samples"] / r["predict_seconds"])
            elif r.get("predict_error"):
                configs[cfg.name]["predict_error"] = r["predict_error"]
            return Sample(r["samples"], r["seconds"])

        def failed(name: str, exc: Exception) -> None:
            configs[name]["error"] = str(exc)
            live[:] = [c for c in live if c.name != name]

        def said(r: int, t: Timings) -> None:
            self.say(f"  round {r + 1}/{self.reps}: " + ", ".join(f"{c.name} {t.rates[c.name][-1]:,.0f}" for c in live
                                                                   if t.rates[c.name]))

        timings = interleaved({c.name: functools.partial(rep, c) for c in live}, rounds=self.reps, on_error=failed,
                              after_round=said) if live else Timings({})
        for cfg in live:
            c = configs[cfg.name]
            c["samples_per_s"] = _spread(list(timings.rates[cfg.name]))
            c["call_samples_per_s"] = _spread(calls[cfg.name])  # the whole fit() call, its set-up included
            if predicts[cfg.name]:
                c["predict_samples_per_s"] = _spread(predicts[cfg.name])
            r = self.ask(cfg, op="loss")
            c["loss"], c["eval_loss"] = (r.get("loss"), r.get("eval_loss")) if r.get("ok") else (None, None)
            if not r.get("ok"):
                c["loss_error"] = r.get("error")
        return rec

    def close(self) -> None:
        """Stop every worker (all asked to quit first: they end side by side) and close the workers' log."""
        live = [w for w in self.workers.values() if w is not None]
        for wait in (False, True):  # all asked to quit first: they end side by side
            for w in live:
                w.close(wait)
        self.log.close()


# shorthands of --configs: the configuration kinds each selects
SHORTHANDS = {"baseline": ("baseline",), "auto": ("auto_fit", "trainer"), "peers": ("peer",)}


def run_zoo(models: list[str], config_names: list[str] | None, reps: int, steps: int, batch: int | None, out: Path,
            timeout_s: float = 900.0, peak_n: int | None = None) -> dict[str, Any]:
    """Run the zoo benchmark; write ``zoo.json`` and ``zoo.md`` into ``out``; return the report."""
    plan = plan_for()  # the environment's overrides too, as the workers' auto_configure() reads them
    every = configs = configurations(plan, backend_peers(plan.backend))
    if config_names:
        unknown = [n for n in config_names if n not in {c.name for c in every} | set(SHORTHANDS)]
        if unknown:
            raise AmpConfigError(f"unknown zoo configuration(s) {unknown}; on this machine: "
                                 f"{', '.join(c.name for c in every)} (and the shorthands baseline, auto, peers). "
                                 "Fix: pass some of those to --configs, comma-separated, or leave it out (every one).")
        configs = [c for c in every if c.name in config_names
                   or any(c.kind in SHORTHANDS.get(n, ()) for n in config_names)]
        if not configs:
            raise AmpConfigError(
                f"--configs {','.join(config_names)} selects nothing on this machine (it has no peers); "
                f"on this machine: {', '.join(c.name for c in every)}. Fix: pass some of those to --configs.")
    gpu = not str(plan.device).upper().startswith("/CPU")
    dtypes = sorted({c.compute_dtype for c in configs} | {"float32"})
    runner = ZooRun(configs, reps, steps, batch, out, timeout_s, peak_n or (8192 if gpu else 2048), gpu)
    t0 = time.time()
    terminate_as_exit()
    report: dict[str, Any] = {**run_header(), "what": "model zoo", "plan": plan.summary(), "plan_policy": plan.policy,
                              "settings": {"reps": reps, "steps_per_rep": steps, "batch": batch or "per model",
                                           "warmup_reps": 1, "configs": [asdict(c) for c in configs],
                                           "figure": "median repetition, samples/s (min-max over repetitions); a "
                                                     "repetition is one fit()/Trainer.fit() call, timed from the start "
                                                     "of its training to its end (call_samples_per_s: the whole call; "
                                                     "predict_samples_per_s: as many inference batches after each "
                                                     "repetition, Trainer.predict for the trainer, predict_on_batch "
                                                     "for fit)"},
                              "models": []}
    stopped: KeyboardInterrupt | None = None
    try:
        runner.say(f"zoo: {len(models)} model(s) x {len(configs)} configuration(s), {reps} interleaved repetitions of "
                   f"{steps} steps; plan: {plan.summary()}")
        runner.start_all()
        report["peak_gflops_start"] = report["peak_gflops"] = runner.peaks(dtypes)
        for name in models:
            report["models"].append(runner.model(name))
            report["elapsed_s"] = round(time.time() - t0, 1)
            write_json(out / "zoo.json", report)
        # once more at the end: a machine busy at one moment does not lower the peak the models are held against
        report["peak_gflops_end"] = runner.peaks(dtypes)
        report["peak_gflops"] = {k: max((p.get(k) for p in (report["peak_gflops_start"], report["peak_gflops_end"])
                                         if isinstance(p.get(k), (int, float))), default=None)
                                 for k in report["peak_gflops_start"]}
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the models finished so far are written, then it goes on
        stopped = exc
        report["interrupted"] = interrupted(exc)
    finally:
        runner.close()
    report["environment"] = environment()
    report["elapsed_s"] = round(time.time() - t0, 1)
    summarize(report)
    write_json(out / "zoo.json", report)
    (out / "zoo.md").write_text(zoo_markdown(report))
    zoo_table(report)
    print(f"Written to {out}: zoo.json, zoo.md", flush=True)
    if stopped:
        raise stopped
    return report


def summarize(report: dict[str, Any]) -> None:
    """Per model: speed-up of the auto plan over the baseline, ratio to the best manual configuration, share of
    the measured peak of each configuration's compute dtype, loss difference to the baseline."""
    peaks = report.get("peak_gflops") or {}
    for m in report["models"]:
        if m.get("skipped"):  # (its reason is all there is to say)
            continue
        cfgs = m.get("configs") or {}
        rate = {n: c["samples_per_s"]["median"] for n, c in cfgs.items() if c.get("samples_per_s")}
        base = rate.get(BASELINE.name)
        manual = {n: r for n, r in rate.items() if cfgs[n]["kind"] in ("manual", "peer")}
        best = max(manual, key=lambda n: manual[n]) if manual else None
        m["best_manual"] = best
        base_loss = (cfgs.get(BASELINE.name) or {}).get("loss")
        other = (cfgs.get(BASELINE_SEED1.name) or {}).get("loss")
        spread = abs(other - base_loss) if other is not None and base_loss is not None else None
        m["float32_loss_spread"] = spread
        for n, c in cfgs.items():
            r = rate.get(n)
            c["x_baseline"] = r / base if r and base else None
            c["x_best_manual"] = r / manual[best] if r and best else None
            # float32 matmuls that ran in TF32 (asked for, or TensorFlow's default on a GPU) against TF32's peak
            # (a file from before workers said it: the TF32 configurations by name)
            tf32 = c.get("tf32", n.startswith("TF32")) and c["compute_dtype"] == "float32" and "tf32" in peaks
            peak = peaks.get("tf32" if tf32 else c["compute_dtype"])
            flops = m.get("flops_per_sample")
            measured = isinstance(peak, (int, float)) and peak > 0  # (a peak that rounds to 0.0 shares nothing)
            c["share_of_peak"] = (flops * r / 1e9 / peak) if r and flops and measured else None
            c["loss_vs_baseline"] = ((c["loss"] - base_loss) if c.get("loss") is not None and base_loss is not None
                                     else None)
            c["loss_within_spread"] = (abs(c["loss_vs_baseline"]) <= spread if c["loss_vs_baseline"] is not None
                                       and spread is not None else None)
