"""Exceptions raised for user input and for requests the hardware cannot honour."""

from __future__ import annotations


class AmpConfigError(ValueError):
    """A configuration value is not one of the accepted ones (bad keyword argument or env variable)."""


class UnsupportedRequestError(AmpConfigError):
    """A valid request that this hardware cannot honour, raised instead of a downgrade when ``strict``."""


class AmpWarning(UserWarning):
    """Emitted when a request is downgraded, or honoured although it is known to be slow."""
