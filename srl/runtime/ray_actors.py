"""The two Ray actor classes of the Ray runtime: a node agent per node group, and one actor per worker.

Both take a JSON spec (never a pickled object of ours) and rebuild the plan
from the resolved config, the same way an exec'd local worker does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from srl.api.worker import Worker
from srl.base import wire
from srl.base.channel import sweep_stale_pipe_dirs
from srl.base.shm import sweep_stale
from srl.runtime.build import build_worker
from srl.runtime.plan import Plan, plan_from_spec
from srl.runtime.ray_fabric import Endpoints, NodeFabric
from srl.runtime.topology import TRAINER_NODE, Endpoint
from srl.system.tracebacks import error_report

log = logging.getLogger(__name__)


def _normal_priority() -> None:
    """Ray starts workers at niceness 15 (``RAY_worker_niceness``), so they lose the CPU to any other process;
    here they are the run's hot path. Undo it where allowed (root, or CAP_SYS_NICE); otherwise leave it."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except (AttributeError, PermissionError, OSError):
        pass


def _free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the lead trainer binds it moments later, when the trainers meet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _fabric(spec: dict[str, Any], plan: Plan, host: str, serves: tuple[Endpoint, ...] = ()) -> NodeFabric:
    where = spec.get("fabric")
    return NodeFabric(
        plan,
        int(spec["node"]),
        Endpoints.from_json(spec["endpoints"]),
        host,
        tag=None if where is None else where["tag"],
        directory=None if where is None else Path(where["dir"]),
        serves=serves,
    )


@ray.remote
class NodeAgent:
    """Owns one node group's shared memory: creates it, frees a dead actor's buffers, destroys it at the end."""

    def __init__(self, spec_json: str) -> None:
        spec = json.loads(spec_json)
        self.plan = plan_from_spec(spec)
        sweep_stale()  # segments of an earlier agent on this node that died with its process
        sweep_stale_pipe_dirs()  # and its pipe folder
        self.fabric = _fabric(spec, self.plan, ray.util.get_node_ip_address())
        self.fabric.create()
        self.dist: list[str] | None = None
        if self.fabric.node == TRAINER_NODE and self.plan.policy_nodes > 1:  # the lead trainers host the stores
            self.dist = [self._address() for _ in self.plan.policies]

    def _address(self) -> str:
        return f"tcp://{self.fabric.host}:{_free_port(self.fabric.host)}"

    def fresh_dist(self, policy: int) -> str:
        """A new address for the TCP store of policy ``policy``'s trainers (restarted trainers meet afresh)."""
        assert self.dist is not None
        self.dist[policy] = self._address()
        return self.dist[policy]

    def where(self) -> str:
        """The names workers open, and the trainers' TCP store when this group hosts it (JSON)."""
        return json.dumps(
            {"tag": self.fabric.tag, "dir": str(self.fabric.dir), "host": self.fabric.host, "dist": self.dist}
        )

    def free_buffers(self, role: str, index: int) -> int:
        """Free the buffers dead worker ``role``/``index`` held in this group's pool; how many segments were lost."""
        return self.fabric.free_buffers(self.plan.topology.get(role, index))

    def version(self, policy: int = 0) -> int:
        """The newest version in this group's buffer of policy ``policy`` (trainers' node only; -1 before the
        first)."""
        return self.fabric.params(policy=policy).version()

    def snapshot(self, policy: int = 0) -> bytes:
        """Policy ``policy``'s lead trainer's newest snapshot, wire-encoded (trainers' node only; empty before the
        first)."""
        out = np.empty(self.plan.policies[policy].param_size, np.float32)
        version = self.fabric.params(policy=policy).read_into(out, -1)
        if version is None:
            return b""
        return wire.pack(wire.encode("snapshot", {"params": out}, {"version": version}))

    def close(self) -> None:
        self.fabric.destroy()


@ray.remote(concurrency_groups={"control": 1})  # type: ignore[call-overload]  # Ray's stubs lack the keyword
class WorkerActor:
    """One worker. Servers are built and bound by :meth:`prepare` first; :meth:`run` loops until :meth:`stop`."""

    def __init__(self, spec_json: str) -> None:
        _normal_priority()
        self.spec = json.loads(spec_json)
        self.stopping = False
        self.worker: Worker | None = None
        self.plan = plan_from_spec(self.spec)
        self.record = self.plan.topology.get(str(self.spec["role"]), int(self.spec["index"]))
        self.name = self.record.name
        self.host = str(self.spec["fabric"]["host"])
        self.fabric = _fabric(self.spec, self.plan, self.host, self.record.serves)
        torch.set_num_threads(self.plan.cfg.workers.torch_threads)

    def _should_stop(self) -> bool:
        return self.stopping

    def _set_up(self) -> Worker:
        run_dir = self.spec.get("run_dir")
        run_dir = Path(run_dir) if run_dir is not None and Path(run_dir).is_dir() else None  # not on every node
        worker = build_worker(
            self.plan,
            self.fabric,
            self.record,
            run_dir,
            wait_timeout=0.05,
            report_interval=0.1,
            incarnation=int(self.spec["incarnation"]),
            min_version=int(self.spec["min_version"]),
            env_steps=int(self.spec["env_steps"]),
        )
        worker.should_stop = self._should_stop
        worker.setup()
        self.worker = worker
        return worker

    def _fail(self, exc: BaseException) -> str:
        log.debug("worker %s failed:\n%s", self.name, traceback.format_exc())
        report = error_report(self.name, exc)
        try:
            self.fabric.reporter().report("error", report)
        except Exception:  # the report is a courtesy; the driver sees the return value anyway
            pass
        return report["message"]

    def prepare(self, endpoints: str) -> str:
        """Build and set up a server; return the endpoints it bound (JSON: endpoint name -> address), or
        ``{"error": ...}``."""
        self.fabric.endpoints = Endpoints.from_json(json.loads(endpoints))
        try:
            worker = self._set_up()
        except Exception as exc:
            return json.dumps({"error": self._fail(exc)})
        bound: dict[str, str] = {}
        # a segment stop's receiver, a record channel's or mailbox's reader, a parameter server
        for e in self.record.serves:
            if e.stream.segments and e.stream.bound:
                bound[e.name] = worker.source.address  # type: ignore[attr-defined]
            elif e.stream.bound and (e.stream.channel or e.stream.mail):
                bound[e.name] = self.fabric.bound_address(e)
            elif e.stream.bound:
                bound[e.name] = worker.server.address  # type: ignore[attr-defined]
        return json.dumps(bound)

    def run(self, endpoints: str) -> str:
        """The worker loop (``endpoints``: every server's, JSON); returns "" after a requested stop, else why it
        ended."""
        self.fabric.endpoints = Endpoints.from_json(json.loads(endpoints))
        try:
            worker = self.worker or self._set_up()
        except Exception as exc:
            self.fabric.close_worker_side()
            return self._fail(exc)
        message = ""
        try:
            while not self.stopping:
                worker.poll()
        except Exception as exc:
            message = self._fail(exc)
        finally:
            try:
                worker.teardown()
            except Exception as exc:
                message = message or self._fail(exc)
            with contextlib.suppress(Exception):  # the process's CPU to its end (a courtesy, as an error report is)
                self.fabric.reporter().report("spent", {"worker": self.name})
            self.fabric.close_worker_side()
        return message or ("" if self.stopping else "the worker loop ended")

    @ray.method(concurrency_group="control")
    def info(self) -> str:
        """Where this worker runs (JSON: pid, Ray node id, node address), for ``workers.json``."""
        return json.dumps({"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(), "host": self.host})

    @ray.method(concurrency_group="control")
    def stop(self) -> None:
        """Ask the loop to finish (runs beside :meth:`run`)."""
        self.stopping = True
