"""SIGINT and SIGTERM as a request to stop, from a command's first line to its last.

Why a handler of our own from the start: under Python's own dispositions SIGTERM ends the process where it
stands (exit 143: no final checkpoint, no summary, a Ray instance it started left running) and SIGINT raises
KeyboardInterrupt wherever the main thread is. Why a run holds its first signal instead of raising it: raised,
it lands inside whatever the main thread is doing (a lazy import, a file write, starting Ray) and leaves that
half done; held, it sets the run's stop reason, the runtime's loop ends where it next checks, and teardown, the
final checkpoint and the summary run as on any other stop. A second signal raises: it is for a user who will
not wait.

What a second signal must not cut short: the cleanup after it (killing the workers, removing shared memory and
pipes) and the summary. Those run :func:`shielded`: a signal that comes meanwhile is kept, and raised as the
shielded block ends, so a user who presses Ctrl-C twice still finds ``summary.json`` and nothing left behind.
Everything shielded is bounded in time; a third signal raises at once all the same, so a shield never makes
``srl`` deaf (what it then leaves, the next run's sweep removes).

A signal the process inherited as ignored stays ignored: whoever started the process chose that (a shell
script starts ``srl train ... &`` with SIGINT ignored, so that a Ctrl-C meant for the script spares its
background jobs).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """The handler of SIGINT and SIGTERM. Outside :func:`held` blocks a signal raises KeyboardInterrupt. Inside,
    the first goes to the innermost block's ``on_stop``, or waits for a block that names one; a later one
    raises."""

    def __init__(self) -> None:
        self.received = 0
        self.holds = 0
        """Open :func:`held` blocks."""
        self.shields = 0
        """Open :func:`shielded` blocks."""
        self.on_stop: Callable[[], None] | None = None
        self.pending = False
        """A held signal that no ``on_stop`` has taken yet."""
        self.deferred = False
        """A signal that would have raised inside a shielded block: it raises as the block ends."""

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        # counted, not read from a run's stop reason: a run already stopping as solved still hears a second
        if self.holds == 0 or self.received > 1:
            if self.shields and not self.deferred:  # one is kept; one more breaks through (see shielded)
                self.deferred = True
                return
            self.deferred = False
            raise KeyboardInterrupt
        self.pending = True
        self.deliver()

    def deliver(self) -> None:
        """Give a held signal to ``on_stop``, if there is one to take it."""
        if self.pending and self.on_stop is not None:
            self.pending = False
            self.on_stop()


def _installed() -> StopSignals | None:
    """The :class:`StopSignals` that handles SIGINT or SIGTERM now, if any."""
    return next((h for h in map(signal.getsignal, SIGNALS) if isinstance(h, StopSignals)), None)


@contextlib.contextmanager
def listening() -> Iterator[StopSignals | None]:
    """Inside the block SIGINT and SIGTERM go to a :class:`StopSignals` (the one already installed, or a new one),
    except a signal that is ignored; the dispositions from before come back after it.

    Off the main thread, where Python allows no handlers, it changes nothing and yields the installed one, if any.
    """
    if threading.current_thread() is not threading.main_thread():
        yield _installed()
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    handler = _installed() or StopSignals()
    for sig, before in previous.items():
        if before is not signal.SIG_IGN:
            signal.signal(sig, handler)
    try:
        yield handler
    finally:
        for sig, before in previous.items():
            if before is not None:  # None: a handler set outside Python, which cannot be given back
                signal.signal(sig, before)


@contextlib.contextmanager
def held(on_stop: Callable[[], None] | None = None) -> Iterator[None]:
    """Inside, a run is starting or running: the first signal calls ``on_stop`` instead of raising.

    A block without ``on_stop`` (a run that is still starting) keeps its first signal for an inner block that
    names one; one that arrived earlier is given to ``on_stop`` as the block opens. A signal no block took raises
    KeyboardInterrupt as the outermost block ends (after a run has stopped, it still ends the command).
    """
    with listening() as handler:
        if handler is None:
            yield
            return
        outer = handler.on_stop
        handler.holds += 1
        if on_stop is not None:
            handler.on_stop = on_stop
            handler.deliver()
        try:
            yield
        finally:
            handler.holds -= 1
            handler.on_stop = outer
        if handler.pending and handler.holds == 0:
            handler.pending = False
            raise KeyboardInterrupt


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Inside, a signal that would raise is kept: what must run whole (a run's cleanup, its summary) does, and the
    signal raises KeyboardInterrupt as the outermost shielded block ends. One more signal while one is kept
    raises at once: what runs inside is bounded in time (kills, unlinks, bounded waits), but a user who presses
    Ctrl-C a third time is never kept waiting on something that went wrong."""
    with listening() as handler:
        if handler is None:
            yield
            return
        handler.shields += 1
        try:
            yield
        finally:
            handler.shields -= 1
            if handler.deferred and handler.shields == 0:
                handler.deferred = False
                raise KeyboardInterrupt
