"""The version of amp_backends (the package face re-exports it as ``amp_backends.__version__``)."""

__version__ = "0.1.0"
"""The installed version of amp_backends (PEP 440), as in the package metadata."""
