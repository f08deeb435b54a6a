"""The tutorials' MNIST CNN, trained under the auto plan: `train_mnist`.

On real images (MNIST, or ``--digits``) the last tenth of the training images is held out and validates every
epoch (``val_loss``, ``val_accuracy`` in the log and TensorBoard); the best checkpoint by validation accuracy is
kept in ``<run>/checkpoints/best``, and the test accuracy at the end is that checkpoint's, on the test images (never
seen in training or in the choice of the checkpoint). Synthetic images (``--synthetic``, for throughput) have
nothing to validate.

From the command line: ``python -m amp_backends.examples.mnist --help`` or ``amp-backends train mnist``
(`amp_backends.commands.train_command`).
"""

from __future__ import annotations

from typing import Any

from ..run import (
    RunOptions,
    choose_run,
    load_data,
    maybe_tune,
    prepare_models,
    scope,
    seed_models,
    strategy_and_plan,
    trainer_options,
)


def train_mnist(opts: RunOptions) -> Any:
    """Train the MNIST CNN (Adam, sparse categorical cross-entropy) with the auto plan."""
    strategy, plan = strategy_and_plan(opts)
    opts, run = choose_run(opts, strategy)  # a resumed run's own seed, before the data it draws or splits
    (x, y), (xt, yt) = load_data(opts)
    validate = not opts.synthetic
    if validate:  # the last tenth of the training images validates (as Keras's validation_split=0.1 takes it)
        held = max(1, len(x) // 10)
        x, y, xv, yv = x[:-held], y[:-held], x[-held:], y[-held:]
    import tensorflow as tf

    from ...models import mnist_cnn
    from ...training import Trainer, classifier_updates

    def build():
        m = mnist_cnn()
        return [m], classifier_updates(m, tf.keras.optimizers.Adam(opts.lr)), {"model": m}

    plan = maybe_tune(opts, plan, build, x, y)
    seed_models(opts)
    with scope(strategy):
        model = mnist_cnn()
        prepare_models(plan, model, strategy=strategy)
        optimizer = tf.keras.optimizers.Adam(opts.lr)
    trainer = Trainer(classifier_updates(model, optimizer), plan,
                      checkpoint_objects={"model": model, "optimizer": optimizer},
                      metrics=["accuracy"], keep_best="val_accuracy" if validate else None,
                      **trainer_options(opts, run, strategy))
    result = trainer.fit(x, y, epochs=opts.epochs, max_steps=opts.max_steps, resume=opts.resume,
                         validation_data=(xv, yv) if validate else None)
    if validate:
        best = result.best is not None and trainer.restore_best()  # (every worker: they restore and evaluate together)
        accuracy = trainer.evaluate(xt, yt)["accuracy"]
        if strategy is None or trainer.is_chief:
            which = f"the best checkpoint's, step {result.best['step']}" if best and result.best else "the last weights"
            print(f"test accuracy: {accuracy:.4f} ({len(xt)} test images, {which})", flush=True)
    return result, model

