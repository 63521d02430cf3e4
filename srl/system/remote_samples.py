"""The sample stream across nodes: trajectory segments over ZeroMQ TCP, with the run's token.

Inside a node the sample stream is a shared-memory pool plus small records
(:mod:`srl.system.streams`). When the trainer lives on another node, the actor
still fills its node-local buffer in place, but a finished segment is sent as
one wire-format message (header + the raw field buffers, never pickle) and its
buffer is free again as soon as ZeroMQ has queued the copy. The trainer keeps
each received message as it arrived and reads the fields straight from its
frames: no landing pool, no second copy before the batch.

Both ends have the same interface as their shared-memory counterparts
(``acquire``/``submit`` and ``receive``/``segment``/``release``), so actors and
trainers do not know which one they have. Back-pressure is ZeroMQ's: a sender
whose queue to the trainer is full keeps its finished buffers READY (they are
not reused) and retries on its next acquire, so a slow trainer parks actors
exactly as a full pool does.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np
import zmq

from srl.api.schema import FieldSpec
from srl.base import wire
from srl.base.channel import Channel, InProcChannel
from srl.system.streams import FREE, READY, SampleProducer, SegmentPool

log = logging.getLogger(__name__)

SEGMENT = "segment"
MAX_LOGGED_REJECTS = 20
"""Rejected messages are always counted, and logged one per line up to this many (a flood must not fill logs)."""


def segment_bytes(fields: Mapping[str, FieldSpec]) -> int:
    """Bytes of one segment's fields."""
    return sum(int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize for spec in fields.values())


class SendBell(Channel):
    """A sender's bell: its socket's ZeroMQ descriptor, which polls readable when the socket's state may have
    changed (ZeroMQ took a segment off its queue, so there is room for the next). An actor whose buffers all wait
    to be sent blocks on it beside its other channels, and wakes when one can go, not every millisecond. It carries
    no records: what changed is read from the socket (``zmq.EVENTS``, which also re-arms the descriptor)."""

    def __init__(self, sender: SampleSender) -> None:
        super().__init__(1)
        self._sender = sender

    def send(self, record: Any) -> None:
        raise TypeError("a send bell is rung by ZeroMQ, not by records")

    def recv(self, max_records: int, timeout: float | None) -> np.ndarray:
        """Nothing to take: the sender reads its socket's events before it looks at its buffers."""
        return self._empty()

    def fileno(self) -> int | None:
        return self._sender.socket_fd

    def has_buffered(self) -> bool:
        """A buffer can go now (the socket has room for one waiting to be sent)."""
        return self._sender.can_send()

    def close(self) -> None:
        """The sender owns the socket."""


class SampleSender(SampleProducer):
    """Actor side: sends each finished segment of pool row ``row`` to a trainer on another node."""

    def __init__(
        self,
        pool: SegmentPool,
        row: int,
        actor: int,
        address: str,
        token: str,
        ctx: zmq.Context,
        queue: int = 1,
        submitted: int = READY,
    ) -> None:
        """``queue``: segments ZeroMQ may hold for this sender before it applies back-pressure. Kernel socket
        buffers are sized to one segment too: every segment queued on the way is one more version of lag.
        ``submitted``: the state a finished buffer waits in until it is sent (what the sender holds)."""
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, queue)
        sock.setsockopt(zmq.SNDBUF, segment_bytes(pool.layout.fields))
        sock.setsockopt(zmq.LINGER, 2000)  # a stopping actor still delivers what it queued
        sock.connect(address)
        super().__init__(pool, row, InProcChannel(2), submitted)  # the channel is unused: segments go out on the socket
        self.row, self.actor, self.token, self._sock = row, actor, token, sock
        self._unsent: deque[int] = deque()
        self.sent = 0
        self.socket_fd: int = sock.getsockopt(zmq.FD)
        self.bell = SendBell(self)

    def can_send(self) -> bool:
        """A finished segment waits and ZeroMQ would take it now (reads the socket's events: re-arms its
        descriptor)."""
        return bool(self._unsent) and bool(self._sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT)

    @property
    def unsent(self) -> int:
        """Finished segments waiting for ZeroMQ to take them."""
        return len(self._unsent)

    def acquire(self) -> int | None:
        """A free buffer now marked FILLING, or None when all are in use or waiting to be sent."""
        self.flush()
        return super().acquire()

    def submit(self, buffer: int) -> None:
        """The segment in ``buffer`` is complete: send it (or queue it while the trainer is behind)."""
        self._state[buffer] = self.submitted
        self._unsent.append(buffer)
        self.flush()

    def flush(self) -> None:
        """Send what ZeroMQ can take now, oldest first; each sent buffer is free again."""
        # EVENTS (read by can_send) takes in the credits ZeroMQ's I/O thread returned for sent segments; a
        # non-blocking send checks for them only about once per millisecond, so without it a segment finished soon
        # after the previous one would wait in its buffer until the next segment ends.
        while self.can_send():
            buf = self._unsent[0]
            frames = wire.encode(SEGMENT, self.pool.segment(self.row, buf), {"token": self.token, "actor": self.actor})
            try:
                self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=True)  # the buffer is reused at once
            except zmq.Again:
                return
            self._unsent.popleft()
            self._state[buf] = FREE
            self.sent += 1

    def close(self) -> None:
        self._sock.close()


class SampleReceiver:
    """Trainer side: a bound PULL socket; each valid message is one segment, read in place from its frames."""

    channel: Channel | None = None
    """Segments come over the socket: no channel to wait on beside others (only :meth:`receive` waits)."""

    def __init__(
        self, fields: Mapping[str, FieldSpec], address: str, token: str, ctx: zmq.Context, queue: int = 2
    ) -> None:
        """``address``: where to bind (``tcp://HOST:*`` picks a port; :attr:`address` is the bound endpoint)."""
        self.fields = fields
        self.token = token
        self._expect = {name: (spec.dtype, spec.shape) for name, spec in fields.items()}
        self._sock = ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, queue)
        self._sock.setsockopt(zmq.RCVBUF, segment_bytes(fields))
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(address)
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._held: dict[int, dict[str, np.ndarray]] = {}
        self._next = 0
        self.received = 0
        self.rejected = 0

    def receive(self, max_segments: int, timeout: float | None) -> np.ndarray:
        """Up to ``max_segments`` records ``(handle, 0)`` of received segments; malformed messages are dropped."""
        out: list[tuple[int, int]] = []
        if max_segments <= 0 or not self._sock.poll(None if timeout is None else int(timeout * 1000)):
            return np.zeros((0, 2), np.int32)
        while len(out) < max_segments:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            arrays = self._accept(frames)
            if arrays is not None:
                handle = self._next
                self._next = (self._next + 1) & 0x7FFFFFFF
                self._held[handle] = arrays
                out.append((handle, 0))
        return np.asarray(out, np.int32).reshape(-1, 2)

    def _accept(self, frames: list[Any]) -> dict[str, np.ndarray] | None:
        try:
            msg = wire.decode([f.buffer for f in frames], expect_schema=SEGMENT, fields=self._expect)
            wire.check_token(msg.meta.get("token"), self.token)
        except wire.WireError as exc:
            self.rejected += 1
            if self.rejected <= MAX_LOGGED_REJECTS:
                log.error("sample stream: rejected message: %s", exc)
            return None
        self.received += 1
        return msg.arrays

    def segment(self, handle: int, buffer: int) -> dict[str, np.ndarray]:
        """The fields of a received segment (read-only views into its message)."""
        return self._held[handle]

    def release(self, handle: int, buffer: int) -> None:
        """Done with this segment: its message is freed."""
        self._held.pop(handle, None)

    def ring(self) -> None:
        """Nobody to wake: the sender's buffer was free once ZeroMQ took its copy."""

    def holds(self, handle: int, buffer: int) -> bool:
        """Whether the segment is still held (each message is a copy of its own, handed over once)."""
        return handle in self._held

    def close(self) -> None:
        self._held.clear()
        self._sock.close()


class RemoteForwarder:
    """A stage's way on to trainers on other nodes: one :class:`SampleSender` per pool row it serves (each row's
    segments go to the trainer its actor feeds). A kept buffer stays READY until ZeroMQ has queued its copy."""

    def __init__(self, senders: Mapping[int, SampleSender]) -> None:
        self.senders = senders

    def forward(self, actor: int, buffer: int) -> None:
        self.senders[actor].submit(buffer)

    def flush(self) -> bool:
        for sender in self.senders.values():
            sender.flush()
        return not any(sender.unsent for sender in self.senders.values())

    def close(self) -> None:
        for sender in self.senders.values():
            sender.close()
