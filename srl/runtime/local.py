"""The local runtime: one process per worker on this machine, joined by shared memory.

The calling process is the controller: it creates the fabric, starts the
workers (``fork`` on Linux, so torch is imported once; ``spawn`` elsewhere),
reads their reports, watches their exit codes, and stops them all through a
shared stop flag. Every exit path (normal end, Ctrl-C, SIGTERM, a worker
crash, an exception here) joins or kills the children and removes every
shared-memory segment and pipe of the run.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Protocol

import numpy as np
import torch

from srl.api.config import to_dict
from srl.base.fileio import atomic_write_text
from srl.runtime.build import build_worker, worker_roles
from srl.runtime.fabric import SharedFabric
from srl.runtime.plan import Plan
from srl.system.control import ControlReceiver
from srl.system.controller import Controller
from srl.system.streams import FILLING, FREE

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
    plan: Plan, fabric: SharedFabric, role: str, index: int, run_dir: Path | None, parent: int, incarnation: int = 0
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
        worker = build_worker(
            plan, fabric, role, index, run_dir, wait_timeout=0.05, report_interval=0.1, incarnation=incarnation
        )
        # os.getppid() covers platforms without a parent-death signal and a controller that died before prctl.
        worker.run(lambda: bool(stop[0]) or stopping["now"] or os.getppid() != parent)
    except Exception as exc:  # report any worker failure in one line, then exit non-zero
        log.debug("worker %s%d failed:\n%s", role, index, traceback.format_exc())
        message = f"{type(exc).__name__}: {exc}"
        reporter.report("error", {"worker": f"{role}{index}", "message": message[:2000]})
        code = 1
    finally:
        fabric.close_worker_side()
    os._exit(code)  # skip atexit handlers inherited from the controller


def run_local(plan: Plan, controller: Controller, run_dir: Path | None) -> np.ndarray | None:
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
    procs: list[WorkerProcess] = []
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if controller.stop_reason == "interrupted":
            raise KeyboardInterrupt  # a second signal: stop waiting for workers (they are killed below)
        controller.stop_reason = controller.stop_reason or "interrupted"

    try:
        fabric.create()
        receiver = ControlReceiver(fabric.control_address, controller.handle)
        for sig in previous:
            signal.signal(sig, on_signal)
        for role, index in worker_roles(plan):
            procs.append(_start(method, plan, fabric, role, index, run_dir))
        _write_workers(run_dir, procs)
        roles = worker_roles(plan)
        max_restarts = plan.cfg.workers.max_restarts
        controller.supervised_roles = frozenset({"actor", "policy"} if max_restarts > 0 else ())
        while controller.should_stop() is None:
            receiver.drain(0.05)
            controller.tick()
            for i, proc in enumerate(procs):
                if proc.exitcode is None:
                    continue
                receiver.drain(0.2)  # its error report, if it sent one, names the cause
                role, index = roles[i]
                name = f"{role}{index}"
                cause = controller.worker_errors.pop(name, None) or f"exited with code {proc.exitcode}"
                if role not in controller.supervised_roles:
                    controller.fail(f"{proc.name} exited with code {proc.exitcode}")
                elif controller.restarts.get(name, 0) >= max_restarts:
                    controller.fail(f"{name}: {cause} (after {max_restarts} restarts)")
                elif controller.should_stop() is None:
                    controller.note_restart(name, cause, _recover(fabric, role, index))
                    procs[i] = _start(method, plan, fabric, role, index, run_dir, controller.restarts[name])
                    _write_workers(run_dir, procs)
        snapshot = _stop_workers(fabric, procs, receiver)
        return snapshot
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        if receiver is not None:
            receiver.close()
        fabric.destroy()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _write_workers(run_dir: Path | None, procs: list[WorkerProcess]) -> None:
    """``workers.json``: which process is which worker, for operators (and fault-injection tests)."""
    if run_dir is not None:
        atomic_write_text(
            run_dir / "workers.json", json.dumps({p.name.removeprefix("srl-"): p.pid for p in procs}, indent=1) + "\n"
        )


def _recover(fabric: SharedFabric, role: str, index: int) -> int:
    """Before restarting a dead actor: free the buffers it was filling (their segments are dropped); count them."""
    if role != "actor":
        return 0  # a policy worker holds nothing; actors ask again for what it had taken
    state = fabric.pool().state[index]
    filling = state == FILLING
    state[filling] = FREE
    return int(filling.sum())


def _start(
    method: str, plan: Plan, fabric: SharedFabric, role: str, index: int, run_dir: Path | None, incarnation: int = 0
) -> WorkerProcess:
    """Start one worker process (``incarnation``: how many times it was restarted); nothing is pickled."""
    name = f"srl-{role}{index}"
    if method == "fork":
        proc = mp.get_context("fork").Process(
            target=_worker_main,
            name=name,
            daemon=False,
            args=(plan, fabric, role, index, run_dir, os.getpid(), incarnation),
        )
        proc.start()
        return proc
    spec = {
        "config": to_dict(plan.cfg),
        "null_trainer": plan.null_trainer,
        "resume": plan.resume,
        "start_version": plan.start_version,
        "tag": fabric.tag,
        "dir": str(fabric.dir),
        "role": role,
        "index": index,
        "parent": os.getpid(),
        "run_dir": None if run_dir is None else str(run_dir),
        "incarnation": incarnation,
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


def _stop_workers(fabric: SharedFabric, procs: list[WorkerProcess], receiver: ControlReceiver) -> np.ndarray | None:
    """Raise the stop flag, let workers finish (final checkpoint, last reports), then read the newest snapshot."""
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
    out = np.empty(fabric.plan.param_size, np.float32)
    return out if fabric.params().read_into(out, -1) is not None else None
