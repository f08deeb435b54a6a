"""``python -m amp_backends.examples.mnist``: the ``amp-backends train mnist`` command."""

from ...commands.train_command import mnist_command
from ...commands.typer_app import run_single

run_single(mnist_command())
