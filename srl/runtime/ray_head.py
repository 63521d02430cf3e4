"""A run's private Ray instance, held by a small process in a session of its own.

Why not ``ray.init()`` in ``srl`` itself: it starts Ray's processes (the GCS, the raylet and, through the raylet,
every worker) as children in the caller's process group. A signal to that group (Ctrl-C in a terminal, SIGTERM
from a job manager or ``kill -- -PGID``) then ends Ray under the run: the driver waits on a cluster that is gone
and no worker writes its final checkpoint. Started from this process in a new session, Ray hears only what srl
tells it: srl takes the signal, stops its workers as under any runtime, then closes this process's stdin, and
Ray shuts down. Fate is still shared: when srl dies, even by SIGKILL, the pipe closes and this process shuts Ray
down; when this process is killed, Ray's own processes die with it (Ray sets ``PR_SET_PDEATHSIG`` on them).

Why loopback needs a setting: Ray's servers (GCS, raylet, every worker's) bind the wildcard address unless the
node's address is literally 127.0.0.1, and ``ray.init`` turns 127.0.0.1 into the machine's own address unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (its single-machine mode, the default on macOS and Windows). This
process sets it before Ray is imported, and its children inherit it; the driver that connects reads the same
switch (:func:`connect`).

The process prints one JSON line when Ray is up (``{"address": GCS}``, or ``{"error": ...}``), then waits for its
stdin to close. As a command: ``python -m srl.runtime.ray_head CPUS``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch: "0" keeps a node's 127.0.0.1 as its address (so its servers bind loopback only)."""
CLOSE_TIMEOUT = 60.0
"""How long Ray may take to shut down once srl is done with it, before its processes are killed."""


class HeadError(RuntimeError):
    """The private Ray instance did not start or ended early; the message says how, in one line."""


class RayHead:
    """The process that holds a private Ray instance (srl's side of it)."""

    def __init__(self, cpus: int) -> None:
        env = dict(os.environ, **{SINGLE_MACHINE: "0"})
        env.setdefault("RAY_worker_niceness", "0")  # our workers are the hot path, not background work
        env.pop("RAY_ADDRESS", None)  # a fresh instance, whatever cluster the caller's shell points at
        self._said = tempfile.TemporaryFile()  # its stderr (Ray's notices): the last line explains a failed start
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "srl.runtime.ray_head", str(cpus)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._said,
            env=env,
            start_new_session=True,  # out of srl's process group (see the module doc)
        )

    def address(self, timeout: float, stopped: Callable[[], bool]) -> str | None:
        """The GCS address once Ray is up; None when ``stopped()`` turned true first. Raises HeadError."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while not select.select([self.proc.stdout], [], [], 0.1)[0]:
            if stopped():
                return None
            if self.proc.poll() is not None:
                raise HeadError(
                    f"the private Ray instance ended as it started (exit {self.proc.returncode}){self._why()}"
                )
            if time.monotonic() > deadline:
                raise HeadError(
                    f"the private Ray instance did not start within {timeout:.0f} s (ray.start_timeout_seconds)"
                )
        line = self.proc.stdout.readline()
        try:
            said = json.loads(line)
        except ValueError:
            code = self.proc.poll()
            how = f"ended as it started (exit {code})" if code is not None else f"said {line[:200]!r}"
            raise HeadError(f"the private Ray instance {how}{self._why()}") from None
        if "error" in said:
            raise HeadError(f"the private Ray instance did not start: {said['error']}")
        return str(said["address"])

    def _why(self) -> str:
        """The last line the process wrote to stderr, as a clause (empty when it wrote none)."""
        self._said.seek(0)
        lines = self._said.read()[-4096:].decode(errors="replace").strip().splitlines()
        return f": {lines[-1].strip()}" if lines else ""

    def gone(self) -> str | None:
        """How the instance ended under the run (its processes die with this one), or None while it runs."""
        code = self.proc.poll()
        return None if code is None else f"the private Ray instance ended under the run (exit {code})"

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Shut Ray down (bounded: killed after ``timeout``; Ray's processes die with this one)."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._said.close()


def connect(address: str) -> None:
    """Connect this process to the private instance at ``address`` as its driver.

    Two things Ray does only for a cluster it finds on its own are done here for this one, named by its address:
    it keeps 127.0.0.1 as the address to reach it and to bind this driver's server (instead of the machine's), by
    its single-machine switch (:data:`SINGLE_MACHINE`: read once, as Ray was imported, so its value changes here
    while Ray connects); and it takes up the token the instance keeps (:func:`_take_up_token`)."""
    import ray
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        _take_up_token()
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def _take_up_token() -> None:
    """Ray asks for a token on a cluster it starts (keeping it where every process of the user finds it), and a
    driver takes it up for a cluster of this machine found without an address, not for one named by it."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token authentication
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def main(argv: list[str]) -> int:
    """Start Ray with ``argv[0]`` CPUs, say where it is, hold it until stdin closes."""
    os.environ[SINGLE_MACHINE] = "0"  # before Ray is imported: it reads the switch once
    import ray

    try:
        ray.init(
            address="local",  # a new instance, even where `ray start` left one for ray.init() to find
            num_cpus=int(argv[0]),
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}), flush=True)
        return 1
    print(json.dumps({"address": ray.get_runtime_context().gcs_address}), flush=True)
    sys.stdin.read()  # until srl closes it, or dies
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
