"""The progress line of a run: rewritten in place on a terminal, a plain line of its own anywhere else.

Why: a log file (``nohup``, a batch scheduler's output) keeps every byte it is given, and a line rewritten with
``\\r`` once a second becomes one line of hundreds of kilobytes an hour that no pager or ``tail`` can show.
"""

from __future__ import annotations

from typing import TextIO


class ProgressLine:
    """Writes the newest progress and the notes between them to ``stream`` (nothing when it is None)."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.in_place = stream is not None and stream.isatty()
        """A terminal: each progress overwrites the one before."""
        self._open = False  # a progress line in place, not yet ended

    def show(self, text: str) -> None:
        """The newest progress: over the previous one on a terminal, else one line of its own."""
        if self.stream is None:
            return
        if self.in_place:
            self.stream.write(f"\r{text}")
            self._open = True
        else:
            self.stream.write(f"{text.rstrip()}\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        """A line of its own (a warning), under the progress shown so far."""
        if self.stream is None:
            return
        self.end()
        self.stream.write(f"{text}\n")

    def end(self) -> None:
        """End a progress line shown in place, so that what is written next starts on a line of its own."""
        if self.stream is not None and self._open:
            self.stream.write("\n")
            self._open = False
