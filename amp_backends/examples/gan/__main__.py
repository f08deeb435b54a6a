"""``python -m amp_backends.examples.gan``: the ``amp-backends train gan`` command.

See `amp_backends.commands.train`.
"""

from ...commands.train import gan_main

gan_main()
