"""Errors a user can cause. The CLI turns each into one line ``error: ...`` and exit status 2."""

from __future__ import annotations


class AblateError(Exception):
    """Base class for every error caused by user input (config, corpus, storage, ...).

    The message must name the offending key or file, e.g. ``model.num_heads: ...``.
    """


class ConfigError(AblateError):
    """A config file, override or study spec is malformed or describes an impossible model."""


class DataError(AblateError):
    """A corpus is missing, empty or unreadable."""


class StorageError(AblateError):
    """A tracking or study storage cannot be reached or used."""
