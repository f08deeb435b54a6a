"""``python -m amp_backends``: the ``amp-backends`` command line."""

from .commands.cli import main

main()
