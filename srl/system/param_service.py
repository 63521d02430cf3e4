"""The networked parameter service: a root server, a tree of relays, and network readers.

SRL's hierarchical parameter server. The lead trainer writes each new
snapshot into a node-local :class:`~srl.base.seqlock.VersionedBuffer`; a
*root* :class:`ParamServiceWorker` serves it over ZeroMQ. In hierarchical
mode one *relay* per node (or per group; a tree of configurable fan-out)
subscribes upstream, mirrors the newest snapshot into its node's own shared
buffer, and serves its children, so the root sends one copy per version to
each of its direct children instead of one per reader. In flat mode (kept for
comparison) every reader subscribes to the root itself.

Protocol (wire format, never pickle), a long poll over ROUTER/DEALER:

- request  ``param_get``       meta ``{"token": str, "since": int}``
- reply    ``param_snapshot``  meta ``{"version": int}``, array ``params`` (float32, float16, or bfloat16 as
  its uint16 pattern: ``srl/base/transfer.py``)

The server answers a request as soon as it holds a version newer than
``since`` (at once, or when one is published), and sends each version at most
once to each subscriber: a reader that asks again while its copy is still on
the wire (it re-asks after ``REASK_SECONDS`` without an answer, in case the
server restarted) waits for the next version instead of getting a second copy.
On a thin link a copy can take longer than that, and every duplicate would
slow the next copies further. A reader that reconnects is a new subscriber
(ZeroMQ gives each connection its own identity), so a lost copy is sent again.
Requests without the run's token, or malformed, are counted, logged and
dropped; the server keeps going.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import zmq

from srl.api.report import RunFacts
from srl.api.worker import Reporter, Worker
from srl.base import transfer, wire
from srl.base.seqlock import VersionedBuffer
from srl.base.timing import Every
from srl.system.params import SnapshotSource

log = logging.getLogger(__name__)

GET, SNAPSHOT = "param_get", "param_snapshot"
REASK_SECONDS = 5.0
"""A reader re-sends its request after this long without an answer (the upstream may have restarted)."""


def relay_parent(group: int, fan_out: int) -> str:
    """The server relay ``group`` subscribes to in a tree of ``fan_out``: the root serves relays
    ``0..fan_out-1``, relay ``r`` serves the ``fan_out`` relays after them (``(r+1)*fan_out ...``)."""
    return "root" if group < fan_out else f"relay{group // fan_out - 1}"


def _drain(sock: zmq.Socket, take: Any) -> None:
    """Hand every message already waiting on ``sock`` to ``take`` (never blocks)."""
    while True:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        take(frames)


class ParamServer:
    """Serves the newest snapshot of ``source`` to subscribers on ``address`` (ROUTER, bound)."""

    def __init__(
        self,
        ctx: zmq.Context,
        source: SnapshotSource,
        size: int,
        address: str,
        token: str,
        transfer_dtype: str = "float32",
    ) -> None:
        self.source, self.size, self.token = source, size, token
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a departed reader fails instead of vanishing
        self._sock.bind(address)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._scratch = np.empty(size, np.float32)
        self._dtype = transfer_dtype
        self._wire = np.empty(size, transfer.wire_dtype(transfer_dtype))
        self.version = -1
        self._pending: dict[bytes, int] = {}  # subscriber identity -> the version it already holds
        self._sent: dict[bytes, int] = {}  # subscriber identity -> the newest version sent to it
        self.sends = 0
        self.bytes_sent = 0
        self.rejected = 0

    @property
    def socket(self) -> zmq.Socket:
        return self._sock

    def poll(self) -> int:
        """Pick up a newer snapshot, take pending requests, answer those that can be answered; sends made."""
        newest = self.source.read_into(self._scratch, self.version) if self.source.version() > self.version else None
        if newest is not None:
            # A fresh array per version: frames still queued in ZeroMQ (sent without copying) keep
            # referencing the previous one, which must not change under them.
            self._wire = transfer.pack(self._scratch, self._dtype)
            self.version = newest
        _drain(self._sock, self._take)
        sent = 0
        if self.version >= 0:
            due = [i for i, since in self._pending.items() if since < self.version > self._sent.get(i, -1)]
            for identity in due:
                try:
                    self._sock.send_multipart(
                        [identity, *wire.encode(SNAPSHOT, {"params": self._wire}, {"version": self.version})],
                        flags=zmq.NOBLOCK,
                        copy=False,
                    )
                except zmq.Again:  # this reader's queue is full: try again on the next poll
                    continue
                except zmq.ZMQError:  # the reader has gone (EHOSTUNREACH): forget it
                    del self._pending[identity]
                    self._sent.pop(identity, None)
                    continue
                del self._pending[identity]
                self._sent[identity] = self.version
                sent += 1
        self.sends += sent
        self.bytes_sent += sent * self._wire.nbytes
        return sent

    def _take(self, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        try:
            msg = wire.decode([f.buffer for f in frames[1:]], expect_schema=GET, fields={})
            wire.check_token(msg.meta.get("token"), self.token)
            since = msg.meta.get("since")
            if not isinstance(since, int) or isinstance(since, bool):
                raise wire.WireError(f"'since' must be an int, got {since!r}")
        except wire.WireError as exc:
            self.rejected += 1
            log.error("parameter service: rejected request: %s", exc)
            return
        self._pending[identity] = since

    def close(self) -> None:
        self._sock.close()


class RemoteSnapshot:
    """A :class:`SnapshotSource` fed by a :class:`ParamServer` upstream (DEALER, connected).

    It keeps one request outstanding; each answer lands in a float32 staging
    copy and a new request for anything newer goes out at once.
    """

    def __init__(self, ctx: zmq.Context, address: str, size: int, token: str, transfer_dtype: str = "float32") -> None:
        self.size, self.token = size, token
        self._dtype = transfer_dtype
        self._fields = {"params": (transfer.wire_dtype(transfer_dtype).name, (size,))}
        self._sock = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(address)
        self._staging = np.empty(size, np.float32)
        self._version = -1
        self._asked_at: float | None = None
        self.received = 0
        self.rejected = 0

    @property
    def socket(self) -> zmq.Socket:
        return self._sock

    def version(self) -> int:
        self.pump()
        return self._version

    def read_into(self, out: np.ndarray, min_version: int) -> int | None:
        self.pump()
        if self._version <= min_version:
            return None
        np.copyto(out.reshape(-1), self._staging, casting="same_kind")
        return self._version

    def pump(self) -> None:
        """Take any answers that arrived (never blocks) and keep a request outstanding."""
        _drain(self._sock, self._take)
        now = time.monotonic()
        if self._asked_at is None or now - self._asked_at > REASK_SECONDS:
            self._sock.send_multipart(wire.encode(GET, None, {"token": self.token, "since": self._version}))
            self._asked_at = now

    def _take(self, frames: list[zmq.Frame]) -> None:
        try:
            msg = wire.decode([f.buffer for f in frames], expect_schema=SNAPSHOT, fields=self._fields)
            version = msg.meta.get("version")
            if not isinstance(version, int) or isinstance(version, bool):
                raise wire.WireError(f"'version' must be an int, got {version!r}")
        except wire.WireError as exc:
            self.rejected += 1
            log.error("parameter service: rejected snapshot: %s", exc)
            self._asked_at = None  # ask again
            return
        self._asked_at = None
        if version > self._version:
            transfer.unpack_into(self._staging, msg.arrays["params"], self._dtype)
            self._version = version
            self.received += 1

    def close(self) -> None:
        self._sock.close()


class ParamServiceWorker(Worker):
    """The root server (source: the trainer's buffer) or a relay (source: upstream; mirrors into its buffer).

    A relay with no children has no server: it only keeps its node's shared buffer current.
    """

    def __init__(
        self,
        service: str,
        source: SnapshotSource,
        size: int,
        reporter: Reporter,
        server_address: str | None,
        token: str,
        mirror: VersionedBuffer | None = None,
        transfer_dtype: str = "float32",
        wait_timeout: float = 0.05,
        report_interval: float = 1.0,
        ctx: zmq.Context | None = None,
    ) -> None:
        self.service = service
        """Its name in its reports: its worker's, or ``param_root`` in a run of one policy."""
        self.ctx = ctx or zmq.Context.instance()
        self.source, self.size, self.reporter, self.mirror = source, size, reporter, mirror
        self.server_address, self.token, self.transfer_dtype = server_address, token, transfer_dtype
        self.wait_timeout = wait_timeout
        self._reports = Every(report_interval)
        self.server: ParamServer | None = None
        self.mirrored = -1
        self._scratch = np.empty(size, np.float32)

    def setup(self) -> None:
        if self.server_address is not None:
            self.server = ParamServer(
                self.ctx, self.source, self.size, self.server_address, self.token, self.transfer_dtype
            )
        self._poller = zmq.Poller()
        for sock in (getattr(self.source, "socket", None), None if self.server is None else self.server.socket):
            if sock is not None:
                self._poller.register(sock, zmq.POLLIN)
        self._reports.restart()

    def poll(self) -> int:
        if isinstance(self.source, VersionedBuffer):  # the root: new versions appear in memory, not on a socket
            self._poller.poll(int(min(self.wait_timeout, 0.005) * 1000))
        else:
            self._poller.poll(int(self.wait_timeout * 1000))
        work = 0
        if self.mirror is not None and self.source.version() > self.mirrored:
            got = self.source.read_into(self._scratch, self.mirrored)
            if got is not None:
                self.mirror.write(got, self._scratch)
                self.mirrored = got
                work += 1
        if self.server is not None:
            work += self.server.poll()
        if self._reports.due():
            self._report()
        return work

    def teardown(self) -> None:
        self._report()
        if self.server is not None:
            self.server.close()
        if isinstance(self.source, RemoteSnapshot):
            self.source.close()

    def _report(self) -> None:
        meta: dict[str, Any] = {
            "service": self.service,
            "version": max(self.mirrored, -1 if self.server is None else self.server.version),
        }
        if self.server is not None:
            meta.update(sends=self.server.sends, bytes_sent=self.server.bytes_sent, rejected=self.server.rejected)
        if isinstance(self.source, RemoteSnapshot):
            meta.update(received=self.source.received, rejected_upstream=self.source.rejected)
        self.reporter.report("params", meta)


class ParamReports:
    """The parameter servers' reports (the :class:`~srl.api.report.Aggregator` of their kind): each server's
    sends, bytes sent and refused requests (``root_bytes_sent``), and all it reports in ``summary.json``'s
    ``param_service``."""

    def __init__(self, facts: RunFacts) -> None:
        self.newest: dict[str, dict[str, Any]] = {}

    def handle(self, worker: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.newest[str(meta["service"])] = {k: v for k, v in meta.items() if k not in ("service", "worker")}

    def record(self) -> dict[str, int]:
        keys = ("sends", "bytes_sent", "rejected")
        return {f"{name}_{k}": int(stats[k]) for name, stats in self.newest.items() for k in keys if k in stats}

    def summary(self) -> dict[str, Any]:
        return {"param_service": dict(sorted(self.newest.items()))}

    def restarted(self, worker: str) -> None:
        pass
