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

Agents are the env's ``possible_agents``, in that order, and must have one
observation space and one action space (one shared policy). An agent that is
done while others go on, or that is not in the env yet, leaves its column idle
(zero observation and reward) and not ``alive``: segments carry which columns
acted (the ``alive`` field), and trainers learn from those steps only. Its
episode ends when the agent is done; the env's ends when every agent is.

The B environments are stepped in a loop, as Gymnasium's ``SyncVectorEnv``
steps single-agent ones; PettingZoo's own vectorization lives in another
package (SuperSuit) and is not needed for this.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from srl.api.config import ConfigError, EnvConfig
from srl.api.env import SlotStep
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
    """A PettingZoo ``ParallelEnv`` (checked without importing PettingZoo when it is not installed)."""
    try:
        from pettingzoo.utils.env import ParallelEnv
    except ImportError:
        return False
    return isinstance(env, ParallelEnv)


def agent_spaces(env: Any, name: str) -> tuple[list[str], gym.spaces.Space, gym.spaces.Space]:
    """The agents of a ParallelEnv and their one observation and action space (one line when they differ)."""
    agents = list(env.possible_agents)
    if not agents:
        raise ConfigError(f"env: {name!r} has no agents")
    obs_space, action_space = env.observation_space(agents[0]), env.action_space(agents[0])
    for agent in agents[1:]:
        if env.observation_space(agent) != obs_space or env.action_space(agent) != action_space:
            raise ConfigError(
                f"env: {name!r}: agent {agent!r} has other spaces than {agents[0]!r} "
                f"({env.observation_space(agent)}, {env.action_space(agent)}); agents sharing a policy need one"
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


class ParallelSlot:
    """B PettingZoo parallel environments, every agent a column; finished episodes reset within the step."""

    def __init__(
        self, cfg: EnvConfig, num_envs: int, first: Any, make: Any, state: bool = False, agent_id: bool = False
    ) -> None:
        """``first``: one environment already made (it is reused); ``make()`` makes the others; ``state``: carry
        the global state in every observation; ``agent_id``: and each column's agent index (:func:`seat_space`)."""
        self.envs = [first, *(make() for _ in range(num_envs - 1))]
        self.name = cfg.id
        self.state_space: gym.spaces.Space | None = global_state_space(first)
        if state and self.state_space is None:
            raise ConfigError(f"ppo.critic_input: state: env {cfg.id!r} has no global state (state_space, state())")
        self._state = state
        self.agents, self.single_observation_space, env_actions = agent_spaces(first, cfg.id)
        self.single_action_space, self._to_env = action_adapter(env_actions)
        self.agents_per_env = len(self.agents)
        self.num_envs = num_envs * self.agents_per_env
        self.parts = obs_parts(self.single_observation_space)  # as the env gives them; the seat is added after
        self._agent_id = agent_id
        if agent_id:
            self.single_observation_space = seat_space(self.single_observation_space, self.agents_per_env)
        self._reward = np.zeros(self.num_envs, np.float32)
        self._terminated = np.zeros(self.num_envs, bool)
        self._truncated = np.zeros(self.num_envs, bool)
        self._alive = np.ones(self.num_envs, bool)
        self._seed = 0

    def reset(self, seed: int) -> Observation:
        self._seed = seed
        for e, env in enumerate(self.envs):
            env.action_space(self.agents[0]).seed(seed + e)
        obs = self._stack([env.reset(seed=seed + e)[0] for e, env in enumerate(self.envs)])
        return self._with_state(obs, [env.state() for env in self.envs] if self._state else None)

    def step(self, actions: np.ndarray) -> SlotStep:
        N = self.agents_per_env
        actions = self._to_env(actions)
        per_env: list[dict[str, Any]] = []
        final: dict[int, dict[str, Any]] = {}
        states: list[np.ndarray] = []
        final_states: dict[int, np.ndarray] = {}
        self._reward[:] = 0.0
        self._terminated[:] = False
        self._truncated[:] = False
        alive = self._alive
        for e, env in enumerate(self.envs):
            live = set(env.agents)
            acts = {agent: actions[e * N + i] for i, agent in enumerate(self.agents) if agent in live}
            obs, reward, terminated, truncated, _ = env.step(acts)
            for i, agent in enumerate(self.agents):
                c = e * N + i
                alive[c] = agent in live
                if alive[c]:
                    self._reward[c] = reward.get(agent, 0.0)
                    self._terminated[c] = bool(terminated.get(agent, False))
                    self._truncated[c] = bool(truncated.get(agent, False)) and not self._terminated[c]
            if not env.agents:  # every agent is done: the episode ends, the env starts the next one
                final[e] = obs
                if self._state:
                    final_states[e] = env.state()
                self._seed += len(self.envs)
                obs = env.reset(seed=self._seed + e)[0]
            per_env.append(obs)
            if self._state:
                states.append(env.state())
        episode_end = self._terminated | self._truncated
        final_obs = None
        if self._truncated.any():  # an agent's last observation is in the obs of the step it ended in
            final_obs = self._with_state(
                self._stack([final.get(e, per_env[e]) for e in range(len(self.envs))]),
                [final_states.get(e, states[e]) for e in range(len(states))] if self._state else None,
            )
        return SlotStep(
            self._with_state(self._stack(per_env), states if self._state else None),
            self._reward.copy(),
            self._terminated.copy(),
            self._truncated.copy(),
            episode_end,
            final_obs,
            alive.copy(),
        )

    def _stack(self, per_env: list[dict[str, Any]]) -> Observation:
        """Per part ``[B * N, ...]`` from each environment's dict of agent observations (zeros for an agent that
        has none: it is done, or not in the env yet)."""
        rows = [obs.get(agent) for obs in per_env for agent in self.agents]
        if len(self.parts) == 1 and self.parts[0].name == "obs" and all(r is not None for r in rows):
            part = self.parts[0]
            try:
                return {"obs": np.asarray(rows, dtype=part.dtype).reshape(self.num_envs, *part.shape)}
            except ValueError:  # some agent's observation changed shape: the slow path names it
                pass
        out = {p.name: np.zeros((self.num_envs, *p.shape), p.dtype) for p in self.parts}
        N = self.agents_per_env
        for c, row in enumerate(rows):
            if row is not None:
                put_observation(self.parts, out, c, row, self.agents[c % N])
        return out

    def _with_state(self, obs: Observation, states: list[np.ndarray] | None) -> Observation:
        """``obs`` with each env's global state repeated for its agents (``[B * N, ...]``), when carried, and the
        agents' indices with ``env.agent_id``."""
        if self._agent_id:
            obs = with_seats(obs, self.agents_per_env)
        if states is not None:
            obs[STATE] = np.repeat(np.asarray(states, np.float32), self.agents_per_env, axis=0)
        return obs

    def close(self) -> None:
        for env in self.envs:
            env.close()
