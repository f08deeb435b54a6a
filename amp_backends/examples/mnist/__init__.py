"""The tutorials' MNIST CNN, trained under the auto plan: `train_mnist` (``amp-backends train mnist``).

On real images the last tenth of the training images validates every epoch; the best checkpoint by validation
accuracy is kept in ``<run>/checkpoints/best``, and the test accuracy at the end is that checkpoint's, on the test
images. Synthetic images (``--synthetic``, for throughput) have nothing to validate.
"""

from __future__ import annotations

import signal
from typing import Any

from ...errors import TrainingInterrupted
from ..run import RunOptions, final_plan, prepare_models, scope, start, trainer_options


def train_mnist(opts: RunOptions) -> Any:
    """Train the MNIST CNN (Adam, sparse categorical cross-entropy) with the auto plan."""
    opts, strategy, plan, run, ((x, y), (xt, yt)) = start(opts)
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

    plan = final_plan(opts, plan, build, x, y)
    with scope(strategy):
        model = mnist_cnn()
        prepare_models(plan, model, strategy=strategy, steps_per_call=opts.steps_per_call)
        optimizer = tf.keras.optimizers.Adam(opts.lr)
    trainer = Trainer(classifier_updates(model, optimizer), plan,
                      checkpoint_objects={"model": model, "optimizer": optimizer},
                      metrics=["accuracy"], keep_best="val_accuracy" if validate else None,
                      **trainer_options(opts, run, strategy))
    result = trainer.fit(x, y, epochs=opts.epochs, max_steps=opts.max_steps, resume=opts.resume,
                         validation_data=(xv, yv) if validate else None)
    if validate:
        try:
            best = result.best is not None and trainer.restore_best()  # (every worker: they restore, evaluate together)
            accuracy = trainer.evaluate(xt, yt)["accuracy"]
        except KeyboardInterrupt:  # after training: it said "nothing was trained or saved"
            raise TrainingInterrupted(signal.SIGINT, result.steps, trainer.store.latest if trainer.store else None,
                                      f"Interrupted (SIGINT) after training, in the test evaluation: the run's "
                                      f"{result.steps} steps are trained and checkpointed in {run.checkpoints}; only "
                                      "the test accuracy was not computed.") from None
        if strategy is None or trainer.is_chief:
            which = f"the best checkpoint's, step {result.best['step']}" if best and result.best else "the last weights"
            print(f"test accuracy: {accuracy:.4f} ({len(xt)} test images, {which})", flush=True)
    return result, model

