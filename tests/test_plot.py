"""``srl plot`` draws PNG curves from run directories and refuses what is not one."""

from __future__ import annotations

import subprocess
import sys

from srl.api.config import load_config
from srl.runtime.train import train


def test_plot_writes_a_png_for_several_runs(tmp_path):
    for seed in (1, 2):
        cfg = load_config(
            "configs/cartpole_ppo.yaml",
            [
                "runtime=inline",
                f"seed={seed}",
                "run.total_env_steps=1500",
                "run.target_return=null",
                "run.eval_episodes=0",
                "run.log_interval_seconds=0.05",
            ],
        )
        train(cfg, tmp_path / f"run{seed}", progress=None)
    out = tmp_path / "curves.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "srl.cli.main",
            "plot",
            str(tmp_path / "run1"),
            str(tmp_path / "run2"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_refuses_a_directory_without_metrics(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "plot", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"srl: error: {tmp_path}: no metrics.jsonl (not a run directory?)"
