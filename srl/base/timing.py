"""A rate limiter for periodic work on a hot loop (reports, progress lines)."""

from __future__ import annotations

import time


class Every:
    """``due()`` is true at most once per ``interval`` seconds (always when forced); 0 means every call."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last = float("-inf")

    def restart(self) -> None:
        """Count the interval from now."""
        self._last = time.monotonic()

    def due(self, force: bool = False) -> bool:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return False
        self._last = now
        return True
