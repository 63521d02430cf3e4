"""The one error every config check raises, and the check itself.

A :class:`ConfigError` message starts with the field at fault, so the CLI prints it as one line and exits
non-zero. Each section prefixes its own fields; :func:`srl.api.config.parse.build` adds the section path.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A config field is missing, unknown, of the wrong type or out of range."""


def check(cond: bool, name: str, msg: str) -> None:
    """Raise :class:`ConfigError` naming ``name`` unless ``cond`` holds."""
    if not cond:
        raise ConfigError(f"{name}: {msg}")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'CartPole-v1'?"`` for the known name closest to a mistyped ``name`` (case aside), else ``""``.

    Ties go to the greatest name, so a wrong version of an env id suggests its newest version.
    """
    by_folded = {k.casefold(): k for k in sorted(known)}
    close = difflib.get_close_matches(name.casefold(), by_folded, n=1)
    return f"; did you mean {by_folded[close[0]]!r}?" if close else ""
