"""``srl eval``: evaluate a run or checkpoint from the command line, with a playable MP4 of the first episode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest

from srl.api.config import ConfigError, EnvConfig, ExperimentConfig, build, load_config
from srl.envs.video import recording_env, write_mp4
from srl.runtime.train import train

TINY = ["runtime=inline", "run.target_return=null", "run.eval_episodes=0", "run.tensorboard=false"]
SDL_DRIVERS = ("SDL_VIDEODRIVER", "SDL_AUDIODRIVER")


def _srl_eval(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "eval", *args], capture_output=True, text=True, timeout=300, **kwargs
    )


def _frames(path) -> int:
    with imageio.get_reader(path) as reader:
        return sum(1 for _ in reader)


def _last_two_frames(path) -> tuple[np.ndarray, np.ndarray]:
    with imageio.get_reader(path) as reader:
        frames = [frame for frame in reader]
    return frames[-2], frames[-1]


def _tiny_run(run: Path, env: dict, steps: int = 200) -> Path:
    """A run of a few env steps of ``env`` (an ``env`` section), trained inline."""
    cfg = build(
        ExperimentConfig,
        {
            "runtime": "inline",
            "env": env,
            "workers": {"envs_per_slot": 2, "segment_length": 16},
            "run": {"total_env_steps": steps, "target_return": None, "eval_episodes": 0, "tensorboard": False},
        },
    )
    train(cfg, run, progress=None)
    return run


@pytest.mark.parametrize(
    "config,steps,episodes", [("configs/cartpole_ppo.yaml", 2000, 3), ("configs/pong_ppo.yaml", 512, 1)]
)
@pytest.mark.slow
def test_eval_writes_a_playable_video_of_the_first_episode(tmp_path, config, steps, episodes) -> None:
    run = tmp_path / "run"
    train(load_config(config, [*TINY, f"run.total_env_steps={steps}"]), run, progress=None)
    video = tmp_path / "out" / "episode.mp4"
    proc = _srl_eval(str(run), "--episodes", str(episodes), "--video", str(video))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["episodes"] == episodes and result["unfinished"] == 0
    assert result["checkpoint"].startswith(str(run / "checkpoints"))
    # the first observation's frame and one after each agent step, the step that ends the episode included
    assert result["video_frames"] == result["lengths"][0] + 1 == _frames(video)
    if "cartpole" in config:
        assert result["returns"][0] == result["lengths"][0]  # +1 per step
    else:
        assert result["returns"][0] <= -15  # a barely trained Pong agent loses the whole game


@pytest.mark.parametrize(
    "env",
    [
        {"id": "pettingzoo.classic.tictactoe_v3:env"},  # PettingZoo AEC, turn-based
        {"id": "pettingzoo.classic.rps_v2:parallel_env"},  # PettingZoo Parallel
        {"id": "vmas:make_env", "kwargs": {"scenario": "navigation", "n_agents": 2, "max_steps": 20}},
    ],
    ids=["aec", "parallel", "vmas"],
)
@pytest.mark.slow
def test_eval_films_the_first_episode_of_a_multi_agent_env_to_its_last_step(tmp_path, env) -> None:
    run = _tiny_run(tmp_path / "run", env)
    video = tmp_path / "game.mp4"
    proc = _srl_eval(str(run), "--episodes", "2", "--video", str(video))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["unfinished"] == 0 and result["agents_per_episode"] == 2
    assert result["video_frames"] == result["lengths"][0] + 1 == _frames(video)
    before, last = _last_two_frames(video)
    assert not np.array_equal(before, last)  # the episode's last step is on screen (a game's last move)
    assert not list(tmp_path.glob("*.tmp.mp4"))


def test_eval_video_refuses_an_env_without_frames_before_playing(tmp_path) -> None:
    run = _tiny_run(tmp_path / "run", {"id": "srl.envs.turns:game", "kwargs": {"name": "tic_tac_toe"}})
    video = tmp_path / "game.mp4"
    proc = _srl_eval(str(run), "--video", str(video))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "'srl.envs.turns:game' is an OpenSpiel game" in proc.stderr and not proc.stdout
    assert list(tmp_path.iterdir()) == [run]


def test_eval_video_asks_a_factory_without_render_mode_to_take_one(tmp_path, monkeypatch) -> None:
    (tmp_path / "plain_factory.py").write_text(
        "import gymnasium as gym\n\ndef make():\n    return gym.make('CartPole-v1')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run = _tiny_run(tmp_path / "run", {"id": "plain_factory:make"})
    proc = _srl_eval(str(run), "--video", str(tmp_path / "cart.mp4"), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "the env factory plain_factory:make takes no render_mode; accept render_mode='rgb_array'" in proc.stderr
    assert not (tmp_path / "cart.mp4").exists()


def test_video_asks_render_mode_of_a_factory_that_takes_it(tmp_path, monkeypatch) -> None:
    (tmp_path / "factories.py").write_text(
        "import gymnasium as gym\n\n"
        "def plain():\n    return gym.make('CartPole-v1')\n\n"
        "def rendering():\n    return gym.make('CartPole-v1', render_mode='rgb_array')\n\n"
        "def asks(render_mode=None):\n    return gym.make('CartPole-v1', render_mode=render_mode)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for var in SDL_DRIVERS:  # recording_env sets them: undone after the test
        monkeypatch.delenv(var, raising=False)
    assert recording_env(EnvConfig(id="factories:asks")).kwargs == {"render_mode": "rgb_array"}
    assert recording_env(EnvConfig(id="factories:rendering")).kwargs == {}  # it renders into arrays already
    with pytest.raises(ConfigError, match="the env factory factories:plain takes no render_mode"):
        recording_env(EnvConfig(id="factories:plain"))


def test_a_successful_video_says_no_error_without_a_display_or_sound(tmp_path) -> None:
    run = _tiny_run(tmp_path / "run", {"id": "CartPole-v1"})
    video = tmp_path / "cart.mp4"
    bare = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", *SDL_DRIVERS)}
    proc = _srl_eval(str(run), "--episodes", "1", "--video", str(video), env=bare)
    assert proc.returncode == 0, proc.stderr
    assert "error" not in proc.stderr.lower(), proc.stderr
    assert _frames(video) == json.loads(proc.stdout)["video_frames"] > 1


def test_video_keeps_a_users_own_sdl_drivers(monkeypatch) -> None:
    monkeypatch.setenv("SDL_VIDEODRIVER", "x11")
    monkeypatch.delenv("SDL_AUDIODRIVER", raising=False)
    recording_env(EnvConfig(id="CartPole-v1"))
    assert os.environ["SDL_VIDEODRIVER"] == "x11" and os.environ["SDL_AUDIODRIVER"] == "dummy"


def test_no_frames_is_one_line_and_writes_nothing(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no frames"):
        write_mp4(tmp_path / "none.mp4", [], fps=30)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
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


def test_eval_of_a_run_whose_env_was_in_the_training_scripts_main_says_to_move_it(tmp_path, monkeypatch) -> None:
    """A script that defines its env and trains it names it ``__main__:attr``; ``srl eval`` has a __main__ of its
    own, so it must say where the env was and what to do, not that ``'__main__'`` lacks an attribute."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    monkeypatch.setattr(sys.modules["__main__"], "ScriptCartPole", CartPoleEnv, raising=False)
    _tiny_run(tmp_path / "run", {"id": "__main__:ScriptCartPole", "max_episode_steps": 50}, steps=64)
    proc = _srl_eval(str(tmp_path / "run"), "--episodes", "1")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "env.id: '__main__:ScriptCartPole' was defined in the __main__ of the script that trained" in proc.stderr
    assert "to an importable module" in proc.stderr


@pytest.mark.slow
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
