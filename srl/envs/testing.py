"""Environments for tests: real Gymnasium envs with faults injected on purpose."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class CrashAfter(gym.Wrapper):
    """Raises ``RuntimeError`` on the ``crash_after``-th step (counted over resets)."""

    def __init__(self, env: gym.Env, crash_after: int) -> None:
        super().__init__(env)
        self.crash_after = crash_after
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps >= self.crash_after:
            raise RuntimeError(f"injected failure at step {self.steps}")
        return self.env.step(action)


def crashing_cartpole(crash_after: int = 100) -> gym.Env:
    """CartPole-v1 that fails after ``crash_after`` steps: ``env.id: srl.envs.testing:crashing_cartpole``."""
    return CrashAfter(gym.make("CartPole-v1"), crash_after)


class NonFiniteEvery(gym.Wrapper):
    """Every ``every``-th step returns a NaN in the observation and an infinite reward."""

    def __init__(self, env: gym.Env, every: int) -> None:
        super().__init__(env)
        self.every = every
        self.steps = 0

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps % self.every == 0:
            obs = obs.copy()
            obs[0] = float("nan")
            reward = float("inf")
        return obs, reward, terminated, truncated, info


def nonfinite_cartpole(every: int = 50) -> gym.Env:
    """CartPole-v1 with a NaN observation and an infinite reward every ``every`` steps."""
    return NonFiniteEvery(gym.make("CartPole-v1"), every)


class WrongShapeAfter(gym.Wrapper):
    """From the ``after``-th step on, observations have one value too many for the declared space."""

    def __init__(self, env: gym.Env, after: int) -> None:
        super().__init__(env)
        self.after = after
        self.steps = 0

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps >= self.after:
            obs = np.append(obs, np.float32(0.0))
        return obs, reward, terminated, truncated, info


def misshapen_cartpole(after: int = 20) -> gym.Env:
    """CartPole-v1 whose observations stop matching its observation space after ``after`` steps."""
    return WrongShapeAfter(gym.make("CartPole-v1"), after)
