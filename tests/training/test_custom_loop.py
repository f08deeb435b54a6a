"""amp_backends.LossScaler in a tf.GradientTape loop of one's own: the tutorials' loop, three lines changed.

float16 is emulated on a CPU but numerically real: a loss multiplied by 1e-8 has float16 gradients that flush to
zero unless the loss is scaled. The same tests hold on Keras 2 and Keras 3.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import NEUTRAL_CWD, SCRIPTS, policy
from warm_python import run_python

tf = pytest.importorskip("tensorflow")
import amp_backends  # noqa: E402
from amp_backends import LossScaler, Trainer  # noqa: E402
from amp_backends.errors import AmpConfigError  # noqa: E402
from amp_backends.request import LossScale  # noqa: E402

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
X = tf.random.stateless_normal((16, 8), seed=(1, 2))
Y = tf.random.stateless_normal((16, 4), seed=(3, 4))
TINY = 1e-8  # the loss's factor: its float16 gradients are below float16's smallest subnormal (6e-8)


def float16_plan(loss_scale="dynamic"):
    return amp_backends.plan_for(policy="mixed_float16", force=True, loss_scale=loss_scale)


def make_model(policy_name):
    tf.keras.utils.set_random_seed(0)
    with policy(policy_name):
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4)])
    return model


def tutorial_loop(model, opt, scaler=None, jit_compile=False, poison=None):
    """The tutorials' train_step; with ``scaler`` its three lines changed (scale the loss, apply through it)."""

    @tf.function(jit_compile=jit_compile)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.cast(model(x, training=True), tf.float32) - y)) * TINY
            if poison is not None:
                loss = tf.cond(poison, lambda: loss * np.inf, lambda: loss)
            scaled_loss = scaler.scale(loss) if scaler else loss
        grads = tape.gradient(scaled_loss, model.trainable_variables)
        if scaler:
            applied = scaler.apply(grads, model.trainable_variables)
        else:
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            applied = tf.constant(True)
        return loss, grads, applied

    return train_step


def weights(model):
    return [v.numpy().copy() for v in model.trainable_variables]


@pytest.mark.parametrize("jit_compile", [False, True])
def test_the_converted_loop_trains_where_the_unscaled_float16_loop_does_not(jit_compile):
    plan = float16_plan()
    losses = {}
    for scaled in (True, False):
        model = make_model("mixed_float16")
        assert model.layers[0].compute_dtype == "float16"
        opt = tf.keras.optimizers.SGD(2e6)  # the loss is 1e-8 times an ordinary one
        scaler = LossScaler(opt, plan=plan) if scaled else None
        step = tutorial_loop(model, opt, scaler, jit_compile=jit_compile)
        w0 = weights(model)
        run = [step(X, Y) for _ in range(4)]
        losses[scaled] = [float(loss) for loss, _, _ in run]
        moved = max(float(np.abs(w - v).max()) for w, v in zip(w0, weights(model), strict=True))
        if scaled:
            assert all(bool(applied) for _, _, applied in run)
            assert moved > 1e-3
            assert scaler.current == 2.0**15  # no overflow, no growth yet
        else:
            assert all(not np.any(g.numpy()) for g in run[0][1]), "float16 gradients flush to zero unscaled"
            assert moved == 0.0
    assert losses[True][-1] < 0.95 * losses[True][0]
    assert losses[False][-1] == losses[False][0]


def test_a_nonfinite_step_is_skipped_and_the_dynamic_scale_halves_then_grows():
    model = make_model("mixed_float16")
    opt = tf.keras.optimizers.SGD(2e6)
    scaler = LossScaler(opt, plan=LossScale.dynamic(initial=1024, growth_interval=2))
    poison = tf.Variable(True)
    step = tutorial_loop(model, opt, scaler, poison=poison)
    w0 = weights(model)
    _, _, applied = step(X, Y)
    assert not bool(applied)
    assert scaler.current == 512 and int(scaler.skipped.numpy()) == 1
    assert all(np.array_equal(w, v) for w, v in zip(w0, weights(model), strict=True))  # no NaN reached the weights
    assert int(opt.iterations.numpy()) == 0
    poison.assign(False)
    assert bool(step(X, Y)[2]) and bool(step(X, Y)[2])
    assert scaler.current == 1024  # two good steps in a row: doubled
    assert int(opt.iterations.numpy()) == 2
    assert all(np.isfinite(v).all() for v in weights(model))


def test_a_checkpoint_beside_the_model_and_optimizer_keeps_the_scale(tmp_path):
    """tf.train.Checkpoint(..., scaler=scaler) was TensorFlow's ValueError (not a trackable object): a resumed loop
    started again at the initial scale and step counts."""
    model = make_model("mixed_float16")
    opt = tf.keras.optimizers.SGD(2e6)
    scaler = LossScaler(opt, plan=LossScale.dynamic(initial=1024, growth_interval=4))
    poison = tf.Variable(True)
    step = tutorial_loop(model, opt, scaler, poison=poison)
    step(X, Y)  # skipped: the scale halves
    poison.assign(False)
    step(X, Y)
    path = tf.train.Checkpoint(model=model, optimizer=opt, scaler=scaler).save(str(tmp_path / "ckpt"))
    again = LossScaler(tf.keras.optimizers.SGD(2e6), plan=LossScale.dynamic(initial=1024, growth_interval=4))
    tf.train.Checkpoint(scaler=again).read(path).assert_existing_objects_matched()
    assert again.current == 512 and int(again.skipped.numpy()) == 1 and int(again.good_steps.numpy()) == 1


def test_a_fixed_scale_trains_keeps_its_scale_and_skips_nonfinite_steps():
    model = make_model("mixed_float16")
    opt = tf.keras.optimizers.SGD(2e6)
    scaler = LossScaler(opt, plan=float16_plan("fixed:4096"))
    poison = tf.Variable(False)
    step = tutorial_loop(model, opt, scaler, poison=poison)
    first = float(step(X, Y)[0])
    assert float(step(X, Y)[0]) < first
    poison.assign(True)
    before = weights(model)
    assert not bool(step(X, Y)[2])
    assert all(np.array_equal(w, v) for w, v in zip(before, weights(model), strict=True))
    assert scaler.current == 4096 and int(scaler.skipped.numpy()) == 1


def test_under_bfloat16_nothing_is_scaled_and_the_numbers_are_the_plain_loops():
    plan = amp_backends.plan_for(policy="mixed_bfloat16", force=True)
    assert plan.loss_scale.mode == "none"
    runs = []
    for scaled in (True, False):
        model = make_model("mixed_bfloat16")
        opt = tf.keras.optimizers.Adam(1e-2)
        scaler = LossScaler(opt, plan=plan) if scaled else None
        step = tutorial_loop(model, opt, scaler)
        runs.append(([float(step(X, Y)[0]) for _ in range(3)], weights(model)))
        if scaled:
            assert scaler.current == 1.0 and scaler.scale(tf.constant(3.0)).numpy() == 3.0
    (loss_a, w_a), (loss_b, w_b) = runs
    assert loss_a == loss_b
    assert all(np.array_equal(a, b) for a, b in zip(w_a, w_b, strict=True))


def test_the_applied_plan_is_the_default_and_misuse_says_the_fix():
    opt = tf.keras.optimizers.SGD(0.1)
    with pytest.raises(AmpConfigError, match="auto_configure"):
        LossScaler(opt)  # no plan applied yet
    # float16 is slow on a CPU: honoured because forced (or, under ITEX on a CPU with fp16 instructions, unsafe:
    # downgraded even forced); the loss scale asked for is honoured either way
    with pytest.warns(amp_backends.AmpWarning, match="force|unsafe here"):
        amp_backends.auto_configure(policy="mixed_float16", force=True, loss_scale="fixed:64", verbose=False)
    assert LossScaler(opt).config == LossScale.fixed(64)
    with pytest.raises(AmpConfigError, match="inner_optimizer"):
        LossScaler(tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1)))
    with pytest.raises(TypeError, match="Keras optimizer"):
        LossScaler("adam")
    with pytest.raises(ValueError, match="one gradient per variable"):
        LossScaler(opt).apply([tf.ones(2)], [])


def test_a_plan_or_a_class_given_as_the_optimizer_is_refused_in_a_line_and_a_loss_without_gradients_is_ours():
    """LossScaler(plan) quoted the plan's whole dataclass repr (thousands of characters); a loss computed without
    the variables failed inside Keras's optimizer ("not enough values to unpack (expected 2, got 0)")."""
    plan = amp_backends.auto_configure(policy="float32", verbose=False)
    assert repr(plan).startswith("<Plan backend=") and len(repr(plan)) < 200
    with pytest.raises(TypeError, match=r"Received: <Plan backend=\S+ .*\(of type Plan\)\. Fix: "
                                        r"LossScaler\(optimizer\), and a plan by keyword: "
                                        r"LossScaler\(optimizer, plan=plan\)\.$") as info:
        LossScaler(plan)
    assert len(str(info.value)) < 500
    with pytest.raises(TypeError, match="Received: the class Adam, not an optimizer made from it"):
        LossScaler(tf.keras.optimizers.Adam)
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    with tf.GradientTape() as tape:
        loss = tf.stop_gradient(tf.reduce_mean(model(tf.ones((4, 2)))))
    grads = tape.gradient(loss, model.trainable_variables)
    with pytest.raises(AmpConfigError, match=r"no gradient with respect to any of the 2 variables it trains.*Fix: "):
        LossScaler(tf.keras.optimizers.SGD(0.1)).apply(grads, model.trainable_variables)


def test_variable_groups_as_the_sparse_tutorial_splits_them_and_another_optimizer():
    model = make_model("float32")
    kernel, bias = model.trainable_variables
    opt, other = tf.keras.optimizers.SGD(0.1), tf.keras.optimizers.SGD(0.1)
    scaler = LossScaler(opt, plan=LossScale.fixed(256))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            scaled = scaler.scale(tf.reduce_mean(tf.square(model(X) - Y)))
        kernel_grads, bias_grads = tape.gradient(scaled, [[kernel], [bias]])  # two groups, one scaled loss
        together = scaler.apply([kernel_grads, bias_grads], [[kernel], [bias]])
        alone = scaler.apply(bias_grads, [bias], optimizer=other)
        return together, alone

    w0 = weights(model)
    assert [bool(a) for a in step()] == [True, True]
    assert all(not np.array_equal(w, v) for w, v in zip(w0, weights(model), strict=True))
    assert int(opt.iterations.numpy()) == 1 and int(other.iterations.numpy()) == 1


def test_two_optimizers_in_one_apply_make_one_decision_and_one_scale_update():
    """Two apply() calls a step (one per optimizer, as the page allowed) made two decisions: an Inf in one group's
    gradients applied the other group alone, and every finite step counted twice towards the scale's growth. One
    call with a list of optimizers checks both groups together: both applied, or neither, the scale updated once."""
    model = make_model("float32")
    kernel, bias = model.trainable_variables
    first, second = tf.keras.optimizers.SGD(0.1), tf.keras.optimizers.SGD(0.1)
    scaler = LossScaler(first, plan=float16_plan())
    poison = tf.Variable(False)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(X) - Y))
            loss += tf.cond(poison, lambda: np.inf * tf.reduce_sum(bias), lambda: 0.0)  # the bias group only
            scaled = scaler.scale(loss)
        kernel_grads, bias_grads = tape.gradient(scaled, [[kernel], [bias]])
        return scaler.apply([kernel_grads, bias_grads], [[kernel], [bias]], optimizer=[first, second])

    w0, scale = weights(model), scaler.current
    poison.assign(True)
    assert not bool(step())
    assert all(np.array_equal(w, v) for w, v in zip(w0, weights(model), strict=True))  # neither group applied
    assert scaler.current == scale / 2 and int(scaler.skipped.numpy()) == 1
    poison.assign(False)
    assert bool(step()) and bool(step())
    assert int(scaler.good_steps.numpy()) == 2 and int(first.iterations.numpy()) == int(second.iterations.numpy()) == 2
    with pytest.raises(ValueError, match=r"one variable group per optimizer.*2 optimizers, 1 gradient.*Fix"):
        scaler.apply([tf.zeros_like(bias)], [bias], optimizer=[first, second])


def test_two_replicas_skip_together_and_scale_alike():
    out = run_python([SCRIPTS / "custom_loop_mirrored.py"], timeout=300, cwd=NEUTRAL_CWD)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["applied"] == [False, True]
    assert result["scales"] == [512.0, 512.0]
    assert result["unchanged_after_skip"] and result["changed_after_apply"]
    assert result["replicas_agree"]


def test_autograph_converts_the_package_code_a_step_traces(monkeypatch):
    """A ``:=`` in code a step traces (the resident batch's replica slice; LossScaler.apply's optimizer groups) made
    AutoGraph warn "could not transform ... and will run it as-is" in every run."""
    from tensorflow.python.autograph.impl import api

    fell_back, real = [], api._fall_back_unconverted

    def recorded(f, args, kwargs, options, exc):
        fell_back.append(f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', f)}: {exc}")
        return real(f, args, kwargs, options, exc)

    monkeypatch.setattr(api, "_fall_back_unconverted", recorded)
    model = make_model("float32")
    trainer = amp_backends.Trainer(amp_backends.classifier_updates(model, tf.keras.optimizers.SGD(0.1), loss="mse"),
                                   float16_plan(), batch_size=8, steps_per_call=2, progress=False)
    trainer.fit(X.numpy(), Y.numpy(), epochs=1)
    kernel, bias = model.trainable_variables
    first, second = tf.keras.optimizers.SGD(0.1), tf.keras.optimizers.SGD(0.1)
    scaler = LossScaler(first, plan=float16_plan())

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            scaled = scaler.scale(tf.reduce_mean(tf.square(model(X) - Y)))
        kernel_grads, bias_grads = tape.gradient(scaled, [[kernel], [bias]])
        return scaler.apply([kernel_grads, bias_grads], [[kernel], [bias]], optimizer=[first, second])

    assert bool(step())
    assert not [f for f in fell_back if f.startswith("amp_backends")]


def test_the_calls_a_user_gets_wrong_raise_amp_errors():
    """Each raised a bare ValueError or TypeError, or (a gradient of another shape) TensorFlow's own error from
    inside an op; ``except amp_backends.AmpError`` is what the documentation promises to catch them."""
    from amp_backends.errors import AmpError
    from amp_backends.training import Update

    plan = amp_backends.auto_configure(verbose=False)
    opt = tf.keras.optimizers.SGD(0.1)
    a, b = tf.Variable([1.0, 2.0]), tf.Variable([3.0])
    calls = {
        "LossScaler(class)": lambda: LossScaler(tf.keras.optimizers.Adam),
        "one gradient, two variables": lambda: LossScaler(opt).apply([tf.constant([1.0, 1.0])], [a, b]),
        "a gradient of another shape": lambda: LossScaler(opt).apply([tf.constant([1.0, 2.0, 3.0])], [a]),
        "Trainer(model)": lambda: Trainer(tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)]),
                                          plan, batch_size=2),
        "an int loss": lambda: Trainer([Update("u", lambda batch: tf.constant(3), [([a], opt)])], plan,
                                       batch_size=2).fit(np.ones((4, 2), "float32")),
    }
    for what, call in calls.items():
        with pytest.raises(AmpError, match="Received|returned"):
            call()
        assert what
