"""Slot backends: Gymnasium vector envs (the default and the reference), chosen with the others by
:func:`make_slot` from what ``env.id`` makes."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from srl.api.config import ConfigError, EnvConfig
from srl.api.config.policies import DEFAULT_POLICY, AgentRule, map_agents, policy_names
from srl.api.env import LIFE_LOSS, GroupedSlot, MemberSlot, NoGlobalState, OneGroup, Slot, SlotGroup, SlotStep
from srl.api.spaces import Observation, flatten_obs, obs_parts
from srl.envs.factory import create_env, make_env, wrap_env
from srl.envs.multiagent import ParallelSlot, SplitSlot, is_parallel_env
from srl.envs.turns import TurnSlot, is_aec_env, is_openspiel_game
from srl.envs.vmas_slot import VmasSlot, is_vmas_env
from srl.text.task import TextTask


class GymSlot:
    """B environments in one ``SyncVectorEnv`` that resets finished episodes within the same step."""

    agents_per_env = 1
    state_space: gym.spaces.Space | None = None

    def __init__(self, cfg: EnvConfig, num_envs: int, first: gym.Env | None = None) -> None:
        """``first``: one environment already made by :func:`~srl.envs.factory.make_env` (it is reused)."""
        makers = [lambda: make_env(cfg) for _ in range(num_envs)]
        if first is not None:
            makers[0] = lambda: first
        self.venv = SyncVectorEnv(makers, copy=False, autoreset_mode=AutoresetMode.SAME_STEP)
        self.num_envs = num_envs
        self.single_observation_space = self.venv.single_observation_space
        self.single_action_space = self.venv.single_action_space
        self.parts = obs_parts(self.single_observation_space)

    def reset(self, seed: int) -> Observation:
        self.venv.action_space.seed(seed)
        return flatten_obs(self.parts, self.venv.reset(seed=seed)[0])

    def step(self, actions: np.ndarray) -> SlotStep:
        obs, reward, terminated, truncated, info = self.venv.step(actions)
        episode_end = terminated | truncated
        final_obs = None
        if episode_end.any():
            final_info = info.get("final_info", {})
            if LIFE_LOSS in final_info:
                episode_end = episode_end & ~(final_info[LIFE_LOSS] & final_info[f"_{LIFE_LOSS}"])
            if truncated.any():
                final_obs = self._final_obs(info["final_obs"], np.flatnonzero(truncated))
        return SlotStep(
            flatten_obs(self.parts, obs),
            reward.astype(np.float32, copy=False),
            terminated,
            truncated,
            episode_end,
            final_obs,
        )

    def _final_obs(self, last: np.ndarray, envs: np.ndarray) -> Observation:
        """Per part, ``[B, ...]`` with the last observations of ``envs`` (an object array of single observations)."""
        out = {p.name: np.zeros((self.num_envs, *p.shape), p.dtype) for p in self.parts}
        for b in envs.tolist():
            for name, x in flatten_obs(self.parts, last[b]).items():
                out[name][b] = x
        return out

    def close(self) -> None:
        self.venv.close()


def make_slot(cfg: EnvConfig, num_envs: int, state: bool = False) -> Slot:
    """``num_envs`` environments as one slot: the backend ``env.backend`` names, and for ``gymnasium`` the one
    that fits what ``env.id`` makes (a PettingZoo ``ParallelEnv`` or ``AECEnv``, a VMAS env or an OpenSpiel game
    is a slot of every agent of every env, all of them one policy's).
    ``state``: observations also carry the env's global state (field ``state``; multi-agent envs only)."""
    return _make(cfg, num_envs, state)


def make_grouped(
    cfg: EnvConfig,
    num_envs: int,
    rules: Sequence[AgentRule] = (),
    state: Collection[str] = (),
    watch: Callable[[Any], Any] | None = None,
    members: Sequence[str] = (),
) -> GroupedSlot:
    """``num_envs`` environments as one slot whose agents ``rules`` split among policies (see
    :mod:`srl.api.config.policies`); ``state``: the policies whose observations carry the env's global state.
    ``members``: a population's members (``PopulationConfig.names``), which share the environments evenly
    (:class:`MemberSlot`); ``state`` then names members.
    ``watch``: wraps the first environment before the slot is built around it, so it sees that env's own steps
    and resets (the slot resets a finished episode within the step that ended it); evaluation films it so."""
    if members:  # member k of each policy plays the k-th share of the envs (its state: its policy's member 0's)
        bases = policy_names(rules, ())
        on_state = {b for j, b in enumerate(bases) if members[j] in state}
        inner = make_grouped(cfg, num_envs, rules, on_state, watch)
        assert [g.policy for g in inner.groups] == list(bases), f"groups {inner.groups} for policies {bases}"
        return MemberSlot(inner, members)
    if not rules:
        slot = _make(cfg, num_envs, bool(state), (), watch)
        return slot if isinstance(slot, ParallelSlot) else OneGroup(slot, DEFAULT_POLICY)
    slot = _make(cfg, num_envs, state, rules, watch)
    if isinstance(slot, ParallelSlot):
        return slot
    agents = getattr(slot, "agents", None)
    if agents is None:
        slot.close()
        raise ConfigError(f"agents: env {cfg.id!r} is a single-agent env; agents rules map a multi-agent env's agents")
    mapping = map_agents(rules, agents, cfg.id)
    return OneGroup(slot, next(iter(mapping))) if len(mapping) == 1 else SplitSlot(slot, mapping)


def _make(
    cfg: EnvConfig,
    num_envs: int,
    state: bool | Collection[str],
    rules: Sequence[AgentRule] = (),
    watch: Callable[[Any], Any] | None = None,
) -> Slot:
    """The slot backend that fits ``cfg`` (a ParallelSlot already split by ``rules``); the env's kind is read
    before ``watch`` wraps it, and ``watch`` wraps a Gymnasium env outermost (its time limit included)."""
    first = watch or (lambda made: made)
    if cfg.backend == "envpool":
        from srl.envs.envpool_slot import EnvPoolSlot

        if cfg.agent_id:
            raise ConfigError(f"env.agent_id: {cfg.id!r} is not a multi-agent env (EnvPool slots are single-agent)")
        slot: Slot = EnvPoolSlot(cfg, num_envs)
    else:
        env = create_env(cfg, num_envs)
        if is_aec_env(env) or is_openspiel_game(env):
            slot = TurnSlot(cfg, num_envs, first(env), lambda: create_env(cfg), cfg.agent_id)
            if state:
                slot.close()
                raise NoGlobalState(f"turn-based game {cfg.id!r} has no global state")
            return slot
        if is_parallel_env(env):
            return ParallelSlot(cfg, num_envs, first(env), lambda: create_env(cfg), state, cfg.agent_id, rules)
        if is_vmas_env(env):
            slot = VmasSlot(cfg.id, first(env), cfg.agent_id)
        elif isinstance(env, TextTask):
            if cfg.agent_id:
                raise ConfigError(f"env.agent_id: {cfg.id!r} is a text task, not a multi-agent env")
            slot = env
        else:
            if cfg.agent_id:
                env.close()
                raise ConfigError(f"env.agent_id: {cfg.id!r} is not a multi-agent env")
            slot = GymSlot(cfg, num_envs, first(wrap_env(cfg, env)))
    if state:
        slot.close()
        raise NoGlobalState(f"env {cfg.id!r} has no global state (a multi-agent env's state())")
    return slot


@dataclass(frozen=True)
class SlotSpaces:
    """What the streams need to know of an env, probed once."""

    obs: gym.spaces.Space
    """One column's observation space."""
    action: gym.spaces.Space
    agents: int
    """Columns (agents) per environment."""
    state: gym.spaces.Space | None
    """The global state space of a multi-agent env, or None."""
    alive: bool
    """Its steps say which agents acted (a multi-agent env whose agents may finish apart)."""
    turn_based: bool = False
    """A turn-based game (OpenSpiel, PettingZoo AEC): one player moves at a time."""


def probe_spaces(cfg: EnvConfig) -> SlotSpaces:
    """One column's spaces as the streams see them, probed through the configured slot backend (which itself
    validates the env and its options)."""
    slot = make_slot(cfg, 1)
    try:
        return SlotSpaces(
            slot.single_observation_space,
            slot.single_action_space,
            slot.agents_per_env,
            slot.state_space,
            bool(getattr(slot, "reports_alive", False)),
            isinstance(slot, TurnSlot) and not slot.games[0].simultaneous,
        )
    finally:
        slot.close()


@dataclass(frozen=True)
class ProbedGroups:
    """An env's policy groups as the streams see them, probed once (see :func:`probe_groups`)."""

    groups: tuple[SlotGroup, ...]
    agents_per_env: int
    """Columns (agents) per environment, every group's."""
    turn_based: bool


def probe_groups(
    cfg: EnvConfig, rules: Sequence[AgentRule] = (), state: Collection[str] = (), members: Sequence[str] = ()
) -> ProbedGroups:
    """Each policy's columns and spaces for ``rules`` (and a population's ``members``), probed through one slot
    (of one environment, or one per member index), which itself validates the env, its options and the rules."""
    slot = make_grouped(cfg, max(1, len(members) // len(policy_names(rules, ()))), rules, state, members=members)
    try:
        inner = slot.slot if isinstance(slot, (OneGroup, SplitSlot, MemberSlot)) else slot
        turn_based = isinstance(inner, TurnSlot) and not inner.games[0].simultaneous
        agents = sum(g.columns(slot.env_count) for g in slot.groups) // slot.env_count
        return ProbedGroups(slot.groups, agents, turn_based)
    finally:
        slot.close()
