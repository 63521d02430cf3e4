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

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import gymnasium as gym
import numpy as np

from srl.api.config import ConfigError
from srl.api.spaces import Observation

LIFE_LOSS = "life_loss"
"""Info key an environment sets when ``terminated`` marks a lost life, not the end of the game."""


class NoGlobalState(ConfigError):
    """An algorithm asked for the env's global state and the env has none; the plan names the setting that asked
    (``ppo.critic_input``, ``qmix.critic_input``)."""


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

    def columns(self, cols: np.ndarray | slice) -> SlotStep:
        """The columns ``cols`` of this step (a slice is a view, an index array a copy)."""
        return SlotStep(
            {k: v[cols] for k, v in self.obs.items()},
            self.reward[cols],
            self.terminated[cols],
            self.truncated[cols],
            self.episode_end[cols],
            None if self.final_obs is None else {k: v[cols] for k, v in self.final_obs.items()},
            None if self.alive is None else self.alive[cols],
        )

    def carry(self, before: np.ndarray, after: np.ndarray) -> None:
        """Settle the state a policy with memory starts each column's next step from (:func:`carried`)."""
        carried(before, after, self.terminated, self.truncated, self.alive)


def carried(
    before: np.ndarray, after: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, alive: np.ndarray | None
) -> None:
    """The rule for a policy with memory, in place on ``after`` (the states ``[B, S]`` its core gave at a step,
    from ``before``): a column that sat idle keeps the state it had (a player waiting for its turn, an agent
    done before the others or not in the env yet: its step advanced nothing), and a column whose episode ended
    starts its next step from zeros. The actor, the trainer's unroll (``idle`` and ``resets`` of
    :class:`srl.nets.memory.Sequences`), evaluation and matches all carry states by this rule."""
    if alive is not None:
        idle = ~alive.astype(bool)
        if idle.any():
            after[idle] = before[idle]
    ended = terminated | truncated
    if ended.any():
        after[ended] = 0.0


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


@dataclass(frozen=True)
class SlotGroup:
    """The columns of one policy in a slot: ``agents_per_env`` of them per environment (env-major)."""

    policy: str
    agents: tuple[str, ...]
    """The env's agent ids this policy plays, in column order within an environment (() for a single-agent env)."""
    observation_space: gym.spaces.Space
    action_space: gym.spaces.Space
    state_space: gym.spaces.Space | None
    """The global state carried in its observations (``state``), or None."""
    alive: bool
    """Its steps say which columns acted (``SlotStep.alive``)."""
    envs: int = 0
    """How many of the slot's environments it plays (a population member's share); 0: every one of them."""

    @property
    def agents_per_env(self) -> int:
        return max(1, len(self.agents))

    def columns(self, env_count: int) -> int:
        """Its columns in a slot of ``env_count`` environments."""
        return (self.envs or env_count) * self.agents_per_env


class GroupedSlot(Protocol):
    """A slot whose columns belong to several policies (``agents`` rules, a population's members): one
    observation batch, one action batch and one :class:`SlotStep` per group, each ``[group.columns(B), ...]``."""

    groups: tuple[SlotGroup, ...]
    env_count: int
    """Environments in the slot (B)."""

    def reset_groups(self, seed: int) -> list[Observation]: ...

    def step_groups(self, actions: Sequence[np.ndarray]) -> list[SlotStep]: ...

    def close(self) -> None: ...


class OneGroup:
    """A plain :class:`Slot` as a :class:`GroupedSlot` of one group (every column one policy's)."""

    def __init__(self, slot: Slot, policy: str) -> None:
        self.slot = slot
        self.env_count = slot.num_envs // slot.agents_per_env
        agents = tuple(getattr(slot, "agents", ()))
        alive = bool(getattr(slot, "reports_alive", False))
        # its rewards are written downstream, into the segment (a text task with a reward worker): the actor
        # reports no returns for it
        self.deferred_rewards = bool(getattr(slot, "deferred_rewards", False))
        self.groups: tuple[SlotGroup, ...] = (
            SlotGroup(policy, agents, slot.single_observation_space, slot.single_action_space, slot.state_space, alive),
        )

    def reset_groups(self, seed: int) -> list[Observation]:
        return [self.slot.reset(seed)]

    def step_groups(self, actions: Sequence[np.ndarray]) -> list[SlotStep]:
        return [self.slot.step(actions[0])]

    def close(self) -> None:
        self.slot.close()


class MemberSlot:
    """A grouped slot whose environments a population's members share: member ``k`` of each of ``inner``'s
    groups plays environments ``[k * B / N, (k + 1) * B / N)`` of every step, so the members of one index play
    together (contiguous, so each member's columns are one slice of its group's, no copies)."""

    def __init__(self, inner: GroupedSlot, names: Sequence[str]) -> None:
        """``names``: the members' policies, member by member (member ``k`` of inner group ``j`` is
        ``names[k * G + j]``, ``G`` the inner groups), as ``PopulationConfig.names`` gives them."""
        G, B = len(inner.groups), inner.env_count
        N = len(names) // G
        assert N * G == len(names) and B % N == 0, f"{len(names)} members cannot share {B} envs of {G} groups evenly"
        self.inner, self.env_count, self._per = inner, B, B // N
        self.slot = getattr(inner, "slot", inner)
        """The slot of environments inside (what a probe asks what kind of env it is)."""
        self.deferred_rewards = bool(getattr(inner, "deferred_rewards", False))
        self.groups: tuple[SlotGroup, ...] = tuple(
            dataclasses.replace(g, policy=names[k * G + j], envs=B // N)
            for k in range(N)
            for j, g in enumerate(inner.groups)
        )
        self._cols = [
            (j, slice(k * self._per * g.agents_per_env, (k + 1) * self._per * g.agents_per_env))
            for k in range(N)
            for j, g in enumerate(inner.groups)
        ]
        """Per member: its inner group and its columns there."""
        self._actions: list[np.ndarray] = []

    def reset_groups(self, seed: int) -> list[Observation]:
        obs = self.inner.reset_groups(seed)
        return [{k: v[cols] for k, v in obs[j].items()} for j, cols in self._cols]

    def step_groups(self, actions: Sequence[np.ndarray]) -> list[SlotStep]:
        if not self._actions:  # each inner group's whole action batch, filled member by member
            self._actions = [
                np.zeros((g.columns(self.env_count), *np.shape(actions[j])[1:]), np.asarray(actions[j]).dtype)
                for j, g in enumerate(self.inner.groups)
            ]
        for (j, cols), a in zip(self._cols, actions):
            self._actions[j][cols] = a
        steps = self.inner.step_groups(self._actions)
        return [steps[j].columns(cols) for j, cols in self._cols]

    def close(self) -> None:
        self.inner.close()
