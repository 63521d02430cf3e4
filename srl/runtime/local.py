"""The local runtime: one process per worker on this machine, joined by shared memory.

The calling process is the controller: it creates the fabric, starts the
workers (``fork`` on Linux, so torch is imported once; ``exec`` elsewhere),
reads their reports, and stops them all through a shared stop flag. The
supervisor (``runtime/supervisor.py``, the same as under Ray) watches them
through :class:`LocalPlacement` and restarts what died. Every exit path (normal end, Ctrl-C, SIGTERM, a worker
crash, an exception here) joins or kills the children and removes every
shared-memory segment and pipe of the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Protocol

import numpy as np
import torch

from srl.api.config import to_dict
from srl.base.stop_signals import shielded
from srl.runtime.build import build_worker
from srl.runtime.fabric import SharedFabric, newest_snapshots
from srl.runtime.plan import Plan
from srl.runtime.supervisor import Launch, Supervisor
from srl.runtime.topology import Endpoint, Stream, WorkerSpec
from srl.system.control import ControlReceiver
from srl.system.controller import Controller, stop_on_signals
from srl.system.run_dir import RunDirFull, write_run_file
from srl.system.tracebacks import error_report

log = logging.getLogger(__name__)

JOIN_TIMEOUT = 120.0
"""How long stopping workers may take: a trainer finishes its current update (tens of seconds for a CNN on a CPU)
and writes its final checkpoint; killing it would lose both."""


def _set_parent_death_signal() -> None:
    """Linux: get SIGTERM if the controller dies, so no worker outlives it."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _worker_main(
    plan: Plan,
    fabric: SharedFabric,
    worker: WorkerSpec,
    run_dir: Path | None,
    parent: int,
    incarnation: int = 0,
    min_version: int = 0,
    env_steps: int = 0,
) -> None:
    """Entry point of a worker process (forked, or exec'd through :mod:`srl.runtime.worker_main`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the controller decides
    _set_parent_death_signal()
    fabric.after_fork()
    stop = fabric.stop_flag()
    stopping = {"now": False}

    def on_term(signum: int, frame: FrameType | None) -> None:
        stopping["now"] = True

    signal.signal(signal.SIGTERM, on_term)
    torch.set_num_threads(plan.cfg.workers.torch_threads)
    reporter = fabric.reporter()
    code = 0
    try:
        built = build_worker(
            plan,
            fabric,
            worker,
            run_dir,
            wait_timeout=0.05,
            report_interval=0.1,
            incarnation=incarnation,
            min_version=min_version,
            env_steps=env_steps,
        )
        # os.getppid() covers platforms without a parent-death signal and a controller that died before prctl.
        built.run(lambda: bool(stop[0]) or stopping["now"] or os.getppid() != parent)
    except Exception as exc:  # report any worker failure (one line and the user's traceback), then exit non-zero
        log.debug("worker %s failed:\n%s", worker.name, traceback.format_exc())
        reporter.report("error", error_report(worker.name, exc))
        code = 1
    finally:
        reporter.report("spent", {"worker": worker.name})  # the process's CPU to its end, teardown included
        fabric.close_worker_side()
    os._exit(code)  # skip atexit handlers inherited from the controller


def run_local(plan: Plan, controller: Controller, run_dir: Path | None) -> list[np.ndarray] | None:
    """Run until the controller says stop; return the newest policy snapshot.

    Call it from a process that has not yet run multi-threaded torch work (``srl train`` guarantees
    this): forked workers inherit OpenMP's thread-pool state and hang if they use more than one thread.
    """
    torch.set_num_threads(1)  # see the docstring: the controller stays single-threaded
    method = plan.cfg.workers.start_method
    if method == "auto":
        method = "fork" if sys.platform.startswith("linux") else "exec"
    fabric = SharedFabric(plan)
    receiver: ControlReceiver | None = None
    placement = LocalPlacement(plan, fabric, run_dir, method)
    with stop_on_signals(controller):  # around the cleanup too: a first signal there does not cut it short
        try:
            fabric.create()
            receiver = ControlReceiver(fabric.control_address, controller.handle)
            supervisor = Supervisor(plan, placement, controller, receiver, run_dir)
            supervisor.start()
            supervisor.run()
            return _stop_workers(fabric, list(placement.procs.values()), receiver)
        finally:
            with shielded():  # a second signal stops the wait above, never this: kills and unlinks, all bounded
                placement.kill_all()
                if receiver is not None:
                    receiver.close()
                fabric.destroy()


class LocalPlacement:
    """Worker processes on this machine (the :class:`~srl.runtime.supervisor.Placement` of the local runtime)."""

    def __init__(self, plan: Plan, fabric: SharedFabric, run_dir: Path | None, method: str) -> None:
        self.plan, self.fabric, self.run_dir, self.method = plan, fabric, run_dir, method
        self.procs: dict[str, WorkerProcess] = {}

    def start(self, launches: Sequence[Launch]) -> list[WorkerSpec]:
        for launch in launches:
            self.procs[launch.worker.name] = _start(self.method, self.plan, self.fabric, launch, self.run_dir)
        self._write_workers()
        return [launch.worker for launch in launches]

    def started(self) -> list[WorkerSpec]:
        return []  # every start happens at once

    def alive(self, worker: WorkerSpec) -> bool:
        return self.procs[worker.name].exitcode is None

    def exit_cause(self, worker: WorkerSpec) -> str:
        return f"exited with code {self.procs[worker.name].exitcode}"

    def kill(self, worker: WorkerSpec) -> None:
        proc = self.procs.get(worker.name)
        if proc is not None and proc.is_alive():
            proc.kill()
            proc.join(5.0)

    def address(self, endpoint: Endpoint) -> str | None:
        """Fixed for the whole run: a server on this machine binds the same name when it starts again."""
        if endpoint.stream is Stream.PARAMS:
            return self.fabric.param_address(endpoint)
        return str(self.fabric.dir / endpoint.name)

    def free_buffers(self, worker: WorkerSpec) -> int:
        return self.fabric.free_buffers(worker)

    def published_version(self, policy: int = 0) -> int:
        return self.fabric.params(policy=policy).version()

    def kill_all(self) -> None:
        """Every exit path: no worker process outlives the run."""
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)

    def _write_workers(self) -> None:
        """``workers.json``: which process is which worker, for operators (and fault-injection tests)."""
        if self.run_dir is not None:
            pids = {name: proc.pid for name, proc in self.procs.items()}
            with contextlib.suppress(RunDirFull):  # the disk is full: the next start writes it (the run warns)
                write_run_file(self.run_dir / "workers.json", json.dumps(pids, indent=1) + "\n")


def _start(method: str, plan: Plan, fabric: SharedFabric, launch: Launch, run_dir: Path | None) -> WorkerProcess:
    """Start one worker process; nothing is pickled."""
    worker = launch.worker
    name = f"srl-{worker.name}"
    if method == "fork":
        if launch.resume is not None:
            plan = dataclasses.replace(plan, resume=launch.resume)
        proc = mp.get_context("fork").Process(
            target=_worker_main,
            name=name,
            daemon=False,
            args=(plan, fabric, worker, run_dir, os.getpid(), launch.incarnation, launch.min_version, launch.env_steps),
        )
        proc.start()
        return proc
    spec = {
        "config": to_dict(plan.cfg),
        "null_trainer": plan.null_trainer,
        "resume": launch.resume or plan.resume,
        "start_version": plan.start_version,
        "start_env_steps": plan.start_env_steps,
        "tag": fabric.tag,
        "dir": str(fabric.dir),
        "role": worker.role.name,
        "index": worker.index,
        "parent": os.getpid(),
        "run_dir": None if run_dir is None else str(run_dir),
        "incarnation": launch.incarnation,
        "min_version": launch.min_version,
        "env_steps": launch.env_steps,
    }
    return ExecProcess(name, [sys.executable, "-m", "srl.runtime.worker_main"], json.dumps(spec))


class WorkerProcess(Protocol):
    """What the controller needs of a worker process (``multiprocessing.Process`` has it)."""

    name: str

    @property
    def pid(self) -> int | None: ...

    @property
    def exitcode(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class ExecProcess:
    """A worker in a fresh interpreter; its spec (plain JSON, never pickle) arrives on stdin."""

    def __init__(self, name: str, cmd: list[str], spec: str) -> None:
        self.name = name
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, text=True)
        assert self._proc.stdin is not None
        self._proc.stdin.write(spec)
        self._proc.stdin.close()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def exitcode(self) -> int | None:
        return self._proc.poll()

    def is_alive(self) -> bool:
        return self._proc.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def terminate(self) -> None:
        self._proc.terminate()

    def kill(self) -> None:
        self._proc.kill()


def _stop_workers(
    fabric: SharedFabric, procs: list[WorkerProcess], receiver: ControlReceiver
) -> list[np.ndarray] | None:
    """Raise the stop flag, let workers finish (final checkpoint, last reports), then read each policy's newest
    snapshot."""
    fabric.stop_flag()[0] = 1
    deadline = time.monotonic() + JOIN_TIMEOUT
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        receiver.drain(0.05)
    for proc in procs:
        if proc.is_alive():
            log.warning("%s did not stop in %.0f s; terminating", proc.name, JOIN_TIMEOUT)
            proc.terminate()
            proc.join(2.0)
    receiver.drain(0.05)
    return newest_snapshots(fabric)
