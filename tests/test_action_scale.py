"""``env.action_scale``: an unbounded Box shown and driven within +-scale, so SAC and TD3 can run it; the lines that
refuse it where it has nothing to bound; and the shipped HalfCheetah configs of SAC and TD3 loading and planning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

import srl
from srl.api.config import ConfigError, EnvConfig, ExperimentConfig, build, load_config
from srl.envs.factory import make_env
from srl.runtime.plan import make_plan
from srl.runtime.train import train

DRIFT = "user_envs:Drift"


def _cfg(algorithm: str, env: dict[str, Any], **top: Any) -> ExperimentConfig:
    model = {"hidden": [32], "activation": "relu", "normalize_obs": False}
    return build(ExperimentConfig, {"algorithm": algorithm, "env": {"id": DRIFT, **env}, "model": model, **top})


def test_sac_trains_on_an_unbounded_box_within_the_scale(tmp_path: Path) -> None:
    """The env fails on an action beyond +-2 (``limit``): training, evaluation and the loaded policy all drive it
    within the scale, and learning starts."""
    cfg = _cfg(
        "sac",
        {"kwargs": {"limit": 2.0}, "action_scale": 2.0, "max_episode_steps": 50},
        runtime="inline",
        workers={"actors": 1, "ring_size": 1, "envs_per_slot": 2, "policy_workers": 0, "segment_length": 8},
        sac={"batch_size": 32},
        replay={"max_size": 2000, "min_size": 100, "samples_per_insert": 32},
        run={"total_env_steps": 400, "eval_episodes": 2},
    )
    summary = train(cfg, tmp_path / "run", progress=None)
    assert summary["env_steps"] >= 400 and summary["policy_version"] > 0, summary
    assert np.isfinite(summary["final_eval_return_mean"])
    policy = srl.load_policy(tmp_path / "run")
    actions = policy.act(np.random.default_rng(0).normal(size=(64, 2)).astype(np.float32) * 10, deterministic=False)
    assert actions.shape == (64, 2) and np.abs(actions).max() <= 2.0


def test_sac_on_an_unbounded_box_names_action_scale() -> None:
    with pytest.raises(ConfigError, match=r"^algorithm: sac maps its actions .* unbounded .* set env\.action_scale"):
        make_plan(_cfg("sac", {}))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"kwargs": {"low": -1.0, "high": 1.0}, "action_scale": 2.0}, r"^env\.action_scale: .* already finite"),
        (
            {"id": "CartPole-v1", "action_scale": 2.0},
            r"^env\.action_scale: 'CartPole-v1' has Discrete\(2\), .* not a Box",
        ),
        ({"kwargs": {"low": 3.0}, "action_scale": 2.0}, r"^env\.action_scale: 2\.0 crosses a finite bound"),
        (
            {"id": "srl.envs.ma_testing:coop_targets", "action_scale": 2.0},
            r"^env\.action_scale: 'srl\.envs\.ma_testing:coop_targets' is a multi-agent env",
        ),
    ],
)
def test_action_scale_with_nothing_to_bound_is_one_line(env: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_plan(_cfg("ppo", env))


@pytest.mark.parametrize("scale", [0.0, -1.0])
def test_action_scale_must_be_positive(scale: float) -> None:
    with pytest.raises(ConfigError, match=r"^env\.action_scale: must be > 0"):
        _cfg("sac", {"action_scale": scale})


def test_the_env_shows_the_scaled_bounds_keeps_finite_ones_and_clips_to_them() -> None:
    env = make_env(EnvConfig(id=DRIFT, kwargs={"low": 0.0}, action_scale=3.0))
    try:
        assert env.action_space == spaces.Box(np.float32([0, 0]), np.float32([3, 3]), (2,), np.float32)
        clipped = env.action(np.array([-5.0, 7.0], np.float32))  # type: ignore[attr-defined]
        assert clipped.tolist() == [0.0, 3.0]
    finally:
        env.close()


def test_ppo_on_the_unbounded_env_sees_the_bounded_box() -> None:
    plan = make_plan(_cfg("ppo", {"action_scale": 1.5}))
    assert plan.policies[0].action_space == spaces.Box(-1.5, 1.5, (2,), np.float32)


def test_envpool_shows_its_bounds_through_the_same_rule() -> None:
    from srl.envs.envpool_slot import EnvPoolSlot

    with pytest.raises(ConfigError, match=r"^env\.action_scale: 'Pendulum-v1' has .* already finite"):
        EnvPoolSlot(EnvConfig(id="Pendulum-v1", backend="envpool", action_scale=1.0), 1)


@pytest.mark.parametrize("config", ["configs/halfcheetah_sac.yaml", "configs/halfcheetah_td3.yaml"])
def test_the_halfcheetah_configs_load_and_plan(config: str) -> None:
    plan = make_plan(load_config(config))
    assert plan.cfg.replay.samples_per_insert == 256 and plan.policies[0].action_space.shape == (6,)
