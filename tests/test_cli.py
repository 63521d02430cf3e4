"""``srl train`` as a user meets it: its clock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

CARTPOLE = str(ROOT / "configs" / "cartpole_ppo.yaml")
TINY = ["runtime=inline", "run.total_env_steps=512", "run.target_return=null", "run.eval_episodes=0"]


def _train_command(config: str | Path, run: Path, *overrides: str) -> list[str]:
    sets = [a for o in overrides for a in ("--set", o)]
    return [sys.executable, "-m", "srl.cli.main", "train", str(config), "--quiet", "--run-dir", str(run), *sets]


def test_wall_seconds_leave_out_the_shell_that_execs_srl(tmp_path):
    """A shell that sleeps and then execs ``srl train`` hands over its process, and the process's start with it:
    the sleep is not the run's. Two clock marks bound what srl may count: the shell's, written just before the
    exec, and ``summary.json``'s modification time, just after the summary's own clock mark."""
    run, exec_at = tmp_path / "run", tmp_path / "exec_at"
    command = " ".join(_train_command(CARTPOLE, run, *TINY))
    proc = subprocess.run(["bash", "-c", f"sleep 1; date +%s.%N > {exec_at}; exec {command}"], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = run / "summary.json"
    counted = json.loads(summary.read_text())["wall_seconds"]
    coarse = 0.05  # a file's modification time comes from a coarser clock, a tick or so behind
    assert 0 < counted <= summary.stat().st_mtime - float(exec_at.read_text()) + coarse
