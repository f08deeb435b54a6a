"""Loss scaling: the scaler's states, skipped non-finite steps, the stop with a remedy, weights never saved
non-finite."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import applied_plan

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from amp_backends.data import synthetic_mnist  # noqa: E402
from amp_backends.errors import NonFiniteError  # noqa: E402
from amp_backends.models import mnist_cnn  # noqa: E402
from amp_backends.request import LossScale  # noqa: E402
from amp_backends.training import (  # noqa: E402
    LossScaler,
    Trainer,
    Update,
    classifier_updates,
    mnist_batch_fn,
)


def test_dynamic_loss_scale_state_machine():
    s = LossScaler(LossScale.dynamic(initial=1024, growth_interval=3))
    assert float(s.scale(tf.constant(2.0))) == 2048.0
    assert [float(g) for g in s.unscale([tf.constant(2048.0)])] == [2.0]
    assert bool(s.all_finite([tf.constant([1.0, 2.0])])) and not bool(s.all_finite([tf.constant([1.0, np.inf])]))
    s.update(tf.constant(False))
    assert s.current == 512 and int(s.skipped.numpy()) == 1 and int(s.consecutive.numpy()) == 1
    for _ in range(2):
        s.update(tf.constant(True))
    assert s.current == 512 and int(s.good_steps.numpy()) == 2
    s.update(tf.constant(True))
    assert s.current == 1024 and int(s.good_steps.numpy()) == 0 and int(s.consecutive.numpy()) == 0
    for _ in range(20):
        s.update(tf.constant(False))
    assert s.current == 1.0  # never below min_scale


def test_fixed_and_none_loss_scale():
    f = LossScaler(LossScale.fixed(128))
    f.update(tf.constant(False))
    f.update(tf.constant(False))
    assert f.current == 128 and int(f.skipped.numpy()) == 2 and int(f.consecutive.numpy()) == 2
    n = LossScaler(LossScale.none())
    assert float(n.scale(tf.constant(3.0))) == 3.0 and n.current == 1.0


def small_classifier(p, poison: "tf.Variable | None" = None, **kw):
    """The MNIST CNN in a trainer with batch 16; with ``poison``, its loss is inf while the flag is set."""
    m = mnist_cnn()
    opt = tf.keras.optimizers.Adam(1e-3)
    updates = classifier_updates(m, opt)
    if poison is not None:
        updates = [poisoned(u, poison) for u in updates]
    return m, opt, Trainer(updates, p, batch_size=16, checkpoint_objects={"model": m, "optimizer": opt},
                           batch_fn=mnist_batch_fn, progress=False, **kw)


def poisoned(update: Update, flag: tf.Variable) -> Update:
    """Multiply the loss by inf while ``flag`` is set: a non-finite gradient on demand."""
    def loss_fn(batch):
        loss = update.loss_fn(batch)
        return tf.cond(flag, lambda: loss * np.inf, lambda: loss)
    return Update(update.name, loss_fn, update.groups)


def test_nonfinite_steps_are_skipped_and_dynamic_recovers(tmp_path):
    p = applied_plan(policy=None, loss_scale="dynamic")
    (x, y), _ = synthetic_mnist(64, 8)
    flag = tf.Variable(True)
    m, _, t = small_classifier(p, poison=flag)
    before = [v.numpy().copy() for v in m.trainable_variables]
    r = t.fit(x, y, epochs=1, max_steps=2)
    assert r.skipped == {"model": 2} and r.loss_scales == {"model": 2.0**13}
    assert all(np.array_equal(a, v.numpy())
               for a, v in zip(before, m.trainable_variables, strict=True))  # nothing applied
    flag.assign(False)
    r = t.fit(x, y, epochs=1)
    assert r.steps == 4 and r.skipped == {"model": 2}
    assert not all(np.array_equal(a, v.numpy()) for a, v in zip(before, m.trainable_variables, strict=True))


def test_fixed_scale_stops_with_the_remedy_and_saves_finite_state(tmp_path):
    p = applied_plan(policy=None, loss_scale="fixed:1024")
    (x, y), _ = synthetic_mnist(128, 8)
    _, _, t = small_classifier(p, poison=tf.Variable(True), checkpoint_dir=str(tmp_path / "ck"),
                               max_consecutive_nonfinite=3)
    with pytest.raises(NonFiniteError, match=r"3 consecutive steps.*fixed loss scaling, scale 1024.*loss_scale="
                                             r"'fixed:16'.*dynamic.*resume=True") as raised:
        t.fit(x, y, epochs=1)
    assert t.store.latest.endswith("ckpt-3")
    # a Python caller is told what it can change, not command-line flags; a command line gets the same as data
    assert "--" not in str(raised.value)
    assert raised.value.overrides == {"loss_scale": "fixed:16"} and raised.value.resume


def test_nonfinite_weights_are_never_saved(tmp_path):
    p = applied_plan(policy=None)
    m, opt, t = small_classifier(p, checkpoint_dir=str(tmp_path / "ck"))
    good = m.trainable_variables[0].numpy()
    m.trainable_variables[0].assign(tf.fill(m.trainable_variables[0].shape, np.nan))
    with pytest.raises(NonFiniteError, match=r"NaN or Inf \(training diverged\); no checkpoint was saved before\. Fix: "
                                             r"lower the learning rate, start again"):  # (it said "is None")
        t.save()
    m.trainable_variables[0].assign(good)
    assert t.save().endswith("ckpt-0")
    m.trainable_variables[0].assign(tf.fill(m.trainable_variables[0].shape, np.nan))
    with pytest.raises(NonFiniteError, match="NaN or Inf.*latest good checkpoint is .*ckpt-0"):
        t.save()
    assert t.store.latest.endswith("ckpt-0")


def test_a_command_line_says_the_remedy_in_its_own_flags():
    from amp_backends.commands.train_command import _in_flags

    error = NonFiniteError("stopped", overrides={"loss_scale": "fixed:16"}, resume=True)
    assert _in_flags(error) == " On this command line: run it again with --loss-scale fixed:16 --resume."
    assert _in_flags(NonFiniteError("stopped")) == ""
    # the float32 check of the remedy, TF32 (and ITEX's BF32) off too: the flags said --policy float32 alone
    from amp_backends.training import LossScaler

    scaler = LossScaler(tf.keras.optimizers.SGD(), plan=applied_plan(policy=None, loss_scale="dynamic", force=True))
    said = _in_flags(scaler.stalled_error(None))
    assert said == " On this command line: run it again with --policy float32 --tf32 off."
