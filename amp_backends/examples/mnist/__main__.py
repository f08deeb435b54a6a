"""``python -m amp_backends.examples.mnist``: the ``amp-backends train mnist`` command.

See `amp_backends.commands.train`.
"""

from ...commands.train import mnist_main

mnist_main()
