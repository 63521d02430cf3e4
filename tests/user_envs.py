"""An env as a user writes one, outside the srl package, so its frames are the user's in a worker's traceback."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class ExplodingCartPole(CartPoleEnv):
    """CartPole whose simulator fails on its ``explode_at``-th step (counted over resets): a bug in user code."""

    def __init__(self, explode_at: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.explode_at = explode_at
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps >= self.explode_at:
            raise RuntimeError("simulator exploded (user bug)")
        return super().step(action)


def make(explode_at: int = 50, **kwargs: Any) -> ExplodingCartPole:
    """``env.id: user_envs:make``."""
    return ExplodingCartPole(explode_at, **kwargs)


class Drift(gym.Env):
    """``env.id: user_envs:Drift``: a point pushed by a Box action of ``low`` / ``high`` bounds (unbounded by
    default), rewarded for staying near the origin; an action beyond ``limit`` on any side is a user's simulator
    failing on it. Episodes end only by ``env.max_episode_steps``."""

    def __init__(self, low: float = -np.inf, high: float = np.inf, limit: float = np.inf) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(np.float32(low), np.float32(high), (2,), np.float32)
        self.limit = limit
        self.position = np.zeros(2, np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        return self.position.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = np.asarray(action, np.float32)
        if np.abs(action).max() > self.limit:
            raise ValueError(f"action {action} beyond +-{self.limit}")
        self.position = np.clip(self.position + 0.1 * action, -10.0, 10.0)
        return self.position.copy(), -float(np.abs(self.position).sum()), False, False, {}
