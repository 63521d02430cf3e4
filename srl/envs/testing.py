"""Environments for tests: real Gymnasium envs with faults injected on purpose, and small tasks over every
kind of space."""

from __future__ import annotations

import os
import signal
import time
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


class SignalAt(gym.Wrapper):
    """The first copy to reach its ``at``-th step (counted over resets) sends this process ``SIGTERM`` and then
    finishes the step (once per process: the other copies step on); ``finished_after_signal`` counts the steps
    that ran to their end after sending it."""

    sent = False  # class-wide: the runtime builds its own copies of the env
    finished_after_signal = 0

    def __init__(self, env: gym.Env, at: int) -> None:
        super().__init__(env)
        self.at = at
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        signalled = not SignalAt.sent and self.steps >= self.at
        if signalled:
            SignalAt.sent = True
            signal.raise_signal(signal.SIGTERM)  # to this thread: its handler runs before the next bytecode
        out = self.env.step(action)  # the handler has run
        if signalled:
            SignalAt.finished_after_signal += 1
        return out


def signalling_cartpole(at: int = 500) -> gym.Env:
    """CartPole-v1 that sends its own process SIGTERM in the middle of its ``at``-th step."""
    return SignalAt(gym.make("CartPole-v1"), at)


def cartpole_signalling_when_made() -> gym.Env:
    """CartPole-v1 whose first copy sends its process SIGTERM as it is made: a signal while a run starts (the
    controller probes the env before any worker exists; forked workers inherit ``SignalAt.sent``)."""
    if not SignalAt.sent:
        SignalAt.sent = True
        os.kill(os.getpid(), signal.SIGTERM)
    return gym.make("CartPole-v1")


class SlowToClose(gym.Wrapper):
    """A copy that has stepped takes up to ``seconds`` to close (the processes that stepped it stop slowly), and
    first touches the file ``closing``: a test then knows the run is stopping, and how long it would wait."""

    def __init__(self, env: gym.Env, closing: str, seconds: float) -> None:
        super().__init__(env)
        self.closing, self.seconds, self.stepped = closing, seconds, False

    def step(self, action: Any) -> Any:
        self.stepped = True
        return self.env.step(action)

    def close(self) -> None:
        if self.stepped:
            open(self.closing, "a").close()
            time.sleep(self.seconds)
        self.env.close()


def slow_closing_cartpole(closing: str, seconds: float = 60.0) -> gym.Env:
    """CartPole-v1 whose stepped copies take ``seconds`` to close, touching ``closing`` first (:class:`SlowToClose`)."""
    return SlowToClose(gym.make("CartPole-v1"), closing, seconds)


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


class GoalGrid(gym.Env):
    """A Dict-observation, MultiDiscrete-action task where both observation parts matter.

    The agent walks a ``size`` x ``size`` grid towards one of four goal cells. Observation: ``position`` (Box, the
    agent's cell scaled to [0, 1]) and ``goal`` (Discrete(4), which goal cell counts this episode). Action:
    MultiDiscrete([3, 3]), a move of -1/0/+1 on each axis (diagonals allowed, walls stop). Reward +1 on the goal
    (the episode ends), -0.05 per step otherwise; at most ``max_steps`` steps.

    The goals sit inside the grid, so the right move depends on where the agent is relative to the goal. Mean
    returns measured over 4,000 episodes at the defaults: walking straight to the goal 0.885; touring the goals
    without looking at ``goal`` (even with memory of those visited) 0.45; the best fixed move per goal (blind to
    ``position``) -0.33; uniform random moves -0.32.
    """

    def __init__(self, size: int = 7, max_steps: int = 10) -> None:
        self.size, self.max_steps = size, max_steps
        lo, hi = 1, size - 2
        self.goals = np.array([(lo, lo), (lo, hi), (hi, lo), (hi, hi)])
        self.observation_space = gym.spaces.Dict(
            {"position": gym.spaces.Box(0.0, 1.0, (2,), np.float32), "goal": gym.spaces.Discrete(len(self.goals))}
        )
        self.action_space = gym.spaces.MultiDiscrete([3, 3])
        self._pos = np.zeros(2, np.int64)
        self._goal = 0
        self._steps = 0

    def _obs(self) -> dict[str, Any]:
        return {"position": (self._pos / (self.size - 1)).astype(np.float32), "goal": self._goal}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._goal = int(self.np_random.integers(len(self.goals)))
        while True:
            self._pos = self.np_random.integers(0, self.size, 2)
            if not (self._pos == self.goals[self._goal]).all():
                break
        self._steps = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        move = np.asarray(action, np.int64) - 1
        self._pos = np.clip(self._pos + move, 0, self.size - 1)
        self._steps += 1
        reached = bool((self._pos == self.goals[self._goal]).all())
        reward = 1.0 if reached else -0.05
        return self._obs(), reward, reached, self._steps >= self.max_steps and not reached, {}


def goal_grid(size: int = 7, max_steps: int = 10) -> gym.Env:
    """``env.id: srl.envs.testing:goal_grid``: Dict observations (Box + Discrete), MultiDiscrete actions."""
    return GoalGrid(size, max_steps)


class MaskedChoice(gym.Env):
    """Pick the one rewarded action among the legal ones. Each step ``legal`` of ``n`` actions are legal (the
    ``action_mask`` part, PettingZoo's convention); the observation's one-hot names a legal action, picking it
    pays 1. An illegal action raises: a run on this env fails if its policy ever samples one. Episodes are
    ``length`` steps; a uniformly random *legal* choice scores ``length / legal``."""

    def __init__(self, n: int = 6, legal: int = 3, length: int = 8, mask_size: int | None = None) -> None:
        """``mask_size``: declare a mask of another size than the actions (for the refusal of such a space)."""
        self.n, self.legal, self.length = n, legal, length
        mask = gym.spaces.MultiBinary(n if mask_size is None else mask_size)
        self.observation_space = gym.spaces.Dict(
            {"observation": gym.spaces.Box(0.0, 1.0, (n,), np.float32), "action_mask": mask}
        )
        self.action_space = gym.spaces.Discrete(n)
        self._mask = np.zeros(n, np.int8)
        self._target = 0
        self._t = 0

    def _draw(self) -> dict[str, np.ndarray]:
        self._mask[:] = 0
        allowed = self.np_random.choice(self.n, self.legal, replace=False)
        self._mask[allowed] = 1
        self._target = int(self.np_random.choice(allowed))
        obs = np.zeros(self.n, np.float32)
        obs[self._target] = 1.0
        return {"observation": obs, "action_mask": self._mask.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._draw(), {}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if not self._mask[int(action)]:
            raise RuntimeError(f"illegal action {int(action)} sampled (legal: {np.flatnonzero(self._mask).tolist()})")
        reward = float(int(action) == self._target)
        self._t += 1
        return self._draw(), reward, False, self._t >= self.length, {}


def masked_choice(**kwargs: Any) -> gym.Env:
    """``env.id: srl.envs.testing:masked_choice``."""
    return MaskedChoice(**kwargs)
