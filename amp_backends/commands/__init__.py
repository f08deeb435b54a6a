"""The command line, the only code that parses arguments or exits: ``cli`` (``amp-backends``), and a module per
subcommand, named ``<subcommand>_command``: ``info_command`` with ``capability_report`` (the report it prints),
``check_command``, ``audit_command``, ``train_command`` (the examples), the ``bench`` package, and what they share
(``typer_app``).

Commands sit on top of the library: they import every layer below, and nothing imports them but the
``python -m`` entry points (``amp_backends/__main__.py``, ``info.py``, ``bench.py``, ``examples/*/__main__.py``).
"""
