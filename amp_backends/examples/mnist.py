"""The tutorials' MNIST CNN, trained under the auto plan: ``python -m amp_backends.examples.mnist --help``."""

from __future__ import annotations

from typing import Any

import typer

from .common import RunOptions, checkpoint_dir, command, load_data, maybe_tune, scope, strategy_and_plan, print_flush, profile_window, seed_everything


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
    (x, y), (xt, yt) = load_data(opts)
    import tensorflow as tf

    from ..models import mnist_cnn
    from ..trainer import Trainer, classifier_updates, mnist_batch_fn

    def build():
        m = mnist_cnn()
        return [m], classifier_updates(m, tf.keras.optimizers.Adam(opts.lr)), {"model": m}

    plan = maybe_tune(opts, plan, build, x, y)
    seed_everything(opts.seed)
    with scope(strategy):
        model = mnist_cnn()
        optimizer = tf.keras.optimizers.Adam(opts.lr)
    trainer = Trainer(
        classifier_updates(model, optimizer), plan, batch_size=opts.batch_size,
        checkpoint_objects={"model": model, "optimizer": optimizer}, steps_per_call=opts.steps_per_call,
        log_every=opts.log_every, logdir=opts.logdir, checkpoint_dir=checkpoint_dir(opts),
        checkpoint_every=opts.checkpoint_every, profile_steps=profile_window(opts), progress=opts.progress,
        seed=opts.seed, batch_fn=mnist_batch_fn, strategy=strategy,
    )
    result = trainer.fit(x, y, epochs=opts.epochs, max_steps=opts.max_steps, resume=opts.resume)
    if not opts.synthetic and (strategy is None or trainer.is_chief):
        print_flush(f"test accuracy: {evaluate(model, xt, yt):.4f} ({len(xt)} held-out images)")
    return result, model


mnist_command = command("mnist", train_mnist, batch_size=64, lr=0.01, lr_help="Adam learning rate.")
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command()(mnist_command)

if __name__ == "__main__":
    app()
