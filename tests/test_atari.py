"""Atari preprocessing (shapes, frame stack, unclipped rewards, episodic life, limits) and the Nature CNN."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from srl.api.config import ConfigError, EnvConfig, load_config
from srl.api.env import LIFE_LOSS
from srl.envs.atari import ALE_MAX_FRAMES, EpisodicLife, FireReset, make_atari
from srl.envs.factory import make_env
from srl.envs.slots import GymSlot
from srl.nets.cnn import NatureCNN
from srl.nets.policy import PolicyNet, ValueNet
from srl.runtime.train import train

IMAGE = spaces.Box(0, 255, shape=(4, 84, 84), dtype=np.uint8)
NOOP = 0


def _wrappers(env: gym.Env) -> list[type]:
    """Wrapper classes from the outside in."""
    out = []
    while isinstance(env, gym.Wrapper):
        out.append(type(env))
        env = env.env
    return out


def _lives(env: gym.Env) -> int:
    return int(env.unwrapped.ale.lives())


def test_observation_is_a_uint8_channels_first_stack() -> None:
    env = make_atari("ALE/Pong-v5")
    try:
        assert env.observation_space == IMAGE
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        assert all(np.array_equal(obs[0], frame) for frame in obs)  # the stack starts padded with the reset frame
        first = obs[-1].copy()
        for _ in range(30):
            prev = obs
            obs, *_ = env.step(2)
            np.testing.assert_array_equal(obs[:-1], prev[1:])  # older frames shift left, the newest is last
        assert not np.array_equal(obs[-1], first)
    finally:
        env.close()


def test_reward_passes_through_unclipped() -> None:
    """Same seed and actions as a plain ALE env (native frame skip 4): identical rewards, some above 1."""
    ours = make_atari("ALE/SpaceInvaders-v5", noop_max=0, fire_reset=False, episodic_life=False)
    ref = gym.make("ALE/SpaceInvaders-v5", frameskip=4, repeat_action_probability=0.25)
    try:
        ours.reset(seed=3)
        ref.reset(seed=3)
        actions = np.random.default_rng(0).integers(ours.action_space.n, size=400)
        rewards = []
        for a in actions:
            reward = ours.step(int(a))[1]
            assert reward == ref.step(int(a))[1]
            rewards.append(reward)
            if reward > 1:  # Space Invaders pays 5-30 per alien; nothing clipped it to 1
                break
        assert max(rewards) > 1 and len(rewards) > 10
    finally:
        ours.close()
        ref.close()


def test_episodic_life_in_breakout() -> None:
    """A lost life is terminal with LIFE_LOSS; reset continues the same game; the game's end has no LIFE_LOSS."""
    env = make_atari("ALE/Breakout-v5", repeat_action_probability=0.0)
    try:
        assert _wrappers(env)[1:3] == [FireReset, EpisodicLife]
        _, info = env.reset(seed=0)
        lives = _lives(env)
        life_losses = 0
        while True:
            _, _, terminated, truncated, info = env.step(NOOP)  # never move: the ball is missed every serve
            assert not truncated
            if not terminated:
                continue
            if not info.get(LIFE_LOSS):
                break
            life_losses += 1
            assert _lives(env) == lives - 1
            frame = info["episode_frame_number"]
            _, info = env.reset()
            assert _lives(env) == lives - 1  # the emulator was not reset
            assert info["episode_frame_number"] > frame  # the same game goes on
            lives -= 1
        assert life_losses == 4 and _lives(env) == 0 and LIFE_LOSS not in info
        env.reset()
        assert _lives(env) == 5  # after the real end, reset starts a new game
    finally:
        env.close()


def test_slot_reports_episode_end_only_at_game_over() -> None:
    slot = GymSlot(EnvConfig(id="ALE/Breakout-v5", kwargs={"repeat_action_probability": 0.0}), num_envs=1)
    try:
        slot.reset(seed=0)
        life_losses = 0
        for _ in range(2000):
            step = slot.step(np.zeros(1, dtype=np.int64))
            if step.terminated[0] and not step.episode_end[0]:
                life_losses += 1
            if step.episode_end[0]:
                break
        assert step.episode_end[0] and step.terminated[0]
        assert life_losses == 4
    finally:
        slot.close()


def test_time_limits() -> None:
    """max_episode_steps counts agent steps (a FIRE reset would count as one); ALE caps a game's frames."""
    env = make_atari("ALE/Pong-v5", max_episode_steps=5, fire_reset=False)
    try:
        assert env.unwrapped.ale.getInt("max_num_frames_per_episode") == ALE_MAX_FRAMES
        env.reset(seed=0)
        ends = [env.step(NOOP)[3] for _ in range(5)]
        assert ends == [False] * 4 + [True]
    finally:
        env.close()


def test_factory_passes_kwargs_to_make_atari() -> None:
    env = make_env(EnvConfig(id="ALE/Breakout-v5", kwargs={"episodic_life": False, "fire_reset": False}))
    try:
        assert EpisodicLife not in _wrappers(env) and FireReset not in _wrappers(env)
        assert env.observation_space == IMAGE
    finally:
        env.close()
    with pytest.raises(ConfigError, match="frame_skp"):
        make_env(EnvConfig(id="ALE/Pong-v5", kwargs={"frame_skp": 4}))
    with pytest.raises(ConfigError, match="unknown environment"):
        make_env(EnvConfig(id="ALE/NoSuchGame-v5"))


def _frames(n: int) -> torch.Tensor:
    return torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))


def test_nature_cnn_shapes() -> None:
    cnn = NatureCNN((4, 84, 84))
    assert cnn.out_dim == 512
    out = cnn(_frames(3))
    assert out.shape == (3, 512) and out.dtype == torch.float32 and (out >= 0).all()
    # uint8 input is scaled inside: the same pixels as floats give the same features
    x = _frames(2)
    torch.testing.assert_close(cnn(x), cnn(x.float()))
    with pytest.raises(ValueError, match="too small"):
        NatureCNN((4, 32, 32))


def test_policy_and_value_nets_take_uint8_images() -> None:
    torch.manual_seed(0)
    policy = PolicyNet(IMAGE, spaces.Discrete(6), normalize_obs=True)
    value = ValueNet(IMAGE, normalize_obs=True)
    assert policy.obs_normalizer is None and value.obs_normalizer is None  # images are scaled, not normalized
    obs = {"obs": _frames(8)}
    actions, logp = policy.act(obs)
    assert actions.shape == (8,) and actions.dtype == torch.int64 and logp.shape == (8,)
    new_logp, entropy = policy.evaluate(obs, actions)
    torch.testing.assert_close(new_logp, logp)
    loss = -(new_logp.mean() + entropy.mean()) + value(obs).pow(2).mean()
    loss.backward()
    assert policy.encoder.cnns["obs"].layers[0].weight.grad is not None
    assert value(obs).shape == (8,)

    other = PolicyNet(IMAGE, spaces.Discrete(6))
    other.load_flat_state(policy.flat_state())
    np.testing.assert_array_equal(other.flat_state(), policy.flat_state())
    with torch.no_grad():
        torch.testing.assert_close(other(obs), policy(obs))


@pytest.mark.parametrize(
    "dtype,native,warned", [("bfloat16", False, True), ("bfloat16", True, False), ("float32", False, False)]
)
@pytest.mark.slow
def test_a_bfloat16_cnn_on_a_cpu_without_bfloat16_kernels_is_warned_about(
    tmp_path, monkeypatch, dtype, native, warned
) -> None:
    """Emulated bfloat16 ran Pong's update 10x slower than float32 on an AVX2-only CPU: the run says so, once."""
    monkeypatch.setattr("srl.nets.cnn.bfloat16_is_native", lambda: native)
    overrides = ["runtime=inline", "run.total_env_steps=16", "run.eval_episodes=0", "run.tensorboard=false"]
    cfg = load_config("configs/pong_ppo.yaml", [*overrides, f"model.cnn_dtype={dtype}"])
    summary = train(cfg, tmp_path / "run", progress=None)
    assert sum("model.cnn_dtype=bfloat16" in w for w in summary["warnings"]) == int(warned), summary["warnings"]
