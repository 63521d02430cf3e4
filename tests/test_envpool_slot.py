"""The EnvPool slot behaves like the reference GymSlot: same schema, same-step resets, final
observations on truncation, true episode ends under episodic life, clear config errors."""

from __future__ import annotations

import sys
import warnings

import envpool  # in the test extra: a missing EnvPool fails these tests instead of skipping them
import gymnasium as gym
import numpy as np
import pytest

from srl.api.config import ConfigError, EnvConfig
from srl.envs.envpool_slot import EnvPoolSlot
from srl.envs.slots import GymSlot, make_slot

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

CARTPOLE_RESET_BOUND = 0.05
"""CartPole resets every state variable uniformly in [-0.05, 0.05]; a terminal state has |x| > 2.4 or |theta| > 0.2095."""


def _random_actions(space: gym.spaces.Space, num_envs: int, rng: np.random.Generator) -> np.ndarray:
    """Discrete samples, or Box actions partly outside [-1, 1] (the slot must accept and clip them)."""
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, int(space.n), num_envs)
    return rng.uniform(-1.5, 1.5, (num_envs, *(space.shape or ()))).astype(np.float32)


ATARI_OPTIONS = {
    "noop_max": 0,
    "frame_skip": 3,
    "screen_size": 64,
    "frame_stack": 2,
    "episodic_life": False,
    "fire_reset": False,
    "repeat_action_probability": 0.0,
}
"""Every ``make_atari`` option, away from its default: the EnvPool slot must accept them all."""


@pytest.mark.parametrize(
    "env_id,kwargs",
    [("CartPole-v1", {}), ("HalfCheetah-v5", {}), ("ALE/Pong-v5", {}), ("ALE/Breakout-v5", ATARI_OPTIONS)],
)
def test_schema_matches_gymslot(env_id, kwargs):
    cfg = EnvConfig(id=env_id, kwargs=kwargs)
    pool = EnvPoolSlot(cfg, 2)
    ref = GymSlot(cfg, 2)
    try:
        ref_obs_space, ref_act_space = ref.single_observation_space, ref.single_action_space
        assert pool.single_observation_space == ref_obs_space
        assert pool.single_action_space == ref_act_space
        assert pool.single_action_space.dtype == ref_act_space.dtype
        obs, ref_obs = pool.reset(0)["obs"], ref.reset(0)["obs"]
        assert obs.shape == ref_obs.shape and obs.dtype == ref_obs.dtype
        actions = _random_actions(pool.single_action_space, 2, np.random.default_rng(0))
        out, ref_out = pool.step(actions), ref.step(actions)
        assert out.obs["obs"].shape == ref_out.obs["obs"].shape and out.obs["obs"].dtype == ref_out.obs["obs"].dtype
        assert out.reward.dtype == np.float32 and out.reward.shape == (2,)
        for flags in (out.terminated, out.truncated, out.episode_end):
            assert flags.dtype == np.bool_ and flags.shape == (2,)
    finally:
        pool.close()
        ref.close()


def test_make_slot_selects_envpool():
    slot = make_slot(EnvConfig(id="CartPole-v1", backend="envpool"), 3)
    try:
        assert isinstance(slot, EnvPoolSlot) and slot.num_envs == 3
    finally:
        slot.close()


def _raw_envpool_trajectories(num_envs: int, seed: int, actions: np.ndarray, num_threads: int) -> tuple[list, list]:
    """Per-env ``(obs, reward, terminated, truncated)`` for each of the env's own actions, from a raw EnvPool with
    its native next-step autoreset (the step after a done ignores its action and returns the reset obs, which here
    replaces the done step's obs), and the episode lengths EnvPool reports (``elapsed_step`` at each done)."""
    raw = envpool.make(
        "CartPole-v1", env_type="gymnasium", num_envs=num_envs, batch_size=num_envs, seed=seed, num_threads=num_threads
    )
    steps = actions.shape[0]
    taken = np.zeros(num_envs, dtype=int)
    pending_reset = np.zeros(num_envs, dtype=bool)
    records: list[list[list]] = [[] for _ in range(num_envs)]
    lengths: list[list[int]] = [[] for _ in range(num_envs)]
    try:
        raw.reset()
        while not (np.all(taken >= steps) and not pending_reset.any()):
            act = np.array([actions[min(taken[b], steps - 1), b] for b in range(num_envs)])
            obs, reward, terminated, truncated, info = raw.step(act)
            for b in range(num_envs):
                if pending_reset[b]:
                    records[b][-1][0] = obs[b].copy()  # the reset obs is the next input after the done step
                elif taken[b] < steps:
                    records[b].append([obs[b].copy(), reward[b], terminated[b], truncated[b]])
                    if terminated[b] or truncated[b]:
                        lengths[b].append(int(info["elapsed_step"][b]))
                    taken[b] += 1
            pending_reset = terminated | truncated
    finally:
        raw.close()
    return records, lengths


def test_cartpole_same_step_reset_matches_envpool_own_autoreset():
    """The slot's outputs equal a raw EnvPool's with its own (next-step) resets folded in: after an episode end the
    obs is the reset state, never the terminal one, and episode lengths from ``episode_end`` equal EnvPool's."""
    num_envs, seed, steps = 4, 3, 200
    actions = np.random.default_rng(0).integers(0, 2, (steps, num_envs))
    slot = EnvPoolSlot(EnvConfig(id="CartPole-v1"), num_envs)
    try:
        records, raw_lengths = _raw_envpool_trajectories(num_envs, seed, actions, slot.num_threads)
        slot.reset(seed)
        since_start = np.zeros(num_envs, dtype=int)
        slot_lengths: list[list[int]] = [[] for _ in range(num_envs)]
        for t in range(steps):
            out = slot.step(actions[t])
            # A returned obs is a next policy input: never a terminal CartPole state.
            assert np.all(np.abs(out.obs["obs"][:, 0]) <= 2.4) and np.all(np.abs(out.obs["obs"][:, 2]) <= 0.2095)
            np.testing.assert_array_equal(out.episode_end, out.terminated | out.truncated)
            since_start += 1
            for b in range(num_envs):
                obs, reward, terminated, truncated = records[b][t]
                np.testing.assert_array_equal(out.obs["obs"][b], obs)
                assert (out.reward[b], out.terminated[b], out.truncated[b]) == (reward, terminated, truncated)
                if out.episode_end[b]:
                    assert np.all(np.abs(out.obs["obs"][b]) <= CARTPOLE_RESET_BOUND)
                    slot_lengths[b].append(int(since_start[b]))
                    since_start[b] = 0
        assert slot_lengths == raw_lengths
        assert sum(map(len, slot_lengths)) >= 8  # several episodes ended
    finally:
        slot.close()


def test_truncation_gives_final_obs():
    num_envs = 4
    slot = EnvPoolSlot(EnvConfig(id="CartPole-v1", max_episode_steps=20), num_envs)
    try:
        obs = slot.reset(0)["obs"]
        truncated_seen = False
        for t in range(60):
            previous = obs
            out = slot.step(np.full(num_envs, t % 2))  # alternate pushes: the pole stays up for 20 steps
            obs = out.obs["obs"]
            if not out.truncated.any():
                assert out.final_obs is None
                continue
            truncated_seen = True
            assert out.final_obs is not None and out.final_obs["obs"].shape == obs.shape
            for b in np.flatnonzero(out.truncated):
                assert out.episode_end[b]
                last = out.final_obs["obs"][b]
                assert not np.array_equal(last, obs[b])  # final_obs is the cut episode's last state ...
                assert np.all(np.abs(obs[b]) <= CARTPOLE_RESET_BOUND)  # ... and obs the next episode's first
                assert np.abs(last[0] - previous[b][0]) < 0.1  # one step on from the previous input
        assert truncated_seen
    finally:
        slot.close()


def _run_breakout(episodic_life: bool) -> tuple[list[int], int]:
    """Fire constantly (the paddle never moves, lives go fast) until one game ends; per life-loss ``terminated``
    steps that were not episode ends, and the step of the game's end."""
    slot = EnvPoolSlot(EnvConfig(id="ALE/Breakout-v5", kwargs={"episodic_life": episodic_life}), 1)
    try:
        slot.reset(1)
        life_losses: list[int] = []
        for t in range(2000):
            out = slot.step(np.array([1]))
            if out.episode_end[0]:
                assert out.terminated[0] and not out.truncated[0]
                return life_losses, t
            if out.terminated[0]:
                life_losses.append(t)
        raise AssertionError("Breakout did not end in 2000 steps")
    finally:
        slot.close()


def test_atari_life_loss_is_not_an_episode_end():
    life_losses, end = _run_breakout(episodic_life=True)
    assert len(life_losses) == 4  # 5 lives: 4 losses continue the game, the 5th ends it
    assert life_losses == sorted(life_losses) and life_losses[-1] < end
    no_episodic, _ = _run_breakout(episodic_life=False)
    assert no_episodic == []  # without episodic life only the game's end terminates


def test_box_actions_are_clipped_to_bounds():
    cfg = EnvConfig(id="HalfCheetah-v5")
    wild, tame = EnvPoolSlot(cfg, 2), EnvPoolSlot(cfg, 2)
    try:
        np.testing.assert_array_equal(wild.reset(5)["obs"], tame.reset(5)["obs"])
        actions = np.random.default_rng(1).uniform(-3.0, 3.0, (2, 6)).astype(np.float32)
        a, b = wild.step(actions), tame.step(np.clip(actions, -1.0, 1.0))
        np.testing.assert_array_equal(a.obs["obs"], b.obs["obs"])
        np.testing.assert_array_equal(a.reward, b.reward)
    finally:
        wild.close()
        tame.close()


def test_reset_with_a_seed_is_deterministic():
    slot = EnvPoolSlot(EnvConfig(id="CartPole-v1"), 3)
    try:
        first = slot.reset(11)["obs"]
        after = [slot.step(np.array([0, 1, 0])).obs["obs"].copy() for _ in range(5)]
        np.testing.assert_array_equal(slot.reset(11)["obs"], first)
        np.testing.assert_array_equal([slot.step(np.array([0, 1, 0])).obs["obs"] for _ in range(5)], after)
        assert not np.array_equal(slot.reset(12)["obs"], first)
    finally:
        slot.close()


@pytest.mark.parametrize(
    "env_id", ["NoSuchEnv-v0", "LunarLander-v3", "ALE/NoSuchGame-v5", "srl.envs.testing:crashing_cartpole"]
)
def test_unknown_id_is_a_config_error(env_id):
    with pytest.raises(ConfigError, match="env.id: .* not available in EnvPool"):
        EnvPoolSlot(EnvConfig(id=env_id), 2)


def test_bad_kwargs_are_config_errors():
    with pytest.raises(ConfigError, match="env.kwargs.no_such_option"):
        EnvPoolSlot(EnvConfig(id="HalfCheetah-v5", kwargs={"no_such_option": 1}), 2)
    with pytest.raises(ConfigError, match="env.kwargs.reward_clip"):
        EnvPoolSlot(EnvConfig(id="ALE/Pong-v5", kwargs={"reward_clip": True}), 2)
    with pytest.raises(ConfigError, match="env.kwargs.frame_stack: must be >= 1"):
        EnvPoolSlot(EnvConfig(id="ALE/Pong-v5", kwargs={"frame_stack": 0}), 2)


def test_missing_envpool_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # makes `import envpool` raise ImportError
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError, match=r"srl\[envpool\]"):
            EnvPoolSlot(EnvConfig(id="CartPole-v1"), 2)
