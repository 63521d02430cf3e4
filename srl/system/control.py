"""The control channel: workers report metrics and events to the controller.

Across processes it is a ZeroMQ PUSH -> PULL pipe carrying wire-format
messages (a msgpack header plus raw arrays, never pickle). A malformed
message is logged and dropped; it never stops the receiver. In the inline
runtime workers call the controller directly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import zmq

from srl.api.worker import Reporter
from srl.base import wire
from srl.system.cost import process_spent

log = logging.getLogger(__name__)

Handler = Callable[[str, Mapping[str, Any], Mapping[str, np.ndarray]], None]
"""Takes one report (kind, meta, arrays); raises KeyError (or TypeError, ValueError, IndexError) for a report it
cannot take: a kind it has no handler of, a field missing or of the wrong type."""


class NamedReporter:
    """A worker's reporter: stamps every report with the worker's name (``meta["worker"]``), as the plan gave it,
    so that what the controller keys by worker comes from the plan, never parsed back from a report."""

    def __init__(self, reporter: Reporter, worker: str) -> None:
        self.reporter, self.worker = reporter, worker

    def report(self, kind: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> None:
        self.reporter.report(kind, {**meta, "worker": self.worker}, arrays)


class DirectReporter:
    """In-process reporter: hands records straight to a handler (the controller)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    def report(self, kind: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> None:
        self.handler(kind, meta, arrays or {})


class ZmqReporter:
    """Worker side of the control channel. Created in the worker's own process (sockets don't survive fork), so
    every report also carries what the process spent (:func:`srl.system.cost.process_spent`)."""

    def __init__(self, address: str, linger_ms: int = 2000, token: str | None = None) -> None:
        """``token``: the run's secret, sent with every report when the channel crosses the network."""
        self._token = token
        self._began = time.time()
        self._ctx = zmq.Context()  # its own context, so close() can flush it without touching others
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, linger_ms)
        self._sock.setsockopt(zmq.SNDHWM, 10_000)
        self._sock.connect(address)

    def report(self, kind: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> None:
        meta = {**meta, **process_spent(self._began)}
        if self._token is not None:
            meta["token"] = self._token
        self._sock.send_multipart(wire.encode(kind, arrays or {}, meta), copy=False)

    def close(self) -> None:
        """Close and wait (up to the linger time) until queued reports are delivered.

        Worker processes leave with ``os._exit``, which would drop messages still queued
        in ZeroMQ's I/O thread; terminating the context here flushes them first.
        """
        self._sock.close()
        self._ctx.term()


class ControlReceiver:
    """Controller side: binds the PULL socket and dispatches validated messages."""

    def __init__(self, address: str, handler: Handler, token: str | None = None) -> None:
        """``address``: where to bind (``tcp://HOST:*`` picks a port; :attr:`address` is the bound endpoint).
        ``token``: when given, messages without it are rejected (a channel reachable over the network)."""
        self.handler = handler
        self.token = token
        self.rejected = 0
        self._ctx: zmq.Context = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(address)
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def drain(self, timeout: float) -> int:
        """Handle every pending message, waiting up to ``timeout`` seconds for the first one."""
        handled = 0
        if not self._sock.poll(int(timeout * 1000)):
            return 0
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return handled
            try:
                msg = wire.decode([f.buffer for f in frames])
                if self.token is not None:
                    wire.check_token(msg.meta.pop("token", None), self.token)
            except wire.WireError as exc:
                self.rejected += 1
                log.error("control channel: rejected message: %s", exc)
                continue
            try:
                self.handler(msg.schema, msg.meta, msg.arrays)
            except (KeyError, TypeError, ValueError, IndexError) as exc:  # well-framed, wrong kind or content
                self.rejected += 1
                log.error("control channel: rejected %r message: %s: %s", msg.schema, type(exc).__name__, exc)
                continue
            handled += 1

    def close(self) -> None:
        self._sock.close()
