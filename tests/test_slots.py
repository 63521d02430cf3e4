"""Slots (B envs stepped as one) and the actor's reward transforms."""

from __future__ import annotations

import time

import numpy as np

from srl.api.config import EnvConfig, load_config
from srl.envs.slots import GymSlot
from srl.runtime.inline import run_inline
from srl.runtime.plan import make_plan
from srl.system.controller import Controller
from srl.system.rewards import RewardTransform


def test_gym_slot_resets_in_the_same_step_and_keeps_final_observations():
    slot = GymSlot(EnvConfig(id="CartPole-v1", max_episode_steps=5), 3)
    try:
        obs = slot.reset(seed=0)["obs"]
        assert obs.shape == (3, 4) and obs.dtype == np.float32
        for t in range(5):
            prev = obs.copy()
            step = slot.step(np.zeros(3, np.int64))
            obs = step.obs["obs"]
        # every env hit the 5-step limit on the 5th step (CartPole cannot fail that fast from its start state)
        assert step.truncated.all() and not step.terminated.any() and step.episode_end.all()
        assert step.final_obs is not None
        assert not np.allclose(step.final_obs["obs"], step.obs["obs"])  # obs is already the reset observation
        assert np.abs(step.obs["obs"]).max() <= 0.05  # CartPole resets to U(-0.05, 0.05)
        assert np.abs(step.final_obs["obs"] - prev).max() > 0  # the true last state moved on from the step before
        again = slot.step(np.zeros(3, np.int64))
        assert not again.episode_end.any() and again.final_obs is None
    finally:
        slot.close()


def test_reward_clip_only_clips():
    tf = RewardTransform(2, gamma=0.99, normalize=False, clip=1.0)
    out = tf(np.array([5.0, -0.25]), np.zeros(2, bool))
    assert out.tolist() == [1.0, -0.25] and out.dtype == np.float32


def test_reward_normalization_matches_a_plain_reference():
    rng = np.random.default_rng(0)
    rewards = rng.normal(2.0, 1.0, (300, 4))
    dones = rng.random((300, 4)) < 0.02
    tf = RewardTransform(4, gamma=0.9, normalize=True, clip=None)
    ret = np.zeros(4)
    seen = []
    for r, d in zip(rewards, dones):
        ret = ret * 0.9 + r
        seen.extend(ret.tolist())
        expected = r / np.sqrt(np.var(seen) + 1e-8)
        np.testing.assert_allclose(tf(r, d), expected, rtol=2e-3)  # reference: exact variance of all returns
        ret[d] = 0.0


def test_reported_returns_stay_true_when_training_rewards_are_clipped():
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        ["runtime=inline", "env.reward_clip=0.5", "run.total_env_steps=2000", "run.target_return=null"],
    )
    controller = Controller(cfg, None, time.time(), progress=None)
    returns: list[float] = []
    original = controller.handle

    def spy(kind, meta, arrays):
        if kind == "actor" and len(arrays["episode_returns"]):
            returns.extend(arrays["episode_returns"].tolist())
            lengths = arrays["episode_lengths"].tolist()
            assert arrays["episode_returns"].tolist() == [float(n) for n in lengths]  # CartPole: 1 per step
        original(kind, meta, arrays)

    controller.handle = spy  # type: ignore[method-assign]
    run_inline(make_plan(cfg), controller, None)
    assert len(returns) > 20 and max(returns) > 1.0
