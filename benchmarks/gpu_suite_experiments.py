"""The GPU suite's experiments (``exp_<name>`` for each name of ``gpu_suite.EXPERIMENTS``), and the
worker's entry point: ``python benchmarks/gpu_suite_experiments.py`` (started by the suite)."""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

from gpu_suite import BY_NAME
from gpu_suite_trace import summarize_trace
from gpu_suite_worker import Worker, plan_line

from amp_backends.commands.bench.supervisor import exit_with_parent


class Experiments(Worker):
    def exp_mnist_steps_per_call(self) -> None:
        self.note("auto plan with XLA forced on; default unrolling: a tf.range loop on a GPU (on a CPU unrolled up to "
                  f"UNROLL_LIMIT={self.unroll_limit} steps)")
        for spc in self.spc_list((self.E, 16, 8, 1)):
            label = f"{spc} step{'s' if spc > 1 else ''}/call" + (" (one epoch)" if spc == self.E else "")
            self.mnist_row(label, self.XLA, spc, smoke=spc == self.E)

    def exp_mnist_unroll(self) -> None:
        self.note("complements mnist_steps_per_call (its rows use the default unrolling): each row here is the other "
                  "mode; the unrolled epoch-long call comes last (longest compilation)")
        spcs = self.spc_list((16, 8, self.E))
        spcs = [s for s in spcs if s != self.E] + ([self.E] if self.E in spcs else [])
        for spc in spcs:
            default_unrolled = self.default_unrolled(spc)
            unroll = not default_unrolled
            self.mnist_row(f"{spc} steps/call, {'unrolled' if unroll else 'loop'}", self.XLA, spc, unroll=unroll)

    def exp_mnist_fit_per_epoch(self) -> None:
        B, E = self.sizes["mnist_batch"], self.E
        self.mnist_row(f"one fit, {E} steps/call", self.AUTO, E)

        def per_epoch() -> dict[str, Any]:
            from amp_backends.training import Trainer
            from amp_backends.training import mnist_batch_fn

            plan = self.plan(**self.AUTO)
            timer = self.timer(B, stop_at_deadline=False)
            trainer = Trainer(self.mnist_updates()(), plan, batch_size=B, steps_per_call=E, log_every=10**9,
                              progress=False, batch_fn=mnist_batch_fn, observers=[timer], check_models=False)
            rates, setups = [], []
            for e in range(1, 2 + self.sizes["timed_epochs"]):
                timer.t_start = None
                t0 = time.perf_counter()
                trainer.fit(self.x, self.y, epochs=e)
                dt = time.perf_counter() - t0
                if e > 1:
                    rates.append(E * B / dt)
                    setups.append((timer.t_start or t0) - t0)
                if time.time() > self.exp_deadline and rates:
                    break
            return {"img_per_s": statistics.median(rates), "epoch_img_per_s": [round(v, 1) for v in rates],
                    "fit_setup_s": round(statistics.median(setups), 3), "plan": plan_line(plan),
                    "note": f"fit(x, y, epochs=e) per epoch, as the benchmark; setup (upload, checks) "
                            f"{statistics.median(setups) * 1e3:.1f} ms per fit"}

        self.row("one fit per epoch (as the benchmark)", per_epoch, model="mnist", batch=B, steps_per_call=E)

    def exp_mnist_placement(self) -> None:
        tf, B, E = self.tf, self.sizes["mnist_batch"], self.E
        self.mnist_row(f"resident arrays, {E} steps/call", self.AUTO, E, smoke=False)

        def dataset() -> Any:
            ds = tf.data.Dataset.from_tensor_slices((self.x, self.y)).shuffle(len(self.x), seed=0)
            ds = ds.batch(B, drop_remainder=True).map(
                lambda a, b: (tf.reshape(tf.cast(a, tf.float32) / 255.0, [-1, 28, 28, 1]), b),
                num_parallel_calls=tf.data.AUTOTUNE)
            return ds

        self.mnist_row(f"tf.data pipeline (fit(dataset), prefetched to the device), {E} steps/call", self.AUTO, E,
                       data=dataset)
        self.mnist_row("tf.data pipeline, 1 step/call", self.AUTO, 1, data=dataset, smoke=False)
        k = self.spc_list((8,))[0]

        def host_per_call() -> dict[str, Any]:
            from amp_backends.training import Trainer
            from amp_backends.training import mnist_batch_fn

            plan = self.plan(**self.AUTO)
            trainer = Trainer(self.mnist_updates()(), plan, batch_size=B, steps_per_call=k, log_every=10**9,
                              progress=False, batch_fn=mnist_batch_fn, check_models=False)
            chunk = k * B
            chunks = [(self.x[i:i + chunk], self.y[i:i + chunk])
                      for i in range(0, (len(self.x) // chunk) * chunk, chunk)]
            fits = 0
            rates = []
            for epoch in range(1 + self.sizes["timed_epochs"]):
                t0 = time.perf_counter()
                for xc, yc in chunks:
                    fits += 1
                    trainer.fit(xc, yc, epochs=fits)
                if epoch:
                    rates.append(len(chunks) * chunk / (time.perf_counter() - t0))
                    if time.time() > self.exp_deadline:
                        break
            return {"img_per_s": statistics.median(rates), "epoch_img_per_s": [round(v, 1) for v in rates],
                    "plan": plan_line(plan),
                    "note": f"{len(chunks)} fit() calls per pass, each on {k} batches of host numpy "
                            f"({len(chunks) * k} of {E} steps per pass)"}

        self.row(f"host numpy fed per call ({k} steps/call: fit() per chunk)", host_per_call, model="mnist",
                 batch=B, steps_per_call=k, data="host numpy per call")

    def exp_mnist_dropout_rng(self) -> None:
        E = self.E
        self.mnist_row(f"Dropout as in the model, {E} steps/call", self.AUTO, E, smoke=False)
        self.mnist_row(f"Dropout rates 0 (no random numbers), {E} steps/call", self.AUTO, E, no_dropout=True)

    def exp_mnist_policy(self) -> None:
        E = self.E
        self.mnist_row("auto plan", self.AUTO, E, smoke=False)
        forced = {**self.AUTO, "force": True}  # a policy slow here is honoured all the same (not downgraded)
        self.mnist_row("mixed_bfloat16", {**forced, "policy": "mixed_bfloat16"}, E)
        self.mnist_row("mixed_float16, no loss scaling", {**forced, "policy": "mixed_float16", "loss_scale": "none"}, E)
        self.mnist_row("float32 (TF32 as planned)", {**forced, "policy": "float32"}, E, smoke=False)

    def exp_loss_fetch(self) -> None:
        tf, B, E = self.tf, self.sizes["mnist_batch"], self.E
        self.note("hand-written: one jit-compiled step per tf.function call, data resident on the device and gathered "
                  "in the step, the plan's dtype policy, no loss scaling")

        def run(fetch: bool) -> dict[str, Any]:
            from amp_backends.models import mnist_cnn

            plan = self.plan(**self.AUTO)
            with tf.device(plan.device):
                xd, yd = tf.constant(self.x), tf.constant(self.y)
            model = mnist_cnn()
            opt = tf.keras.optimizers.Adam(self.sizes["lr"])
            loss_obj = tf.keras.losses.SparseCategoricalCrossentropy()

            @tf.function(jit_compile=plan.xla)
            def step(i):
                idx = i * B + tf.range(B)
                xb = tf.reshape(tf.cast(tf.gather(xd, idx), tf.float32) / 255.0, [-1, 28, 28, 1])
                with tf.GradientTape() as tape:
                    loss = loss_obj(tf.gather(yd, idx), model(xb, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
                return loss

            idx = [tf.constant(i, tf.int32) for i in range(E)]

            def epoch() -> None:
                loss: Any = None
                for i in idx:
                    loss = step(i)
                    if fetch:
                        float(loss)
                float(loss)  # one fetch at the end of the epoch: the work is done

            t0 = time.perf_counter()
            epoch()
            warm = time.perf_counter() - t0
            rates = []
            for _ in range(self.sizes["timed_epochs"]):
                t0 = time.perf_counter()
                epoch()
                rates.append(E * B / (time.perf_counter() - t0))
                if time.time() > self.exp_deadline:
                    break
            return {"img_per_s": statistics.median(rates), "epoch_img_per_s": [round(v, 1) for v in rates],
                    "warmup_s": round(warm, 2), "plan": plan_line(plan)}

        self.row("no fetch (one sync per epoch)", lambda: run(False), model="mnist", batch=B, fetch_every_step=False)
        self.row("float(loss) every step", lambda: run(True), model="mnist", batch=B, fetch_every_step=True)

    def exp_gan(self) -> None:
        B, G = self.sizes["gan_batch"], self.G
        self.note(f"{G} steps per epoch of batch {B}; 2 x batch images per step")
        overrides = self.XLA
        if self.args.tiny:  # compiling the GAN's steps for a CPU takes most of a minute: the smoke run checks the rest
            overrides = self.AUTO
            self.note("tiny run: the auto plan as it is (no XLA forced on a CPU)")

        def one(spc: int, unroll: bool | None) -> Callable[[], dict[str, Any]]:
            def run() -> dict[str, Any]:
                plan = self.plan(**overrides)
                r = self.trainer_fit(self.gan_updates, plan, batch=B, per_step=2 * B, spc=spc, unroll=unroll,
                                     data="images", steps_per_epoch=G)
                r["plan"] = plan_line(plan)
                return r

            return run

        default_unrolled = self.default_unrolled(G)
        rows = [(f"one epoch ({G} steps/call), default ({'unrolled' if default_unrolled else 'loop'})", G, None),
                ("1 step/call", 1, None),
                (f"one epoch ({G} steps/call), {'loop' if default_unrolled else 'unrolled'}", G, not default_unrolled)]
        for i, (label, spc, unroll) in enumerate(rows):
            self.row(label, one(spc, unroll), smoke=i == 0, model="gan", batch=B, steps_per_call=spc,
                     unroll_steps=unroll)

    def exp_keras_fit(self) -> None:
        tf, B, E = self.tf, self.sizes["mnist_batch"], self.E
        n = E * B
        xf = (self.x[:n].astype("float32") / 255.0).reshape(-1, 28, 28, 1)
        yy = self.y[:n]
        worker = self

        callback_base: Any = tf.keras.callbacks.Callback

        class EpochTimes(callback_base):
            def __init__(self) -> None:
                super().__init__()
                self.times: list[float] = []

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                self.t = time.perf_counter()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                self.times.append(time.perf_counter() - self.t)
                if time.time() > worker.exp_deadline and len(self.times) > 1:
                    self.model.stop_training = True

        def run(user: bool, steps_per_execution: int | None = None) -> dict[str, Any]:
            from amp_backends.models import mnist_cnn

            if user:
                self.fresh()  # and undo what earlier plans changed: as a script without auto_configure()
                tf.keras.mixed_precision.set_global_policy("float32")
                tf.config.experimental.enable_tensor_float_32_execution(True)  # TensorFlow's default
                kwargs: dict[str, Any] = {}
                where = "float32, compile() defaults (jit_compile='auto')"
            else:
                plan = self.plan()
                kwargs = dict(plan.compile_kwargs())
                if steps_per_execution:
                    kwargs["steps_per_execution"] = steps_per_execution
                where = plan_line(plan) + f", compile({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
            model = mnist_cnn()
            model.compile(optimizer=tf.keras.optimizers.Adam(self.sizes["lr"]), loss="sparse_categorical_crossentropy",
                          **kwargs)
            cb = EpochTimes()
            model.fit(xf, yy, batch_size=B, epochs=1 + self.sizes["timed_epochs"], verbose=0, shuffle=True,
                      callbacks=[cb])
            rates = [n / t for t in cb.times[1:]]
            return {"img_per_s": statistics.median(rates), "epoch_img_per_s": [round(v, 1) for v in rates],
                    "warmup_s": round(cb.times[0], 2), "plan": where}

        self.row("as users write it (float32, default compile)", lambda: run(True), model="mnist", batch=B)
        self.row("under auto_configure(), compile(**plan.compile_kwargs())", lambda: run(False), smoke=False,
                 model="mnist", batch=B)
        self.row(f"under auto_configure(), steps_per_execution={E}", lambda: run(False, E), model="mnist", batch=B,
                 steps_per_execution=E)

    def exp_profile(self) -> dict[str, Any]:
        tf, B, E = self.tf, self.sizes["mnist_batch"], self.E
        logdir = tempfile.mkdtemp(prefix="gpu-suite-trace-")
        traced = self.sizes["profiled_epochs"]
        from amp_backends.training import Observer

        class Window(Observer):
            """Trace the calls of the epochs after two untraced ones (warm-up, steady state)."""

            def __init__(self) -> None:
                self.on = False
                self.calls = 0

            def before_call(self, step: int, steps: int) -> None:
                if not self.on and step >= 2 * E and step < (2 + traced) * E:
                    tf.profiler.experimental.start(logdir)
                    self.on = True

            def after_call(self, r: Any) -> None:
                if self.on:
                    self.calls += 1
                    if r.step >= (2 + traced) * E:
                        tf.profiler.experimental.stop()
                        self.on = False

        extra: dict[str, Any] = {}

        def run() -> dict[str, Any]:
            from amp_backends.training import Trainer

            from amp_backends.training import mnist_batch_fn

            plan = self.plan()
            window = Window()
            timer = self.timer(B)
            trainer = Trainer(self.mnist_updates()(), plan, batch_size=B, steps_per_call=E, log_every=10**9,
                              progress=False, batch_fn=mnist_batch_fn, observers=[timer, window], check_models=False)
            try:
                trainer.fit(self.x, self.y, epochs=2 + traced)
            finally:
                if window.on:
                    tf.profiler.experimental.stop()
            r = timer.stats(E)
            r["plan"] = plan_line(plan)
            r["traced_calls"] = window.calls
            r["traced_steps"] = traced * E
            summary = summarize_trace(logdir, self.out / "profile", traced * E, self.say, batch=B)
            extra["op_summary"] = summary.pop("text")
            r["profile"] = summary
            r["note"] = f"{window.calls} call(s), {traced * E} steps traced (timing includes the profiler)"
            return r

        self.row(f"auto plan, {E} steps/call, trace of {traced} epoch(s)", run, model="mnist", batch=B,
                 steps_per_call=E)
        shutil.rmtree(logdir, ignore_errors=True)
        return extra


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="The GPU suite's worker (started by python benchmarks/gpu_suite.py).")
    p.add_argument("--out", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--deadline", required=True)
    p.add_argument("--only", type=lambda s: [n for n in s.split(",") if n in BY_NAME], required=True)
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args(argv)
    exit_with_parent()
    return Experiments(args).main()


if __name__ == "__main__":
    sys.exit(main())
