"""Updates: several variable groups and optimizers from one loss, the GAN's two updates."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import applied_plan

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from amp_backends.data import synthetic_mnist  # noqa: E402
from amp_backends.models import gan_discriminator, gan_generator  # noqa: E402
from amp_backends.training import Trainer, Update, gan_updates, mnist_batch_fn  # noqa: E402


def test_several_variable_groups_and_optimizers_in_one_update():
    """As SparseOperationKit does: embedding and dense variables from one scaled loss, two optimizers."""
    p = applied_plan(policy=None, loss_scale="dynamic")
    emb = tf.keras.layers.Embedding(50, 8)
    dense = tf.keras.layers.Dense(1)
    emb.build((None,))
    dense.build((None, 8))
    o1, o2 = tf.keras.optimizers.SGD(0.1), tf.keras.optimizers.Adam(0.01)

    def loss_fn(batch):
        ids, target = batch
        return tf.reduce_mean((tf.cast(dense(emb(ids))[:, 0], tf.float32) - target) ** 2)

    upd = Update("sok", loss_fn, [(emb.trainable_variables, o1), (dense.trainable_variables, o2)])
    ids = np.arange(64) % 50
    target = np.ones(64, np.float32)
    t = Trainer([upd], p, batch_size=16, checkpoint_objects={"emb": emb, "dense": dense}, progress=False)
    e0, d0 = emb.embeddings.numpy().copy(), dense.kernel.numpy().copy()
    r = t.fit(ids, target, epochs=3)
    assert r.skipped == {"sok": 0} and r.steps == 12
    assert not np.array_equal(e0, emb.embeddings.numpy()) and not np.array_equal(d0, dense.kernel.numpy())
    assert int(o1.iterations.numpy()) == 12 and int(o2.iterations.numpy()) == 12


def test_gan_trains_with_two_optimizers_and_two_scales():
    p = applied_plan(policy=None, loss_scale="dynamic")
    (x, _), _ = synthetic_mnist(64, 8)
    g, d = gan_generator(), gan_discriminator()
    go, do = tf.keras.optimizers.Adam(1e-3), tf.keras.optimizers.RMSprop(1e-4)
    t = Trainer(gan_updates(g, d, go, do), p, batch_size=16, images_per_step=32,
                checkpoint_objects={"g": g, "d": d}, batch_fn=mnist_batch_fn, progress=False, steps_per_call=2)
    r = t.fit(x, None, epochs=1)
    assert set(r.last_losses) == {"generator", "discriminator"} and all(np.isfinite(list(r.last_losses.values())))
    assert set(r.loss_scales) == {"generator", "discriminator"}


def test_gan_batches_without_a_fixed_size_are_our_input_error_with_the_fix():
    """Traced for batches of no fixed size (a custom loop's ``tf.function`` with ``[None, ...]``), the GAN's loss
    raised a bare ValueError."""
    from amp_backends.errors import InputError

    generator_update, _ = gan_updates(gan_generator(), gan_discriminator(), tf.keras.optimizers.Adam(1e-3),
                                      tf.keras.optimizers.RMSprop(1e-4))
    loss = tf.function(generator_update.loss_fn, input_signature=[tf.TensorSpec([None, 28, 28, 1], tf.float32)])
    with pytest.raises(InputError, match="gan_updates needs batches of a fixed size.*drop_remainder=True"):
        loss.get_concrete_function()


@pytest.mark.parametrize("data", ["arrays", "dataset"])
def test_the_users_functions_keep_python_control_flow_on_tensors_inside_the_trainers_compiled_calls(data):
    """The trainer traces its own calls without AutoGraph (a faster start); what the user gives still runs as
    AutoGraph converts it: a Python ``if`` on a tensor in an update's ``loss_fn`` or a loss function, a ``for`` over a
    tensor range in a ``batch_fn``, in training, evaluation and prediction. Without the conversion, TensorFlow
    refuses a tensor used as a Python bool while tracing."""
    from amp_backends.training import classifier_updates

    p = applied_plan(policy=None, loss_scale="none")
    rng = np.random.RandomState(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.randint(0, 3, 64)
    dense = tf.keras.layers.Dense(1)
    dense.build((None, 4))

    def loss_fn(batch):
        err = tf.reduce_mean((tf.cast(dense(batch[0])[:, 0], tf.float32) - tf.cast(batch[1], tf.float32)) ** 2)
        if err > 1e9:  # a tensor as a Python bool: AutoGraph's tf.cond
            err = err * 0.0
        return err

    def batch_fn(xs, ys, idx):
        xb = tf.gather(xs, idx)
        for _ in tf.range(2):  # a tf.while_loop under AutoGraph
            xb = xb + 0.0
        return xb, tf.gather(ys, idx)

    def per_example(labels, pred):
        loss = tf.keras.losses.sparse_categorical_crossentropy(labels, pred, from_logits=True)
        if tf.reduce_any(tf.math.is_nan(loss)):
            loss = tf.zeros_like(loss)
        return loss

    class Confident(tf.keras.metrics.Metric):  # (Keras 2 converts a metric's update_state itself, when enabled)
        def __init__(self, name="confident", **kwargs):
            super().__init__(name=name, **kwargs)
            self.n = self.add_weight(name="n", shape=(), initializer="zeros")

        def update_state(self, y_true, y_pred, sample_weight=None):
            if tf.reduce_max(tf.cast(y_pred, tf.float32)) > -1e9:
                self.n.assign_add(1.0)

        def result(self):
            return self.n

    data_of = (lambda a, b: (a, b)) if data == "arrays" else \
        (lambda a, b: (tf.data.Dataset.from_tensor_slices((a, b)).batch(16), None))
    custom = Trainer([Update("u", loss_fn, [(dense.trainable_variables, tf.keras.optimizers.SGD(0.01))])], p,
                     batch_size=16, batch_fn=batch_fn if data == "arrays" else None,
                     checkpoint_objects={"d": dense}, progress=False, steps_per_call=2)
    r = custom.fit(*data_of(x, y), epochs=1)
    assert r.steps == 4 and r.skipped == {"u": 0} and np.isfinite(r.last_losses["u"])
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    t = Trainer(classifier_updates(model, tf.keras.optimizers.Adam(1e-3), loss=per_example), p, batch_size=16,
                progress=False, check_models=False, metrics=["accuracy", Confident()])
    r = t.fit(*data_of(x, y), epochs=1)
    assert r.steps == 4 and np.isfinite(r.last_losses["model"])
    assert r.epochs[-1]["confident"] == 4  # a batch each
    scores = t.evaluate(*data_of(x, y))
    assert np.isfinite(scores["loss"]) and 0 <= scores["accuracy"] <= 1 and scores["confident"] == 4
    assert t.predict(x).shape == (64, 3)


def test_the_librarys_error_from_inside_the_users_loss_fn_comes_out_as_raised_and_no_autograph_warning(caplog):
    """A user's ``loss_fn`` around the classifier's (adding a penalty) given no labels: the classifier's
    `InputError` came out with AutoGraph's frame listing ("in user code: ...") before its message; a ``loss_fn``
    calling `record_predictions` logged "AutoGraph could not transform <function _gcd_import ...>"."""
    import logging

    from amp_backends.errors import InputError
    from amp_backends.training import Evaluation, classifier_updates, record_predictions

    p = applied_plan(policy=None, loss_scale="none")
    x, y = np.random.RandomState(0).normal(size=(32, 4)).astype("float32"), np.arange(32) % 3
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3, activation="softmax")])
    opt = tf.keras.optimizers.SGD(0.01)
    base = classifier_updates(model, opt)[0]

    def penalized(batch):
        return base.loss_fn(batch) + 1e-4 * tf.add_n([tf.reduce_sum(tf.square(w)) for w in model.trainable_weights])

    t = Trainer([Update("model", penalized, [(model.trainable_variables, opt)])], p, batch_size=8, progress=False,
                check_models=False)
    with pytest.raises(InputError) as err:
        t.fit(x, epochs=1)  # no labels
    assert str(err.value).startswith("classifier_updates trains on labelled batches"), str(err.value)

    def recorded(batch):
        pred = model(batch[0], training=True)
        record_predictions("u", batch[1], pred)
        return tf.keras.losses.sparse_categorical_crossentropy(batch[1], pred)

    ev = Evaluation(predict=lambda v: model(v, training=False), loss=tf.keras.losses.sparse_categorical_crossentropy)
    t = Trainer([Update("u", recorded, [(model.trainable_variables, opt)], evaluation=ev)], p, batch_size=8,
                progress=False, check_models=False, metrics=["accuracy"])
    caplog.set_level(logging.WARNING)
    epoch = t.fit(x, y, epochs=1, validation_data=(x, y)).epochs[-1]
    assert 0 <= epoch["accuracy"] <= 1 and 0 <= epoch["val_accuracy"] <= 1
    assert not [r for r in caplog.records if "AutoGraph" in r.getMessage()], caplog.text


def test_the_librarys_error_with_its_own_arguments_from_inside_the_users_loss_fn_comes_out_as_raised():
    """`NonFiniteError` and `ModelCallError` take keyword arguments: AutoGraph, unable to copy them, raised a
    StagingError ("in user code: ...") in their place."""
    from amp_backends.errors import ModelCallError, NonFiniteError

    v = tf.Variable(1.0)
    for error in (NonFiniteError("a helper of the library found inf", resume=True),
                  ModelCallError("a helper of the library could not call the model", layer="dense")):
        def loss_fn(batch, error=error):
            if tf.reduce_sum(batch[0]) > 1e9:  # converted code, as a user's is
                return v * 0.0
            raise error

        t = Trainer([Update("u", loss_fn, [([v], tf.keras.optimizers.SGD())])], applied_plan(policy="float32"),
                    batch_size=4, progress=False, check_models=False)
        with pytest.raises(type(error)) as raised:
            t.fit(np.zeros((8, 1), np.float32), np.zeros(8), epochs=1)
        assert raised.value is error and "in user code" not in str(raised.value)


def test_an_optimizer_of_the_users_own_with_python_control_flow_on_tensors_trains():
    """The trainer applies the gradients inside its compiled call: an optimizer subclass of the user's, with a Python
    ``if`` on a tensor in ``apply_gradients``, is converted by AutoGraph there as before."""
    class Guarded(tf.keras.optimizers.SGD):
        def apply_gradients(self, grads_and_vars, *args, **kwargs):
            grads_and_vars = list(grads_and_vars)
            scale = 1.0
            if tf.linalg.global_norm([g for g, _ in grads_and_vars]) > 1e9:  # a tensor as a Python bool
                scale = 0.0
            return super(Guarded, self).apply_gradients([(g * scale, v) for g, v in grads_and_vars], *args, **kwargs)

    p = applied_plan(policy=None, loss_scale="none")
    dense = tf.keras.layers.Dense(1)
    dense.build((None, 4))
    before = dense.kernel.numpy().copy()
    x = np.random.RandomState(0).normal(size=(32, 4)).astype("float32")
    upd = Update("u", lambda b: tf.reduce_mean(tf.square(dense(b[0]) - 1.0)), [(dense.trainable_variables,
                                                                                  Guarded(0.1))])
    r = Trainer([upd], p, batch_size=8, checkpoint_objects={"d": dense}, progress=False).fit(x, epochs=1)
    assert r.steps == 4 and r.skipped == {"u": 0} and not np.array_equal(before, dense.kernel.numpy())


def test_an_update_whose_loss_does_not_reach_its_variables_is_our_error_before_a_step():
    """A loss under tf.stop_gradient, or an Update listing another model's variables, failed inside Keras's
    optimizer: "ValueError: not enough values to unpack (expected 2, got 0)"."""
    from amp_backends.errors import AmpConfigError
    from amp_backends.training import classifier_updates

    K = tf.keras
    x, y = np.random.default_rng(0).random((32, 4)).astype("float32"), np.arange(32) % 2
    model, other = (K.Sequential([K.Input((4,)), K.layers.Dense(2)]) for _ in range(2))
    stopped = classifier_updates(model, K.optimizers.SGD(0.1), loss=lambda yt, yp: tf.stop_gradient(
        K.losses.sparse_categorical_crossentropy(yt, yp, from_logits=True)))
    wrong = [Update("critic", lambda b: tf.reduce_mean(model(b[0]) ** 2), [(other.trainable_variables,
                                                                           K.optimizers.SGD(0.1))])]
    for updates, name in ((stopped, "model"), (wrong, "critic")):
        t = Trainer(updates, applied_plan(), batch_size=8, progress=False)
        with pytest.raises(AmpConfigError, match=rf"The loss of the update '{name}' has no gradient with respect to "
                                                 r"any of the 2 variables it trains \(\S*kernel\S*, \S*bias\S*\).*Fix: "
                                                 r"train the variables of the model the loss calls"):
            t.fit(x, y, epochs=1)
        assert int(t.global_step.numpy()) == 0


def test_a_variable_group_its_loss_does_not_reach_is_left_as_it_is_while_the_others_train():
    """Two groups, the backbone behind tf.stop_gradient: the head trains and the backbone is left as it is (it
    trained so on Keras 2 before the no-gradient check refused the whole update, and failed inside Keras 3)."""
    from amp_backends import LossScaler

    K = tf.keras
    x, y = np.random.default_rng(0).random((32, 4)).astype("float32"), np.arange(32) % 2
    backbone, head = K.Sequential([K.Input((4,)), K.layers.Dense(8)]), K.Sequential([K.Input((8,)), K.layers.Dense(2)])
    loss = K.losses.SparseCategoricalCrossentropy(from_logits=True)
    before = [v.numpy().copy() for v in backbone.trainable_variables + head.trainable_variables]
    u = Update("model", lambda b: loss(b[1], head(tf.stop_gradient(backbone(b[0])))),
               [(backbone.trainable_variables, K.optimizers.SGD(0.1)),
                (head.trainable_variables, K.optimizers.SGD(0.1))])
    assert Trainer([u], applied_plan(), batch_size=8, progress=False).fit(x, y, epochs=1).steps == 4
    after = [v.numpy() for v in backbone.trainable_variables + head.trainable_variables]
    assert all(np.array_equal(a, b) for a, b in zip(before[:2], after[:2], strict=True))  # the backbone: as it was
    assert not any(np.array_equal(a, b) for a, b in zip(before[2:], after[2:], strict=True))  # the head: trained
    first, second = K.optimizers.SGD(0.1), K.optimizers.SGD(0.1)  # the same in a loop of one's own
    scaler = LossScaler(first, plan=applied_plan())
    with tf.GradientTape() as tape:
        value = loss(y[:8], head(tf.stop_gradient(backbone(x[:8]))))
    variables = [backbone.trainable_variables, head.trainable_variables]
    scaler.apply(tape.gradient(value, variables), variables, optimizer=[first, second])
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(after[:2], backbone.trainable_variables, strict=True))
    assert not np.array_equal(after[2], head.trainable_variables[0].numpy())


def test_a_misspelt_loss_name_is_our_error_with_the_nearest_name():
    """classifier_updates(loss='sparse_categorical_crossentropi') passed on Keras's ValueError, whose words are
    about custom object scopes."""
    from amp_backends.errors import AmpConfigError
    from amp_backends.training import classifier_updates
    from helpers import mlp

    with pytest.raises(AmpConfigError, match=r"Unknown loss 'sparse_categorical_crossentropi'\. Expected a Keras loss "
                                             r"name.*Fix: did you mean 'sparse_categorical_crossentropy'\?"):
        classifier_updates(mlp(), tf.keras.optimizers.SGD(), loss="sparse_categorical_crossentropi")
    assert classifier_updates(mlp(), tf.keras.optimizers.SGD(), loss="mse")


def test_a_loss_that_mixes_the_models_low_precision_output_with_float32_labels_is_our_error_with_the_fix():
    """A loss of ``model(x) - y`` with a bfloat16 output and float32 labels failed while the step was traced with
    AutoGraph's 'in user code: ... TypeError: Input 'y' of 'Sub' Op has type float32 that does not match type
    bfloat16': a graph traceback, naming neither the mixed precision nor the fix. (The layer is given its policy,
    so that the error shows under any plan; it is raised as the step is traced, before any op runs.)"""
    from amp_backends.errors import AmpConfigError

    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1, dtype="mixed_bfloat16")])
    loss = lambda b: tf.reduce_mean(tf.square(model(b[0]) - b[1]))  # noqa: E731
    trainer = Trainer([Update("reg", loss, [(model.trainable_variables, tf.keras.optimizers.SGD())])],
                      applied_plan("float32"), batch_size=8, progress=False)
    with pytest.raises(AmpConfigError, match=r"gives the op Sub a float32 and a bfloat16 tensor at \S+"
                                             r"test_training_updates\.py:\d+ \(lambda b:.*Fix: cast one side "
                                             r"there \(in a loss: tf\.cast\(y_pred, tf\.float32\)"):
        trainer.fit(np.ones((32, 4), "float32"), np.ones((32, 1), "float32"), max_steps=2)
    assert int(trainer.global_step.numpy()) == 0


def test_update_groups_in_the_wrong_order_are_our_error_with_the_fix():
    """groups=[(optimizer, variables)] was Python's "'SGD' object is not iterable" from inside the trainer."""
    from amp_backends.errors import AmpConfigError

    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    update = Update("reg", lambda b: tf.reduce_mean(model(b[0])), [(tf.keras.optimizers.SGD(), model.weights)])
    with pytest.raises(AmpConfigError, match=r"The groups of update 'reg' must be a list of \(variables, optimizer\) "
                                             r"pairs\. Received: \(SGD, list\)\. Fix: groups=\[\(model\.trainable"):
        Trainer([update], applied_plan("float32"), batch_size=8, progress=False)
    bare = Update("reg", update.loss_fn, (model.weights, tf.keras.optimizers.SGD()))  # (one pair, not in a list)
    with pytest.raises(AmpConfigError, match=r"Received: one pair, not in a list\. Fix"):
        Trainer([bare], applied_plan("float32"), batch_size=8, progress=False)
