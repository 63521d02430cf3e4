"""Partially observed versions of Gymnasium tasks: the memory benchmarks' way of making a policy need a memory.

``env.id: srl.envs.partial:keep_dims`` with ``env.kwargs: {env: CartPole-v1, keep: [0, 2]}`` is CartPole with
only the cart's position and the pole's angle observed (its velocities hidden): a feed-forward policy sees
where the pole is but not where it is going; a recurrent one can tell from two observations in a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from srl.api.config import ConfigError


class KeepDims(gym.ObservationWrapper):
    """Only the entries ``keep`` of a flat Box observation."""

    def __init__(self, env: gym.Env, keep: Sequence[int]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ConfigError(f"env.kwargs.keep: needs a flat Box observation, the env has {space}")
        index = np.asarray(list(keep), np.int64)
        if not len(index) or index.min() < 0 or index.max() >= space.shape[0] or len(set(index.tolist())) < len(index):
            raise ConfigError(
                f"env.kwargs.keep: {list(keep)} must be distinct entries of the observation's {space.shape[0]}"
            )
        self._index = index
        self.observation_space = gym.spaces.Box(space.low[index], space.high[index], dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self._index]


def keep_dims(env: str, keep: Sequence[int], **kwargs: Any) -> gym.Env:
    """``gym.make(env, **kwargs)`` observing only the entries ``keep`` of its observation."""
    try:
        inner = gym.make(env, **kwargs)
    except gym.error.Error as exc:
        raise ConfigError(f"env.kwargs.env: {env!r}: {exc}") from None
    return KeepDims(inner, keep)
