"""The command line, the only code that parses arguments or exits: ``cli`` (``amp-backends``), ``info`` with
``report``, ``check``, ``train`` (the examples), ``bench``, and what they share (``typer_app``).

Commands sit on top of the library: they import every layer below, and nothing imports them but the
``python -m`` entry points (``amp_backends/__main__.py``, ``info.py``, ``bench.py``, ``examples/*/__main__.py``).
"""
