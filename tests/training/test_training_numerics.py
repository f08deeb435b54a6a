"""Numerics and efficiency of the trainer: sparse gradients, never-finite models, reproducible seeds, full calls."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import applied_plan, mlp

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from amp_backends.errors import AmpConfigError, NonFiniteError  # noqa: E402
from amp_backends.models import gan_discriminator, gan_generator  # noqa: E402
from amp_backends.training import (  # noqa: E402
    Trainer,
    Update,
    classifier_updates,
    gan_updates,
    mnist_batch_fn,
    seed_everything,
    step_seed,
)


# --------------------------------------------------------------------------- sparse gradients
class RecordingSGD:
    """Wraps an optimizer; records the type of every gradient handed to ``apply_gradients`` (at trace time)."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def apply_gradients(self, grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        self.seen += [type(g).__name__ for g, _ in grads_and_vars]
        return self.inner.apply_gradients(grads_and_vars)


@pytest.mark.parametrize("loss_scale", ["none", "fixed:1024", "dynamic"])
def test_embedding_gradients_stay_sparse_under_every_loss_scale(loss_scale):
    emb = tf.keras.layers.Embedding(20000, 64)
    head = tf.keras.layers.Dense(1)
    emb.build((None,))
    head.build((None, 64))
    e_opt, h_opt = RecordingSGD(tf.keras.optimizers.SGD(0.1)), tf.keras.optimizers.SGD(0.1)

    def loss_fn(batch):
        ids, target = batch
        return tf.reduce_mean((tf.cast(head(emb(ids))[:, 0], tf.float32) - target) ** 2)

    upd = Update("emb", loss_fn, [(emb.trainable_variables, e_opt), (head.trainable_variables, h_opt)])
    t = Trainer([upd], applied_plan(loss_scale=loss_scale), batch_size=16, progress=False)
    ids = np.arange(64) * 300
    before = emb.embeddings.numpy()[[0, 1]].copy()
    r = t.fit(ids, np.ones(64, np.float32), epochs=1)
    assert r.skipped == {"emb": 0}
    assert e_opt.seen and set(e_opt.seen) == {"IndexedSlices"}  # never a dense 20000 x 64 tensor
    after = emb.embeddings.numpy()
    assert not np.array_equal(after[0], before[0]) and np.array_equal(after[1], before[1])  # only looked-up rows


def test_a_sparse_gradient_with_inf_is_caught_and_skipped():
    from amp_backends.request import LossScale
    from amp_backends.training import LossScaler

    s = LossScaler(LossScale.fixed(8))
    g = tf.IndexedSlices(tf.constant([[16.0, np.inf]]), tf.constant([3]), tf.constant([10, 2]))
    (u,) = s.unscale([g])
    assert isinstance(u, tf.IndexedSlices) and u.values.numpy()[0, 0] == 2.0
    assert not bool(s.all_finite([u])) and bool(s.all_finite([tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]))]))


# --------------------------------------------------------------------------- never-finite models
def never_finite(model, opt):
    base = classifier_updates(model, opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))[0]
    return [Update("model", lambda b: base.loss_fn(b) * np.inf, base.groups)]


@pytest.mark.parametrize("mode,stop_at,needle", [
    # the float32 check names tf32='off' too: TF32 (and ITEX's BF32) run float32 matmuls in reduced precision
    ("none", 25, "without loss scaling the loss or the forward pass itself is NaN or Inf.*policy='float32' and "
                 "tf32='off'"),
    ("dynamic", 25, "non-finite even at loss scale 1.*AMP_POLICY=float32 AMP_TF32=off"),
    ("fixed:4096", 25, "fixed loss scale 4096 is too high"),
])
def test_a_model_whose_gradients_are_never_finite_stops_with_the_remedy(mode, stop_at, needle, caplog):
    caplog.set_level("INFO", logger="amp_backends.train")
    model = mlp(hidden=None)
    w0 = [v.numpy().copy() for v in model.weights]
    t = Trainer(never_finite(model, tf.keras.optimizers.SGD()), applied_plan(loss_scale=mode), batch_size=4,
                progress=False)
    x = np.random.default_rng(0).normal(size=(400, 4)).astype("float32")
    with pytest.raises(NonFiniteError, match=needle):
        t.fit(x, np.zeros(400, int), epochs=1)
    assert int(t.global_step.numpy()) == stop_at  # bounded, not 100 silently skipped steps
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(w0, model.weights, strict=True))
    assert caplog.text.count("[skipped: non-finite gradients in model]") == stop_at


def test_dynamic_scaling_stops_only_once_its_scale_sits_at_the_floor():
    """From 2^40 the scale needs 40 halvings to reach 1: the run is not stopped while lowering it may still help."""
    from amp_backends.request import LossScale

    model = mlp(hidden=None)
    p = applied_plan(loss_scale=LossScale.dynamic(initial=2.0**40))
    t = Trainer(never_finite(model, tf.keras.optimizers.SGD()), p, batch_size=4, progress=False, steps_per_call=5)
    with pytest.raises(NonFiniteError, match="scale 1"):
        t.fit(np.zeros((800, 4), np.float32), np.zeros(800, int), epochs=1)
    assert int(t.global_step.numpy()) == 40  # 40 halvings from 2^40 reach the floor of 1, not 25 steps
    assert t.scalers["model"].current == 1.0


def test_the_summary_counts_applied_and_skipped_steps(caplog):
    caplog.set_level("INFO", logger="amp_backends.train")
    model = mlp(hidden=None)
    flag = tf.Variable(True)
    base = classifier_updates(model, tf.keras.optimizers.SGD(), tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))[0]
    upd = Update("model", lambda b: tf.cond(flag, lambda: base.loss_fn(b) * np.inf, lambda: base.loss_fn(b)),
                 base.groups)
    t = Trainer([upd], applied_plan(loss_scale="dynamic"), batch_size=4, progress=False)
    t.fit(np.zeros((12, 4), np.float32), np.zeros(12, int), epochs=1)
    flag.assign(False)
    r = t.fit(np.zeros((12, 4), np.float32), np.zeros(12, int), epochs=3)
    assert r.applied == {"model": 6} and r.skipped == {"model": 3}
    assert "9 steps (model: 6 applied, 3 skipped)" in caplog.text


def test_a_step_skipped_with_no_loss_scale_to_blame_is_said_once_with_its_step(caplog):
    """NaN in a later batch of a dataset (the arrays' check before training does not see a pipeline's) skipped its
    step under a plan without dynamic scaling, with nothing said but an INFO line's mark."""
    from amp_backends.errors import AmpWarning

    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    x[3 * 8 + 2, 1] = np.nan  # batch 3
    data = tf.data.Dataset.from_tensor_slices((x, np.zeros(64, "int64"))).batch(8, drop_remainder=True)
    t = Trainer(classifier_updates(mlp(), tf.keras.optimizers.SGD(0.1), tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True)), applied_plan(loss_scale="none"), batch_size=8, progress=False, check_models=False)
    with pytest.warns(AmpWarning, match=r"Step 3 \(epoch 0, step 3 of the epoch\) of 'model' was skipped: its "
                                        r"gradients were not finite.*none loss scaling.*Fix: check that batch"):
        r = t.fit(data, epochs=2)  # (the second epoch's skip is not said again)
    assert r.skipped == {"model": 2} and caplog.text.count("was skipped: its gradients") == 1


# --------------------------------------------------------------------------- reproducibility
def train_mnist_like(seed, steps=4):
    """Weights, dropout and shuffling from one seed: the MNIST CNN's own layers, a few steps."""
    from amp_backends.models import mnist_cnn

    seed_everything(seed)
    m = mnist_cnn()
    opt = tf.keras.optimizers.Adam(1e-3)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (64, 28, 28)).astype(np.uint8), rng.integers(0, 10, 64)
    t = Trainer(classifier_updates(m, opt), applied_plan(), batch_size=16, batch_fn=mnist_batch_fn, progress=False,
                seed=seed)
    return [h["model"] for h in t.fit(x, y, epochs=1, max_steps=steps).history]


def test_the_same_seed_gives_the_same_losses_and_another_seed_others():
    a, b, c = train_mnist_like(3), train_mnist_like(3), train_mnist_like(4)
    assert a == b and a != c


def train_gan(seed, batch=8):
    seed_everything(seed)
    g, d = gan_generator(), gan_discriminator()
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (16, 28, 28)).astype(np.uint8)  # two steps: the noise of each is drawn from the seed
    t = Trainer(gan_updates(g, d, tf.keras.optimizers.Adam(1e-3), tf.keras.optimizers.RMSprop(1e-4)), applied_plan(),
                batch_size=batch, batch_fn=mnist_batch_fn, progress=False, seed=seed, check_models=False)
    return [(h["generator"], h["discriminator"]) for h in t.fit(x, None, epochs=1).history]


def test_the_gans_noise_is_reproducible_from_the_seed():
    assert train_gan(5) == train_gan(5) != train_gan(6)


def test_step_seeds_differ_per_step_and_salt_and_exist_only_inside_a_step():
    with pytest.raises(AmpConfigError, match="only available inside a training step"):
        step_seed()
    v = tf.Variable(1.0)
    seeds = tf.Variable(tf.zeros([4, 2, 2], tf.int64))
    calls = tf.Variable(0, dtype=tf.int64)

    def recording(batch):
        i = tf.cast(calls.assign_add(1) - 1, tf.int32)
        seeds[i].assign(tf.stack([step_seed(1), step_seed(2)]))
        return tf.reduce_mean(v * 0.0)

    Trainer([Update("u", recording, [([v], tf.keras.optimizers.SGD())])], applied_plan(), batch_size=1, progress=False,
            seed=9).fit(np.zeros((4, 1), np.float32), epochs=1)
    s = seeds.numpy()
    assert len({tuple(s[i, j]) for i in range(4) for j in range(2)}) == 8  # every step and salt distinct


def test_deterministic_ops_can_be_switched_on():
    from tensorflow.python.framework import (
        config,  # the public API can switch it on, not read or reset it
    )

    try:
        seed_everything(0, deterministic=True)
        assert config.is_op_determinism_enabled()
    finally:
        config.disable_op_determinism()


# --------------------------------------------------------------------------- full calls
def counting_trainer(**kw):
    model = mlp(hidden=None)
    return Trainer(classifier_updates(model, tf.keras.optimizers.SGD(), tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True)), applied_plan(), batch_size=4, progress=False, **kw)


def test_checkpoints_every_10_steps_keep_16_step_calls_full(tmp_path, caplog):
    caplog.set_level("INFO", logger="amp_backends.train")
    t = counting_trainer(steps_per_call=16, checkpoint_every=10, checkpoint_dir=str(tmp_path), keep_checkpoints=10)
    r = t.fit(np.zeros((256, 4), np.float32), np.zeros(256, int), epochs=1)
    assert r.steps == 64 and len(r.history) == 4  # 4 calls, not 64 single steps
    assert sorted(int(p.rsplit("-", 1)[1]) for p in t.store.paths()) == [16, 32, 48, 64]
    assert "checkpoints at the end of the call that reaches each multiple of 10 steps" in caplog.text


def test_an_epochs_remainder_is_one_more_compiled_size_when_steps_are_unrolled():
    t = counting_trainer(steps_per_call=4, unroll_steps=True)
    r = t.fit(np.zeros((40, 4), np.float32), np.zeros(40, int), epochs=2)  # 10 steps per epoch: 4 + 4 + 2
    assert r.steps == 20 and [h["step"] for h in r.history] == [4, 8, 10, 14, 18, 20]
    assert sorted(key[2] for key in t.program._calls) == [2, 4]


@pytest.mark.parametrize("xla", ["off", "on"])
def test_looped_calls_take_any_length_with_one_compiled_function(xla):
    """Calls of 4, 2 and 1 steps share one function whose shapes do not change: XLA compiles it once too."""
    model = mlp(hidden=None)
    t = Trainer(classifier_updates(model, tf.keras.optimizers.SGD(), tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True)), applied_plan(xla=xla), batch_size=4, progress=False, steps_per_call=4, unroll_steps=False)
    r = t.fit(np.zeros((40, 4), np.float32), np.zeros(40, int), epochs=2, max_steps=19)
    assert [h["step"] for h in r.history] == [4, 8, 10, 14, 18, 19]
    (fn,) = t.program._calls.values()
    assert fn.experimental_get_tracing_count() == 1
    # seconds per call: the first compiles; a call of a new length (2 steps at step 10, 1 at 19) must not
    starts = [0] + [h["step"] for h in r.history]  # each call's first step (the last entry starts no call)
    seconds = [(h["step"] - prev) * 4 / h["throughput"] for prev, h in zip(starts, r.history, strict=False)]
    assert max(seconds[2], seconds[5]) < seconds[0] / 5, seconds


def test_a_profile_window_is_traced_by_whole_calls(tmp_path, caplog):
    caplog.set_level("INFO", logger="amp_backends.train")
    t = counting_trainer(steps_per_call=8, logdir=str(tmp_path), profile_steps=(10, 20))
    r = t.fit(np.zeros((128, 4), np.float32), np.zeros(128, int), epochs=1)
    assert len(r.history) == 4
    assert "Profiler trace of steps 8:24 (asked: 10:20; calls are traced whole)" in caplog.text
    assert list((tmp_path / "plugins" / "profile").glob("*/*.xplane.pb"))


def test_a_profile_window_the_fit_does_not_reach_or_leaves_early_is_said(tmp_path, caplog):
    """A window past the run's end wrote nothing and said nothing; one the run ended inside was traced silently."""
    caplog.set_level("INFO", logger="amp_backends.train")
    x, y = np.zeros((32, 4), np.float32), np.zeros(32, int)  # 8 steps of 4
    counting_trainer(steps_per_call=2, logdir=str(tmp_path / "past"), profile_steps=(50, 60)).fit(x, y, epochs=1)
    assert ("No profiler trace in this fit: the profile window 50:60 was not reached (this fit ended at step 8; the "
            "window starts at step 50). Fix: choose a window inside the steps the run trains") in caplog.text
    assert not (tmp_path / "past" / "plugins").exists()
    caplog.clear()
    counting_trainer(steps_per_call=2, logdir=str(tmp_path / "end"), profile_steps=(2, 10)).fit(x, y, epochs=1)
    assert "Profiler trace of steps 2:8 (asked: 2:10; calls are traced whole; training ended first) written" \
        in caplog.text and "No profiler trace" not in caplog.text
    assert list((tmp_path / "end" / "plugins" / "profile").glob("*/*.xplane.pb"))
    from amp_backends.training.observers import ProfilerWindow

    caplog.clear()
    window = ProfilerWindow(str(tmp_path / "stopped"), (50, 60))
    window.on_fit_start(0, 8)
    try:  # a fit that Ctrl-C or an error stopped: no "choose a window" beside its own message
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        window.close()
    assert "No profiler trace" not in caplog.text
    window.close()
    assert "No profiler trace in this fit" in caplog.text


def test_a_window_counted_from_the_first_fits_start_is_reached_by_later_short_fits(tmp_path, caplog):
    """``--profile``'s window counts from the step the first fit starts at (a resumed run's): moved again at each
    fit, a trainer fitted in short pieces never reached it."""
    from amp_backends.training.observers import ProfilerWindow

    caplog.set_level("INFO", logger="amp_backends.train")
    window = ProfilerWindow(str(tmp_path), (2, 6), after_fit_start=True)
    t = counting_trainer(steps_per_call=2, logdir=str(tmp_path), observers=[window])
    x, y = np.zeros((8, 4), np.float32), np.zeros(8, int)  # 2 steps of 4 per epoch: one call per fit
    for epochs in range(1, 5):
        t.fit(x, y, epochs=epochs)
    assert "Profiler trace of steps 2:4 (asked: 2:6; calls are traced whole; training ended first)" in caplog.text
    assert list((tmp_path / "plugins" / "profile").glob("*/*.xplane.pb"))


# --------------------------------------------------------------------------- float8 layers
@pytest.mark.skipif(not hasattr(tf.keras.layers.Dense, "quantize"), reason="float8 training needs Keras >= 3.3")
def test_float8_layers_train_and_their_scales_are_not_unscaled():
    """A float8 Dense's scales and amax history are overwritten with their "gradients": loss scaling leaves them
    alone."""
    states = {}
    for mode in ("none", "fixed:1024"):
        seed_everything(2)
        model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(32, activation="relu"),
                                     tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(4)])
        model.layers[1].quantize("float8")
        opt = tf.keras.optimizers.SGD(0.01)
        t = Trainer(classifier_updates(model, opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
                    applied_plan(loss_scale=mode), batch_size=8, progress=False)
        rng = np.random.default_rng(0)
        r = t.fit(rng.normal(size=(64, 16)).astype("float32"), rng.integers(0, 4, 64), epochs=1)
        assert r.skipped == {"model": 0} and all(np.isfinite(h["model"]) for h in r.history)
        states[mode] = {v.name: v.numpy() for v in model.layers[1].weights
                        if getattr(v, "overwrite_with_gradient", False)}
    assert {"inputs_scale", "kernel_scale", "outputs_grad_scale"} <= set(states["none"])
    for name in ("inputs_scale", "kernel_scale", "inputs_amax_history", "kernel_amax_history"):
        np.testing.assert_allclose(states["none"][name], states["fixed:1024"][name], rtol=1e-3)  # forward: untouched
    # the gradients' scale follows the (scaled) gradients it quantizes, as under Keras's own LossScaleOptimizer
    np.testing.assert_allclose(states["fixed:1024"]["outputs_grad_scale"] / states["none"]["outputs_grad_scale"],
                               1024, rtol=1e-2)


# --------------------------------------------------------------------------- the precision check at start
def test_the_trainer_logs_the_precision_check_of_its_models_once(caplog):
    caplog.set_level("INFO", logger="amp_backends.train")
    p = applied_plan(policy="mixed_bfloat16", force=True)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(3, activation="softmax")])  # a bfloat16 softmax: wrong
    opt = tf.keras.optimizers.SGD(0.1)
    t = Trainer(classifier_updates(model, opt), p, batch_size=8, progress=False,
                checkpoint_objects={"model": model, "optimizer": opt})
    x, y = np.zeros((32, 4), np.float32), np.zeros(32, int)
    t.fit(x, y, epochs=1)
    t.fit(x, y, epochs=2)
    assert caplog.text.count("Precision check of") == 1
    # the layer plan computes the classifier's softmax in float32 before the first step: the check has no error left
    assert model.layers[-1].compute_dtype == "float32" and "1 float32 (head)" in caplog.text
    assert not [r.message for r in caplog.records if r.message.startswith("error:")]


# --------------------------------------------------------------------------- state the forward pass changes
def test_a_skipped_step_leaves_no_nan_in_batchnorm_statistics(tmp_path):
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.BatchNormalization(),
                                 tf.keras.layers.Dense(3)])
    opt = tf.keras.optimizers.SGD(0.1)
    t = Trainer(classifier_updates(model, opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
                applied_plan(), batch_size=4, progress=False, checkpoint_dir=str(tmp_path),
                checkpoint_objects={"model": model, "optimizer": opt})
    x = np.ones((16, 4), np.float32)
    x[1, 0] = np.inf  # one bad input in the first batch
    r = t.fit(x, np.zeros(16, int), epochs=1)
    assert r.skipped == {"model": 1} and r.applied == {"model": 3}
    assert all(np.isfinite(v.numpy()).all() for v in model.variables)  # moving mean and variance included
    assert t.store.latest.endswith("ckpt-4")


def test_non_finite_statistics_are_never_saved(tmp_path):
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.BatchNormalization(), tf.keras.layers.Dense(3)])
    opt = tf.keras.optimizers.SGD(0.1)
    t = Trainer(classifier_updates(model, opt), applied_plan(), batch_size=4, progress=False,
                checkpoint_dir=str(tmp_path), checkpoint_objects={"model": model, "optimizer": opt})
    bn = model.layers[0]
    bn.moving_mean.assign(tf.fill(bn.moving_mean.shape, np.nan))  # not trainable, still a weight
    with pytest.raises(NonFiniteError, match="NaN or Inf"):
        t.save()


def test_seed_everything_seeds_the_trainers_made_afterwards():
    seed_everything(7)
    t = Trainer(classifier_updates(mlp(hidden=None), tf.keras.optimizers.SGD()), applied_plan(), batch_size=4)
    assert t.seed == 7 and Trainer(classifier_updates(mlp(hidden=None), tf.keras.optimizers.SGD()), applied_plan(),
                                   batch_size=4, seed=3).seed == 3
    seed_everything(0)


@pytest.mark.parametrize(("device", "unrolled"), [("/CPU:0", [True, True, False]), ("/GPU:0", [False, False, False]),
                                                  ("/XPU:0", [False, False, False])])
def test_xla_unrolls_a_calls_steps_on_a_cpu_and_loops_them_on_an_accelerator(device, unrolled):
    """XLA:CPU runs a looped step 10x slower than unrolled; XLA:GPU autotunes every copy of an unrolled step (minutes
    for 16 BERT steps on an H200, results/zoo-h200/bert-unfinished): the default unrolls on a CPU only."""
    import dataclasses

    plan = dataclasses.replace(applied_plan(xla="on"), devices=(device,))
    t = Trainer(classifier_updates(mlp(hidden=None), tf.keras.optimizers.SGD(), tf.keras.losses.
                                   SparseCategoricalCrossentropy(from_logits=True)), plan, batch_size=4, progress=False)
    assert [t.program.unrolled(k) for k in (1, 16, 17)] == unrolled
    assert not Trainer(classifier_updates(mlp(hidden=None), tf.keras.optimizers.SGD(), "mse"), applied_plan(xla="off"),
                       batch_size=4, progress=False).program.unrolled(4)  # no XLA: a loop
    forced = Trainer(classifier_updates(mlp(hidden=None), tf.keras.optimizers.SGD(), "mse"), plan, batch_size=4,
                     progress=False, unroll_steps=True)
    assert forced.program.unrolled(64)  # the user's choice stands
