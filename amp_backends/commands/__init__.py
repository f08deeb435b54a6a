"""The command line and what it shows: ``cli`` (``amp-backends``), ``report`` (``info``), ``bench``.

Commands sit on top of the library: they import the core, never the reverse.
"""
