"""One configuration of the model zoo, in a process of its own (``python -m amp_backends.commands.bench.zoo_worker``):
a dtype policy, XLA and an applied plan are process-wide. It answers one JSON request a line (`supervisor.answer`):
``prepare`` (build with seed 0, or 1 for the second float32 baseline; compile; one untimed warm-up repetition; with
``flops``, FLOPs per sample), ``rep`` (one timed repetition of ``steps`` steps, then as many inference batches),
``loss`` (the loss on a fixed batch in inference mode) and ``peak`` (matmul rates for the dtypes asked).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
import traceback
from typing import Any

from ...tf_import import exit_quickly
from .supervisor import answer, exit_with_parent


class ZooWorker:
    """One configuration of the model zoo in this process: TensorFlow imported, the dtype policy, TF32 and a peer's
    grappler rewrite (or the auto plan) set; its methods answer the requests `main` reads, by name.

    Args:
        cfg: The configuration: `zoo_suite.ZooConfig`'s fields.
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        from ...tf_import import import_tensorflow, quiet_tensorflow_logs

        import_tensorflow(quiet_tensorflow_logs())
        import tensorflow as tf

        from ...configure import auto_configure
        from ...keras_compat import set_global_policy

        self.tf = tf
        self.plan: Any = None  # the auto plan, for the auto_fit and trainer kinds
        if cfg["kind"] in ("auto_fit", "trainer"):
            self.plan = auto_configure(verbose=False)
            self.policy = self.plan.policy
        else:
            if cfg.get("tf32") is not None:
                tf.config.experimental.enable_tensor_float_32_execution(bool(cfg["tf32"]))
            if cfg.get("rewrite"):  # a peer's grappler rewrite (the float32 model rewritten by TensorFlow itself)
                tf.config.optimizer.set_experimental_options({cfg["rewrite"]: True})
            self.policy = cfg["policy"]
        set_global_policy(self.policy, tf)
        self.model: Any = None
        self.window: dict[str, float] = {}  # start and end of the last repetition's training, set by hooks
        self.trainer: Any = None

    def describe(self) -> str:
        """The configuration's set-up in words: the plan's settings, or the policy, XLA (as Keras resolved it) and a
        peer's settings.

        Returns:
            The description (``zoo.md``'s set-up column).
        """
        if self.plan is not None:
            p = self.plan
            return (f"{p.policy}, XLA {'on' if p.xla else 'off'}, TF32 {'on' if p.tf32 else 'off'}, "
                    f"loss scale {p.loss_scale.mode}, compile{self.plan.compile_kwargs()}")
        xla = {None: "compile() defaults", True: "XLA on", False: "XLA off"}[self.cfg.get("xla")]
        resolved = getattr(self.model, "jit_compile", None)  # what Keras made of jit_compile
        peer = "".join([f", {k}={v}" for k, v in self.cfg.get("env") or ()]
                       + ([f", grappler {self.cfg['rewrite']}"] if self.cfg.get("rewrite") else []))
        return (f"{self.cfg['policy']}, {xla}" + (f" (jit_compile={resolved})" if self.cfg.get("xla") is None else "")
                + peer)

    # -- requests --------------------------------------------------------------------------------
    def prepare(self, model: str, batch: int, steps: int, flops: bool) -> dict[str, Any]:
        """The ``prepare`` request: build the model (seeded), compile it or make its trainer, then run one warm-up
        repetition (left out of the figures).

        Args:
            model: A model of `amp_backends.zoo.ZOO`.
            batch: Its batch size.
            steps: Training steps per repetition.
            flops: Whether to count its FLOPs per sample too (`flops`).

        Returns:
            The warm-up's seconds, the set-up in words, the policy it was built under, its parameter count and whether
            TF32 ran; with ``flops``, ``flops_per_sample`` and ``flops_note``.

        Raises:
            RuntimeError: The model was built under another policy than the configuration's.
        """
        import gc

        import numpy as np

        from ...keras_compat import policy_name, set_global_policy, walk
        from ...zoo import get

        tf = self.tf
        self.model = self.trainer = None
        tf.keras.backend.clear_session()  # which also sets Keras's global dtype policy back to float32:
        set_global_policy(self.policy, tf)  # the configuration's policy again
        gc.collect()
        self.entry, self.batch, self.steps = get(model), batch, steps
        self.x, self.y = self.entry.data(steps * batch, 0)
        self.x_eval, self.y_eval = self.entry.data(batch, 1)
        seed = int(self.cfg.get("seed", 0))
        tf.keras.utils.set_random_seed(seed)
        self.model = self.entry.build()
        kind = self.cfg["kind"]

        def float32_layers() -> int:
            return sum(policy_name(layer) == "float32" for _, layer in walk(self.model, self.model.name)
                       if layer is not self.model)

        built_float32 = float32_layers()
        layer_plan = None
        if kind == "trainer":
            from ...training import Trainer, classifier_updates, gan_updates

            m = self.model
            updates = (gan_updates(m.generator, m.discriminator, tf.keras.optimizers.Adam(1e-3),
                                   tf.keras.optimizers.RMSprop(1e-4)) if self.entry.gan else
                       classifier_updates(m, tf.keras.optimizers.Adam(1e-3), loss=self.entry.example_loss()))
            self.trainer = Trainer(updates, self.plan, batch_size=batch, steps_per_call=steps,
                                   images_per_step=batch * self.entry.per_sample, log_every=10**9, progress=False,
                                   seed=seed, observers=[_trainer_window(self.window)],
                                   check_models=False)  # (a timing: `amp-backends check` is the check)
        else:
            opt = tf.keras.optimizers.Adam(1e-3)
            kwargs: dict[str, Any] = {}
            if kind == "auto_fit":  # as the documentation tells fit users: prepare_model, then compile with the plan's
                from ...prepare import prepare_model

                first = tf.nest.map_structure(lambda a: a[:batch], self.x)
                prep = prepare_model(self.model, self.plan, inputs=None if self.entry.gan else first)
                layer_plan = prep.layer_plan
                if prep.choice:
                    print(f"zoo worker: {prep.choice}", file=sys.stderr, flush=True)
                opt, kwargs = self.plan.wrap_optimizer(opt), dict(self.plan.compile_kwargs())
            elif self.cfg.get("xla") is not None:
                kwargs["jit_compile"] = bool(self.cfg["xla"])
            self.model.compile(optimizer=opt, loss=self.entry.loss(), **kwargs)
        self.fits = itertools.count(1)  # the trainer's fit() calls: each one more epoch
        self.callbacks = [tf.keras.callbacks.LambdaCallback(  # the training's start and end, for fit
            on_train_begin=lambda logs: self.window.update(start=time.perf_counter()),
            on_train_end=lambda logs: self.window.update(end=time.perf_counter()))]
        t0 = time.perf_counter()
        self.rep()  # (the inference function is traced there too)
        warmup = time.perf_counter() - t0
        policy: Any = getattr(self.model, "dtype_policy", None) or getattr(self.model, "_dtype_policy", None)
        built_under = str(getattr(policy, "name", self.policy))
        if built_under != self.policy:
            raise RuntimeError(f"the model was built under {built_under}, not {self.policy}")
        if self.trainer is not None:
            layer_plan = self.trainer.layer_plans.get(self.model.name)
        choice = layer_plan.measurement if layer_plan is not None and layer_plan.all_float32 else None
        kept = float32_layers() - built_float32
        setup = self.describe() + (
            f", every layer float32 (measured {choice.ratio:.2f}x as fast as {choice.policy} on this model)"
            if choice is not None and choice.rounds else
            f", {kept} layers kept in float32 (plan.float32_layers)" if kept else "")
        out: dict[str, Any] = {"warmup_s": round(warmup, 2), "setup": setup, "policy": built_under,
                               "params": int(sum(np.prod(v.shape) for v in self.model.weights)),
                               # TensorFlow's flag is on by default, also where no GPU has TF32 to use
                               "tf32": bool(tf.config.experimental.tensor_float_32_execution_enabled()
                                            and tf.config.list_physical_devices("GPU"))}
        if choice is not None:
            out["compute_dtype"] = "float32"  # its share of peak is of the float32 peak
        if flops:
            out["flops_per_sample"], out["flops_note"] = self.flops()
        return out

    def rep(self) -> dict[str, Any]:
        """One ``fit`` call of ``steps`` steps, timed from the start of its training to its end (hooks), leaving out
        the set-up paid once per call."""
        self.window.clear()
        t0 = time.perf_counter()
        if self.trainer is not None:
            self.trainer.fit(self.x, self.y, epochs=next(self.fits))
        else:
            h = self.model.fit(self.x, self.y, batch_size=self.batch, epochs=1, verbose=0, shuffle=False,
                               callbacks=self.callbacks)
            self.window["loss_sum"] = float(h.history["d_loss" if self.entry.gan else "loss"][-1])
            self.window["loss_n"] = 1.0
        t1 = time.perf_counter()
        dt = self.window.get("end", t1) - self.window.get("start", t0)
        out: dict[str, Any] = {"seconds": dt, "call_seconds": t1 - t0,
                               "samples": self.steps * self.batch * self.entry.per_sample}
        if not self.entry.gan:  # inference as this configuration's user runs it (the GAN: no one model to predict with)
            predict = self.trainer.predict if self.trainer is not None else self.model.predict_on_batch
            try:
                predict(self.x_eval)  # (traced on the warm-up repetition)
                t2 = time.perf_counter()
                for _ in range(self.steps):
                    predict(self.x_eval)
                out["predict_seconds"] = time.perf_counter() - t2
            except Exception as exc:  # inference failing leaves the training figure standing
                out["predict_error"] = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
        return out

    def loss(self) -> dict[str, Any]:
        """``loss``: the mean training loss of the last repetition (the discriminator's for the GAN); ``eval_loss``:
        the loss on a fixed batch in inference mode (far off for BatchNormalization after a few steps)."""
        n = self.window.get("loss_n", 0.0)
        return {"loss": self.window["loss_sum"] / n if n else None,
                "eval_loss": self.entry.evaluate(self.model, self.x_eval, self.y_eval)}

    def flops(self) -> tuple[float | None, str]:
        """FLOPs per sample of one training step (``model.train_step``), from TensorFlow's graph profiler; ops inside
        loop bodies (recurrent layers) are not seen."""
        tf = self.tf
        from tensorflow.python.profiler import model_analyzer, option_builder

        try:
            xb, yb = self.entry.data(self.batch, 2)
            spec = tf.nest.map_structure(lambda a: tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)), (xb, yb) if
                                         yb is not None else (xb,))
            graph = tf.function(self.model.train_step).get_concrete_function(spec).graph
            opts = option_builder.ProfileOptionBuilder.float_operation()
            opts["output"] = "none"
            total = model_analyzer.profile(graph, options=opts).total_float_ops
            loops = sum(op.type in ("While", "StatelessWhile") for op in graph.get_operations())
            note = "train_step graph, TF profiler float_ops"
            if loops:
                note += f"; {loops} while loop(s) not counted: a lower bound"
            return total / (self.batch * self.entry.per_sample), note
        except Exception as exc:
            return None, f"not counted: {type(exc).__name__}: {str(exc)[:200]}"

    def peak(self, dtypes: list[str], n: int, repeats: int, tf32: bool = False) -> dict[str, Any]:
        """GFLOP/s of an n x n matmul per dtype: median of ``repeats`` timed calls, each of 4 chained matmuls; float32
        with TF32 execution set to ``tf32`` for the measurement (TensorFlow's default, on, would make a float32 peak
        TF32's on a GPU that has it), the process's setting restored after."""
        tf = self.tf
        was = tf.config.experimental.tensor_float_32_execution_enabled()
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
        try:
            return self._peaks(dtypes, n, repeats)
        finally:
            tf.config.experimental.enable_tensor_float_32_execution(was)

    def _peaks(self, dtypes: list[str], n: int, repeats: int) -> dict[str, Any]:
        tf = self.tf
        out: dict[str, Any] = {}
        for name in dtypes:
            dtype = tf.as_dtype(name)
            a = tf.random.uniform([n, n], dtype=tf.float32)
            a, b = tf.cast(a, dtype), tf.cast(tf.transpose(a), dtype)

            @tf.function
            def chain(a: Any, b: Any) -> Any:
                c = a
                for _ in range(4):
                    c = tf.matmul(c, b) * tf.constant(1.0 / n, a.dtype)  # a.dtype, not the loop variable
                return tf.reduce_sum(tf.cast(c, tf.float32))  # all of c: no part of the work can be left out

            try:
                float(chain(a, b))
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    float(chain(a, b))
                    times.append(time.perf_counter() - t0)
                out[name] = round(4 * 2 * n**3 / statistics.median(times) / 1e9, 1)
            except Exception as exc:
                out[name] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
        return out


def _trainer_window(window: dict[str, float]) -> Any:
    import numpy as np

    from ...training import Observer

    class Window(Observer):
        def on_fit_start(self, start_step: int, total_steps: int | None) -> None:
            window["start"] = time.perf_counter()

        def after_call(self, record: Any) -> None:
            window["end"] = time.perf_counter()
            last = np.asarray(record.losses, dtype="float64")[:, -1]  # the last update's loss (the discriminator's)
            last = last[np.isfinite(last)]
            window["loss_sum"] = window.get("loss_sum", 0.0) + float(last.sum())
            window["loss_n"] = window.get("loss_n", 0.0) + float(last.size)

    return Window()


def main() -> int:
    """Run a zoo worker: read its configuration (``--config``, JSON), answer that it is ready, then answer one request a
    line until ``quit``.

    Returns:
        The exit status: 0 after ``quit`` or at the end of the input, 1 where the configuration could not be set up.
    """
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True, help="the configuration, as JSON")
    cfg = json.loads(p.parse_args().config)
    exit_with_parent()
    exit_quickly()
    try:
        worker = ZooWorker(cfg)
    except Exception as exc:
        answer({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    answer({"ok": True, "ready": True})
    for line in sys.stdin:
        req = json.loads(line)
        op = req.pop("op")
        if op == "quit":
            return 0
        try:
            answer({"ok": True, **getattr(worker, op)(**req)})
        except Exception as exc:
            print(traceback.format_exc().strip(), file=sys.stderr, flush=True)
            message = str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ""
            answer({"ok": False, "error": f"{type(exc).__name__}: {message}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
