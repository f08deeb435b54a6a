"""``python -m amp_backends.info``: the capability report (see ``--help``; `amp_backends.commands.info_command`)."""

if __name__ == "__main__":
    from .commands.info_command import info
    from .commands.typer_app import run_single

    run_single(info)
