"""The GPU suite's worker process: experiments run here (TensorFlow imported), each event reported as a JSON
line to the events file that ``gpu_suite.Suite`` watches. The experiments themselves are in
``gpu_suite_experiments``; this module holds what they share: sizes, timing, the trainer runs, the rows.

Figures: images per second of the median timed epoch after one warm-up epoch (tracing, XLA compilation),
images counted as the tutorials counted them (MNIST: the batch per step; GAN: 2 x batch). For the
trainer, an epoch's time runs from the end of the previous epoch's last call to the end of its own last
call, inside one ``fit`` (the trainer's own overhead between calls included, the data upload of ``fit``
excluded); "per call" is the median of the calls' own step times. A trainer configuration on resident
MNIST arrays that an earlier experiment already measured (same plan, steps per call, unrolling, model)
is not compiled again: its row repeats those figures and says where they come from.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from gpu_suite import BY_NAME, EXPERIMENTS, FULL, TINY, Clock

class TimeUp(Exception):
    """An experiment's time limit passed inside a measurement: what was measured is kept."""


class Worker:
    """Runs experiments in this process (TensorFlow imported here) and reports each event as a JSON line."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.events = open(args.events, "a", buffering=1, encoding="utf-8")
        self.deadline = float(args.deadline)
        self.sizes = TINY if args.tiny else FULL
        self.clock = Clock()
        self.exp_deadline = self.deadline
        self.current = ""
        self.measured: dict[Any, tuple[str, dict[str, Any]]] = {}  # resident MNIST configurations measured so far

    def emit(self, **ev: Any) -> None:
        self.events.write(json.dumps(ev, default=str) + "\n")
        self.events.flush()

    def say(self, text: str) -> None:
        print(f"{self.clock.stamp()} {text}", flush=True)

    def left(self) -> float:
        return self.exp_deadline - time.time()

    # -- setup -----------------------------------------------------------------------------------
    def start(self) -> None:
        import logging

        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("amp_backends").setLevel(logging.WARNING)
        import numpy as np

        from amp_backends.data import synthetic_mnist
        from amp_backends.tf_import import exit_quickly, import_tensorflow

        exit_quickly()  # as the package's own processes: no collection during TensorFlow's import, none at exit
        tf = import_tensorflow(quiet=False)

        self.np, self.tf = np, tf
        sw: dict[str, Any] = {"tensorflow": tf.__version__, "keras": getattr(tf.keras, "__version__", None)}
        try:
            import keras

            sw["keras"] = keras.__version__
        except Exception:
            pass
        try:
            info = tf.sysconfig.get_build_info()
            sw["cuda_build"], sw["cudnn_build"] = info.get("cuda_version"), info.get("cudnn_version")
        except Exception:
            pass
        gpus = tf.config.list_physical_devices("GPU")
        details = []
        for g in gpus:
            try:
                d = tf.config.experimental.get_device_details(g)
                capability = ".".join(map(str, d.get("compute_capability", ())))
                details.append(f"{d.get('device_name', g.name)} (CC {capability})")
            except Exception:
                details.append(g.name)
        sw["gpus_tf"] = details
        sw["tf32_default"] = tf.config.experimental.tensor_float_32_execution_enabled()
        self.emit(event="software", data=sw)
        self.say(f"TensorFlow {sw['tensorflow']}, Keras {sw['keras']}, GPUs: {details or 'none'}")
        s = self.sizes
        (self.x, self.y), _ = synthetic_mnist(s["samples"], 8)
        self.E = s["samples"] // s["mnist_batch"]  # MNIST steps per epoch (58)
        self.G = s["samples"] // s["gan_batch"]  # GAN steps per epoch (14)
        from amp_backends.training.step import UNROLL_LIMIT, unrolls

        self.unroll_limit = UNROLL_LIMIT
        device_type = "GPU" if self.tf.config.list_physical_devices("GPU") else "CPU"
        self.default_unrolled = lambda steps: unrolls(device_type, True, steps)  # the trainer's default under XLA
        for label, overrides in (("auto", {}), ("auto, XLA forced on", {"xla": "on"})):
            try:
                self.emit(event="plan", label=label, data=self.plan(**overrides).summary())
            except Exception as exc:
                self.emit(event="plan", label=label, data=f"failed: {type(exc).__name__}: {exc}")

    def fresh(self) -> None:
        """A fresh Keras session (it also resets Keras's global dtype policy) and no plan applied."""
        import gc

        from amp_backends.configure import reset

        self.tf.keras.backend.clear_session()
        gc.collect()
        reset()

    def plan(self, **overrides: Any) -> Any:
        """A fresh Keras session and the plan applied again."""
        from amp_backends.configure import auto_configure

        self.fresh()
        return auto_configure(verbose=False, **overrides)

    # -- measuring -------------------------------------------------------------------------------
    def spc_list(self, values: tuple[int, ...]) -> list[int]:
        seen: list[int] = []
        for v in values:
            v = min(v, self.E) if not self.args.tiny else min({1: 1, 8: 2, 16: 3}.get(v, v), self.E)
            if v not in seen:
                seen.append(v)
        return seen

    def row(self, label: str, fn: Callable[[], dict[str, Any]], min_left: float = 2.0, smoke: bool = True,
            **config: Any) -> None:
        """Measure one configuration; any error is recorded on its row and the experiment goes on.

        ``smoke=False``: left out of a --tiny run (another row there runs the same code path).
        """
        r: dict[str, Any]
        if self.args.tiny and not smoke:
            r = {"label": label, "config": config, "status": "skipped", "img_per_s": None,
                 "error": "left out of the tiny run (another row runs the same code)"}
        elif self.left() < min_left:
            r = {"label": label, "config": config, "status": "skipped", "img_per_s": None,
                 "error": "the experiment's time limit was reached"}
        else:
            self.say(f"   {self.current}: {label} ...")
            t0 = time.time()
            try:
                r = {"label": label, "config": config, "status": "ok", **fn()}
            except TimeUp as exc:
                r = {"label": label, "config": config, "status": "partial", "img_per_s": None, "error": str(exc)}
            except Exception as exc:
                tb = traceback.format_exc().strip().splitlines()
                message = str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ""
                r = {"label": label, "config": config, "status": "failed", "img_per_s": None,
                     "error": f"{type(exc).__name__}: {message}",
                     "traceback": tb[-12:]}
            r["seconds"] = round(time.time() - t0, 1)
        if r.get("status") == "partial" and r.get("epoch_img_per_s"):
            r["img_per_s"] = statistics.median(r["epoch_img_per_s"])
        self.say(f"   {self.current}: {label}: "
                 + (f"{r['img_per_s']:,.0f} img/s" if r.get("img_per_s") else f"{r['status']}: {r.get('error')}")
                 + (f" (per call {r['call_img_per_s']:,.0f})" if r.get("call_img_per_s") else "")
                 + (f", warm-up {r['warmup_s']} s" if r.get("warmup_s") is not None else ""))
        self.emit(event="row", name=self.current, row=r)

    def timer(self, per_step: int, stop_at_deadline: bool = True) -> Any:
        from amp_backends.training import Observer

        worker = self

        class EpochTimer(Observer):
            def __init__(self) -> None:
                self.calls: list[tuple[float, int, int, float]] = []
                self.t_start: float | None = None

            def on_fit_start(self, start_step: int, total_steps: int | None) -> None:
                if self.t_start is None:
                    self.t_start = time.perf_counter()

            def after_call(self, r: Any) -> None:
                self.calls.append((time.perf_counter(), int(r.epoch), int(r.steps), float(r.step_time)))
                if stop_at_deadline and time.time() > worker.exp_deadline:
                    raise TimeUp(f"time limit reached at epoch {r.epoch}")

            def stats(self, steps_per_epoch: int) -> dict[str, Any]:
                ends: dict[int, list[float]] = {}
                per_call: dict[int, list[float]] = {}
                for t, e, n_steps, step_time in self.calls:
                    ends.setdefault(e, [t, 0])
                    ends[e][0] = t
                    ends[e][1] += n_steps
                    per_call.setdefault(e, []).append(per_step / step_time)
                epochs = sorted(ends)
                if not epochs:
                    return {"epoch_img_per_s": []}
                first = epochs[0]
                rates, calls = [], []
                prev = ends[first][0]
                for e in epochs[1:]:
                    t, steps = ends[e]
                    if steps == steps_per_epoch:
                        rates.append(steps * per_step / (t - prev))
                        calls += per_call[e]
                    prev = t
                return {"epoch_img_per_s": [round(v, 1) for v in rates],
                        "img_per_s": statistics.median(rates) if rates else None,
                        "call_img_per_s": statistics.median(calls) if calls else None,
                        "warmup_s": round(ends[first][0] - (self.t_start or ends[first][0]), 2),
                        "calls_per_epoch": len(per_call[epochs[-1]])}

        return EpochTimer()

    def trainer_fit(self, make_updates: Callable[[], Any], plan: Any, *, batch: int, per_step: int, spc: int,
                    unroll: bool | None, data: Any = "arrays", steps_per_epoch: int, epochs: int | None = None) -> dict:
        """Build a Trainer, fit 1 + N epochs in one call, time each epoch and call."""
        from amp_backends.training import Trainer
        from amp_backends.training import mnist_batch_fn

        timer = self.timer(per_step)
        stream = not isinstance(data, str)
        trainer = Trainer(make_updates(), plan, batch_size=batch, steps_per_call=spc, unroll_steps=unroll,
                          log_every=10**9, progress=False, batch_fn=None if stream else mnist_batch_fn,
                          images_per_step=per_step, observers=[timer], check_models=False)
        n = 1 + (epochs or self.sizes["timed_epochs"])
        t0 = time.perf_counter()
        try:
            if stream:
                trainer.fit(data, epochs=n)
            else:
                trainer.fit(self.x, self.y if data == "arrays" else None, epochs=n)
        except TimeUp:
            s = timer.stats(steps_per_epoch)
            if not s.get("img_per_s"):
                raise TimeUp(f"time limit reached before a timed epoch ended (warm-up "
                             f"{s.get('warmup_s', round(time.perf_counter() - t0, 1))} s)") from None
            s.update(status="partial", error="time limit reached: fewer timed epochs")
            return s
        s = timer.stats(steps_per_epoch)
        s["fit_setup_s"] = round((timer.t_start or t0) - t0, 3)
        s["unrolled"] = trainer.program.unrolled(spc) if not stream else None
        return s

    # -- models ----------------------------------------------------------------------------------
    def mnist_updates(self, no_dropout: bool = False) -> Callable[[], Any]:
        def make() -> Any:
            from amp_backends.models import mnist_cnn
            from amp_backends.training import classifier_updates

            model = mnist_cnn_without_dropout(self.tf) if no_dropout else mnist_cnn()
            return classifier_updates(model, self.tf.keras.optimizers.Adam(self.sizes["lr"]))

        return make

    def gan_updates(self) -> Any:
        from amp_backends.models import gan_discriminator, gan_generator
        from amp_backends.training import gan_updates

        tf = self.tf
        return gan_updates(gan_generator(), gan_discriminator(), tf.keras.optimizers.Adam(1e-3),
                           tf.keras.optimizers.RMSprop(1e-4))

    def mnist_row(self, label: str, overrides: dict[str, Any], spc: int, unroll: bool | None = None,
                  no_dropout: bool = False, data: Any = "arrays", min_left: float = 2.0, smoke: bool = True) -> None:
        B = self.sizes["mnist_batch"]

        def run() -> dict[str, Any]:
            plan = self.plan(**overrides)
            unrolled = (plan.xla and self.default_unrolled(spc)) if unroll is None else unroll
            key = (plan.training_key(), spc, unrolled, no_dropout) if data == "arrays" else None
            if key in self.measured:  # the same configuration, already measured in this run: not compiled again
                where, r = self.measured[key]
                return {**r, "note": f"the figures of {where} (the same configuration; measured once)", "reused": where}
            d = data() if callable(data) else data
            r = self.trainer_fit(self.mnist_updates(no_dropout), plan, batch=B, per_step=B, spc=spc, unroll=unroll,
                                 data=d, steps_per_epoch=self.E)
            r["plan"] = plan_line(plan)
            if key is not None and r.get("img_per_s") and r.get("status") != "partial":
                self.measured[key] = (f"{self.current}: {label}", r)
            return r

        self.row(label, run, min_left=min_left, smoke=smoke, model="mnist", batch=B, steps_per_call=spc,
                 unroll_steps=unroll, plan_overrides=overrides, data=data if isinstance(data, str) else "tf.data",
                 dropout=not no_dropout)

    # -- the experiments -------------------------------------------------------------------------
    XLA = {"xla": "on"}  # on the GPU the auto plan has XLA on anyway; on a CPU this forces it (with a warning)
    AUTO: dict[str, Any] = {}  # the auto plan as it is

    def note(self, text: str) -> None:
        self.emit(event="note", name=self.current, text=text)

    # -- the loop --------------------------------------------------------------------------------
    def main(self) -> int:
        names = [n for n in (e.name for e in EXPERIMENTS) if n in self.args.only and n != "bench"]
        self.start()
        for name in names:
            exp = BY_NAME[name]
            left = self.deadline - time.time()
            if left < exp.min_s:
                self.emit(event="skip", name=name, why=f"only {max(left, 0):.0f} s left in the budget")
                self.say(f"== {name}: skipped, {left:.0f} s left")
                continue
            limit = min(exp.tiny_limit_s if self.args.tiny else exp.limit_s, left)
            self.current = name
            self.exp_deadline = time.time() + limit
            self.emit(event="start", name=name, limit_s=limit)
            self.say(f"== {name} (limit {limit:.0f} s): {exp.title}")
            t0 = time.time()
            status, error, extra = "done", None, None
            fault = dict(f.split(":", 1) for f in os.environ.get("GPU_SUITE_FAULTS", "").split(",") if ":" in f)
            try:
                if name in fault:  # to test the recovery: GPU_SUITE_FAULTS=gan:crash,profile:hang
                    {"crash": os.abort, "hang": lambda: time.sleep(10**6)}.get(fault[name], lambda: 1 / 0)()
                extra = getattr(self, f"exp_{name}")()
            except Exception as exc:
                status, error = "failed", f"{type(exc).__name__}: {exc}"[:600] + " | " + " / ".join(
                    traceback.format_exc().strip().splitlines()[-6:])
            self.emit(event="done", name=name, status=status, error=error, elapsed_s=round(time.time() - t0, 1),
                      extra=extra)
            self.say(f"== {name}: {status} in {time.time() - t0:.1f} s" + (f": {error}" if error else ""))
        return 0


def plan_line(plan: Any) -> str:
    ls = getattr(plan.loss_scale, "mode", plan.loss_scale)
    return (f"{plan.policy}, XLA {'on' if plan.xla else 'off'}, TF32 {'on' if plan.tf32 else 'off'}, "
            f"loss scale {ls}, {plan.device}")


def mnist_cnn_without_dropout(tf: Any) -> Any:
    """models.mnist_cnn with every Dropout rate 0 (Keras then draws no random numbers): same layers, same parameters."""
    from amp_backends.models import mnist_cnn

    base = mnist_cnn()
    config = base.get_config()
    changed = 0
    for layer in config["layers"]:
        if layer.get("class_name") == "Dropout":
            layer["config"]["rate"] = 0.0
            changed += 1
    model = tf.keras.Sequential.from_config(config)
    if changed == 0 or model.count_params() != base.count_params():
        raise RuntimeError(f"the copy without dropout differs: {changed} Dropout layers changed, "
                           f"{model.count_params()} vs {base.count_params()} parameters")
    return model
