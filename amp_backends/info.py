"""``python -m amp_backends.info``: the capability report (see ``--help``)."""

from .cli import info_main

if __name__ == "__main__":
    info_main()
