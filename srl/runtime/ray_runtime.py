"""The Ray runtime: the same workers as Ray actors, placed by node group on a Ray cluster.

Ray places and supervises; it never carries per-step data. Each actor node
group is one placement group (one bundle, so one node) holding a node agent
(it owns the group's shared memory), the group's actors, its policy workers
and its parameter relay. The trainers fill ``ray.trainer_nodes`` more placement
groups; the first also holds the root parameter server and the eval worker.
Within a node, workers talk through
shared memory exactly as under the local runtime; across nodes, through
ZeroMQ TCP with a per-run token (see :mod:`srl.runtime.ray_fabric`).

Everything handed to a Ray actor is a JSON string (config, endpoints, names),
and everything it returns is a JSON string or wire-format bytes: no object of
ours is pickled across the boundary.

Without ``ray.address`` the run starts a Ray instance of its own, on loopback and out of srl's process group
(:mod:`srl.runtime.ray_head`), and shuts it down at the end. Every wait on Ray is bounded, and those of the start
give up as soon as the run is told to stop: a signal during start-up ends the run like one during training.

Supervision is the runtime-independent :class:`~srl.runtime.supervisor.Supervisor`
over :class:`RayPlacement`: when a worker's actor dies (its process, or its
whole node), it is started again in the same placement group (Ray re-places a
group whose node is gone once a node with its resources joins: the placement
defers the group's workers until then). A lost node group comes back whole: a
new agent, then its relay, policy workers and actors; its servers bind afresh
there, and the supervisor restarts their clients in other groups to follow
them. Trainers restart from the newest checkpoint, data-parallel ones all
together at a fresh rendezvous; only a lost trainer *node* with several
trainers ends the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from srl.api.config import ConfigError, to_dict
from srl.base import wire
from srl.base.channel import sweep_stale_pipe_dirs
from srl.base.shm import sweep_stale
from srl.base.stop_signals import SIGNALS, shielded
from srl.runtime.plan import Plan
from srl.runtime.ray_actors import NodeAgent, WorkerActor
from srl.runtime.ray_fabric import Endpoints
from srl.runtime.ray_head import HeadError, RayHead, connect
from srl.runtime.supervisor import Launch, StartError, Supervisor
from srl.runtime.topology import TRAINER_NODE, Endpoint, Restart, Stream, WorkerSpec, trainer_group
from srl.system.control import ControlReceiver
from srl.system.controller import Controller, stop_on_signals
from srl.system.run_dir import RunDirFull, write_run_file

log = logging.getLogger(__name__)

STOP_TIMEOUT = 120.0
"""How long stopping workers may take (a trainer finishes its update and writes its final checkpoint)."""
SERVER_READY_TIMEOUT = 120.0
"""How long a server (trainer, parameter root or relay) may take to bind once its node is placed."""
CALL_TIMEOUT = 30.0
"""How long a short call to a worker or a node agent (where it runs, a snapshot, closing) may take."""
POLL = 0.1
"""Seconds between looks at the run's stop flag while the start waits on Ray."""


class Stopped(Exception):
    """The run was told to stop while its start waited on Ray: what already runs stops as on any other stop."""


def _get(ref: Any, timeout: float, stopped: Callable[[], bool]) -> Any:
    """``ray.get`` bounded by ``timeout`` (GetTimeoutError) that gives up as soon as ``stopped()`` (Stopped): a
    signal while Ray places or starts workers ends the wait, whatever the cluster does meanwhile."""
    deadline = time.monotonic() + timeout
    while not ray.wait([ref], timeout=max(0.0, min(POLL, deadline - time.monotonic())))[0]:
        if stopped():
            raise Stopped
        if time.monotonic() >= deadline:
            raise GetTimeoutError(f"not ready within {timeout:.0f} s")
    return ray.get(ref, timeout=CALL_TIMEOUT)  # ready: at once


@dataclass
class Group:
    """One node group: its placement group, its agent and where the agent put the shared memory."""

    node: int
    pg: PlacementGroup
    agent: Any = None
    where: dict[str, Any] = field(default_factory=dict)
    pending: Any = None
    """The agent's ``where()`` while the group is being (re)placed."""


@dataclass
class Running:
    """One started worker: its Ray actor and the reference of its loop (None while it is being started)."""

    worker: WorkerSpec
    handle: Any
    ref: Any = None
    info: dict[str, Any] | None = None
    """Where it runs (pid, Ray node id, host), asked once when it started."""


def _bundle(plan: Plan, node: int) -> dict[str, float]:
    """Resources of one node group (claimed as a single bundle, so the group shares one node)."""
    r = plan.cfg.ray
    workers = plan.topology.in_group(node)
    bundle: dict[str, float] = {"CPU": max(0.01, sum(w.cpus for w in workers))}
    if node <= TRAINER_NODE:
        gpus = sum(w.gpus for w in workers)
        if gpus:
            bundle["GPU"] = gpus
        if r.trainer_resource:
            bundle[r.trainer_resource] = 1.0
    elif r.node_resource:
        bundle[r.node_resource] = 1.0
    return bundle


def _present() -> str | None:
    """A cluster srl did not start: nothing to say about how it went."""
    return None


@contextlib.contextmanager
def _session(plan: Plan, stopped: Callable[[], bool]) -> Iterator[Callable[[], str | None] | None]:
    """Connected to Ray inside, with a function that says how Ray ended under the run (None while it runs); None
    instead when told to stop before it was connected. Without ``ray.address`` a private instance is started for
    the run (on loopback, out of srl's process group: :mod:`srl.runtime.ray_head`) and shut down after it; a
    joined cluster is left running; a connection the caller made before is the caller's."""
    if ray.is_initialized():
        yield _present
        return
    head = RayHead(_cpus(plan)) if plan.cfg.ray.address is None else None
    try:
        connected = _connect(plan, head, stopped)
        yield (_present if head is None else head.gone) if connected else None
    finally:
        with shielded():  # bounded: Ray's shutdown, then its processes killed if they take too long
            if ray.is_initialized():
                ray.shutdown()
            if head is not None:
                head.close()


def _cpus(plan: Plan) -> int:
    """A private instance's CPUs: the machine's, or enough to hold the whole layout."""
    need = sum(_bundle(plan, n)["CPU"] for n in plan.topology.groups)
    return max(os.cpu_count() or 1, int(np.ceil(need)))


def _connect(plan: Plan, head: RayHead | None, stopped: Callable[[], bool]) -> bool:
    """Join the run's private instance (``head``) or the cluster at ``ray.address``; False when told to stop
    before the private instance was up. Raises StartError, or ConfigError for an address that does not answer."""
    r = plan.cfg.ray
    if head is not None:
        try:
            address = head.address(r.start_timeout_seconds, stopped)
        except HeadError as exc:
            raise StartError(f"ray: {exc}") from None
        if address is None:
            return False
        with _signals_kept():
            connect(address)
        return True
    assert r.address is not None
    _probe(r.address)
    try:
        with _signals_kept():
            ray.init(address=r.address, logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise ConfigError(f"ray.address: cannot connect to {r.address!r}: {exc}") from None
    return True


@contextlib.contextmanager
def _signals_kept() -> Iterator[None]:
    """Around ``ray.init``: it installs handlers of its own for SIGTERM (and more) that end the process at once, no
    summary, no cleanup. Here SIGINT and SIGTERM are held back while Ray connects (its threads start with them
    blocked, so they never take one), the run's handlers (:mod:`srl.base.stop_signals`) are put back, and a signal
    that came meanwhile is delivered to them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            if handler is not None:  # None: set outside Python, nothing to put back
                signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _probe(address: str) -> None:
    """Fail fast with one line when nothing listens at ``ray.address`` (``ray.init`` would retry for minutes)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5.0).close()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"ray.address: cannot reach {address!r} ({exc})") from None


class RayPlacement:
    """Workers as Ray actors, one placement group per node group (the :class:`~srl.runtime.supervisor.Placement`
    of the Ray runtime)."""

    def __init__(
        self,
        plan: Plan,
        run_dir: Path | None,
        endpoints: Endpoints,
        stopped: Callable[[], bool] = lambda: False,
        gone: Callable[[], str | None] = _present,
    ) -> None:
        """``stopped``: whether the run was told to stop (the start's waits on Ray give up then: :class:`Stopped`);
        ``gone``: how Ray ended under the run, if it did (then nothing is asked of it any more)."""
        self.plan, self.run_dir, self.endpoints, self.stopped, self.gone = plan, run_dir, endpoints, stopped, gone
        self.groups: dict[int, Group] = {}
        self.workers: dict[str, Running] = {}
        self.waiting: dict[int, list[Launch]] = {}  # node group -> workers to start once it is placed again

    # ------------------------------------------------------------------ placing
    def place(self) -> None:
        """Claim one placement group per node group and wait until the cluster has placed them all."""
        for node in self.plan.topology.groups:
            self.groups[node] = Group(
                node,
                placement_group(
                    [_bundle(self.plan, node)], strategy="STRICT_PACK", name=f"srl-{self.endpoints.token[:8]}-{node}"
                ),
            )
        timeout = self.plan.cfg.ray.start_timeout_seconds
        for node, group in self.groups.items():
            try:
                _get(group.pg.ready(), timeout, self.stopped)
            except GetTimeoutError:
                raise StartError(
                    f"ray: node group {node} needs {_bundle(self.plan, node)}, which the cluster did "
                    f"not offer within {timeout:.0f} s (ray.start_timeout_seconds)"
                ) from None
        for group in self.groups.values():
            self._start_agent(group)
        for node, group in self.groups.items():
            try:
                group.where = json.loads(_get(group.pending, timeout, self.stopped))
            except (GetTimeoutError, RayActorError) as exc:
                raise StartError(f"ray: the agent of node group {node} did not start ({type(exc).__name__})") from None
            group.pending = None
        dist: Any = self.groups[TRAINER_NODE].where.get("dist")  # one store per policy, or None
        self.endpoints.dist = None if dist is None else [str(d) for d in dist]

    def _options(self, node: int, cpus: float, gpus: float = 0.0) -> dict[str, Any]:
        group = self.groups[node]
        return {
            "num_cpus": cpus,
            "num_gpus": gpus,  # Ray sets CUDA_VISIBLE_DEVICES
            "max_restarts": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(group.pg, placement_group_bundle_index=0),
        }

    def _start_agent(self, group: Group) -> None:
        spec = {**self._common(), "node": group.node}
        group.agent = NodeAgent.options(**self._options(group.node, 0)).remote(json.dumps(spec))  # type: ignore[attr-defined]
        group.pending = group.agent.where.remote()

    def _common(self) -> dict[str, Any]:
        p = self.plan
        return {
            "config": to_dict(p.cfg),
            "null_trainer": p.null_trainer,
            "resume": p.resume,
            "start_version": p.start_version,
            "start_env_steps": p.start_env_steps,
            "endpoints": self.endpoints.to_json(),
            "run_dir": None if self.run_dir is None else str(self.run_dir),
            "plugin_path": os.getcwd(),
        }

    def _ready(self, group: Group) -> bool:
        """Whether the group is placed and its agent alive. When the agent is gone, so is its node: a new agent
        is started (Ray places the group again once a node can take it), and its servers will bind afresh."""
        if group.node in self.waiting or group.pending is not None:
            return False
        try:
            ray.get(group.agent.where.remote(), timeout=10.0)
            return True
        except (RayActorError, GetTimeoutError):
            pass
        log.warning("node group %d lost; waiting for Ray to place it again", group.node)
        ray.kill(group.agent, no_restart=True)
        self._start_agent(group)
        self.waiting.setdefault(group.node, [])
        for worker in self.plan.topology.in_group(group.node):
            for endpoint in worker.serves:
                self.endpoints.servers.pop(endpoint.name, None)
        return False

    # ------------------------------------------------------------------ Placement
    def start(self, launches: Sequence[Launch]) -> list[WorkerSpec]:
        """Start now those whose group is placed; defer the others until it is (a restart may find its node
        lost). Data-parallel trainers restart only on the nodes they had."""
        ready = {
            node: all(launch.incarnation == 0 for launch in launches) or self._ready(self.groups[node])
            for node in {launch.worker.group for launch in launches}
        }
        # the workers that restart from a checkpoint together (data-parallel trainers) meet at a fresh store
        trainers = [launch for launch in launches if launch.worker.restart is Restart.FROM_CHECKPOINT]
        if len(trainers) > 1 and not all(ready[launch.worker.group] for launch in trainers):
            raise StartError("a trainer node was lost, and data-parallel trainers restart only on the nodes they had")
        dist = self.endpoints.dist
        if dist is not None:  # trainers on several nodes meet again at a new TCP store of their policy
            agent = self.groups[TRAINER_NODE].agent
            for k in sorted({launch.worker.policy or 0 for launch in trainers if launch.incarnation > 0}):
                dist[k] = str(_get(agent.fresh_dist.remote(k), CALL_TIMEOUT, self.stopped))
        now = [launch for launch in launches if ready[launch.worker.group]]
        for launch in launches:
            if not ready[launch.worker.group]:
                self.waiting.setdefault(launch.worker.group, []).append(launch)
        self._start_now(now)
        return [launch.worker for launch in now]

    def started(self) -> list[WorkerSpec]:
        """Start the workers of groups placed again since the last call (in start order). Raises StartError when
        Ray itself ended (its workers with it)."""
        if (gone := self.gone()) is not None:
            raise StartError(f"ray: {gone}")
        out: list[WorkerSpec] = []
        for node in list(self.waiting):
            group = self.groups[node]
            if group.pending is not None:
                done, _ = ray.wait([group.pending], timeout=0)
                if not done:
                    continue
                try:
                    group.where = json.loads(ray.get(group.pending))
                except RayActorError:  # placed on a node that died as well: try again
                    self._start_agent(group)
                    continue
                group.pending = None
            launches = self.waiting.pop(node)
            order = self.plan.topology.in_start_order([launch.worker for launch in launches])
            by_name = {launch.worker.name: launch for launch in launches}
            try:
                self._start_now([by_name[w.name] for w in order])
            except StartError as exc:
                raise StartError(f"node group {node} placed again, but it did not start: {exc}") from None
            out.extend(order)
        return out

    def alive(self, worker: WorkerSpec) -> bool:
        running = self.workers.get(worker.name)
        if running is None or running.ref is None:
            return False
        done, _ = ray.wait([running.ref], timeout=0)
        return not done

    def exit_cause(self, worker: WorkerSpec) -> str:
        ref = self.workers[worker.name].ref
        if ref is None:
            return "killed"
        try:
            result = ray.get(ref)
        except RayActorError as exc:  # Ray says "... because its node has died" when the node was lost
            return "Ray actor lost with its node" if "its node" in str(exc).lower() else "Ray actor died"
        return str(result) or "ended before the run did"

    def kill(self, worker: WorkerSpec) -> None:
        running = self.workers.get(worker.name)
        if running is not None:
            ray.kill(running.handle, no_restart=True)
            running.ref = None

    def address(self, endpoint: Endpoint) -> str | None:
        return self.endpoints.servers.get(endpoint.name)

    def free_buffers(self, worker: WorkerSpec) -> int:
        group = self.groups[worker.group]
        if not self._ready(group):
            return 0  # the node is gone, and its pool with it
        return int(ray.get(group.agent.free_buffers.remote(worker.role.name, worker.index), timeout=30.0))

    def published_version(self, policy: int = 0) -> int:
        try:
            lead = self.groups[trainer_group(self.plan.lead_node(policy))].agent
            return int(ray.get(lead.version.remote(policy), timeout=10.0))
        except (RayActorError, GetTimeoutError):
            return -1

    # ------------------------------------------------------------------ starting
    def _start_now(self, launches: Sequence[Launch]) -> None:
        """Create the workers' actors at once (their processes start in parallel); then the servers of the sample
        streams and record channels bind together (data-parallel trainers meet in their setup), then one at a
        time in start order the parameter servers (each relay connects to a parent already bound) and the
        servers that write to record channels (a role that commands the trainers' ports), and then
        everyone runs."""
        if not launches:
            return
        for launch in launches:
            self._create(launch)
        workers = [launch.worker for launch in launches]
        bound = [w for w in workers if any(e.stream.bound for e in w.serves)]
        together = [w for w in bound if not w.service(Stream.PARAMS) and not self._writes_records(w)]
        self._prepare(together)
        for w in bound:
            if w not in together:
                self._prepare([w])
        endpoints = json.dumps(self.endpoints.to_json())
        for w in workers:
            self.workers[w.name].ref = self.workers[w.name].handle.run.remote(endpoints)
        for w in workers:
            try:
                self.workers[w.name].info = json.loads(
                    _get(self.workers[w.name].handle.info.remote(), CALL_TIMEOUT, self.stopped)
                )
            except (RayActorError, GetTimeoutError):
                pass  # died at once: the supervisor sees it
        self.write_workers()

    @staticmethod
    def _writes_records(worker: WorkerSpec) -> bool:
        """It writes to a bound record channel or mailbox (a role that commands the trainers' ports): it connects
        at setup, so it is prepared after the readers."""
        return any(
            e.stream.bound and (e.stream.channel or e.stream.mail) and not e.stream.segments for e in worker.connects
        )

    def _create(self, launch: Launch) -> None:
        w = launch.worker
        spec = {
            **self._common(),
            "node": w.group,
            "fabric": self.groups[w.group].where,
            "role": w.role.name,
            "index": w.index,
            "incarnation": launch.incarnation,
            "min_version": launch.min_version,
            "env_steps": launch.env_steps,
            "resume": launch.resume or self.plan.resume,
        }
        options = self._options(w.group, w.cpus, w.gpus)
        handle = WorkerActor.options(**options).remote(json.dumps(spec))  # type: ignore[attr-defined]
        self.workers[w.name] = Running(w, handle)

    def _prepare(self, servers: Sequence[WorkerSpec]) -> None:
        """Build and set up these servers (all at once) and record the endpoints they bound."""
        endpoints = json.dumps(self.endpoints.to_json())
        refs = {w.name: self.workers[w.name].handle.prepare.remote(endpoints) for w in servers}
        for name, ref in refs.items():
            try:
                bound = json.loads(_get(ref, SERVER_READY_TIMEOUT, self.stopped))
            except GetTimeoutError:
                raise StartError(f"{name}: not ready within {SERVER_READY_TIMEOUT:.0f} s") from None
            except RayActorError as exc:
                raise StartError(f"{name}: died while starting ({type(exc).__name__})") from None
            if "error" in bound:
                raise StartError(f"{name}: {bound['error']}")
            self.endpoints.servers.update(bound)

    def write_workers(self) -> None:
        """``workers.json``: where each running worker runs (pid, Ray node), for operators and fault-injection
        tests."""
        if self.run_dir is None:
            return
        where = {name: w.info for name, w in self.workers.items() if w.ref is not None and w.info is not None}
        with contextlib.suppress(RunDirFull):  # the disk is full: the next start writes it (the run warns)
            write_run_file(self.run_dir / "workers.json", json.dumps(where, indent=1) + "\n")

    # ------------------------------------------------------------------ stop
    def stop(self, receiver: ControlReceiver) -> list[np.ndarray] | None:
        """Ask every worker to finish (final checkpoint, last reports), then read each policy's newest snapshot."""
        if self.gone() is not None:
            return None
        live = [w for w in self.workers.values() if w.ref is not None]
        for w in live:
            w.handle.stop.remote()
        deadline = time.monotonic() + STOP_TIMEOUT
        pending = [w.ref for w in live]
        while pending and time.monotonic() < deadline:
            receiver.drain(0.05)
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
        receiver.drain(0.1)
        snapshots = []
        for k, policy in enumerate(self.plan.policies):
            lead = self.groups[trainer_group(self.plan.lead_node(k))].agent if self.groups else None
            if lead is None:  # stopped before it was placed
                return None
            try:
                packed = ray.get(lead.snapshot.remote(k), timeout=CALL_TIMEOUT)
            except (RayActorError, GetTimeoutError):
                return None
            if not packed:
                return None
            size = {"params": ("float32", (policy.param_size,))}
            snapshots.append(
                np.array(wire.decode(wire.unpack(packed), expect_schema="snapshot", fields=size).arrays["params"])
            )
        return snapshots

    def release(self) -> None:
        """Kill every actor, destroy every node's shared memory, free the placement groups (every exit path; bounded:
        the agents close together, within one :data:`CALL_TIMEOUT`). Nothing to do when Ray itself ended: all of
        it went with Ray, and what the agents made in shared memory is swept after."""
        if self.gone() is not None:
            return
        for w in self.workers.values():
            ray.kill(w.handle, no_restart=True)
        agents = [group.agent for group in self.groups.values() if group.agent is not None]
        closing = [agent.close.remote() for agent in agents]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=CALL_TIMEOUT)
        for agent in agents:
            ray.kill(agent, no_restart=True)
        for group in self.groups.values():
            remove_placement_group(group.pg)


def run_ray(plan: Plan, controller: Controller, run_dir: Path | None) -> list[np.ndarray] | None:
    """Run until the controller says stop; return the newest policy snapshot."""

    def stopped() -> bool:
        return controller.should_stop() is not None

    with stop_on_signals(controller):  # from the start of Ray on, and around the cleanup too
        try:
            with _session(plan, stopped) as gone:
                return None if gone is None else _run(plan, controller, run_dir, stopped, gone)
        except StartError as exc:  # the private instance did not start
            controller.fail(str(exc))
            return None
        finally:
            sweep_stale()  # segments of node agents that died with their node (same machine only)
            sweep_stale_pipe_dirs()  # and their pipe folders


def _run(
    plan: Plan,
    controller: Controller,
    run_dir: Path | None,
    stopped: Callable[[], bool],
    gone: Callable[[], str | None],
) -> list[np.ndarray] | None:
    token = secrets.token_hex(16)
    receiver = ControlReceiver(f"tcp://{ray.util.get_node_ip_address()}:*", controller.handle, token=token)
    placement = RayPlacement(plan, run_dir, Endpoints(receiver.address, token), stopped, gone)
    try:
        supervisor = Supervisor(plan, placement, controller, receiver, run_dir)
        try:
            placement.place()
            supervisor.start()
            supervisor.run()
        except Stopped:
            pass  # told to stop while the start (or a restart) waited on Ray
        except StartError as exc:
            controller.fail(str(exc))
            return None
        return placement.stop(receiver)
    finally:
        with shielded():  # a second signal stops the wait above, never this: kills and frees, all bounded
            try:
                placement.release()
            finally:
                receiver.close()
