"""The tutorials' MNIST CNN, trained under the auto plan: :func:`train_mnist`.

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


def evaluate(model: Any, x: Any, y: Any, batch_size: int = 1024) -> float:
    """Accuracy of ``model`` on uint8 images ``x`` (scaled /255) and labels ``y``."""
    import numpy as np

    correct = 0
    for i in range(0, len(x), batch_size):
        xb = (x[i:i + batch_size].astype("float32") / 255.0).reshape(-1, 28, 28, 1)
        pred = np.argmax(np.asarray(model(xb, training=False)), axis=-1)
        correct += int((pred == y[i:i + batch_size]).sum())
    return correct / max(len(x), 1)


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
    trainer = Trainer(classifier_updates(model, optimizer), plan,
                      checkpoint_objects={"model": model, "optimizer": optimizer},
                      **trainer_options(opts, run, strategy))
    result = trainer.fit(x, y, epochs=opts.epochs, max_steps=opts.max_steps, resume=opts.resume)
    if not opts.synthetic and (strategy is None or trainer.is_chief):
        print(f"test accuracy: {evaluate(model, xt, yt):.4f} ({len(xt)} held-out images)", flush=True)
    return result, model

