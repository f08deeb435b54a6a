"""``python -m amp_backends.examples.gan``: the ``amp-backends train gan`` command."""

from ...commands.train_command import gan_main

gan_main()
