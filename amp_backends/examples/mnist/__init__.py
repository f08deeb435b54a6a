"""The tutorials' MNIST CNN, trained under the auto plan: :func:`train_mnist`.

On real images (MNIST, or ``--digits``) the held-out images validate every epoch (``val_loss``,
``val_accuracy`` in the log and TensorBoard) and the best checkpoint by validation accuracy is kept in
``<run>/checkpoints/best``; synthetic images (``--synthetic``, for throughput) have nothing to validate.

From the command line: ``python -m amp_backends.examples.mnist --help`` or ``amp-backends train mnist``
(:mod:`amp_backends.commands.train`).
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
    validate = not opts.synthetic
    trainer = Trainer(classifier_updates(model, optimizer), plan,
                      checkpoint_objects={"model": model, "optimizer": optimizer},
                      metrics=["accuracy"], keep_best="val_accuracy" if validate else None,
                      **trainer_options(opts, run, strategy))
    result = trainer.fit(x, y, epochs=opts.epochs, max_steps=opts.max_steps, resume=opts.resume,
                         validation_data=(xt, yt) if validate else None)
    if validate:
        accuracy = trainer.evaluate(xt, yt)["accuracy"]  # (every worker evaluates its share; the chief says it)
        if strategy is None or trainer.is_chief:
            print(f"test accuracy: {accuracy:.4f} ({len(xt)} held-out images)", flush=True)
    return result, model

