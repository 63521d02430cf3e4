"""``srl eval``: evaluate a run or checkpoint from the command line, with a playable MP4 of the first episode."""

from __future__ import annotations

import json
import subprocess
import sys

import imageio.v2 as imageio
import pytest

from srl.api.config import load_config
from srl.runtime.train import train

TINY = ["runtime=inline", "run.target_return=null", "run.eval_episodes=0", "run.tensorboard=false"]


def _srl_eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "eval", *args], capture_output=True, text=True, timeout=300
    )


def _frames(path) -> int:
    with imageio.get_reader(path) as reader:
        return sum(1 for _ in reader)


@pytest.mark.parametrize(
    "config,steps,episodes", [("configs/cartpole_ppo.yaml", 2000, 3), ("configs/pong_ppo.yaml", 512, 1)]
)
def test_eval_writes_a_playable_video_of_the_first_episode(tmp_path, config, steps, episodes) -> None:
    run = tmp_path / "run"
    train(load_config(config, [*TINY, f"run.total_env_steps={steps}"]), run, progress=None)
    video = tmp_path / "out" / "episode.mp4"
    proc = _srl_eval(str(run), "--episodes", str(episodes), "--video", str(video))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["episodes"] == episodes and result["unfinished"] == 0
    assert result["checkpoint"].startswith(str(run / "checkpoints"))
    assert result["video_frames"] == result["lengths"][0] == _frames(video)  # one frame per agent step
    if "cartpole" in config:
        assert result["returns"][0] == result["lengths"][0]  # +1 per step
    else:
        assert result["returns"][0] <= -15  # a barely trained Pong agent loses the whole game


def test_eval_refuses_missing_or_foreign_targets(tmp_path) -> None:
    missing = _srl_eval(str(tmp_path / "nothing"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such run directory" in missing.stderr
    foreign = tmp_path / "foreign.pt"
    foreign.write_bytes(b"definitely not a checkpoint")
    bad = _srl_eval(str(foreign))
    assert bad.returncode == 2 and f"{foreign}: not a torch file" in bad.stderr
    empty = tmp_path / "run"
    (empty / "checkpoints").mkdir(parents=True)
    none = _srl_eval(str(empty))
    assert none.returncode == 2 and "no checkpoint" in none.stderr


@pytest.mark.parametrize("runtime", ["inline", "local"])
def test_eval_worker_reports_during_training_and_keeps_the_best_policy(tmp_path, runtime) -> None:
    run = tmp_path / "run"
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        [*TINY, f"runtime={runtime}", "run.total_env_steps=12000", "run.eval_every_versions=4", "run.eval_episodes=4"],
    )
    summary = train(cfg, run, progress=None)
    assert summary["evaluations"] >= 2
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("eval_return_mean" in r for r in records)
    best = run / "checkpoints" / "best.pt"
    proc = _srl_eval(str(best), "--episodes", "4")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["version"] == summary["best_eval_version"]
    # Same policy, same seed, same episode count as the eval worker: the same deterministic returns.
    assert result["return_mean"] == pytest.approx(summary["best_eval_return_mean"])
