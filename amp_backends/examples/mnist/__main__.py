"""``python -m amp_backends.examples.mnist``: the ``amp-backends train mnist`` command."""

from ...commands.train_command import mnist_main

mnist_main()
