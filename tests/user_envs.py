"""An env as a user writes one, outside the srl package, so its frames are the user's in a worker's traceback."""

from __future__ import annotations

from typing import Any

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
