"""Errors that modules on every floor raise, defined below all of them (tests/test_layout.py)."""


class ConfigError(ValueError):
    """A configuration mistake the user can fix; the message says how."""
