"""The sample stream across nodes: trajectory segments over ZeroMQ TCP with the run's token, and credits back.

Inside a node the sample stream is a shared-memory pool plus small records
(:mod:`srl.system.streams`). When the trainer lives on another node, the actor
still fills its node-local buffer in place, but a finished segment is sent as
one wire-format message (header + the raw field buffers, never pickle). The
trainer keeps each received message as it arrived and reads the fields straight
from its frames: no landing pool, no second copy before the batch.

Flow control is the pool's, as inside a node: a sent buffer is free again only when the trainer has taken its
segment (copied it into a batch, or dropped it as too old), which the trainer says with a *credit*, a small
message back on the same connection naming the buffer and the segment's sequence number. So an actor has at most
its pool row's buffers (``workers.sample_buffers``) segments between its envs and the trainer, wherever the
trainer runs, and the policy lag is bounded as under the local runtime. Why not ZeroMQ's own back-pressure, as
before (a buffer free once ZeroMQ had queued its copy, high-water marks of one segment): it counts messages per
pipe, not what the kernel's socket buffers and the receiver's queue hold, so segments piled up on the way, about
4.4 versions of lag on CartPole against 2.0 inside a node.

Credits come only from a trainer that got the segments: one that died took the credits of what it held with it. So
the sender watches its connection (a ZeroMQ socket monitor): when it drops, every buffer still waiting for a credit
is free again (its segment counted in ``lost``), and a late credit for a buffer since sent anew is told apart by
its sequence number.

Both ends have the same interface as their shared-memory counterparts
(``acquire``/``submit`` and ``receive``/``segment``/``release``), so actors and
trainers do not know which one they have. A sender whose buffers all wait (to be
sent, or for their credits) parks its actor exactly as a full pool does.
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
CREDIT = "credit"
"""The receiver's word back: the segment sent from ``buffer`` as ``seq`` is taken, the buffer may be refilled."""
MAX_LOGGED_REJECTS = 20
"""Rejected messages are always counted, and logged one per line up to this many (a flood must not fill logs)."""


def segment_bytes(fields: Mapping[str, FieldSpec]) -> int:
    """Bytes of one segment's fields."""
    return sum(int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize for spec in fields.values())


def _int_meta(meta: Mapping[str, Any], *names: str) -> tuple[int, ...]:
    """The named integer fields of a message's meta (WireError when one is missing or not an int)."""
    values = tuple(meta.get(name) for name in names)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise wire.WireError(f"meta {names} must be integers, got {values}")
    return values  # type: ignore[return-value]  # checked above


class SendBell(Channel):
    """A sender's bell: its socket's ZeroMQ descriptor, which polls readable when the socket's state may have
    changed (a credit came back, or ZeroMQ took a segment off its queue). An actor whose buffers all wait blocks on
    it beside its other channels, and wakes when one may be free, not every millisecond. It carries no records:
    what changed is read from the socket (``zmq.EVENTS``, which also re-arms the descriptor)."""

    def __init__(self, sender: SampleSender) -> None:
        super().__init__(1)
        self._sender = sender

    def send(self, record: Any) -> None:
        raise TypeError("a send bell is rung by ZeroMQ, not by records")

    def recv(self, max_records: int, timeout: float | None) -> np.ndarray:
        """Nothing to take: the sender reads its socket before it looks at its buffers."""
        return self._empty()

    def fileno(self) -> int | None:
        return self._sender.socket_fd

    def has_buffered(self) -> bool:
        """A credit came back, or a buffer waiting to be sent can go now."""
        return self._sender.has_news()

    def close(self) -> None:
        """The sender owns the socket."""


class SampleSender(SampleProducer):
    """Actor side: sends each finished segment of pool row ``row`` to a trainer on another node; a buffer is free
    again when the trainer's credit for it comes back."""

    def __init__(
        self,
        pool: SegmentPool,
        row: int,
        actor: int,
        address: str,
        token: str,
        ctx: zmq.Context,
        submitted: int = READY,
    ) -> None:
        """``submitted``: the state a finished buffer stays in until its credit comes back (what the sender
        holds)."""
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.SNDHWM, pool.layout.buffers)  # never the bound: the credits are
        sock.setsockopt(zmq.LINGER, 2000)  # a stopping actor still delivers what it queued
        self._monitor: zmq.Socket = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sock.connect(address)
        super().__init__(pool, row, InProcChannel(2), submitted)  # the channel is unused: segments go out on the socket
        self.row, self.actor, self.token, self._sock = row, actor, token, sock
        self._unsent: deque[int] = deque()
        self._awaiting: dict[int, int] = {}  # buffer -> sequence number of the segment sent from it, until credited
        self._seq = 0
        self.sent = 0
        self.lost = 0
        """Segments whose credit never came: the connection dropped (their trainer died) while they were out."""
        self.rejected = 0
        """Messages back that were not credits of this run (counted, never acted on)."""
        self.socket_fd: int = sock.getsockopt(zmq.FD)
        self.bell = SendBell(self)

    def can_send(self) -> bool:
        """A finished segment waits and ZeroMQ would take it now (reads the socket's events: re-arms its
        descriptor)."""
        return bool(self._unsent) and bool(self._sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT)

    def has_news(self) -> bool:
        """A credit waits to be read, or a finished segment can go now (re-arms the socket's descriptor)."""
        events = self._sock.getsockopt(zmq.EVENTS)
        return bool(events & zmq.POLLIN) or (bool(self._unsent) and bool(events & zmq.POLLOUT))

    @property
    def unsent(self) -> int:
        """Finished segments waiting for ZeroMQ to take them."""
        return len(self._unsent)

    @property
    def awaiting(self) -> int:
        """Segments sent whose credit has not come back yet."""
        return len(self._awaiting)

    def acquire(self) -> int | None:
        """A free buffer now marked FILLING, or None when all are in use, waiting to be sent or for their credits."""
        self.flush()
        return super().acquire()

    def submit(self, buffer: int) -> None:
        """The segment in ``buffer`` is complete: send it (or queue it while the socket is full)."""
        self._state[buffer] = self.submitted
        self._unsent.append(buffer)
        self.flush()

    def flush(self) -> None:
        """Take in the credits that came back, then send what ZeroMQ can take now, oldest first."""
        self._take_credits()
        # EVENTS (read by can_send) takes in the room ZeroMQ's I/O thread made for the next segment; a non-blocking
        # send checks for it only about once per millisecond, so without it a segment finished soon after the
        # previous one would wait in its buffer until the next segment ends.
        while self.can_send():
            buf, seq = self._unsent[0], self._seq + 1
            meta = {"token": self.token, "actor": self.actor, "buffer": buf, "seq": seq}
            frames = wire.encode(SEGMENT, self.pool.segment(self.row, buf), meta)
            try:
                self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=True)  # a copy: the buffer stays intact
            except zmq.Again:
                return
            self._unsent.popleft()
            self._awaiting[buf] = self._seq = seq
            self.sent += 1

    def _take_credits(self) -> None:
        """Free each buffer whose credit came back; all that wait for one when the connection dropped."""
        if self._dropped():
            for buf in self._awaiting:
                self._state[buf] = FREE
            self.lost += len(self._awaiting)
            self._awaiting.clear()
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            credit = self._credit(frames)
            if credit is not None and self._awaiting.get(credit[0]) == credit[1]:  # not one for a buffer sent anew
                del self._awaiting[credit[0]]
                self._state[credit[0]] = FREE

    def _dropped(self) -> bool:
        """Whether the connection to the trainer dropped since the last look (the monitor's events, all read)."""
        dropped = False
        while True:
            try:
                self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return dropped
            dropped = True

    def _credit(self, frames: list[Any]) -> tuple[int, int] | None:
        """``(buffer, seq)`` of a valid credit; None (counted) for anything else."""
        try:
            msg = wire.decode([f.buffer for f in frames], expect_schema=CREDIT, fields={})
            wire.check_token(msg.meta.get("token"), self.token)
            buf, seq = _int_meta(msg.meta, "buffer", "seq")
        except wire.WireError as exc:
            self.rejected += 1
            if self.rejected <= MAX_LOGGED_REJECTS:
                log.error("sample stream: rejected credit: %s", exc)
            return None
        return buf, seq

    def close(self) -> None:
        self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._sock.close()


class SampleReceiver:
    """Trainer side: a bound ROUTER socket; each valid message is one segment, read in place from its frames, and
    its release sends the sender a credit for its buffer."""

    channel: Channel | None = None
    """Segments come over the socket: no channel to wait on beside others (only :meth:`receive` waits)."""

    def __init__(
        self, fields: Mapping[str, FieldSpec], address: str, token: str, ctx: zmq.Context, queue: int = 2
    ) -> None:
        """``address``: where to bind (``tcp://HOST:*`` picks a port; :attr:`address` is the bound endpoint);
        ``queue``: segments ZeroMQ holds per sender before it stops reading that sender's connection."""
        self.fields = fields
        self.token = token
        self._expect = {name: (spec.dtype, spec.shape) for name, spec in fields.items()}
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.RCVHWM, queue)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(address)
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._held: dict[int, tuple[dict[str, np.ndarray], bytes, int, int]] = {}  # arrays, sender, buffer, seq
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
                sender, *frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            held = self._accept(frames)
            if held is not None:
                handle = self._next
                self._next = (self._next + 1) & 0x7FFFFFFF
                self._held[handle] = (held[0], sender.bytes, held[1], held[2])
                out.append((handle, 0))
        return np.asarray(out, np.int32).reshape(-1, 2)

    def _accept(self, frames: list[Any]) -> tuple[dict[str, np.ndarray], int, int] | None:
        try:
            msg = wire.decode([f.buffer for f in frames], expect_schema=SEGMENT, fields=self._expect)
            wire.check_token(msg.meta.get("token"), self.token)
            buf, seq = _int_meta(msg.meta, "buffer", "seq")
        except wire.WireError as exc:
            self.rejected += 1
            if self.rejected <= MAX_LOGGED_REJECTS:
                log.error("sample stream: rejected message: %s", exc)
            return None
        self.received += 1
        return msg.arrays, buf, seq

    def segment(self, handle: int, buffer: int) -> dict[str, np.ndarray]:
        """The fields of a received segment (read-only views into its message)."""
        return self._held[handle][0]

    def release(self, handle: int, buffer: int) -> None:
        """Done with this segment: its message is freed, and its sender gets the credit for its buffer (dropped by
        ZeroMQ when that sender is gone)."""
        held = self._held.pop(handle, None)
        if held is None:
            return
        _, sender, buf, seq = held
        credit = wire.encode(CREDIT, None, {"token": self.token, "buffer": buf, "seq": seq})
        try:
            self._sock.send_multipart([sender, *credit], flags=zmq.NOBLOCK)
        except zmq.Again:  # its queue back is full: a sender that stopped reading
            pass

    def ring(self) -> None:
        """Nobody to wake here: each release sent its credit."""

    def holds(self, handle: int, buffer: int) -> bool:
        """Whether the segment is still held (each message is a copy of its own, handed over once)."""
        return handle in self._held

    def close(self) -> None:
        self._held.clear()
        self._sock.close()


class RemoteForwarder:
    """A stage's way on to trainers on other nodes: one :class:`SampleSender` per pool row it serves (each row's
    segments go to the trainer its actor feeds). A kept buffer stays held until the trainer's credit for it."""

    def __init__(self, senders: Mapping[int, SampleSender]) -> None:
        self.senders = senders

    def forward(self, actor: int, buffer: int) -> None:
        self.senders[actor].submit(buffer)

    def flush(self) -> bool:
        """Take in credits and send what can go; whether nothing waits to be sent."""
        for sender in self.senders.values():
            sender.flush()
        return not any(sender.unsent for sender in self.senders.values())

    def close(self) -> None:
        for sender in self.senders.values():
            sender.close()
