"""Multi-agent environments for tests (PettingZoo ``ParallelEnv`` and ``AECEnv``; needs
``pip install -e '.[multiagent]'``)."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from pettingzoo.utils.env import AECEnv, ParallelEnv


class _Episodic(ParallelEnv):
    """What both test envs share: a seeded reset that starts every agent at step 0."""

    _rng: np.random.Generator
    _t: int

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._t = 0
        self._begin()
        return self._observe(), {a: {} for a in self.agents}

    def _begin(self) -> None:
        """Draw what a new episode starts with."""

    def _observe(self) -> dict[str, np.ndarray]:
        raise NotImplementedError


class CoopTargets(_Episodic):
    """A cooperative task for ``agents`` agents: each step every agent is shown its own target (one of ``n``,
    one-hot, plus a one-hot of its own index) and the team's reward is the fraction of agents that picked their
    target. ``state()`` is every agent's target (for a centralized critic). An episode is ``length`` steps; a
    random team scores ``length / n``, a perfect one ``length``.
    Every agent's observation is its own, so a run that mixed up which column is which agent could not learn.

    ``finish_early``: agent 0 is done after half the episode while the others go on (for the adapter's refusal).
    ``odd_spaces``: the last agent has a larger observation (for the refusal of agents with other spaces).
    ``shared_obs``: every agent sees the same observation, every agent's target side by side and no index, so
    only a policy that knows which agent it acts for (``env.agent_id``) can pick the right one.
    ``grow_at``: from this step of the first episode on, the last agent's observations have one more entry than
    its space (an env whose spaces change mid-run).
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "coop_targets_v0"}

    def __init__(
        self,
        agents: int = 2,
        n: int = 4,
        length: int = 8,
        finish_early: bool = False,
        odd_spaces: bool = False,
        grow_at: int | None = None,
        shared_obs: bool = False,
    ) -> None:
        self.grow_at, self._steps, self.shared_obs = grow_at, 0, shared_obs
        self.possible_agents = [f"agent_{i}" for i in range(agents)]
        self.agents: list[str] = []
        self.n, self.length, self.finish_early = n, length, finish_early
        size = agents * n if shared_obs else n + agents
        self._obs_spaces = {a: gym.spaces.Box(0.0, 1.0, (size,), np.float32) for a in self.possible_agents}
        if odd_spaces:
            self._obs_spaces[self.possible_agents[-1]] = gym.spaces.Box(0.0, 1.0, (size + 1,), np.float32)
        self.state_space = gym.spaces.Box(0.0, 1.0, (agents * n,), np.float32)
        self._rng = np.random.default_rng(0)
        self._targets = np.zeros(agents, np.int64)
        self._t = 0

    def state(self) -> np.ndarray:
        """The global state: every agent's target, one-hot, side by side."""
        out = np.zeros((len(self.possible_agents), self.n), np.float32)
        out[np.arange(len(self.possible_agents)), self._targets] = 1.0
        return out.reshape(-1)

    def observation_space(self, agent: str) -> gym.spaces.Space:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Discrete(self.n)

    def _observe(self) -> dict[str, np.ndarray]:
        if self.shared_obs:
            return {agent: self.state() for agent in self.agents}
        out = {}
        for i, agent in enumerate(self.agents):
            obs = np.zeros(self._obs_spaces[agent].shape, np.float32)
            if self.grow_at is not None and self._steps >= self.grow_at and agent == self.possible_agents[-1]:
                obs = np.zeros(obs.size + 1, np.float32)
            obs[self._targets[i]] = 1.0
            obs[self.n + i] = 1.0
            out[agent] = obs
        return out

    def _begin(self) -> None:
        self._targets = self._rng.integers(0, self.n, len(self.possible_agents))

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        hits = [int(actions[a]) == int(self._targets[i]) for i, a in enumerate(self.possible_agents) if a in actions]
        reward = float(np.mean(hits))
        self._t += 1
        self._steps += 1
        self._targets = self._rng.integers(0, self.n, len(self.possible_agents))
        done = self._t >= self.length
        terminated = {a: False for a in self.agents}
        truncated = {a: done for a in self.agents}
        if self.finish_early and self._t == self.length // 2:
            terminated[self.agents[0]] = True
        obs = self._observe()
        rewards = {a: reward for a in self.agents}
        infos: dict[str, dict] = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terminated[a] or truncated[a])]
        return obs, rewards, terminated, truncated, infos


def coop_targets(**kwargs: Any) -> CoopTargets:
    """``env.id: srl.envs.ma_testing:coop_targets``."""
    return CoopTargets(**kwargs)


class TwoStep(_Episodic):
    """The two-step cooperative game of the QMIX paper (Rashid et al. 2018, section 6.1), for two agents who both
    see which of three states they are in (one-hot; ``state()`` is the same). In the first state neither is paid
    and agent 0's action picks the next: ``2A`` pays 7 whatever both do, ``2B`` pays 0, 1, 1 or 8 as their actions
    are (0, 0), (0, 1), (1, 0) or (1, 1); then the episode ends. Both agents get the payoff. The best team goes to
    2B and scores 8; a team value that is a sum of the agents' values cannot represent 2B's payoffs well enough to
    prefer it to 7 (VDN), a monotonic mix can (QMIX)."""

    metadata: ClassVar[dict[str, Any]] = {"name": "two_step_v0"}
    PAYOFF_2B = ((0.0, 1.0), (1.0, 8.0))

    def __init__(self) -> None:
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        self._space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self.state_space = self._space
        self._rng = np.random.default_rng(0)
        self._state = 0
        self._t = 0

    def state(self) -> np.ndarray:
        return np.eye(3, dtype=np.float32)[self._state]

    def observation_space(self, agent: str) -> gym.spaces.Space:
        return self._space

    def action_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Discrete(2)

    def _begin(self) -> None:
        self._state = 0

    def _observe(self) -> dict[str, np.ndarray]:
        return {agent: self.state() for agent in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        first, second = int(actions["agent_0"]), int(actions["agent_1"])
        done = self._state != 0
        if done:
            reward = 7.0 if self._state == 1 else self.PAYOFF_2B[first][second]
        else:
            reward, self._state = 0.0, 1 + first
        obs = self._observe()
        agents = list(self.agents)
        if done:
            self.agents = []
        infos: dict[str, dict] = {a: {} for a in agents}
        return obs, dict.fromkeys(agents, reward), dict.fromkeys(agents, done), dict.fromkeys(agents, False), infos


def two_step() -> TwoStep:
    """``env.id: srl.envs.ma_testing:two_step``."""
    return TwoStep()


class TwoKinds(_Episodic):
    """Two kinds of agent with different spaces, for runs of several policies: ``reds`` red agents see their own
    target among 4 (``Box(4)``) and pick one of 4; ``blues`` blue agents see their target among 3 and two
    constant entries (``Box(5)``) and pick one of 3. Each agent is rewarded 1 for each hit of its own target.
    An episode is ``length`` steps: a random red scores ``length / 4``, a random blue ``length / 3``, a perfect
    agent ``length``. One policy cannot play both kinds (their spaces differ); each kind's policy must learn."""

    metadata: ClassVar[dict[str, Any]] = {"name": "two_kinds_v0"}

    def __init__(self, reds: int = 2, blues: int = 1, length: int = 8) -> None:
        self.possible_agents = [f"red_{i}" for i in range(reds)] + [f"blue_{i}" for i in range(blues)]
        self.agents: list[str] = []
        self.length = length
        self._n = {a: 4 if a.startswith("red") else 3 for a in self.possible_agents}
        self._rng = np.random.default_rng(0)
        self._targets: dict[str, int] = {}
        self._t = 0

    def observation_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Box(0.0, 1.0, (4 if self._n[agent] == 4 else 5,), np.float32)

    def action_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Discrete(self._n[agent])

    def _observe(self) -> dict[str, np.ndarray]:
        self._targets = {a: int(self._rng.integers(0, self._n[a])) for a in self.agents}
        out = {}
        for agent, target in self._targets.items():
            obs = np.zeros(4 if self._n[agent] == 4 else 5, np.float32)
            obs[target] = 1.0
            if self._n[agent] == 3:
                obs[3:] = 0.5
            out[agent] = obs
        return out

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        rewards = {a: float(int(actions[a]) == self._targets[a]) for a in self.agents}
        self._t += 1
        done = self._t >= self.length
        truncated = {a: done for a in self.agents}
        terminated = {a: False for a in self.agents}
        obs = self._observe()
        infos: dict[str, dict] = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terminated, truncated, infos


def two_kinds(**kwargs: Any) -> TwoKinds:
    """``env.id: srl.envs.ma_testing:two_kinds``."""
    return TwoKinds(**kwargs)


class StepCounters(_Episodic):
    """The memory probe's env (:class:`srl.system.testing.StepCounter`) with ``agents`` agents: each agent says
    who it is and how far into the episode it is, ``[uid, t]``, with a ``uid`` of its own drawn per episode, so a
    state carried into another agent's column shows. Every agent's episode ends together, after 3 to 9 steps,
    some by a time limit (truncated); with ``finish_early`` agent 0 is done after 2 steps and sits out the rest
    of the episode (no observation: an idle column), so its next episode must start from zeros again."""

    metadata: ClassVar[dict[str, Any]] = {"name": "step_counters_v0"}

    def __init__(self, agents: int = 3, finish_early: bool = False) -> None:
        self.finish_early = finish_early
        self.possible_agents = [f"agent_{i}" for i in range(agents)]
        self.agents: list[str] = []
        self._rng = np.random.default_rng(0)
        self._uids = np.zeros(agents, np.float32)
        self._t = self._length = 0

    def observation_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Box(0.0, np.inf, (2,), np.float32)

    def action_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Discrete(2)

    def _begin(self) -> None:
        self._uids = self._rng.integers(1, 1_000_000, len(self.possible_agents)).astype(np.float32)
        self._length = int(self._rng.integers(3, 10))

    def _observe(self) -> dict[str, np.ndarray]:
        return {a: np.array([self._uids[i], self._t], np.float32) for i, a in enumerate(self.possible_agents)}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self._t += 1
        end = self._t >= self._length
        truncated = end and self._length % 2 == 0
        agents = self.agents
        done = {a: end and not truncated for a in agents}
        if self.finish_early and self._t == 2 and not end and agents and agents[0] == self.possible_agents[0]:
            done[agents[0]] = True
        self.agents = [] if end else [a for a in agents if not done[a]]
        # a done agent's last observation only where its episode ended with everyone's (so its column shows
        # zeros from the step it finished in, as the rows after an end show the next episode's start)
        obs = {a: x for a, x in self._observe().items() if a in (agents if end else self.agents)}
        return obs, {a: 0.0 for a in agents}, done, {a: truncated for a in agents}, {a: {} for a in agents}


def step_counters(**kwargs: Any) -> StepCounters:
    """``env.id: srl.envs.ma_testing:step_counters``."""
    return StepCounters(**kwargs)


class MoveCounters(AECEnv):
    """The memory probe's turn-based game: two players move in turn, and each sees who it is and how many moves
    it has made in this game, ``[uid, moves]``, with a ``uid`` of its own drawn per game. A game lasts 3 to 9
    moves; an even length ends by a time limit (truncated). Wherever a policy's state is carried right, a
    player's state stands still while it waits for its turn: the state a step starts from is then ``[uid,
    moves]`` of its own observation (zeros before its first move)."""

    metadata: ClassVar[dict[str, Any]] = {"name": "move_counters_v0", "is_parallelizable": False}

    def __init__(self) -> None:
        super().__init__()
        self.possible_agents = ["player_0", "player_1"]
        self.agents: list[str] = []
        self._space = gym.spaces.Box(0.0, np.inf, (2,), np.float32)
        self._rng = np.random.default_rng(0)
        self._uids = np.zeros(2, np.float32)
        self._moves = np.zeros(2, np.float32)
        self._t = self._length = 0

    def observation_space(self, agent: str) -> gym.spaces.Space:
        return self._space

    def action_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._uids = self._rng.integers(1, 1_000_000, 2).astype(np.float32)
        self._moves[:] = 0.0
        self._t, self._length = 0, int(self._rng.integers(3, 10))
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos: dict[str, dict] = {a: {} for a in self.agents}
        self.agent_selection = self.agents[0]

    def observe(self, agent: str) -> np.ndarray:
        i = self.possible_agents.index(agent)
        return np.array([self._uids[i], self._moves[i]], np.float32)

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:  # a dead step: the agent leaves
            self.agents.remove(agent)
            if self.agents:
                self.agent_selection = self.agents[0]
            return
        self._moves[self.possible_agents.index(agent)] += 1.0
        self._t += 1
        if self._t >= self._length:
            done = self.truncations if self._length % 2 == 0 else self.terminations
            for a in self.agents:
                done[a] = True
        self.agent_selection = self.agents[1 - self.agents.index(agent)]


def move_counters() -> MoveCounters:
    """``env.id: srl.envs.ma_testing:move_counters``."""
    return MoveCounters()
