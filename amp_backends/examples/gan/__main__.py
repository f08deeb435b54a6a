"""``python -m amp_backends.examples.gan``: the ``amp-backends train gan`` command."""

from ...commands.train_command import gan_command
from ...commands.typer_app import run_single

run_single(gan_command())
