"""The tutorials' MNIST GAN, trained under the auto plan: `train_gan` (``amp-backends train gan``).

One step updates the generator (Adam), then the discriminator (RMSprop, 1e-4), each with its own forward pass and
loss scale; throughput counts 2 x batch images per step, as the tutorial did.
"""

from __future__ import annotations

from typing import Any

from ..run import RunOptions, final_plan, prepare_models, scope, start, trainer_options

D_LR = 1e-4


def train_gan(opts: RunOptions) -> Any:
    """Train the GAN (generator Adam(--lr), discriminator RMSprop(1e-4)) with the auto plan."""
    opts, strategy, plan, run, ((x, _), _) = start(opts)
    import tensorflow as tf

    from ...models import gan_discriminator, gan_generator
    from ...training import Trainer, gan_updates

    def build():
        g, d = gan_generator(), gan_discriminator()
        opts_ = (tf.keras.optimizers.Adam(opts.lr), tf.keras.optimizers.RMSprop(D_LR))
        return [g, d], gan_updates(g, d, *opts_), {"g": g, "d": d}

    plan = final_plan(opts, plan, build, x, None, images_per_step=2 * opts.batch_size)
    with scope(strategy):
        generator, discriminator = gan_generator(), gan_discriminator()
        prepare_models(plan, generator, discriminator, strategy=strategy, steps_per_call=opts.steps_per_call)
        g_opt, d_opt = tf.keras.optimizers.Adam(opts.lr), tf.keras.optimizers.RMSprop(D_LR)
    trainer = Trainer(
        gan_updates(generator, discriminator, g_opt, d_opt), plan, images_per_step=2 * opts.batch_size,
        checkpoint_objects={"generator": generator, "discriminator": discriminator, "g_optimizer": g_opt,
                            "d_optimizer": d_opt},
        **trainer_options(opts, run, strategy))
    return trainer.fit(x, None, epochs=opts.epochs, max_steps=opts.max_steps, resume=opts.resume), generator

