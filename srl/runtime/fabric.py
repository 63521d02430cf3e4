"""Fabrics: the stream endpoints a worker is handed, for one placement.

A fabric owns the memory and channels that join the workers of a run:
the segment pool, inference request/reply channels, sample channels, the
parameter buffer, the stop flag and the control channel. The inline fabric
keeps them in this process; the shared fabric puts them in node-local shared
memory and named pipes, created by the controller and opened by name in each
worker process (so the same code serves fork, spawn or a Ray actor). Which
channels and buffers exist, and which trainer an actor feeds, comes from the
run's topology.
"""

from __future__ import annotations

import secrets
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from srl.api.worker import Reporter
from srl.base.channel import Channel, FifoChannel, InProcChannel, ipc_address, make_pipe_dir
from srl.base.seqlock import VersionedBuffer
from srl.base.shm import ShmArray, new_tag
from srl.runtime.plan import Plan
from srl.runtime.topology import (
    TRAINER,
    Endpoint,
    Holding,
    Stream,
    WorkerSpec,
    clients,
    held_by,
    pool_layout,
    position,
    receives_on,
    stop,
    storage_opener,
    submitted_state,
)
from srl.system.control import DirectReporter, Handler, ZmqReporter
from srl.system.remote_records import InProcMail, Mailbox, MailReader, MailWriter
from srl.system.streams import (
    BELL_WIDTH,
    FREE,
    REPLY_WIDTH,
    PoolForwarder,
    SampleConsumer,
    SampleProducer,
    SegmentForwarder,
    SegmentPool,
    SegmentSink,
    SegmentSource,
)


class Fabric(ABC):
    """Endpoints of one run, opened lazily in whichever process asks."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    @abstractmethod
    def pool(self, policy: int = 0) -> SegmentPool:
        """Policy ``policy``'s pool of segment buffers (in this node)."""

    @abstractmethod
    def channel(self, endpoint: Endpoint) -> Channel:
        """The channel of ``endpoint`` (of a kind that declares one), in this node."""

    @abstractmethod
    def buffers(self, endpoint: Endpoint) -> SegmentPool:
        """The pool of ``endpoint`` (of a kind that declares one: a replay's batches), in this node."""

    @abstractmethod
    def storage(self, endpoint: Endpoint) -> Any:
        """The storage of ``endpoint`` (of a kind that declares one: a replay's items), in this node."""

    @abstractmethod
    def mailbox(self, endpoint: Endpoint, read: bool) -> Mailbox:
        """The mailbox of ``endpoint`` (of a kind with ``mail``): its reading end (``read``: the worker that serves
        it; it binds when first opened) or a writing end (any worker; it connects)."""

    @abstractmethod
    def replies(self, actor: int) -> Channel: ...

    @abstractmethod
    def bell(self, pool: int | Endpoint, row: int) -> Channel:
        """The bell of row ``row`` of a pool (policy ``pool``'s segment pool, or endpoint ``pool``'s own): rung
        whenever one of the row's buffers is handed back, waited on by the worker that fills the row."""

    @abstractmethod
    def params(self, group: int | None = None, policy: int = 0) -> VersionedBuffer:
        """Policy ``policy``'s snapshot buffer: its lead trainer's (``None``), or node group ``group``'s fed by its
        relay."""

    @abstractmethod
    def param_address(self, server: Endpoint) -> str:
        """Where parameter server ``server`` (the root or relay ``g``) listens."""

    @abstractmethod
    def token(self) -> str:
        """The run's secret: readers present it to parameter servers."""

    @abstractmethod
    def reporter(self) -> Reporter: ...

    @abstractmethod
    def dist_init_method(self, epoch: int = 0, policy: int = 0) -> str:
        """Rendezvous address of policy ``policy``'s data-parallel trainers (``torch.distributed`` init method);
        trainers that start again together meet at the one of their new ``epoch``."""

    def dist_interface(self) -> str | None:
        """The network interface gloo listens on (``GLOO_SOCKET_IFNAME``; a user's setting wins): loopback,
        unless the trainers span several nodes. None leaves the choice to gloo."""
        return "lo"

    @abstractmethod
    def stop_flag(self) -> np.ndarray:
        """A one-element int32 array; non-zero asks every worker to finish."""

    def requests(self, policy_worker: int) -> Channel:
        """Policy worker ``policy_worker``'s request channel."""
        return self.channel(Endpoint(Stream.INFERENCE, policy_worker))

    # ------------------------------------------------------------------ the sample path
    def sample_producers(self, actor: int) -> list[SegmentSink]:
        """Actor ``actor``'s ends of the sample path, one per policy: to the path's first stop for its segments of
        that policy (a hop of its node, or the policy's trainer it feeds)."""
        plan, state = self.plan, submitted_state(self.plan, 0)
        return [self.segment_sink(stop(plan, 0, actor, k), actor, k, state) for k in range(len(plan.policies))]

    def segment_sink(self, to: Endpoint, actor: int, policy: int, state: int) -> SegmentSink:
        """What hands actor ``actor``'s buffers of policy ``policy`` to stop ``to`` (in state ``state``): inside a
        node, the buffer's record down the stop's channel."""
        row = self.plan.actor_row(actor)
        return SampleProducer(self.pool(policy), row, self.channel(to), submitted=state, bell=self.bell(policy, row))

    def segment_source(self, worker: WorkerSpec) -> SegmentSource:
        """What ``worker`` (a stop of the sample path: a hop, or a trainer that takes segments) receives segments
        from: its endpoint's channel over the pool of the policy it serves."""
        endpoint, policy, at = self._stop_of(worker)
        rows = {self.plan.actor_row(a) for a, k in clients(self.plan, worker.role, worker.index) if k == policy}
        return SampleConsumer(
            self.pool(policy),
            self.channel(endpoint),
            accepts=submitted_state(self.plan, at),
            bells={row: self.bell(policy, row) for row in sorted(rows)},
        )

    def _stop_of(self, worker: WorkerSpec) -> tuple[Endpoint, int, int]:
        """Stop ``worker``'s endpoint, the policy whose segments it takes (0 for a hop of every policy's pool
        row: a stage serves runs of one policy), and its position on the sample path."""
        at = position(self.plan, worker.role)
        assert at is not None, f"{worker.name} is not on the sample path"
        return receives_on(worker.role, worker.index), worker.policy or 0, at

    def _next_stops(self, worker: WorkerSpec) -> dict[tuple[int, int], Endpoint]:
        """(Actor, policy) -> the stop after hop ``worker`` that its segments go on to."""
        _, _, at = self._stop_of(worker)
        return {(a, k): stop(self.plan, at + 1, a, k) for a, k in clients(self.plan, worker.role, worker.index)}

    def sample_consumer(self, trainer: int) -> SegmentSource:
        """Trainer ``trainer``'s end of the sample stream (in its policy's pool)."""
        return self.segment_source(self.plan.topology.get(TRAINER, trainer))

    def segment_forwarder(self, worker: WorkerSpec) -> SegmentForwarder:
        """Where hop ``worker`` sends what it keeps: each client's row to that client's next stop."""
        _, _, at = self._stop_of(worker)
        channels = {self.plan.actor_row(a): self.channel(e) for (a, _), e in self._next_stops(worker).items()}
        return PoolForwarder(self.pool(), channels, submitted_state(self.plan, at + 1))

    def free_buffers(self, worker: WorkerSpec) -> int:
        """Before restarting dead ``worker`` (controller): free the buffers it held; how many that drops. A record
        still in a pipe for a freed buffer is ignored on receipt (the buffer is no longer in the state its reader
        accepts)."""
        return sum(_free(self._pool_of(key).state[row], states) for (key, row), states in self.held_by(worker).items())

    def held_by(self, worker: WorkerSpec) -> Holding:
        """(Pool key, row) -> the buffer states in which dead ``worker`` held that row's buffers (its declaration
        and its place on the sample path say which)."""
        return held_by(self.plan, worker)

    def _pool_of(self, key: int | Endpoint) -> SegmentPool:
        """A pool of a :data:`Holding`: policy ``key``'s segment pool, or endpoint ``key``'s own."""
        return self.pool(key) if isinstance(key, int) else self.buffers(key)

    def _declaring(self, what: str) -> list[Endpoint]:
        """The endpoints of this run whose kind declares ``what`` (``channel``, ``pool``, ``storage``)."""
        return [e for w in self.plan.topology.workers for e in w.serves if getattr(e.stream, what)]


class InlineFabric(Fabric):
    """Everything in this process: numpy pool, deque channels, direct reports."""

    def __init__(self, plan: Plan, handler: Handler) -> None:
        super().__init__(plan)
        self._pools = [SegmentPool.in_process(p.layout) for p in plan.policies]
        self._channels = {e.name: InProcChannel(e.stream.channel) for e in self._declaring("channel")}
        self._buffers = {e.name: SegmentPool.in_process(pool_layout(plan, e)) for e in self._declaring("pool")}
        self._storage = {e.name: storage_opener(e).create(plan, e, None) for e in self._declaring("storage")}
        self._mail = {e.name: InProcMail() for e in self._declaring("mail")}
        self._replies = [InProcChannel(REPLY_WIDTH) for _ in range(plan.actors_per_node)]
        self._bells: dict[str, InProcChannel] = {}
        self._params = [VersionedBuffer.in_process(p.param_size, np.float32) for p in plan.policies]
        self._reporter = DirectReporter(handler)
        self._stop = np.zeros(1, np.int32)

    def pool(self, policy: int = 0) -> SegmentPool:
        return self._pools[policy]

    def channel(self, endpoint: Endpoint) -> Channel:
        return self._channels[endpoint.name]

    def buffers(self, endpoint: Endpoint) -> SegmentPool:
        return self._buffers[endpoint.name]

    def storage(self, endpoint: Endpoint) -> Any:
        return self._storage[endpoint.name]

    def mailbox(self, endpoint: Endpoint, read: bool) -> Mailbox:
        return self._mail[endpoint.name]

    def replies(self, actor: int) -> Channel:
        return self._replies[actor]

    def bell(self, pool: int | Endpoint, row: int) -> Channel:
        """Never waited on (nothing runs while a worker would wait), but rung and emptied as elsewhere."""
        return self._bells.setdefault(bell_name(pool, row), InProcChannel(BELL_WIDTH))

    def params(self, group: int | None = None, policy: int = 0) -> VersionedBuffer:
        if group is not None:
            raise ValueError("the inline runtime has one parameter buffer per policy")
        return self._params[policy]

    def param_address(self, server: Endpoint) -> str:
        raise ValueError("the inline runtime has no parameter servers")

    def token(self) -> str:
        raise ValueError("the inline runtime has no parameter servers")

    def reporter(self) -> Reporter:
        return self._reporter

    def dist_init_method(self, epoch: int = 0, policy: int = 0) -> str:
        raise ValueError("the inline runtime runs one trainer per policy; several need runtime: local")

    def stop_flag(self) -> np.ndarray:
        return self._stop


class SharedFabric(Fabric):
    """Node-local shared memory plus named pipes; a ZeroMQ ipc socket for reports.

    The controller calls :meth:`create` (and :meth:`destroy` on every exit path);
    worker processes open the same names on first use.
    """

    def __init__(self, plan: Plan, tag: str | None = None, directory: Path | None = None) -> None:
        """A new fabric (controller), or with ``tag`` and ``directory`` the names of an existing one (worker)."""
        super().__init__(plan)
        self.tag = tag or f"srl_{new_tag()}"
        self.dir = directory or make_pipe_dir()
        self.control_address = f"ipc://{self.dir}/control"
        self._opened: dict[str, Any] = {}
        self._token: str | None = None

    # ------------------------------------------------------------------ owner
    def create(self) -> None:
        """Create every segment and pipe (controller process)."""
        topology = self.plan.topology
        try:
            for k, policy in enumerate(self.plan.policies):
                self._opened[f"pool{k}"] = SegmentPool.shared(policy.layout, f"{self.tag}_p{k}", create=True)
            for buffer in topology.endpoints(Stream.SNAPSHOTS):  # each lead trainer's, and each relay's mirror
                self._opened[buffer.name] = VersionedBuffer.create_shared(
                    f"{self.tag}_{buffer.name}", self.plan.policies[buffer.policy].param_size, np.float32
                )
            token = self.dir / "token"
            token.touch(mode=0o600)
            token.write_text(secrets.token_hex(16))
            self._opened["stop"] = ShmArray.create(f"{self.tag}_stop", (1,), "int32")
            self._create_rows()
            self._create_declared(self._declaring("channel"), self._declaring("pool"), self._declaring("storage"))
        except BaseException:
            self.destroy()
            raise

    def _create_rows(self) -> None:
        """Each actor row's reply channel, and the bell of its row in each policy's pool."""
        for row in range(self.plan.actors_per_node):
            self._opened[f"rep{row}"] = FifoChannel.create(str(self.dir / f"rep{row}"), REPLY_WIDTH)
            for k in range(len(self.plan.policies)):
                self._create_bell(k, row)

    def _create_bell(self, pool: int | Endpoint, row: int) -> None:
        """A bell holds at most a ring per buffer of its row (its filler empties it as it takes one): the pipe's
        default size is plenty."""
        name = bell_name(pool, row)
        self._opened[f"ch_{name}"] = FifoChannel.create(str(self.dir / name), BELL_WIDTH, large=False)

    def _create_declared(self, channels: list[Endpoint], pools: list[Endpoint], stored: list[Endpoint]) -> None:
        """Create the channels, pools (with their bells) and storage these endpoints' kinds declare."""
        for e in channels:
            self._opened[f"ch_{e.name}"] = FifoChannel.create(str(self.dir / e.name), e.stream.channel)
        for e in pools:
            self._opened[f"buf_{e.name}"] = SegmentPool.shared(pool_layout(self.plan, e), f"{self.tag}_{e.name}", True)
            self._create_bell(e, 0)
        for e in stored:
            self._opened[f"st_{e.name}"] = storage_opener(e).create(self.plan, e, f"{self.tag}_{e.name}")

    def destroy(self) -> None:
        """Close and remove everything this run created; safe to call twice."""
        self._close_opened(unlink=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def after_fork(self) -> None:
        """In a forked child: forget the parent's handles (they are not ours to close) and reopen by name."""
        self._opened = {}

    def close_worker_side(self) -> None:
        """Worker process exit: close (never unlink) what this process opened."""
        self._close_opened(unlink=False)

    def _close_opened(self, unlink: bool) -> None:
        for key, obj in list(self._opened.items()):
            if isinstance(obj, SegmentPool) or key.startswith("st_"):  # a pool, or a kind's storage: close(unlink)
                obj.close(unlink=unlink)
                continue
            obj.close()
            if unlink and hasattr(obj, "unlink"):
                obj.unlink()
        self._opened.clear()

    # ------------------------------------------------------------------ endpoints
    def _get(self, key: str, opener: Any) -> Any:
        obj = self._opened.get(key)
        if obj is None:
            obj = self._opened[key] = opener()
        return obj

    def pool(self, policy: int = 0) -> SegmentPool:
        layout = self.plan.policies[policy].layout
        return self._get(f"pool{policy}", lambda: SegmentPool.shared(layout, f"{self.tag}_p{policy}", create=False))

    def channel(self, endpoint: Endpoint) -> Channel:
        name, width = endpoint.name, endpoint.stream.channel
        return self._get(f"ch_{name}", lambda: FifoChannel.open(str(self.dir / name), width))

    def buffers(self, endpoint: Endpoint) -> SegmentPool:
        layout, name = pool_layout(self.plan, endpoint), endpoint.name
        return self._get(f"buf_{name}", lambda: SegmentPool.shared(layout, f"{self.tag}_{name}", create=False))

    def storage(self, endpoint: Endpoint) -> Any:
        name = endpoint.name
        return self._get(
            f"st_{name}", lambda: storage_opener(endpoint).attach(self.plan, endpoint, f"{self.tag}_{name}")
        )

    def mailbox(self, endpoint: Endpoint, read: bool) -> Mailbox:
        """A ZeroMQ ipc socket in the run's pipe folder (removed with it; a restarted reader binds it again)."""
        address, token = ipc_address(self.dir, f"mail_{endpoint.name}"), self.token()
        ctx: zmq.Context = zmq.Context.instance()
        if read:
            return self._get(f"mr_{endpoint.name}", lambda: MailReader(address, token, ctx))
        return self._get(f"mw_{endpoint.name}", lambda: MailWriter(address, token, ctx))

    def replies(self, actor: int) -> Channel:
        return self._get(f"rep{actor}", lambda: FifoChannel.open(str(self.dir / f"rep{actor}"), REPLY_WIDTH))

    def bell(self, pool: int | Endpoint, row: int) -> Channel:
        name = bell_name(pool, row)
        return self._get(f"ch_{name}", lambda: FifoChannel.open(str(self.dir / name), BELL_WIDTH))

    def params(self, group: int | None = None, policy: int = 0) -> VersionedBuffer:
        key, size = Endpoint(Stream.SNAPSHOTS, group, policy).name, self.plan.policies[policy].param_size
        return self._get(key, lambda: VersionedBuffer.attach_shared(f"{self.tag}_{key}", size, np.float32))

    def param_address(self, server: Endpoint) -> str:
        return ipc_address(self.dir, f"param_{server.name}")

    def token(self) -> str:
        if self._token is None:  # written by create(), in the run's private (0700) directory
            self._token = (self.dir / "token").read_text()
        return self._token

    def reporter(self) -> Reporter:
        return self._get("reporter", lambda: ZmqReporter(self.control_address))

    def dist_init_method(self, epoch: int = 0, policy: int = 0) -> str:
        # inside the run's private directory, removed with it
        return f"file://{self.dir}/trainers{epoch}_p{policy}.store"

    def stop_flag(self) -> np.ndarray:
        return self._get("stop", lambda: ShmArray.attach(f"{self.tag}_stop", (1,), "int32")).array


def bell_name(pool: int | Endpoint, row: int) -> str:
    """The name of a pool row's bell (its pipe's, in the fabric's folder): ``bell_p1_3`` for row 3 of policy 1's
    segment pool, ``bell_batches0`` for an endpoint's pool of one row."""
    return f"bell_p{pool}_{row}" if isinstance(pool, int) else f"bell_{pool.name}"


def _free(row_state: np.ndarray, states: tuple[int, ...]) -> int:
    """Mark the buffers of one pool row that are in one of ``states`` FREE; how many there were."""
    held = np.isin(row_state, states)
    row_state[held] = FREE
    return int(held.sum())


def newest_snapshots(fabric: Fabric) -> list[np.ndarray] | None:
    """Each policy's newest snapshot in its lead trainer's buffer (None when some policy has none yet)."""
    out = []
    for k, policy in enumerate(fabric.plan.policies):
        flat = np.empty(policy.param_size, np.float32)
        if fabric.params(policy=k).read_into(flat, -1) is None:
            return None
        out.append(flat)
    return out
