"""Faults survived on purpose: actor and policy worker processes killed mid-run, an env that keeps raising."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from srl.api.config import load_config
from srl.runtime.train import train

CARTPOLE = "configs/cartpole_ppo.yaml"


def _wait_for(cond, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _steps(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return json.loads(lines[-1])["env_steps"] if lines else 0


def _pids(run: Path) -> dict[str, int]:
    try:
        return json.loads((run / "workers.json").read_text())
    except (OSError, ValueError):
        return {}


def _returns_since(run: Path, first: int) -> list[float]:
    """Training return means of the metrics records from index ``first`` on (complete lines only)."""
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().split("\n")[:-1] if metrics.exists() else []
    return [json.loads(line).get("return_mean", 0.0) for line in lines[first:]]


def test_kill_9_of_an_actor_and_of_a_policy_worker_mid_run_is_survived(tmp_path) -> None:
    """Both processes come back and the run learns on to a return of 475. No target or budget ends the run (a
    fast machine would solve CartPole before the kills): the test stops it once it has seen that return."""
    run = tmp_path / "run"
    sets = [
        "workers.policy_workers=1",
        "workers.request_timeout_seconds=1",
        "run.target_return=null",
        "run.total_env_steps=100000000",
        "run.log_interval_seconds=0.2",
    ]
    cmd = [sys.executable, "-m", "srl.cli.main", "train", CARTPOLE, "--quiet", "--run-dir", str(run)]
    proc = subprocess.Popen(
        [*cmd, *[a for s in sets for a in ("--set", s)]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for(lambda: _steps(run) > 3000 and "actor0" in _pids(run), proc)
        first = _pids(run)
        os.kill(first["actor0"], signal.SIGKILL)
        _wait_for(lambda: _pids(run).get("actor0") not in (None, first["actor0"]), proc)
        steps = _steps(run)
        _wait_for(lambda: _steps(run) > steps + 1000, proc)  # the new actor steps
        os.kill(first["policy0"], signal.SIGKILL)
        _wait_for(lambda: _pids(run).get("policy0") not in (None, first["policy0"]), proc)
        records = len(_returns_since(run, 0))
        _wait_for(lambda: any(r >= 475 for r in _returns_since(run, records)), proc)  # it learns on after both
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130  # ended by the test's SIGINT, not by an error
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and "error" not in summary, summary
    assert summary["restarts"] == {"actor0": 1, "policy0": 1}
    assert any("actor0: restarted (1) after: exited with code -9" in w for w in summary["warnings"])


def test_an_env_that_keeps_raising_is_restarted_and_the_run_completes(tmp_path) -> None:
    cfg = load_config(
        CARTPOLE,
        [
            "env.id=srl.envs.testing:crashing_cartpole",
            "env.kwargs={crash_after: 1200}",
            "workers.max_restarts=50",
            "run.max_wall_seconds=240",
        ],
    )
    summary = train(cfg, tmp_path / "run", progress=None)
    assert summary["solved"], summary
    assert summary["restarts"]["actor0"] >= 1 and "error" not in summary
    assert any("injected failure at step 1200" in w for w in summary["warnings"])


def test_restarts_are_bounded(tmp_path) -> None:
    cfg = load_config(
        CARTPOLE,
        [
            "env.id=srl.envs.testing:crashing_cartpole",
            "env.kwargs={crash_after: 50}",
            "workers.max_restarts=2",
            "run.eval_episodes=0",
        ],
    )
    summary = train(cfg, tmp_path / "run", progress=None)
    assert summary["stop_reason"] == "error"
    assert summary["error"].startswith("actor0: RuntimeError: env srl.envs.testing:crashing_cartpole: step failed")
    assert summary["error"].endswith("RuntimeError: injected failure at step 50 (after 2 restarts)")
    assert summary["restarts"] == {"actor0": 2}
