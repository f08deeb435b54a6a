"""``python -m amp_backends.info``: the capability report (see ``--help``; :mod:`amp_backends.commands.report`)."""

if __name__ == "__main__":
    from .commands.cli import info_main

    info_main()
