"""Test doubles shipped with the package: a random policy that records its batch sizes."""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np

from srl.api.schema import Field


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

    def output_fields(self) -> tuple[Field, ...]:
        return (Field("logp", (), "float32"),)

    def act(self, obs: Mapping[str, np.ndarray], deterministic: bool = False) -> dict[str, np.ndarray]:
        n = len(next(iter(obs.values())))
        self.batch_sizes.append(n)
        if isinstance(self.action_space, gym.spaces.Discrete):
            actions = self.rng.integers(0, self.action_space.n, n)
            return {"actions": actions.astype(np.int64), "logp": np.full(n, -np.log(self.action_space.n), np.float32)}
        shape = (n, *(self.action_space.shape or ()))
        return {"actions": self.rng.uniform(-1, 1, shape).astype(np.float32), "logp": np.zeros(n, np.float32)}

    def load_flat(self, flat: np.ndarray) -> None:
        if len(flat) != self.size:
            raise ValueError(f"expected {self.size} values, got {len(flat)}")
        self.loaded.append(float(flat[0]))

    def flat_size(self) -> int:
        return self.size

    def flat_state(self) -> np.ndarray:
        return np.full(self.size, self.loaded[-1] if self.loaded else 0.0, np.float32)
