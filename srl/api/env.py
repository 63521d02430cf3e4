"""What an actor slot is: B environments stepped together, whatever the backend.

Backends (a Gymnasium vector env, an EnvPool batch) differ in how they reset
finished episodes and report their last observation; a :class:`Slot` hides
that. Observations are parts (``{"obs": ...}``, or ``{"obs.<key>": ...}`` for Dict
and Tuple spaces; see :mod:`srl.api.spaces`), each ``[B, ...]``. After ``step``
the returned ``obs`` is always the next policy input
(reset observations where an episode ended), ``final_obs`` the true last
observation where a time limit cut an episode (to bootstrap its value), and
``episode_end`` marks the end of a *real* episode: with episodic life an Atari
life loss is ``terminated`` for learning but not the end of the game whose
return we report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import gymnasium as gym
import numpy as np

from srl.api.spaces import Observation

LIFE_LOSS = "life_loss"
"""Info key an environment sets when ``terminated`` marks a lost life, not the end of the game."""


@dataclass
class SlotStep:
    """The result of stepping one slot; arrays are ``[B, ...]``."""

    obs: Observation
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_end: np.ndarray
    final_obs: Observation | None
    """Last observations, valid where ``truncated``; None when nothing was truncated."""
    alive: np.ndarray | None = None
    """Multi-agent slots: the columns whose agent acted in this step (one waiting for its turn, done before the
    others, or not yet in the env did not: its action is not a sample for the policy, though its step still is
    one for the critic). None: every column acted."""


class Slot(Protocol):
    """B environments stepped as one: ``num_envs`` columns, ``agents_per_env`` of them per environment (every
    agent of a multi-agent env is a column)."""

    num_envs: int
    agents_per_env: int
    state_space: gym.spaces.Space | None
    """A multi-agent env's global state space (carried in ``obs["state"]`` when the slot was asked to), or None."""
    single_observation_space: gym.spaces.Space
    single_action_space: gym.spaces.Space

    def reset(self, seed: int) -> Observation:
        """Reset every environment; the first observations ``[B, ...]``."""

    def step(self, actions: np.ndarray) -> SlotStep:
        """Step every environment once."""

    def close(self) -> None:
        """Release the environments."""
