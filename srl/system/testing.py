"""Test doubles shipped with the package: a random policy that records its batch sizes, and a probe of how the
streams carry a policy's memory (an env that counts its steps, a policy that remembers them, an algorithm
that checks every batch)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from srl.api.schema import MEMORY, Field, memory_field
from srl.api.worker import TrainResult


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


class StepCounter(gym.Env):
    """An env that says who it is and how far into its episode it is: ``[uid, t]`` (``uid`` drawn per env,
    ``t`` steps since the reset). Episodes end after 3 to 9 steps, some by a time limit (truncated)."""

    observation_space = gym.spaces.Box(0.0, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.uid = 0.0
        self.t = self.length = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None or self.uid == 0.0:
            self.uid = float(self.np_random.integers(1, 1_000_000))
        self.t, self.length = 0, int(self.np_random.integers(3, 10))
        return np.array([self.uid, 0.0], np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        end = self.t >= self.length
        truncated = end and self.length % 2 == 0
        return np.array([self.uid, self.t], np.float32), 0.0, end and not truncated, truncated, {}


class MemoryProbePolicy(RandomPolicy):
    """A policy with a two-float memory that records what it has seen: from state ``[uid, k]`` and observation
    ``[uid', t]`` it goes to ``[uid', k + 1]``. Wherever the system carries the state right, the state a step
    starts from is ``[uid, t]`` for the env's own uid, and zeros at an episode's first step (``t == 0``)."""

    def __init__(self, action_space: gym.spaces.Space) -> None:
        super().__init__(action_space)

    def output_fields(self) -> tuple[Field, ...]:
        return (Field("logp", (), "float32"), memory_field(2))

    def act(self, obs: Mapping[str, np.ndarray], deterministic: bool = False) -> dict[str, np.ndarray]:
        state = obs[MEMORY]
        out = super().act({k: v for k, v in obs.items() if k != MEMORY}, deterministic)
        out[MEMORY] = np.stack([_seen(obs)[:, 0], state[:, 1] + 1.0], axis=1).astype(np.float32)
        return out


def _seen(obs: Mapping[str, np.ndarray]) -> np.ndarray:
    """The probe's ``[uid, t]``: the observation, or a turn-based game's ``observation`` part."""
    return obs["obs"] if "obs" in obs else obs["obs.observation"]


def memory_violations(batch: Mapping[str, np.ndarray]) -> tuple[int, int]:
    """How many of a batch's rows break :class:`MemoryProbePolicy`'s rule, of how many. A multi-agent column
    holds zeros in the row after its agent's episode ended, and over each step it sat idle (``alive`` false:
    its agent done before the others) keeps the state it had, whatever it is shown there."""
    obs, memory = _seen(batch), batch[MEMORY]
    want = np.where((obs[..., 1:] == 0), 0.0, obs)
    if "alive" in batch:  # as the actor carries them, step by step
        ended = batch["terminated"] | batch["truncated"]
        idle = ~batch["alive"].astype(bool)
        for t in range(len(ended)):
            want[t + 1][idle[t]] = want[t][idle[t]]
            want[t + 1][ended[t]] = 0.0
    return int((~np.isclose(memory, want).all(axis=-1)).sum()), int(memory.shape[0] * memory.shape[1])


class MemoryProbe:
    """``algorithm: srl.system.testing:MemoryProbe``: acts with :class:`MemoryProbePolicy`, learns nothing, and
    reports the rows of each batch whose state was carried wrong (``memory_violations``, of ``memory_rows``)."""

    def __init__(self, ctx: Any) -> None:
        self.action_space = ctx.action_space

    @staticmethod
    def acting_policy(ctx: Any) -> MemoryProbePolicy:
        return MemoryProbePolicy(ctx.action_space)

    def train(self, batch: Mapping[str, np.ndarray], progress: float) -> TrainResult:
        bad, rows = memory_violations(batch)
        return TrainResult({"memory_violations": float(bad), "memory_rows": float(rows)})

    def policy_state(self) -> np.ndarray:
        return np.zeros(4, np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass

    def synchronize(self) -> None:
        pass


def step_counter() -> gym.Env:
    """``env.id: srl.system.testing:step_counter``."""
    return StepCounter()
