"""``python -m amp_backends.examples.gan``: the ``amp-backends train gan`` command.

See `amp_backends.commands.train_command`.
"""

from ...commands.train_command import gan_main

gan_main()
