"""``python -m amp_backends.bench``: the benchmark (see ``--help``; `amp_backends.commands.bench`)."""

if __name__ == "__main__":
    from .commands.bench import cli_main

    cli_main()
