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

from srl.api.worker import Reporter
from srl.base.channel import Channel, FifoChannel, InProcChannel, make_pipe_dir
from srl.base.seqlock import VersionedBuffer
from srl.base.shm import ShmArray, new_tag
from srl.runtime.plan import Plan
from srl.runtime.topology import ACTOR, STAGE, TRAINER, Endpoint, Stream, WorkerSpec
from srl.system.control import DirectReporter, Handler, ZmqReporter
from srl.system.streams import (
    FILLING,
    FREE,
    READY,
    STAGED,
    PoolForwarder,
    SampleConsumer,
    SampleProducer,
    SegmentForwarder,
    SegmentPool,
    SegmentSink,
    SegmentSource,
)

REQUEST_WIDTH, REPLY_WIDTH, SAMPLE_WIDTH = 5, 2, 2


class Fabric(ABC):
    """Endpoints of one run, opened lazily in whichever process asks."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    @abstractmethod
    def pool(self, policy: int = 0) -> SegmentPool:
        """Policy ``policy``'s pool of segment buffers (in this node)."""

    @abstractmethod
    def requests(self, policy_worker: int) -> Channel: ...

    @abstractmethod
    def replies(self, actor: int) -> Channel: ...

    @abstractmethod
    def samples(self, trainer: int) -> Channel: ...

    @abstractmethod
    def staged(self, stage: int) -> Channel:
        """Stage worker ``stage``'s channel of submitted segments."""

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

    def sample_producers(self, actor: int) -> list[SegmentSink]:
        """Actor ``actor``'s ends of the sample streams, one per policy: to the stage its record connects it to
        (runs of one policy), or to the trainer of each policy it feeds."""
        stage = self.plan.topology.get(ACTOR, actor).connection(Stream.STAGE)
        if stage is not None and stage.index is not None:
            return [SampleProducer(self.pool(), self.plan.actor_row(actor), self.staged(stage.index), submitted=STAGED)]
        return [self.trainer_sink(actor, k) for k in range(len(self.plan.policies))]

    def trainer_sink(self, actor: int, policy: int = 0) -> SegmentSink:
        """What sends actor ``actor``'s row of policy ``policy``'s pool straight to the trainer of that policy it
        feeds (inside a node: its channel)."""
        plan = self.plan
        return SampleProducer(self.pool(policy), plan.actor_row(actor), self.samples(plan.trainer_of(actor, policy)))

    def sample_consumer(self, trainer: int) -> SegmentSource:
        """Trainer ``trainer``'s end of the sample stream (in its policy's pool)."""
        return SampleConsumer(self.pool(self.plan.policy_of_trainer(trainer)), self.samples(trainer))

    def stage_consumer(self, stage: int) -> SegmentSource:
        """Stage worker ``stage``'s end of its actors' sample streams."""
        return SampleConsumer(self.pool(), self.staged(stage), accepts=STAGED)

    def stage_forwarder(self, stage: int) -> SegmentForwarder:
        """Where stage worker ``stage`` sends what it keeps: each of its actors' rows to that actor's trainer."""
        plan = self.plan
        return PoolForwarder(
            self.pool(), {plan.actor_row(a): self.samples(plan.trainer_of(a)) for a in self.stage_clients(stage)}
        )

    def stage_clients(self, stage: int) -> list[int]:
        """The actors that submit to stage worker ``stage``."""
        return [w.index for w in self.plan.topology.clients_of(Endpoint(Stream.STAGE, stage))]


class InlineFabric(Fabric):
    """Everything in this process: numpy pool, deque channels, direct reports."""

    def __init__(self, plan: Plan, handler: Handler) -> None:
        super().__init__(plan)
        topology = plan.topology
        self._pools = [SegmentPool.in_process(p.layout) for p in plan.policies]
        self._requests = {e.index: InProcChannel(REQUEST_WIDTH) for e in topology.endpoints(Stream.INFERENCE)}
        self._replies = [InProcChannel(REPLY_WIDTH) for _ in range(plan.actors_per_node)]
        self._samples = {e.index: InProcChannel(SAMPLE_WIDTH) for e in topology.endpoints(Stream.SAMPLES)}
        self._staged = {e.index: InProcChannel(SAMPLE_WIDTH) for e in topology.endpoints(Stream.STAGE)}
        self._params = [VersionedBuffer.in_process(p.param_size, np.float32) for p in plan.policies]
        self._reporter = DirectReporter(handler)
        self._stop = np.zeros(1, np.int32)

    def pool(self, policy: int = 0) -> SegmentPool:
        return self._pools[policy]

    def requests(self, policy_worker: int) -> Channel:
        return self._requests[policy_worker]

    def replies(self, actor: int) -> Channel:
        return self._replies[actor]

    def samples(self, trainer: int) -> Channel:
        return self._samples[trainer]

    def staged(self, stage: int) -> Channel:
        return self._staged[stage]

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
            for e in topology.endpoints(Stream.INFERENCE):
                self._opened[f"req{e.index}"] = FifoChannel.create(str(self.dir / f"req{e.index}"), REQUEST_WIDTH)
            for row in range(self.plan.actors_per_node):
                self._opened[f"rep{row}"] = FifoChannel.create(str(self.dir / f"rep{row}"), REPLY_WIDTH)
            for e in topology.endpoints(Stream.SAMPLES):
                self._opened[f"smp{e.index}"] = FifoChannel.create(str(self.dir / f"smp{e.index}"), SAMPLE_WIDTH)
            for e in topology.endpoints(Stream.STAGE):
                self._opened[e.name] = FifoChannel.create(str(self.dir / e.name), SAMPLE_WIDTH)
        except BaseException:
            self.destroy()
            raise

    def free_buffers(self, worker: WorkerSpec) -> int:
        """Before restarting dead ``worker`` (controller): free the pool buffers it held; how many segments that
        drops. A record still in a pipe for a freed buffer is ignored on receipt (the buffer is no longer in the
        state its reader accepts)."""
        held = self.held_by(worker)
        return sum(_free(self.pool(k).state[row], states) for (k, row), states in held.items())

    def held_by(self, worker: WorkerSpec) -> dict[tuple[int, int], tuple[int, ...]]:
        """(Policy, pool row) -> the buffer states in which dead ``worker`` held that row's buffers. An actor:
        those it was filling, in every policy's pool. A stage: those submitted to it. A trainer: those handed to
        it in its policy's pool (their records went down its pipe, and what it had read of them died with it)."""
        plan = self.plan
        if worker.role is ACTOR:
            return {(k, plan.actor_row(worker.index)): (FILLING,) for k in range(len(plan.policies))}
        if worker.role is STAGE:
            return {(0, plan.actor_row(a)): (STAGED,) for a in self.stage_clients(worker.index)}
        if worker.role is TRAINER:
            k, actors = plan.policy_of_trainer(worker.index), range(plan.cfg.workers.actors)
            return {(k, plan.actor_row(a)): (READY,) for a in actors if plan.trainer_of(a, k) == worker.index}
        return {}

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
        for obj in list(self._opened.values()):
            if isinstance(obj, SegmentPool):
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

    def requests(self, policy_worker: int) -> Channel:
        return self._get(
            f"req{policy_worker}", lambda: FifoChannel.open(str(self.dir / f"req{policy_worker}"), REQUEST_WIDTH)
        )

    def replies(self, actor: int) -> Channel:
        return self._get(f"rep{actor}", lambda: FifoChannel.open(str(self.dir / f"rep{actor}"), REPLY_WIDTH))

    def samples(self, trainer: int) -> Channel:
        return self._get(f"smp{trainer}", lambda: FifoChannel.open(str(self.dir / f"smp{trainer}"), SAMPLE_WIDTH))

    def staged(self, stage: int) -> Channel:
        name = Endpoint(Stream.STAGE, stage).name
        return self._get(name, lambda: FifoChannel.open(str(self.dir / name), SAMPLE_WIDTH))

    def params(self, group: int | None = None, policy: int = 0) -> VersionedBuffer:
        key, size = Endpoint(Stream.SNAPSHOTS, group, policy).name, self.plan.policies[policy].param_size
        return self._get(key, lambda: VersionedBuffer.attach_shared(f"{self.tag}_{key}", size, np.float32))

    def param_address(self, server: Endpoint) -> str:
        return f"ipc://{self.dir}/param_{server.name}"

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
