"""One supervisor for every placement: restart what died, by the topology's restart policies.

Why: the local and the Ray runtime each had a supervisor of their own, with
different rules (locally a dead trainer ended the run; under Ray it restarted
from its newest checkpoint). RLlib's EnvRunnerGroup and Launchpad promise that
one flag switches local and distributed; this makes it true here. The loop
and the rules live in :class:`Supervisor`; what differs between processes on
this machine and Ray actors on a cluster is the small :class:`Placement`
interface underneath (start, alive, kill, address, and freeing what a dead
worker held).

The rules, for every runtime (see ``topology.Restart``): a worker that dies is
started again in its node group, alone, after the pool buffers it held are
freed (their segments counted as dropped); a trainer restarts together with
its data-parallel peers from the newest checkpoint and publishes above every
version readers hold. Each worker restarts at most ``workers.max_restarts``
times; one death more ends the run. A server that comes back at another
address (its node was lost and the group landed elsewhere) takes its running
clients with it: they start again to connect there. Every restart is counted
in ``restarts`` and printed as a warning by the controller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from srl.runtime.plan import Plan
from srl.runtime.topology import Endpoint, Restart, WorkerSpec, attach_reports
from srl.system.checkpoint import checkpoints
from srl.system.control import ControlReceiver
from srl.system.controller import Controller
from srl.system.run_dir import policy_checkpoints


class StartError(RuntimeError):
    """The placement could not start part of the run; the message names what."""


@dataclass(frozen=True)
class Launch:
    """One start of one worker."""

    worker: WorkerSpec
    incarnation: int = 0
    """How many times it was started before (data-parallel peers restarted together share the number)."""
    resume: tuple[str, ...] | None = None
    """A restarted trainer: the checkpoints (one per policy; its own policy's is read) it continues from (else the
    run's own ``plan.resume``)."""
    min_version: int = 0
    """A restarted trainer publishes at least this version."""
    env_steps: int = 0
    """A restarted actor: the env steps its earlier starts took, which its exploration schedule counts on from."""


class Placement(Protocol):
    """Where workers run: processes on this machine, or Ray actors on a cluster."""

    def start(self, launches: Sequence[Launch]) -> list[WorkerSpec]:
        """Start these workers (given in start order); return those started now. A placement may defer the
        others until their node group is placed again (:meth:`started` reports them). Raises StartError."""

    def started(self) -> list[WorkerSpec]:
        """The deferred workers that started since the last call. Raises StartError."""

    def alive(self, worker: WorkerSpec) -> bool:
        """Whether its current start still runs."""

    def exit_cause(self, worker: WorkerSpec) -> str:
        """How a worker that is no longer alive ended."""

    def kill(self, worker: WorkerSpec) -> None:
        """End it now (nothing happens to one already gone)."""

    def address(self, endpoint: Endpoint) -> str | None:
        """Where ``endpoint`` is served now (None before its server bound it)."""

    def free_buffers(self, worker: WorkerSpec) -> int:
        """Free the pool buffers dead ``worker`` held; how many segments that drops."""

    def published_version(self, policy: int = 0) -> int:
        """The newest version in policy ``policy``'s lead trainer's buffer (-1 when unknown)."""


class Supervisor:
    """Starts every worker of the topology, then, until the controller says stop, reads reports and restarts
    what died."""

    def __init__(
        self, plan: Plan, placement: Placement, controller: Controller, receiver: ControlReceiver, run_dir: Path | None
    ) -> None:
        self.plan, self.topology = plan, plan.topology
        self.placement, self.controller, self.receiver = placement, controller, receiver
        self.run_dir = run_dir
        self.max_restarts = plan.cfg.workers.max_restarts
        self.incarnations: dict[str, int] = {}
        self.running: set[str] = set()
        self.addresses: dict[Endpoint, str] = {}
        attach_reports(plan.topology, controller)
        controller.supervised = frozenset(w.name for w in self.topology.workers if self.restartable(w))

    def restartable(self, worker: WorkerSpec) -> bool:
        """Restarts are on, and a trainer has a run directory to find its checkpoints in."""
        if self.max_restarts == 0:
            return False
        return worker.restart is not Restart.FROM_CHECKPOINT or self.run_dir is not None

    def start(self) -> None:
        """Start every worker (raises StartError)."""
        self._started(self.placement.start([Launch(w) for w in self.topology.workers]))

    def run(self) -> None:
        """The loop: reports, progress, deferred starts, and a restart for each worker found dead."""
        controller = self.controller
        while controller.should_stop() is None:
            self.receiver.drain(0.05)
            controller.tick()
            try:
                self._started(self.placement.started())
            except StartError as exc:
                controller.fail(str(exc))
                return
            for worker in self.topology.workers:
                if controller.should_stop() is not None:
                    return
                if worker.name in self.running and not self.placement.alive(worker):
                    self.receiver.drain(0.2)  # its error report, if it sent one, names the cause
                    self._lost(worker)

    # ------------------------------------------------------------------ rules
    def _lost(self, worker: WorkerSpec) -> None:
        controller, name = self.controller, worker.name
        self.running.discard(name)
        cause = controller.worker_errors.pop(name, None) or self.placement.exit_cause(worker)
        if not self.restartable(worker):
            controller.fail(f"{name}: {cause}", name)
            return
        if controller.restarts.get(name, 0) >= self.max_restarts:
            controller.fail(f"{name}: {cause} (after {self.max_restarts} restarts)", name)
            return
        peers = self.topology.peers(worker)
        for peer in peers:
            if peer is not worker:
                controller.worker_errors.pop(peer.name, None)  # a peer's own error was the broken group's echo
                controller.tracebacks.pop(peer.name, None)
        causes = {p.name: cause if p is worker else f"{name} failed ({cause})" for p in peers}
        try:
            self._restart(peers, causes)
        except StartError as exc:
            controller.fail(f"{name}: {cause}; not restarted: {exc}", name)

    def _restart(self, workers: Sequence[WorkerSpec], causes: Mapping[str, str]) -> None:
        """Kill these workers, free what they held, start them again and count each restart."""
        if not workers:
            return
        for w in workers:
            self.placement.kill(w)
            self.running.discard(w.name)
        dropped = {w.name: self.placement.free_buffers(w) for w in workers}
        launches = self._launches(workers)
        self.incarnations.update((launch.worker.name, launch.incarnation) for launch in launches)
        started = self.placement.start(launches)
        for w in workers:
            self.controller.note_restart(w.name, causes[w.name], dropped[w.name])
        self._started(started)

    def _launches(self, workers: Sequence[WorkerSpec]) -> list[Launch]:
        """The next start of each worker, in start order. Data-parallel peers restarted together share one
        incarnation number (it names their fresh rendezvous) and continue from the newest checkpoint, above every
        version readers hold."""
        out: dict[str, Launch] = {}
        for role in dict.fromkeys(w.role for w in workers):
            batch = [w for w in workers if w.role is role]
            if role.restart is not Restart.FROM_CHECKPOINT:
                for w in batch:
                    steps = self.controller.worker_env_steps(w.name)
                    out[w.name] = Launch(w, self.incarnations.get(w.name, 0) + 1, env_steps=steps)
                continue
            epoch = max(self.incarnations.get(w.name, 0) for w in batch) + 1
            k = batch[0].policy or 0  # peers restarted together train one policy
            reported = self.controller.version_of(k)  # what readers may hold, as we know
            floor = max(reported, self.placement.published_version(k)) + 1
            resume = list(self.plan.resume or [""] * len(self.plan.policies))
            resume[k] = self._newest_checkpoint(batch[0], k)
            out.update((w.name, Launch(w, epoch, tuple(resume), floor)) for w in batch)
        return [out[w.name] for w in self.topology.in_start_order(list(workers))]

    def _newest_checkpoint(self, worker: WorkerSpec, policy: int) -> str:
        plan = self.plan
        folder = (
            None if self.run_dir is None else policy_checkpoints(self.run_dir, plan.cfg, plan.policies[policy].name)
        )
        found = checkpoints(folder) if folder is not None else []
        if not found:
            raise StartError(f"{worker.name} died before the first checkpoint; nothing to restart it from")
        return str(found[-1])

    def _started(self, started: Sequence[WorkerSpec]) -> None:
        """These workers run now; clients of theirs elsewhere follow a server that came back at a new address."""
        self.running.update(w.name for w in started)
        moved: list[tuple[Endpoint, str]] = []
        for w in started:
            for endpoint in w.serves:
                address = self.placement.address(endpoint) if endpoint.stream.bound else None
                if address is None:
                    continue
                if self.addresses.get(endpoint, address) != address:
                    moved.append((endpoint, address))
                self.addresses[endpoint] = address
        names = {w.name for w in started}
        for endpoint, address in moved:
            clients = [c for c in self.topology.clients_of(endpoint) if c.name in self.running - names]
            try:
                self._restart(clients, {c.name: f"{endpoint.name} moved to {address}" for c in clients})
            except StartError as exc:
                raise StartError(f"could not follow {endpoint.name} to {address}: {exc}") from None
