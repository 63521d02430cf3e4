"""The fabric of one node group under the Ray runtime.

A node group is one Ray node's share of the run. An *actor node* holds its
actors' segment pool, the request/reply pipes between them and their policy
workers, and the buffer its parameter relay mirrors into: all node-local
shared memory, exactly as in the local runtime, opened by name. The
*trainers' node* holds the lead trainer's parameter buffer. Everything that
crosses nodes is ZeroMQ TCP with the run's token: segments (actor -> trainer, and a credit back for each, which
frees its buffer: :mod:`srl.system.remote_samples`),
parameter snapshots (root -> relays, or -> every reader in flat mode), the
records of a bound kind's channel (episode sinks, trainers' command ports,
:mod:`srl.system.remote_records`) and reports (every worker -> the controller). Servers bind the node's own address;
their endpoints travel to the other workers inside the JSON specs the runtime
hands out, so no shared filesystem is needed.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from srl.api.worker import Reporter
from srl.base.channel import Channel
from srl.base.seqlock import VersionedBuffer
from srl.runtime.fabric import SharedFabric
from srl.runtime.plan import Plan
from srl.runtime.topology import (
    TRAINER_NODE,
    Endpoint,
    Holding,
    Stream,
    WorkerSpec,
    held_by,
    submitted_state,
)
from srl.system.control import ZmqReporter
from srl.system.remote_records import Mailbox, MailReader, MailWriter, RecordReader, RecordWriter
from srl.system.remote_samples import RemoteForwarder, SampleReceiver, SampleSender
from srl.system.streams import SegmentForwarder, SegmentPool, SegmentSink, SegmentSource


def interface_of(address: str) -> str | None:
    """The network interface that holds IPv4 ``address`` (gloo must listen there), or None when none does."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR: the interface's IPv4 address
                packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:  # no IPv4 address on this interface
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    return None


@dataclass
class Endpoints:
    """Where the run's TCP servers listen, and the secret they expect. Travels as JSON, never pickled."""

    control: str
    token: str
    servers: dict[str, str] = field(default_factory=dict)
    """Bound endpoints by name (``trainer<i>``'s sample receiver, the ``root`` or ``relay<g>`` parameter
    server; see ``topology.Endpoint``) -> their address."""
    dist: list[str] | None = None
    """Each policy's data-parallel trainers' TCP store (``tcp://HOST:PORT``) when they span several nodes."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Endpoints:
        dist = data.get("dist")
        return cls(
            str(data["control"]),
            str(data["token"]),
            dict(data["servers"]),
            None if dist is None else [str(d) for d in dist],
        )


class NodeFabric(SharedFabric):
    """Shared memory of one node group plus the run's TCP endpoints."""

    def __init__(
        self,
        plan: Plan,
        node: int,
        endpoints: Endpoints,
        host: str,
        tag: str | None = None,
        directory: Path | None = None,
        serves: tuple[Endpoint, ...] = (),
    ) -> None:
        """``node``: an actor node group, or a trainer node group (:func:`trainer_group`); ``host``: this node's
        address (servers bind it); ``serves``: what the worker that opens this fabric serves (it reads the
        channels of those, and writes to the others)."""
        super().__init__(plan, tag, directory)
        self.node, self.endpoints, self.host, self.serves = node, endpoints, host, serves
        self._stop = np.zeros(1, np.int32)  # Ray workers are stopped by a call, not by a shared flag

    def create(self) -> None:
        """Create this node group's segments and pipes (its node agent)."""
        plan, opened, topology = self.plan, self._opened, self.plan.topology
        try:
            if self.node <= TRAINER_NODE:  # every trainer opens its node's buffer; the lead's is the one served
                for k, policy in enumerate(plan.policies):
                    name = Endpoint(Stream.SNAPSHOTS, policy=k).name
                    opened[name] = VersionedBuffer.create_shared(f"{self.tag}_{name}", policy.param_size, np.float32)
                self._create_declared(*self._declared_here())
                return
            for k, policy in enumerate(plan.policies):
                opened[f"pool{k}"] = SegmentPool.shared(policy.layout, f"{self.tag}_p{k}", create=True)
            for buffer in topology.endpoints(Stream.SNAPSHOTS, self.node):  # its relays' mirrors
                opened[buffer.name] = VersionedBuffer.create_shared(
                    f"{self.tag}_{buffer.name}", plan.policies[buffer.policy].param_size, np.float32
                )
            self._create_rows()
            self._create_declared(*self._declared_here())
        except BaseException:
            self.destroy()
            raise

    def held_by(self, worker: WorkerSpec) -> Holding:
        """What dead ``worker`` held of this node's pools (its node agent frees it). Segments cross nodes as
        copies: whoever sends a row's segments to another node holds them while they wait to go out (an actor
        that feeds its trainers directly, or a stage), and their receiver holds none here."""
        return held_by(self.plan, worker, across_nodes=True)

    def _declared_here(self) -> tuple[list[Endpoint], list[Endpoint], list[Endpoint]]:
        """The channels, pools and storage of the endpoints served in this node group; a bound kind's channel
        is a socket across nodes instead of a pipe."""
        here = {e for w in self.plan.topology.in_group(self.node) for e in w.serves}
        channels = [e for e in self._declaring("channel") if e in here and not e.stream.bound]
        pools, stored = ([e for e in self._declaring(what) if e in here] for what in ("pool", "storage"))
        return channels, pools, stored

    def channel(self, endpoint: Endpoint) -> Channel:
        """A bound kind's channel is a socket: its reader binds (a restarted one its old address), its writers
        connect to the address the reader bound."""
        kind = endpoint.stream
        if not kind.bound or kind.segments:
            return super().channel(endpoint)
        token = self.endpoints.token
        ctx: zmq.Context = zmq.Context.instance()
        if endpoint in self.serves:
            address = self.endpoints.servers.get(endpoint.name, f"tcp://{self.host}:*")
            return self._get(f"ch_{endpoint.name}", lambda: RecordReader(kind.channel, address, token, ctx))
        address = self.endpoints.servers[endpoint.name]
        return self._get(f"ch_{endpoint.name}", lambda: RecordWriter(kind.channel, address, token, ctx))

    def mailbox(self, endpoint: Endpoint, read: bool) -> Mailbox:
        """A TCP socket: its reader binds (a restarted one its old address), writers connect to it (opened when
        first used, so a writer's address is known by then)."""
        token = self.endpoints.token
        ctx: zmq.Context = zmq.Context.instance()
        if read:
            address = self.endpoints.servers.get(endpoint.name, f"tcp://{self.host}:*")
            return self._get(f"mr_{endpoint.name}", lambda: MailReader(address, token, ctx))
        address = self.endpoints.servers[endpoint.name]
        return self._get(f"mw_{endpoint.name}", lambda: MailWriter(address, token, ctx))

    def bound_address(self, endpoint: Endpoint) -> str:
        """Where this worker's reader of a bound kind's channel or mailbox listens (after it opened it)."""
        reader = self._opened.get(f"ch_{endpoint.name}") or self._opened.get(f"mr_{endpoint.name}")
        assert isinstance(reader, RecordReader | MailReader), f"{endpoint.name} is not read here"
        return reader.address

    def param_address(self, server: Endpoint) -> str:
        # A server not yet bound picks a free port on this node; a restarted one takes its old address back.
        return self.endpoints.servers.get(server.name, f"tcp://{self.host}:*")

    def token(self) -> str:
        return self.endpoints.token

    def reporter(self) -> Reporter:
        return self._get("reporter", lambda: ZmqReporter(self.endpoints.control, token=self.endpoints.token))

    def dist_init_method(self, epoch: int = 0, policy: int = 0) -> str:
        # several trainer nodes meet at their policy's TCP store on the lead trainer node (a new one per epoch,
        # from the driver); on one node, at a file in its directory
        if self.endpoints.dist:
            return self.endpoints.dist[policy]
        return f"file://{self.dir}/trainers{epoch}_p{policy}.store"

    def dist_interface(self) -> str | None:
        return interface_of(self.host) if self.endpoints.dist else "lo"

    def stop_flag(self) -> np.ndarray:
        return self._stop

    def segment_forwarder(self, worker: WorkerSpec) -> SegmentForwarder:
        """A hop sends what it keeps to a next stop on another node from here (a dropped segment never crosses
        the network), or inside its node as the local runtime does."""
        nexts = self._next_stops(worker)
        if not any(e.stream.bound for e in nexts.values()):
            return super().segment_forwarder(worker)
        state = submitted_state(self.plan, self._stop_of(worker)[2] + 1)
        return RemoteForwarder({self.plan.actor_row(a): self._sender(e, a, k, state) for (a, k), e in nexts.items()})

    def segment_sink(self, to: Endpoint, actor: int, policy: int, state: int) -> SegmentSink:
        """To a stop on another node (a bound stream: a trainer, a replay): sends actor ``actor``'s row of policy
        ``policy``'s pool there as copies (from the actor, or from its hop)."""
        if not to.stream.bound:
            return super().segment_sink(to, actor, policy, state)
        return self._sender(to, actor, policy, state)

    def _sender(self, to: Endpoint, actor: int, policy: int, state: int) -> SampleSender:
        return SampleSender(
            self.pool(policy),
            self.plan.actor_row(actor),
            actor,
            self.endpoints.servers[to.name],
            self.endpoints.token,
            zmq.Context.instance(),
            submitted=state,
        )

    def segment_source(self, worker: WorkerSpec) -> SegmentSource:
        """A stop whose stream is bound receives its segments over the network (from actors or hops on other
        nodes)."""
        endpoint, k, _ = self._stop_of(worker)
        if not endpoint.stream.bound:
            return super().segment_source(worker)
        return SampleReceiver(
            self.plan.policies[k].layout.fields,
            self.endpoints.servers.get(endpoint.name, f"tcp://{self.host}:*"),
            self.endpoints.token,
            zmq.Context.instance(),
            queue=self.plan.cfg.workers.buffers_per_actor,  # what one sender may have out (its credits)
        )
