"""VMAS as a native batched slot: one VMAS environment of B worlds, every agent of every world a column.

VMAS simulates a batch of worlds in torch, so a slot is one VMAS env made with
``num_envs`` = ``workers.envs_per_slot`` (the factory gets ``num_envs``
because it takes that argument, e.g. ``env.id: vmas:make_env``), stepped with
one call per step and no Python loop over worlds. Columns are world-major, as
for PettingZoo envs (:mod:`srl.envs.multiagent`): column ``b * N + i`` is agent
``i`` of world ``b``. Worlds that are done are reset in the same step
(``reset_at``), their last observations kept as ``final_obs``.

VMAS reports one ``done`` per world; a world that hit ``max_steps`` is a
truncation (its value is bootstrapped), any other end a termination. Envs
made with ``terminated_truncated=True`` say so themselves.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from srl.api.config import ConfigError
from srl.api.env import SlotStep
from srl.api.plugins import instance_of
from srl.api.spaces import OBS, Observation, UnsupportedSpace, check_spaces
from srl.envs.multiagent import seat_space, with_seats


def is_vmas_env(env: Any) -> bool:
    """A VMAS ``Environment`` (checked without importing VMAS)."""
    return instance_of(env, "vmas.simulator.environment.environment", "Environment")


def _gymnasium(space: Any) -> gym.spaces.Space:
    """A VMAS (old ``gym``) space as a Gymnasium one."""
    name = type(space).__name__
    if name == "Box":
        return gym.spaces.Box(space.low, space.high, space.shape, np.float32)
    if name == "Discrete":
        return gym.spaces.Discrete(int(space.n))
    raise UnsupportedSpace(f"VMAS space {space} is not supported")


class VmasSlot:
    """One VMAS env of ``num_envs`` worlds; ``N`` agents each, all with one observation and action space."""

    state_space: gym.spaces.Space | None = None

    def __init__(self, name: str, env: Any, agent_id: bool = False) -> None:
        """``agent_id``: each column also observes its agent's index (``obs.agent``; see ``env.agent_id``)."""
        self.env, self.name, self._agent_id = env, name, agent_id
        self.worlds = int(env.num_envs)
        self.agents = [a.name for a in env.agents]
        self.agents_per_env = len(self.agents)
        self.num_envs = self.worlds * self.agents_per_env
        try:
            obs_spaces = [_gymnasium(s) for s in env.observation_space.spaces]
            act_spaces = [_gymnasium(s) for s in env.action_space.spaces]
        except (AttributeError, UnsupportedSpace) as exc:
            raise ConfigError(f"env: {name!r}: {exc} (VMAS envs need dict_spaces=False)") from None
        if any(s != obs_spaces[0] for s in obs_spaces) or any(s != act_spaces[0] for s in act_spaces):
            raise ConfigError(f"env: {name!r}: agents have different spaces; agents sharing a policy need one")
        self.single_observation_space, self.single_action_space = obs_spaces[0], act_spaces[0]
        try:
            check_spaces(self.single_observation_space, self.single_action_space)
        except UnsupportedSpace as exc:
            raise ConfigError(f"env: {name!r} {exc}") from None
        if agent_id:
            self.single_observation_space = seat_space(self.single_observation_space, self.agents_per_env)
        box = self.single_action_space
        self._low = torch.as_tensor(box.low) if isinstance(box, gym.spaces.Box) else None
        self._high = torch.as_tensor(box.high) if isinstance(box, gym.spaces.Box) else None

    def _columns(self, per_agent: list[torch.Tensor]) -> np.ndarray:
        """Agent-major tensors ``N x [B, ...]`` as world-major columns ``[B * N, ...]``."""
        stacked = torch.stack(per_agent, dim=1)  # [B, N, ...]
        return stacked.reshape(self.num_envs, *stacked.shape[2:]).numpy()

    def _obs(self, per_agent: list[torch.Tensor]) -> Observation:
        obs = {OBS: self._columns(per_agent).astype(np.float32, copy=False)}
        return with_seats(obs, self.agents_per_env) if self._agent_id else obs

    def reset(self, seed: int) -> Observation:
        self.env.seed(seed)
        return self._obs(self.env.reset())

    def step(self, actions: np.ndarray) -> SlotStep:
        acts = torch.as_tensor(actions).reshape(self.worlds, self.agents_per_env, *actions.shape[1:])
        if self._low is not None and self._high is not None:
            acts = torch.maximum(torch.minimum(acts, self._high), self._low)
        out = self.env.step([acts[:, i] for i in range(self.agents_per_env)])
        if self.env.terminated_truncated:
            obs, rewards, terminated, truncated, _ = out
        else:
            obs, rewards, done, _ = out
            limit = self.env.max_steps
            truncated = done & (self.env.steps >= limit) if limit is not None else torch.zeros_like(done)
            terminated = done & ~truncated
        ended = (terminated | truncated).numpy()
        final_obs = None
        next_obs = obs
        if ended.any():
            if truncated.any():
                final_obs = self._obs(obs)
            for b in np.flatnonzero(ended).tolist():
                next_obs = self.env.reset_at(b)
        N = self.agents_per_env
        term = np.repeat(terminated.numpy(), N)
        trunc = np.repeat(truncated.numpy(), N) & ~term
        return SlotStep(
            self._obs(next_obs),
            self._columns(rewards).astype(np.float32, copy=False),
            term,
            trunc,
            term | trunc,
            final_obs,
        )

    def close(self) -> None:
        """VMAS holds only tensors."""
