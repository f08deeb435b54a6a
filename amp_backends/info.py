"""``python -m amp_backends.info``: the capability report (see ``--help``; `amp_backends.commands.info`)."""

if __name__ == "__main__":
    from .commands.info import main

    main()
