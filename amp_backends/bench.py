"""``python -m amp_backends.bench``: the benchmark (see ``--help``; `amp_backends.commands.bench`)."""

if __name__ == "__main__":
    from .commands.bench import main
    from .commands.typer_app import run_single

    run_single(main)
