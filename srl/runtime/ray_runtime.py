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

Supervision: when a worker's actor dies (its process, or its whole node), the
controller is told, counts the restart, and starts a fresh one in the same
placement group (Ray re-places a group whose node is gone once a node with its
resources joins). A lost node group comes back whole: a new agent, then its
relay, policy workers and actors; workers in other groups that connect to
its servers (child relays, actors sending to its trainer) restart to follow
them to their new addresses. Trainers restart from the newest checkpoint;
data-parallel trainers all together, at a fresh rendezvous. Restarts are
bounded by ``workers.max_restarts`` per worker.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from srl.api.config import ConfigError, to_dict
from srl.base import wire
from srl.base.channel import sweep_stale_pipe_dirs
from srl.base.fileio import atomic_write_text
from srl.base.shm import sweep_stale
from srl.runtime.build import ROLES, worker_roles
from srl.runtime.plan import Plan
from srl.runtime.ray_actors import NodeAgent, WorkerActor
from srl.runtime.ray_fabric import TRAINER_NODE, Endpoints, trainer_group
from srl.system.control import ControlReceiver
from srl.system.controller import Controller
from srl.system.trainer_worker import checkpoints

log = logging.getLogger(__name__)

STOP_TIMEOUT = 120.0
"""How long stopping workers may take (a trainer finishes its update and writes its final checkpoint)."""
SERVER_READY_TIMEOUT = 120.0
"""How long a server (trainer, parameter root or relay) may take to bind once its node is placed."""
SERVERS = ("trainer", "param_root", "relay")


class StartError(RuntimeError):
    """The cluster could not place or start part of the run; the message names what."""


@dataclass
class Group:
    """One node group: its placement group, its agent and where the agent put the shared memory."""

    node: int
    pg: PlacementGroup
    agent: Any = None
    where: dict[str, str] = field(default_factory=dict)
    pending: Any = None
    """The agent's ``where()`` while the group is being (re)placed."""
    moved: dict[str, str] = field(default_factory=dict)
    """After its node was lost: the addresses its servers had (they bind afresh wherever the group lands)."""


@dataclass
class Running:
    """One started worker."""

    role: str
    index: int
    handle: Any
    ref: Any
    incarnation: int = 0


def node_of(plan: Plan, role: str, index: int) -> int:
    """The node group a worker is placed in."""
    if role == "actor":
        return plan.actor_node(index)
    if role == "policy":
        return plan.policy_node(index)
    if role == "relay":
        return index
    if role == "trainer":
        return trainer_group(plan.trainer_node(index))
    return TRAINER_NODE  # the root server and the eval worker live with the lead trainer


def endpoint_name(role: str, index: int) -> str:
    """The name a server's endpoint goes by in :class:`Endpoints` (and in ``Plan.clients_of``)."""
    return "root" if role == "param_root" else f"{role}{index}"


def all_groups(plan: Plan) -> list[int]:
    """Every node group of the run: the trainer nodes', then the actor nodes'."""
    return [*(trainer_group(k) for k in range(plan.trainer_nodes)), *range(plan.nodes)]


def _cpus(plan: Plan, role: str) -> float:
    r = plan.cfg.ray
    return {"actor": r.cpus_per_actor, "policy": r.cpus_per_policy_worker, "trainer": r.cpus_per_trainer}.get(role, 0.0)


def _bundle(plan: Plan, node: int) -> dict[str, float]:
    """Resources of one node group (claimed as a single bundle, so the group shares one node)."""
    r = plan.cfg.ray
    roles = [ri for ri in worker_roles(plan) if node_of(plan, *ri) == node]
    bundle: dict[str, float] = {"CPU": max(0.01, sum(_cpus(plan, role) for role, _ in roles))}
    if node <= TRAINER_NODE:
        if r.trainer_gpus:
            bundle["GPU"] = r.trainer_gpus * sum(role == "trainer" for role, _ in roles)
        if r.trainer_resource:
            bundle[r.trainer_resource] = 1.0
    elif r.node_resource:
        bundle[r.node_resource] = 1.0
    return bundle


def _connect(plan: Plan) -> bool:
    """Join (or start) Ray; True when this call started it (and so must shut it down)."""
    if ray.is_initialized():
        return False
    r = plan.cfg.ray
    if r.address is None:  # a private instance on this machine, on loopback, sized to hold the whole layout
        os.environ.setdefault("RAY_worker_niceness", "0")  # our workers are the hot path, not background work
        need = sum(_bundle(plan, n)["CPU"] for n in all_groups(plan))
        ray.init(
            num_cpus=max(os.cpu_count() or 1, int(np.ceil(need))),
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            logging_level=logging.WARNING,
            log_to_driver=True,
        )
    else:
        _probe(r.address)
        try:
            ray.init(address=r.address, logging_level=logging.WARNING)
        except ConnectionError as exc:
            raise ConfigError(f"ray.address: cannot connect to {r.address!r}: {exc}") from None
    return True


def _probe(address: str) -> None:
    """Fail fast with one line when nothing listens at ``ray.address`` (``ray.init`` would retry for minutes)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5.0).close()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"ray.address: cannot reach {address!r} ({exc})") from None


class RayRun:
    """The driver's state for one run: groups, workers, endpoints; started, supervised and stopped here."""

    def __init__(self, plan: Plan, controller: Controller, run_dir: Path | None, endpoints: Endpoints) -> None:
        self.plan, self.controller, self.run_dir, self.endpoints = plan, controller, run_dir, endpoints
        self.groups: dict[int, Group] = {}
        self.workers: dict[str, Running] = {}
        self.waiting: dict[int, list[tuple[str, int, int]]] = {}  # node -> workers to start once it is placed

    # ------------------------------------------------------------------ start
    def place(self) -> None:
        """Claim one placement group per node group and wait until the cluster has placed them all."""
        for node in all_groups(self.plan):
            self.groups[node] = Group(
                node,
                placement_group(
                    [_bundle(self.plan, node)], strategy="STRICT_PACK", name=f"srl-{self.endpoints.token[:8]}-{node}"
                ),
            )
        timeout = self.plan.cfg.ray.start_timeout_seconds
        for node, group in self.groups.items():
            try:
                ray.get(group.pg.ready(), timeout=timeout)
            except GetTimeoutError:
                raise StartError(
                    f"ray: node group {node} needs {_bundle(self.plan, node)}, which the cluster did "
                    f"not offer within {timeout:.0f} s (ray.start_timeout_seconds)"
                ) from None
        for group in self.groups.values():
            self._start_agent(group)
        for node, group in self.groups.items():
            try:
                group.where = json.loads(ray.get(group.pending, timeout=timeout))
            except (GetTimeoutError, RayActorError) as exc:
                raise StartError(f"ray: the agent of node group {node} did not start ({type(exc).__name__})") from None
            group.pending = None
        self.endpoints.dist = self.groups[TRAINER_NODE].where.get("dist")

    def _options(self, node: int, cpus: float, gpus: float = 0.0) -> dict[str, Any]:
        group = self.groups[node]
        return {
            "num_cpus": cpus,
            "num_gpus": gpus,
            "max_restarts": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(group.pg, placement_group_bundle_index=0),
        }

    def _start_agent(self, group: Group) -> None:
        spec = {**self._common(), "node": group.node}
        group.agent = NodeAgent.options(**self._options(group.node, 0)).remote(json.dumps(spec))
        group.pending = group.agent.where.remote()

    def _common(self) -> dict[str, Any]:
        p = self.plan
        return {
            "config": to_dict(p.cfg),
            "null_trainer": p.null_trainer,
            "resume": p.resume,
            "start_version": p.start_version,
            "endpoints": self.endpoints.to_json(),
            "run_dir": None if self.run_dir is None else str(self.run_dir),
        }

    def start_all(self) -> None:
        """Start every worker; servers bind first and their endpoints go to everyone else (:meth:`_start`)."""
        self._start([(role, index, 0) for role, index in worker_roles(self.plan)])

    def write_workers(self) -> None:
        """``workers.json``: where each worker runs (pid, Ray node), for operators and fault-injection tests."""
        if self.run_dir is None:
            return
        live = {name: w.handle.info.remote() for name, w in self.workers.items() if w.ref is not None}
        where = {}
        for name, ref in live.items():
            try:
                where[name] = json.loads(ray.get(ref, timeout=30.0))
            except (RayActorError, GetTimeoutError):
                continue
        atomic_write_text(self.run_dir / "workers.json", json.dumps(where, indent=1) + "\n")

    def _create(self, role: str, index: int, incarnation: int, **extra: Any) -> None:
        node = node_of(self.plan, role, index)
        spec = {
            **self._common(),
            "node": node,
            "fabric": self.groups[node].where,
            "role": role,
            "index": index,
            "incarnation": incarnation,
            **extra,
        }
        gpus = self.plan.cfg.ray.trainer_gpus if role == "trainer" else 0.0  # Ray sets CUDA_VISIBLE_DEVICES
        handle = WorkerActor.options(**self._options(node, _cpus(self.plan, role), gpus)).remote(json.dumps(spec))
        self.workers[f"{role}{index}"] = Running(role, index, handle, None, incarnation)

    def _launch(self, names: list[str]) -> None:
        """Start these workers' loops; servers among them first bind (all at once), and their endpoints are
        recorded before anyone runs."""
        endpoints = json.dumps(self.endpoints.to_json())
        servers = [name for name in names if self.workers[name].role in SERVERS]
        bound_refs = {name: self.workers[name].handle.prepare.remote(endpoints) for name in servers}
        for name, ref in bound_refs.items():
            try:
                bound = json.loads(ray.get(ref, timeout=SERVER_READY_TIMEOUT))
            except GetTimeoutError:
                raise StartError(f"{name}: not ready within {SERVER_READY_TIMEOUT:.0f} s") from None
            except RayActorError as exc:
                raise StartError(f"{name}: died while starting ({type(exc).__name__})") from None
            if "error" in bound:
                raise StartError(f"{name}: {bound['error']}")
            if "samples" in bound:
                self.endpoints.samples[name] = bound["samples"]
            if "params" in bound:
                self.endpoints.params[endpoint_name(self.workers[name].role, self.workers[name].index)] = bound[
                    "params"
                ]
        endpoints = json.dumps(self.endpoints.to_json())
        for name in names:
            self.workers[name].ref = self.workers[name].handle.run.remote(endpoints)

    # ------------------------------------------------------------------ supervise
    def supervise(self, receiver: ControlReceiver) -> None:
        """Until the controller says stop: read reports, restart what died, start what waited for its node."""
        controller = self.controller
        while controller.should_stop() is None:
            receiver.drain(0.05)
            controller.tick()
            self._start_placed_groups()
            refs = {w.ref: name for name, w in self.workers.items() if w.ref is not None}
            done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
            for ref in done:
                name = refs[ref]
                if self.workers[name].ref is not ref:  # already started again (with a data-parallel peer)
                    continue
                receiver.drain(0.2)  # its error report, if it sent one, names the cause
                self._lost(name, self._cause(name, ref))

    def _cause(self, name: str, ref: Any) -> str:
        try:
            result = ray.get(ref)
        except RayActorError as exc:
            died = "its node was lost" if "node" in str(exc).lower() and "died" in str(exc).lower() else "died"
            return self.controller.worker_errors.pop(name, None) or f"Ray actor {died}"
        return self.controller.worker_errors.pop(name, None) or str(result) or "ended before the run did"

    def _lost(self, name: str, cause: str) -> None:
        controller, w = self.controller, self.workers[name]
        w.ref = None
        if not self.restartable(w.role):
            controller.fail(f"{name}: {cause}")
            return
        if controller.restarts.get(name, 0) >= self.plan.cfg.workers.max_restarts:
            controller.fail(f"{name}: {cause} (after {self.plan.cfg.workers.max_restarts} restarts)")
            return
        if w.role == "trainer" and self.plan.cfg.workers.trainers > 1:
            self._restart_trainers(name, cause)
            return
        node = node_of(self.plan, w.role, w.index)
        group = self.groups[node]
        ray.kill(w.handle, no_restart=True)
        dropped = 0
        if node in self.waiting or group.pending is not None:
            self.waiting.setdefault(node, []).append((w.role, w.index, w.incarnation + 1))
        elif not self._agent_alive(group):
            self._replace_agent(group)
            self.waiting.setdefault(node, []).append((w.role, w.index, w.incarnation + 1))
        else:
            if w.role == "actor":
                dropped = int(ray.get(group.agent.recover.remote(self.plan.actor_row(w.index))))
            try:
                self._restart([(w.role, w.index, w.incarnation + 1)])
            except StartError as exc:
                controller.fail(f"{name}: {cause}; not restarted: {exc}")
                return
        controller.note_restart(name, cause, dropped)

    def _restart_trainers(self, name: str, cause: str) -> None:
        """Data-parallel trainer ``name`` is gone. Its peers cannot go on without it (their gloo group is broken),
        so all of them start again together from the newest checkpoint and meet at a fresh rendezvous; actors
        keep sending to the same addresses. Only on the nodes they had: a lost trainer node ends the run."""
        n = self.plan.cfg.workers.trainers
        trainers = [self.workers[f"trainer{i}"] for i in range(n)]
        for peer in trainers:
            ray.kill(peer.handle, no_restart=True)
            peer.ref = None
        nodes = {node_of(self.plan, "trainer", i) for i in range(n)}
        if any(node in self.waiting or not self._agent_alive(self.groups[node]) for node in nodes):
            self.controller.fail(
                f"{name}: {cause}; a trainer node was lost, and data-parallel trainers restart "
                "only on the nodes they had"
            )
            return
        epoch = max(peer.incarnation for peer in trainers) + 1  # names the fresh rendezvous
        if self.endpoints.dist is not None:  # trainers on several nodes: a new TCP store
            self.endpoints.dist = str(ray.get(self.groups[TRAINER_NODE].agent.fresh_dist.remote(), timeout=30.0))
        try:
            self._restart([("trainer", i, epoch) for i in range(n)])
        except StartError as exc:
            self.controller.fail(f"{name}: {cause}; not restarted: {exc}")
            return
        for i in range(n):
            peer = f"trainer{i}"
            self.controller.worker_errors.pop(peer, None)  # a peer's own error was the broken group's echo
            self.controller.note_restart(peer, cause if peer == name else f"{name} failed ({cause})", 0)

    def restartable(self, role: str) -> bool:
        if self.plan.cfg.workers.max_restarts == 0:
            return False
        if role == "trainer":  # from the newest checkpoint, which lives in the run directory
            return self.run_dir is not None
        return True

    def _agent_alive(self, group: Group) -> bool:
        try:
            ray.get(group.agent.where.remote(), timeout=10.0)
            return True
        except (RayActorError, GetTimeoutError):
            return False

    def _replace_agent(self, group: Group) -> None:
        """The node group's node is gone: a new agent (Ray re-places the group when a node can take it)."""
        log.warning("node group %d lost; waiting for Ray to place it again", group.node)
        ray.kill(group.agent, no_restart=True)
        self._start_agent(group)
        self.waiting.setdefault(group.node, [])
        # Its servers cannot keep their addresses on another node: they bind afresh, and their clients follow.
        servers = [
            endpoint_name(role, index)
            for role, index in worker_roles(self.plan)
            if role in SERVERS and node_of(self.plan, role, index) == group.node
        ]
        for table in (self.endpoints.params, self.endpoints.samples):
            group.moved.update({name: table.pop(name) for name in servers if name in table})

    def _start_placed_groups(self) -> None:
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
            start_order = {ri: k for k, ri in enumerate(worker_roles(self.plan))}  # servers before their readers
            try:
                self._restart(sorted(self.waiting.pop(node), key=lambda r: start_order[r[:2]]))
            except StartError as exc:
                self.controller.fail(f"node group {node} placed again, but it did not start: {exc}")
                return
            moved, group.moved = group.moved, {}
            for server, old in moved.items():
                new = self.endpoints.params.get(server) or self.endpoints.samples.get(server)
                if new != old and not self._follow(server, new, node):
                    return

    def _follow(self, server: str, address: str | None, moved_node: int) -> bool:
        """``server`` came back at ``address``: restart its running clients in other groups so they connect there
        (its own group has just started with the new address, as will clients not running now). False when the
        run failed."""
        again: list[tuple[str, int, int]] = []
        dropped: dict[str, int] = {}
        for role, index in self.plan.clients_of(server):
            name, node = f"{role}{index}", node_of(self.plan, role, index)
            w = self.workers.get(name)
            if node == moved_node or node in self.waiting or w is None or w.ref is None:
                continue
            ray.kill(w.handle, no_restart=True)
            w.ref = None
            dropped[name] = (
                int(ray.get(self.groups[node].agent.recover.remote(self.plan.actor_row(index))))
                if role == "actor"
                else 0
            )
            again.append((role, index, w.incarnation + 1))
        try:
            self._restart(again)
        except StartError as exc:
            self.controller.fail(f"could not follow {server} to {address}: {exc}")
            return False
        for name, lost in dropped.items():
            self.controller.note_restart(name, f"{server} moved to {address}", lost)
        return True

    def _restart(self, items: list[tuple[str, int, int]]) -> None:
        """Start workers ``(role, index, incarnation)`` again (see :meth:`_start`); trainers continue from the
        newest checkpoint and publish above every version readers already hold."""
        if not items:
            return
        resume = None
        if any(role == "trainer" for role, _, _ in items):
            resume = {
                "resume": self._newest_checkpoint(),
                "min_version": int(self.controller.trainer.get("version", 0)) + 1,
            }
        self._start(items, resume)

    def _start(self, items: list[tuple[str, int, int]], trainer_spec: dict[str, Any] | None = None) -> None:
        """Start workers ``(role, index, incarnation)``, given in start order: their processes are created at once
        (they start in parallel), trainers bind together (data-parallel peers meet in their setup), the other
        servers one at a time in that order (each relay connects to a parent already bound), then the rest run.
        ``trainer_spec``: extra spec entries for trainers (a restart's checkpoint and version floor)."""
        for role, index, incarnation in items:
            extra = trainer_spec if role == "trainer" and trainer_spec else {}
            self._create(role, index, incarnation, **extra)
        names = [f"{role}{index}" for role, index, _ in items]
        self._launch([name for name in names if self.workers[name].role == "trainer"])
        for name in names:
            if self.workers[name].role in SERVERS and self.workers[name].role != "trainer":
                self._launch([name])
        self._launch([name for name in names if self.workers[name].role not in SERVERS])
        self.write_workers()

    def _newest_checkpoint(self) -> str:
        found = checkpoints(Path(self.run_dir) / "checkpoints") if self.run_dir is not None else []
        if not found:
            raise StartError("trainer0 died before its first checkpoint; nothing to restart it from")
        return str(found[-1])

    # ------------------------------------------------------------------ stop
    def stop(self, receiver: ControlReceiver) -> np.ndarray | None:
        """Ask every worker to finish (final checkpoint, last reports), then read the newest snapshot."""
        live = [w for w in self.workers.values() if w.ref is not None]
        for w in live:
            w.handle.stop.remote()
        deadline = time.monotonic() + STOP_TIMEOUT
        pending = [w.ref for w in live]
        while pending and time.monotonic() < deadline:
            receiver.drain(0.05)
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
        receiver.drain(0.1)
        try:
            packed = ray.get(self.groups[TRAINER_NODE].agent.snapshot.remote(), timeout=30.0)
        except (RayActorError, GetTimeoutError):
            return None
        if not packed:
            return None
        msg = wire.decode(
            wire.unpack(packed), expect_schema="snapshot", fields={"params": ("float32", (self.plan.param_size,))}
        )
        return np.array(msg.arrays["params"])

    def release(self) -> None:
        """Kill every actor, destroy every node's shared memory, free the placement groups (every exit path)."""
        for w in self.workers.values():
            ray.kill(w.handle, no_restart=True)
        for group in self.groups.values():
            if group.agent is not None:
                try:
                    ray.get(group.agent.close.remote(), timeout=10.0)
                except (RayActorError, GetTimeoutError):
                    pass
                ray.kill(group.agent, no_restart=True)
            remove_placement_group(group.pg)


def run_ray(plan: Plan, controller: Controller, run_dir: Path | None) -> np.ndarray | None:
    """Run until the controller says stop; return the newest policy snapshot."""
    owns_ray = _connect(plan)
    token = secrets.token_hex(16)
    receiver = ControlReceiver(f"tcp://{ray.util.get_node_ip_address()}:*", controller.handle, token=token)
    run = RayRun(plan, controller, run_dir, Endpoints(receiver.address, token))
    controller.supervised_roles = frozenset(role for role in ROLES if run.restartable(role))
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if controller.stop_reason == "interrupted":
            raise KeyboardInterrupt  # a second signal: stop waiting for workers (they are killed below)
        controller.stop_reason = controller.stop_reason or "interrupted"

    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        try:
            run.place()
            run.start_all()
        except StartError as exc:
            controller.fail(str(exc))
            return None
        run.supervise(receiver)
        return run.stop(receiver)
    finally:
        try:
            run.release()
        finally:
            receiver.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if owns_ray:
                ray.shutdown()
            sweep_stale()  # segments of node agents that died with their node (same machine only)
            sweep_stale_pipe_dirs()  # and their pipe folders
