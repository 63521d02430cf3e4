"""Shared fixtures: every test must leave no shared-memory segment and no child process of ours behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from srl.base.shm import list_segments
from srl.testing.chaos import children_of, last_record

__all__ = ["children_of", "last_record"]  # the tests' helpers, shared with the chaos harness

ROOT = Path(__file__).resolve().parents[1]


def wait_while_running(cond: Callable[[], object], proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until ``cond()`` holds; fails when ``proc`` (a run) ends first or the timeout passes."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def worker_pids(run: Path) -> dict[str, int]:
    """A local run's ``workers.json`` (worker name -> pid), or {} before it is written."""
    try:
        return json.loads((run / "workers.json").read_text())
    except (OSError, ValueError):
        return {}


def train_killing(
    run: Path, config: str, settings: list[str], ready: Callable[[], object], kill: list[str], freeze: str | None = None
) -> dict:
    """``srl train config`` into ``run`` with ``settings``; once ``ready()`` holds, each worker named in ``kill``
    killed with SIGKILL in turn, each restarted before the next; the run's summary, once it ended with exit 0.
    ``freeze``: one of ``kill`` stopped (SIGSTOP) from ``ready()`` until its own kill. A replay run's trainer so
    frozen holds its actors back (the replay's rate limiter), so the run cannot end before every kill, however fast
    the machine."""
    assert freeze is None or freeze in kill
    cmd = [sys.executable, "-m", "srl.cli.main", "train", config, "--quiet", "--run-dir", str(run)]
    for setting in settings:
        cmd += ["--set", setting]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_while_running(ready, proc)
        first = worker_pids(run)
        if freeze is not None:
            os.kill(first[freeze], signal.SIGSTOP)
        for name in kill:
            os.kill(first[name], signal.SIGKILL)
            wait_while_running(lambda name=name: worker_pids(run).get(name) not in (None, first[name]), proc)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    return json.loads(out)


def _children() -> set[int]:
    return children_of(os.getpid())


def _ours() -> set[str]:
    return {name for name in list_segments() if name.startswith(f"srl_{os.getpid()}_")}


def pytest_configure(config: pytest.Config) -> None:
    """The suite tests how runs take Ctrl-C, so it runs as a foreground command does: a shell starts a background
    job (``.ci/run &``) with SIGINT ignored, every process below it inherits that, and a run keeps an inherited
    ignored SIGINT ignored (tests/test_cli.py tests that on purpose)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The two clusters' tests first (Ray's simulated one, then the namespaces'). Under pytest-xdist (``-n 2
    --dist loadgroup``, as ``.ci/run`` runs the suite) each module is one unit of work and among the longest, so
    the workers start on them and share the rest after."""
    first = {"test_ray.py": 0, "test_netcluster.py": 1}
    items.sort(key=lambda item: first.get(item.path.name, 2))  # stable: each file keeps its own order


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail a test that leaves segments created by this process or live child processes."""
    before_children, before_segments = _children(), _ours()
    yield
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and (_children() - before_children or _ours() - before_segments):
        time.sleep(0.05)
    assert not (_ours() - before_segments), f"leaked shared memory: {sorted(_ours() - before_segments)}"
    assert not (_children() - before_children), f"leaked child processes: {sorted(_children() - before_children)}"


def start_endless_training(
    run: Path,
    *overrides: str,
    tmp: Path | None = None,
    new_session: bool = False,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.Popen:
    """``srl train`` on CartPole with no target and an unreachable step budget: it runs until signalled.

    ``tmp`` becomes the run's temporary folder (``TMPDIR``), where its named pipes live; with ``new_session``
    the run leads its own process group (``os.killpg(proc.pid, ...)`` reaches every worker); ``preexec_fn`` runs
    in the child before ``srl`` starts (to hand it a signal disposition, say).
    """
    sets = ["run.total_env_steps=100000000", "run.target_return=null", "run.log_interval_seconds=0.2", *overrides]
    env = dict(os.environ, TMPDIR=str(tmp)) if tmp is not None else None
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "srl.cli.main",
            "train",
            str(ROOT / "configs" / "cartpole_ppo.yaml"),
            "--quiet",
            "--run-dir",
            str(run),
            *[a for o in sets for a in ("--set", o)],
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=new_session,
        preexec_fn=preexec_fn,
    )


def reporting(controller, *roles):
    """``controller`` with its run's report table (what a runtime attaches as it starts), for tests that hand it
    reports themselves; with ``roles``, only theirs (for a config whose env is not made)."""
    from srl.runtime.plan import make_plan
    from srl.runtime.topology import attach_reports

    if not roles:
        attach_reports(make_plan(controller.cfg).topology, controller)
    else:
        controller.attach({r.report.kind: r.report.make(controller) for r in roles}, {})
    return controller
