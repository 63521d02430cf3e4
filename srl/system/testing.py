"""Test doubles shipped with the package: a random policy that records its batch sizes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class RandomPolicy:
    """Implements the :class:`~srl.api.worker.Policy` protocol with uniform random actions.

    ``batch_sizes`` records the size of every ``act`` call, so tests can see how
    requests were batched; ``loaded`` records the first element of each snapshot loaded.
    """

    def __init__(self, action_space: gym.spaces.Space, size: int = 4, seed: int = 0) -> None:
        self.action_space = action_space
        self.size = size
        self.rng = np.random.default_rng(seed)
        self.batch_sizes: list[int] = []
        self.loaded: list[float] = []

    def act(self, obs: np.ndarray, deterministic: bool = False) -> tuple[np.ndarray, np.ndarray]:
        n = len(obs)
        self.batch_sizes.append(n)
        if isinstance(self.action_space, gym.spaces.Discrete):
            actions = self.rng.integers(0, self.action_space.n, n)
            return actions.astype(np.int64), np.full(n, -np.log(self.action_space.n), np.float32)
        shape = (n, *self.action_space.shape)
        return self.rng.uniform(-1, 1, shape).astype(np.float32), np.zeros(n, np.float32)

    def load_flat(self, flat: np.ndarray) -> None:
        if len(flat) != self.size:
            raise ValueError(f"expected {self.size} values, got {len(flat)}")
        self.loaded.append(float(flat[0]))

    def flat_size(self) -> int:
        return self.size
