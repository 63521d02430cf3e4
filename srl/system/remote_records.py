"""Record channels across nodes, and mailboxes: messages between workers over ZeroMQ, with the run's token.

**Record channels.** A stream kind's small integer records over ZeroMQ TCP.

On one machine a channel is a node-local pipe (a queue inline). Under Ray a bound kind's channel may join workers
on different nodes: the population's episodes (actors on every actor node -> the population worker) and its
member commands (the population worker -> each member's lead trainer, wherever its node group is). The reader
binds a PULL socket and the writers connect PUSH sockets to it; both ends are :class:`~srl.base.channel.Channel`,
so the workers do not know which one they have. Each message is one wire message (a header and the raw
``[n, width]`` int32 records, never pickle) with the run's token; the reader drops and counts malformed or
unauthenticated messages.

A writer never blocks its worker's loop. While its reader is away (a restarting worker binds its old address
again, and ZeroMQ reconnects) up to ``queue`` messages wait in ZeroMQ; past that a record is dropped and counted
(``dropped``). Both kinds of records tolerate it: an episodes record only moves a member's counters, and a
member command that was never carried out is asked for again (an export) or found in the run directory by a
restarted trainer (an import).

**Mailboxes.** A stream kind with ``mail`` carries messages of any size: a small meta (plain values) and one byte
payload, such as a state handed from one worker to another (a population member's, as checkpoint bytes). The
reader binds a PULL socket (``ipc://`` in the run's pipe folder on one machine, ``tcp://`` under Ray, where it may
be on another node), its writers connect PUSH sockets; inline, :class:`InProcMail` is a queue. Every message is one
wire message with the run's token; the reader drops and counts malformed or unauthenticated ones. A writer never
blocks its worker: what cannot be queued for an absent reader is dropped and counted, so a protocol over mail
asks again for what was not answered (the population's does).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import zmq

from srl.base import wire
from srl.base.channel import Channel
from srl.system.remote_samples import MAX_LOGGED_REJECTS

log = logging.getLogger(__name__)

RECORDS = "records"
QUEUE = 1000
"""Messages ZeroMQ holds for an absent reader (per writer) before records are dropped."""


class RecordReader(Channel):
    """The reader's end: a bound PULL socket. ``address``: where to bind (``tcp://HOST:*`` picks a port;
    :attr:`address` is the bound endpoint)."""

    def __init__(self, width: int, address: str, token: str, ctx: zmq.Context, queue: int = QUEUE) -> None:
        super().__init__(width)
        self.token = token
        self._sock = _bound_pull(ctx, address, queue)
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._held: deque[np.ndarray] = deque()  # records received beyond what a recv asked for
        self.received = 0
        self.rejected = 0

    def send(self, record: Sequence[int] | np.ndarray) -> None:
        raise TypeError("a record reader only reads")

    def recv(self, max_records: int, timeout: float | None) -> np.ndarray:
        """Up to ``max_records`` records; waits up to ``timeout`` seconds for the first message (None: forever)."""
        if not self._held and not self._sock.poll(None if timeout is None else int(timeout * 1000)):
            return self._empty()
        while sum(len(a) for a in self._held) < max_records:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            records = self._accept(frames)
            if records is not None and len(records):
                self._held.append(records)
        out, n = [], 0
        while self._held and n < max_records:
            head = self._held.popleft()
            take = min(len(head), max_records - n)
            out.append(head[:take])
            if take < len(head):
                self._held.appendleft(head[take:])
            n += take
        return np.concatenate(out) if out else self._empty()

    def _accept(self, frames: list[Any]) -> np.ndarray | None:
        msg = _authentic(self, frames, RECORDS, {RECORDS: ("int32", (None, self.width))}, "record channel")
        if msg is None:
            return None
        records = np.array(msg.arrays[RECORDS], np.int32)  # own the words: the frame is freed with the message
        self.received += len(records)
        return records

    def fileno(self) -> int | None:
        """ZeroMQ's descriptor: it polls readable when the socket's state may have changed (see
        :meth:`has_buffered`)."""
        return int(self._sock.getsockopt(zmq.FD))

    def has_buffered(self) -> bool:
        """Records are held here, or a message waits in ZeroMQ (reading the events re-arms the descriptor)."""
        return bool(self._held) or bool(int(self._sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)

    def close(self) -> None:
        self._held.clear()
        self._sock.close()


class RecordWriter(Channel):
    """A writer's end: a PUSH socket connected to the reader's address."""

    def __init__(self, width: int, address: str, token: str, ctx: zmq.Context, queue: int = QUEUE) -> None:
        super().__init__(width)
        self.token = token
        self._sock = _connected_push(ctx, address, queue)
        self.address = address
        self.sent = 0
        self.dropped = 0

    def send(self, record: Sequence[int] | np.ndarray) -> None:
        """Send one record, or every row of a 2-D batch, as one message; dropped (and counted) when ZeroMQ's
        queue to an absent reader is full."""
        records = self._records(record)
        if not len(records):
            return
        if _sent(self._sock, wire.encode(RECORDS, {RECORDS: records}, {"token": self.token})):
            self.sent += len(records)
        else:
            self.dropped += len(records)

    def recv(self, max_records: int, timeout: float | None) -> np.ndarray:
        raise TypeError("a record writer only writes")

    def close(self) -> None:
        self._sock.close()


MAIL = "mail"
PAYLOAD = "payload"
Mail = tuple[dict[str, Any], bytes]
"""A message of a mailbox: its meta (plain values) and its payload."""


class Mailbox(Protocol):
    """Either end of a mailbox endpoint (a reader only reads, a writer only writes)."""

    def send(self, meta: Mapping[str, Any], payload: bytes = b"") -> None:
        """Send one message (dropped and counted when it cannot be queued)."""

    def recv(self, timeout: float = 0.0) -> list[Mail]:
        """The messages that came, waiting up to ``timeout`` seconds for the first (None: forever)."""

    def close(self) -> None:
        """Close this end."""


class InProcMail:
    """A mailbox inside one process (the inline runtime): both ends are this queue."""

    def __init__(self) -> None:
        self._queue: deque[Mail] = deque()

    def send(self, meta: Mapping[str, Any], payload: bytes = b"") -> None:
        wire.encode(MAIL, None, meta)  # what the sockets would refuse is refused here too
        self._queue.append((dict(meta), bytes(payload)))

    def recv(self, timeout: float = 0.0) -> list[Mail]:
        out = list(self._queue)
        self._queue.clear()
        return out

    def close(self) -> None:
        self._queue.clear()


class MailReader:
    """A mailbox's reading end: a bound PULL socket (``address``: where to bind; :attr:`address` is the bound
    endpoint)."""

    def __init__(self, address: str, token: str, ctx: zmq.Context, queue: int = QUEUE) -> None:
        self.token = token
        self._sock = _bound_pull(ctx, address, queue)
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.rejected = 0

    def send(self, meta: Mapping[str, Any], payload: bytes = b"") -> None:
        raise TypeError("a mailbox reader only reads")

    def recv(self, timeout: float = 0.0) -> list[Mail]:
        out: list[Mail] = []
        if not self._sock.poll(None if timeout is None else int(timeout * 1000)):
            return out
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return out
            msg = _authentic(self, frames, MAIL, {PAYLOAD: ("uint8", (None,))}, "mailbox")
            if msg is None:
                continue
            meta = {k: v for k, v in msg.meta.items() if k != "token"}
            out.append((meta, msg.arrays[PAYLOAD].tobytes()))

    def close(self) -> None:
        self._sock.close()


class MailWriter:
    """A mailbox's writing end: a PUSH socket connected to the reader's address."""

    def __init__(self, address: str, token: str, ctx: zmq.Context, queue: int = QUEUE) -> None:
        self.token = token
        self._sock = _connected_push(ctx, address, queue)
        self.address = address
        self.sent = 0
        self.dropped = 0

    def send(self, meta: Mapping[str, Any], payload: bytes = b"") -> None:
        frames = wire.encode(MAIL, {PAYLOAD: np.frombuffer(payload, np.uint8)}, {**meta, "token": self.token})
        if _sent(self._sock, frames):
            self.sent += 1
        else:
            self.dropped += 1

    def recv(self, timeout: float = 0.0) -> list[Mail]:
        raise TypeError("a mailbox writer only writes")

    def close(self) -> None:
        self._sock.close()


def _bound_pull(ctx: zmq.Context, address: str, queue: int) -> zmq.Socket:
    """A reader's socket: PULL, bound at ``address``, holding up to ``queue`` messages."""
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, queue)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    return sock


def _connected_push(ctx: zmq.Context, address: str, queue: int) -> zmq.Socket:
    """A writer's socket: PUSH, connected to ``address``, queueing up to ``queue`` messages for an absent reader."""
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, queue)
    sock.setsockopt(zmq.LINGER, 2000)  # a stopping worker still delivers what it queued
    sock.connect(address)
    return sock


def _sent(sock: zmq.Socket, frames: list[Any]) -> bool:
    """Send ``frames`` without blocking; False when ZeroMQ's queue to an absent reader is full."""
    try:
        sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=True)
    except zmq.Again:
        return False
    return True


def _authentic(reader: Any, frames: list[Any], schema: str, fields: Any, what: str) -> wire.Message | None:
    """A received message of ``schema`` with the run's token (``reader.token``), or None: counted in
    ``reader.rejected`` and logged (the first :data:`MAX_LOGGED_REJECTS`)."""
    try:
        msg = wire.decode([f.buffer for f in frames], expect_schema=schema, fields=fields)
        wire.check_token(msg.meta.get("token"), reader.token)
    except wire.WireError as exc:
        reader.rejected += 1
        if reader.rejected <= MAX_LOGGED_REJECTS:
            log.error("%s %s: rejected message: %s", what, reader.address, exc)
        return None
    return msg
