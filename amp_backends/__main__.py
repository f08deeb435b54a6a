"""``python -m amp_backends``: the ``amp-backends`` command line."""

from .cli import main

main()
