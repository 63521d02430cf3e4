"""Multi-agent environments as slots: each agent of each environment is one column of the slot.

A PettingZoo ``ParallelEnv`` with N agents, B of them in a slot, is a slot of
``B * N`` columns (environment-major: column ``e * N + i`` is agent ``i`` of
environment ``e``). Everything downstream (the segment pool, inference,
the trainer's batch, episode returns) sees columns and needs nothing more: with
every agent mapped to one shared policy this is parameter-shared independent
PPO, the way Sample Factory runs multi-agent envs. An episode's return is
reported per agent, so a run's return is the mean over agents. With ``env.agent_id``
each column also observes its agent's index (:func:`seat_space`).

With ``state``, each column's observation also carries the env's global state
(``env.state()``, field ``state``, the same for every agent of one env) for a
centralized critic (MAPPO); the acting policy never reads it.

Agents are the env's ``possible_agents``, in that order; the agents of one
policy must have one observation space and one action space. With ``agents``
rules that map them to several policies, each policy's agents are a group of
its own columns and spaces (``ParallelSlot.step_groups``). An agent that is
done while others go on, or that is not in the env yet, leaves its column idle
(zero observation and reward) and not ``alive``: segments carry which columns
acted (the ``alive`` field), and trainers learn from those steps only. Its
episode ends when the agent is done; the env's ends when every agent is.

The B environments are stepped in a loop, as Gymnasium's ``SyncVectorEnv``
steps single-agent ones; PettingZoo's own vectorization lives in another
package (SuperSuit) and is not needed for this.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from srl.api.config import ConfigError, EnvConfig
from srl.api.config.policies import AgentRule, map_agents
from srl.api.env import NoGlobalState, SlotGroup, SlotStep
from srl.api.plugins import instance_of
from srl.api.spaces import OBS, STATE, Observation, ObsPart, UnsupportedSpace, check_spaces, flatten_obs, obs_parts

AGENT = "agent"
"""Observation key of a column's agent index (``env.agent_id``): field ``obs.agent``, one-hot in the encoder."""


def seat_space(space: gym.spaces.Space, agents: int) -> gym.spaces.Dict:
    """One agent's observation space with its index among ``agents`` under the key ``agent`` (``env.agent_id``);
    a space that is not a Dict moves to the key ``observation``."""
    base = dict(space.spaces) if isinstance(space, gym.spaces.Dict) else {"observation": space}
    return gym.spaces.Dict({**base, AGENT: gym.spaces.Discrete(agents)})


def with_seats(obs: Observation, agents: int) -> Observation:
    """Columns' observation parts (``[B * agents, ...]``, env-major) as :func:`seat_space` lays them out: each
    column's agent index added, a plain observation moved from ``obs`` to ``obs.observation``."""
    out = dict(obs)
    if OBS in out:
        out[f"{OBS}.observation"] = out.pop(OBS)
    rows = len(next(iter(obs.values())))
    out[f"{OBS}.{AGENT}"] = np.tile(np.arange(agents, dtype=np.int64), rows // agents)
    return out


def is_parallel_env(env: Any) -> bool:
    """A PettingZoo ``ParallelEnv`` (checked without importing PettingZoo)."""
    return instance_of(env, "pettingzoo.utils.env", "ParallelEnv")


def agent_spaces(
    env: Any, name: str, agents: Sequence[str] | None = None
) -> tuple[list[str], gym.spaces.Space, gym.spaces.Space]:
    """The agents of a ParallelEnv (or those of them given, one policy's) and their one observation and action
    space (one line when they differ)."""
    agents = list(env.possible_agents if agents is None else agents)
    if not agents:
        raise ConfigError(f"env: {name!r} has no agents")
    obs_space, action_space = env.observation_space(agents[0]), env.action_space(agents[0])
    for agent in agents[1:]:
        if env.observation_space(agent) != obs_space or env.action_space(agent) != action_space:
            raise ConfigError(
                f"env: {name!r}: agent {agent!r} has other spaces than {agents[0]!r} "
                f"({env.observation_space(agent)}, {env.action_space(agent)}); agents sharing a policy need one "
                "(map them to several: agents rules)"
            )
    try:
        check_spaces(obs_space, action_space)
    except UnsupportedSpace as exc:
        raise ConfigError(f"env: {name!r} {exc}") from None
    return agents, obs_space, action_space


def global_state_space(env: Any) -> gym.spaces.Space | None:
    """A ParallelEnv's global state space (PettingZoo's ``state_space`` with ``state()``), when it is a Box."""
    space = getattr(env, "state_space", None)
    return space if isinstance(space, gym.spaces.Box) and callable(getattr(env, "state", None)) else None


def action_adapter(space: gym.spaces.Space) -> tuple[gym.spaces.Space, Any]:
    """What the policy samples and how the env gets it: Box actions clipped to the bounds, Discrete and
    MultiDiscrete ones shifted by their ``start`` (as ``envs.factory`` wraps single-agent envs)."""
    if isinstance(space, gym.spaces.Box):
        low, high = space.low, space.high
        return space, lambda a: np.clip(a, low, high)
    if isinstance(space, gym.spaces.Discrete) and int(space.start) != 0:
        start = int(space.start)
        return gym.spaces.Discrete(int(space.n)), lambda a: a + start
    if isinstance(space, gym.spaces.MultiDiscrete) and np.any(space.start != 0):
        start_v = space.start
        return gym.spaces.MultiDiscrete(space.nvec), lambda a: a + start_v
    return space, lambda a: a


def put_observation(parts: tuple[ObsPart, ...], out: Observation, row: int, obs: Any, agent: str) -> None:
    """``agent``'s observation into row ``row`` of ``out``; one line naming the agent and the part when it does
    not fit the space the run was built for (an env whose agents' spaces change mid-run)."""
    for part, (name, x) in zip(parts, flatten_obs(parts, obs).items()):
        if np.shape(x) != part.shape:
            raise ValueError(
                f"agent {agent!r}: observation {name!r} of shape {np.shape(x)}, but its space has "
                f"{part.shape} (an agent's spaces must not change during a run)"
            )
        out[name][row] = x


class _Group:
    """One policy's agents in a :class:`ParallelSlot`: their spaces, and their columns' step arrays."""

    def __init__(self, env: Any, name: str, policy: str, agents: tuple[str, ...], B: int, state: bool, seat: bool):
        self.policy, self.agents, self.n = policy, agents, len(agents)
        _, obs_space, env_actions = agent_spaces(env, name, agents)
        self.action_space, self.to_env = action_adapter(env_actions)
        self.parts = obs_parts(obs_space)  # as the env gives them; the seat is added after
        self.observation_space = seat_space(obs_space, self.n) if seat else obs_space
        self.state, self.seat = state, seat
        self.columns = B * self.n
        self.reward = np.zeros(self.columns, np.float32)
        self.terminated = np.zeros(self.columns, bool)
        self.truncated = np.zeros(self.columns, bool)
        self.alive = np.ones(self.columns, bool)

    def clear(self) -> None:
        self.reward[:] = 0.0
        self.terminated[:] = False
        self.truncated[:] = False


class ParallelSlot:
    """B PettingZoo parallel environments, every agent a column; finished episodes reset within the step.

    The agents may be split among several policies (``agents`` rules): each policy's agents are a group with
    its own spaces and its own columns (:class:`~srl.api.env.GroupedSlot`); with one group it is also a plain
    :class:`~srl.api.env.Slot`."""

    reports_alive = True

    def __init__(
        self,
        cfg: EnvConfig,
        num_envs: int,
        first: Any,
        make: Any,
        state: bool | Collection[str] = False,
        agent_id: bool = False,
        rules: Sequence[AgentRule] = (),
    ) -> None:
        """``first``: one environment already made (it is reused); ``make()`` makes the others; ``state``: carry
        the global state in the observations (of every group, or of the policies named); ``agent_id``: and each
        column's agent index within its group (:func:`seat_space`); ``rules``: which policy plays each agent."""
        self.envs = [first, *(make() for _ in range(num_envs - 1))]
        self.name = cfg.id
        self.state_space: gym.spaces.Space | None = global_state_space(first)
        self.agents = list(first.possible_agents)
        if not self.agents:
            raise ConfigError(f"env: {cfg.id!r} has no agents")
        mapping = map_agents(rules, self.agents, cfg.id)
        wants = set(mapping) if state is True else set() if state is False else set(state)
        if wants and self.state_space is None:
            raise NoGlobalState(f"env {cfg.id!r} has no global state (state_space, state())")
        self._groups = [
            _Group(first, cfg.id, policy, ids, num_envs, policy in wants, agent_id) for policy, ids in mapping.items()
        ]
        self.groups = tuple(
            SlotGroup(
                g.policy, g.agents, g.observation_space, g.action_space, self.state_space if g.state else None, True
            )
            for g in self._groups
        )
        one = self._groups[0]  # the plain Slot view (one group)
        self.single_observation_space, self.single_action_space = one.observation_space, one.action_space
        self.agents_per_env, self.num_envs = one.n, one.columns
        self.env_count = num_envs
        self._seed = 0

    def reset(self, seed: int) -> Observation:
        return self.reset_groups(seed)[0]

    def step(self, actions: np.ndarray) -> SlotStep:
        return self.step_groups([actions])[0]

    def reset_groups(self, seed: int) -> list[Observation]:
        self._seed = seed
        for e, env in enumerate(self.envs):
            for g in self._groups:
                env.action_space(g.agents[0]).seed(seed + e)
        per_env = [env.reset(seed=seed + e)[0] for e, env in enumerate(self.envs)]
        states = [env.state() for env in self.envs] if any(g.state for g in self._groups) else []
        return [self._observation(g, per_env, states) for g in self._groups]

    def step_groups(self, actions: Sequence[np.ndarray]) -> list[SlotStep]:
        assert len(actions) == len(self._groups), "one action batch per group"
        env_actions = [g.to_env(a) for g, a in zip(self._groups, actions)]
        per_env: list[dict[str, Any]] = []
        final: dict[int, dict[str, Any]] = {}
        states: list[np.ndarray] = []
        final_states: dict[int, np.ndarray] = {}
        carry_state = any(g.state for g in self._groups)
        for g in self._groups:
            g.clear()
        for e, env in enumerate(self.envs):
            live = set(env.agents)
            acts = {
                agent: a[e * g.n + j]
                for g, a in zip(self._groups, env_actions)
                for j, agent in enumerate(g.agents)
                if agent in live
            }
            obs, reward, terminated, truncated, _ = env.step(acts)
            for g in self._groups:
                for j, agent in enumerate(g.agents):
                    c = e * g.n + j
                    g.alive[c] = agent in live
                    if g.alive[c]:
                        g.reward[c] = reward.get(agent, 0.0)
                        g.terminated[c] = bool(terminated.get(agent, False))
                        g.truncated[c] = bool(truncated.get(agent, False)) and not g.terminated[c]
            if not env.agents:  # every agent is done: the episode ends, the env starts the next one
                final[e] = obs
                if carry_state:
                    final_states[e] = env.state()
                self._seed += len(self.envs)
                obs = env.reset(seed=self._seed + e)[0]
            per_env.append(obs)
            if carry_state:
                states.append(env.state())
        steps = []
        for g in self._groups:
            final_obs = None
            if g.truncated.any():  # an agent's last observation is in the obs of the step it ended in
                last = [final.get(e, per_env[e]) for e in range(len(self.envs))]
                final_obs = self._observation(g, last, [final_states.get(e, s) for e, s in enumerate(states)])
            steps.append(
                SlotStep(
                    self._observation(g, per_env, states),
                    g.reward.copy(),
                    g.terminated.copy(),
                    g.truncated.copy(),
                    g.terminated | g.truncated,
                    final_obs,
                    g.alive.copy(),
                )
            )
        return steps

    def _observation(self, g: _Group, per_env: list[dict[str, Any]], states: list[np.ndarray]) -> Observation:
        """Group ``g``'s observation parts ``[B * n, ...]`` from each environment's dict of agent observations
        (zeros for an agent that has none: it is done, or not in the env yet), with each env's global state
        repeated for its agents when the group carries it, and the agents' indices with ``env.agent_id``."""
        obs = self._stack(g, per_env)
        if g.seat:
            obs = with_seats(obs, g.n)
        if g.state:
            obs[STATE] = np.repeat(np.asarray(states, np.float32), g.n, axis=0)
        return obs

    def _stack(self, g: _Group, per_env: list[dict[str, Any]]) -> Observation:
        rows = [obs.get(agent) for obs in per_env for agent in g.agents]
        if len(g.parts) == 1 and g.parts[0].name == "obs" and all(r is not None for r in rows):
            part = g.parts[0]
            try:
                return {"obs": np.asarray(rows, dtype=part.dtype).reshape(g.columns, *part.shape)}
            except ValueError:  # some agent's observation changed shape: the slow path names it
                pass
        out = {p.name: np.zeros((g.columns, *p.shape), p.dtype) for p in g.parts}
        for c, row in enumerate(rows):
            if row is not None:
                put_observation(g.parts, out, c, row, g.agents[c % g.n])
        return out

    def close(self) -> None:
        for env in self.envs:
            env.close()


class SplitSlot:
    """A multi-agent slot whose agents share one space, its columns split among several policies (VMAS worlds,
    turn-based games): one gather per group and field, one scatter of the groups' actions."""

    def __init__(self, slot: Any, mapping: Mapping[str, Sequence[str]]) -> None:
        """``mapping``: policy -> the agent ids it plays (:func:`~srl.api.config.policies.map_agents`)."""
        self.slot = slot
        N = slot.agents_per_env
        self.env_count = B = slot.num_envs // N
        agents = list(slot.agents)
        alive = bool(getattr(slot, "reports_alive", False))
        self.groups = tuple(
            SlotGroup(p, tuple(ids), slot.single_observation_space, slot.single_action_space, slot.state_space, alive)
            for p, ids in mapping.items()
        )
        seats = [np.array([agents.index(a) for a in ids]) for ids in mapping.values()]
        self._cols = [(np.arange(B)[:, None] * N + s[None, :]).reshape(-1) for s in seats]
        self._actions: np.ndarray | None = None

    def reset_groups(self, seed: int) -> list[Observation]:
        obs = self.slot.reset(seed)
        return [{k: v[cols] for k, v in obs.items()} for cols in self._cols]

    def step_groups(self, actions: Sequence[np.ndarray]) -> list[SlotStep]:
        if self._actions is None:
            first = np.asarray(actions[0])
            self._actions = np.zeros((self.slot.num_envs, *first.shape[1:]), first.dtype)
        for cols, a in zip(self._cols, actions):
            self._actions[cols] = a
        step = self.slot.step(self._actions)
        return [step.columns(cols) for cols in self._cols]

    def close(self) -> None:
        self.slot.close()
