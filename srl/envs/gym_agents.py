"""Gymnasium environments of several agents as PettingZoo parallel environments, so the multi-agent slots run
them: Level-Based Foraging (``lbforaging``) and the multi-robot warehouse (``rware``) are Gymnasium envs whose
spaces are Tuples with one entry per agent, whose ``step`` takes a tuple of actions and returns one reward per
agent. ``env.id: srl.envs.gym_agents:parallel`` with ``env.kwargs: {env: "lbforaging:Foraging-8x8-2p-2f-coop-v3"}``
(the module before the colon is imported first, which registers the envs); other kwargs go to ``gymnasium.make``.

Agents are ``agent_0 .. agent_{N-1}``, in the Tuple's order. Such envs have no global state of their own; where
every agent's observation is a Box, the env's ``state()`` is their observations joined, in the agents' order
(EPyMARL's state for LBF and RWARE), for MAPPO's critic (``ppo.critic_input: state``) and QMIX's mixer. An
episode ends for every agent at once, as these envs end it (``terminated`` and ``truncated`` are one flag each, or
one per agent).
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from pettingzoo.utils.env import ParallelEnv

from srl.api.config import ConfigError

__all__ = ["GymAgents", "parallel"]


class GymAgents(ParallelEnv):
    """One Gymnasium env of several agents (Tuple spaces) as a PettingZoo ``ParallelEnv``."""

    metadata: ClassVar[dict[str, Any]] = {"name": "gym_agents"}

    def __init__(self, env: str, **kwargs: Any) -> None:
        try:
            self.env = gym.make(env, **{"disable_env_checker": True, **kwargs})  # its rewards are lists
        except (gym.error.Error, ModuleNotFoundError) as exc:
            raise ConfigError(f"env.kwargs.env: {env!r} cannot be made: {exc}") from None
        obs, actions = self.env.observation_space, self.env.action_space
        if not (isinstance(obs, gym.spaces.Tuple) and isinstance(actions, gym.spaces.Tuple)):
            self.env.close()
            raise ConfigError(
                f"env.kwargs.env: {env!r} is not an env of several agents: its spaces are {obs} and {actions}, "
                "not Tuples with one entry per agent"
            )
        self.possible_agents = [f"agent_{i}" for i in range(len(obs.spaces))]
        self.agents: list[str] = []
        self._obs = dict(zip(self.possible_agents, obs.spaces))
        self._actions = dict(zip(self.possible_agents, actions.spaces))
        self._last: tuple[np.ndarray, ...] = ()
        boxes = [space for space in obs.spaces if isinstance(space, gym.spaces.Box)]
        if len(boxes) == len(obs.spaces):
            low = np.concatenate([np.ravel(box.low) for box in boxes]).astype(np.float32)
            high = np.concatenate([np.ravel(box.high) for box in boxes]).astype(np.float32)
            self.state_space = gym.spaces.Box(low, high, dtype=np.float32)

    def observation_space(self, agent: str) -> gym.spaces.Space:
        return self._obs[agent]

    def action_space(self, agent: str) -> gym.spaces.Space:
        return self._actions[agent]

    def state(self) -> np.ndarray:
        """Every agent's newest observation, joined in the agents' order."""
        return np.concatenate([np.ravel(o) for o in self._last]).astype(np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, _ = self.env.reset(seed=seed, options=options)
        self.agents, self._last = list(self.possible_agents), tuple(obs)
        return dict(zip(self.agents, obs)), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        agents = list(self.agents)
        obs, rewards, terminated, truncated, _ = self.env.step(tuple(int(actions[a]) for a in self.possible_agents))
        self._last = tuple(obs)
        done, cut = _per_agent(terminated, len(agents)), _per_agent(truncated, len(agents))
        over = bool(np.all(done | cut))  # the env goes on while any agent does: nobody leaves before the end
        self.agents = [] if over else agents
        paid = np.broadcast_to(np.asarray(rewards, np.float64), (len(agents),))
        return (
            dict(zip(agents, obs)),
            {a: float(r) for a, r in zip(agents, paid)},
            {a: over and bool(done[i]) for i, a in enumerate(agents)},
            {a: over and bool(cut[i] and not done[i]) for i, a in enumerate(agents)},
            {a: {} for a in agents},
        )

    def close(self) -> None:
        self.env.close()


def _per_agent(flag: Any, agents: int) -> np.ndarray:
    """An episode-end flag, one bool for the env or one per agent, as one per agent."""
    return np.broadcast_to(np.asarray(flag, bool), (agents,)).copy()


def parallel(env: str, **kwargs: Any) -> GymAgents:
    """``env.id: srl.envs.gym_agents:parallel``."""
    return GymAgents(env, **kwargs)
