"""The one error every config check raises, and the check itself.

A :class:`ConfigError` message starts with the field at fault, so the CLI prints it as one line and exits
non-zero. Each section prefixes its own fields; :func:`srl.api.config.parse.build` adds the section path.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A config field is missing, unknown, of the wrong type or out of range."""


def check(cond: bool, name: str, msg: str) -> None:
    """Raise :class:`ConfigError` naming ``name`` unless ``cond`` holds."""
    if not cond:
        raise ConfigError(f"{name}: {msg}")
