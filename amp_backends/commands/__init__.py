"""The command line, the only code that parses arguments or exits: ``cli`` (``amp-backends``) and a module per
subcommand (``<subcommand>_command``; ``capability_report`` is what ``info`` prints; the ``bench`` package), with what
they share in ``typer_app``. Nothing imports them but the ``python -m`` entry points.
"""
