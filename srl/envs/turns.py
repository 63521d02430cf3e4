"""Turn-based games as slots: OpenSpiel games and PettingZoo ``AECEnv``s, every player of every game a column.

B games of N players are ``B * N`` columns (game-major, as in
:mod:`srl.envs.multiagent`). At each step of the slot every game makes one
move: the player to move acts (its column is ``alive``), the others wait. A
waiting column still observes the game and receives its rewards (the
opponent's winning move pays -1 to the one who waits), so from each player's
side the game is one MDP in which some steps ignore its action; trainers fit
the critic on every step and the policy on the steps acted in (see
:class:`srl.algorithms.ppo.PPO`). A simultaneous-move OpenSpiel game has every
player act at once; chance nodes are sampled in the slot.

Observations are a Dict: ``observation`` (the game's observation tensor) and
``action_mask`` (1 for legal moves). A waiting column's mask allows every
move: the action sampled there is never played. A player who leaves a game
before its end (a PettingZoo AEC agent terminated early) idles, as in
:class:`~srl.envs.multiagent.ParallelSlot`. With ``env.agent_id`` each column
also sees which player it is (field ``obs.agent``, one-hot in the encoder):
the switch that lets one shared policy play every seat of a game whose
observation does not say whose turn it is (OpenSpiel's connect_four).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from srl.api.config import ConfigError, EnvConfig
from srl.api.env import SlotStep
from srl.api.plugins import instance_of
from srl.api.spaces import ACTION_MASK, GAME_HISTORY, Observation, UnsupportedSpace, check_spaces, obs_parts
from srl.envs.multiagent import AGENT, put_observation, seat_space

MASK_KEY = ACTION_MASK.split(".", 1)[1]
"""The Dict key of the legal-move mask (``action_mask``, as PettingZoo's classic games name it)."""


class Game(Protocol):
    """One turn-based game as :class:`TurnSlot` plays it."""

    players: list[str]
    observation_space: gym.spaces.Dict
    """One player's observation, ``action_mask`` among its keys when the game has legal moves."""
    action_space: gym.spaces.Discrete
    simultaneous: bool
    """Every player moves at once (else one player per move)."""

    def reset(self, seed: int) -> None: ...

    def to_move(self) -> list[int]:
        """The players who act now (one, or every player still in a simultaneous move)."""

    def observe(self, player: int) -> dict[str, np.ndarray]:
        """``player``'s observation now, including its legal-move mask."""

    def play(self, moves: dict[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Make the move; every player's reward, and whether it terminated or was truncated, ``[N]`` each."""

    def over(self) -> bool:
        """Every player is done: the game is finished."""

    def close(self) -> None: ...


HISTORY_KEY = GAME_HISTORY.split(".", 1)[1]
"""The Dict key of a game's history (``srl.envs.turns:game`` with ``history: true``): the observer's seat, then the
game's actions so far (chance outcomes included), -1 after them. A search rebuilds the game from it."""


@dataclass(frozen=True)
class SeatedGame:
    """An OpenSpiel game with options of ``srl.envs.turns:game``: its observation planes ``planes`` (one per
    player, in player order; ``seat_planes``) rotated so that every player sees its own plane first, and with
    ``history`` its history in every observation (:data:`HISTORY_KEY`)."""

    game: Any
    planes: tuple[int, ...] = ()
    history: bool = False


def is_openspiel_game(env: Any) -> bool:
    return isinstance(env, SeatedGame) or instance_of(env, "pyspiel", "Game")


def is_aec_env(env: Any) -> bool:
    return instance_of(env, "pettingzoo.utils.env", "AECEnv")


def game(name: str, seat_planes: list[int] | None = None, history: bool = False, **params: Any) -> Any:
    """``env.id: srl.envs.turns:game`` with ``env.kwargs: {name: connect_four, ...game parameters}``: an
    OpenSpiel game by its short name.

    ``seat_planes``: for board games whose observation tensor has one plane of pieces per player (OpenSpiel's
    are the same for every observer): those planes, in player order (``[0, 1]`` for connect_four, whose planes
    are x, o, empty). Each player then sees its own pieces in the first of them and its opponent's next, so
    one shared policy learns each pattern once for every seat. ``history``: every observation also carries the
    observer's seat and the game's history (:data:`HISTORY_KEY`), from which a search rebuilds the game."""
    try:
        import pyspiel
    except ImportError:
        raise ConfigError("env: OpenSpiel games need open_spiel (pip install 'srl[multiagent]')") from None
    try:
        loaded = pyspiel.load_game(name, params) if params else pyspiel.load_game(name)
    except pyspiel.SpielError as exc:
        raise ConfigError(f"env.kwargs.name: {name!r}: {exc}") from None
    if seat_planes is None:
        return SeatedGame(loaded, history=True) if history else loaded
    planes = tuple(int(p) for p in seat_planes)
    shape = loaded.observation_tensor_shape() if loaded.get_type().provides_observation_tensor else []
    if len(shape) != 3 or len(planes) != loaded.num_players() or any(not 0 <= p < shape[0] for p in planes):
        raise ConfigError(
            f"env.kwargs.seat_planes: {list(planes)}: {name!r} needs one plane index per player "
            f"({loaded.num_players()}) of its [planes, H, W] observation {list(shape)}"
        )
    return SeatedGame(loaded, planes, bool(history))


class OpenSpielGame:
    """One OpenSpiel game (sequential or simultaneous, with chance nodes) behind the :class:`Game` protocol."""

    def __init__(self, spiel_game: Any, name: str) -> None:
        import pyspiel

        self._spiel = pyspiel
        self._planes: tuple[int, ...] | None = None
        self._history = 0  # its length in observations (0: none)
        if isinstance(spiel_game, SeatedGame):
            self._planes = spiel_game.planes or None
            self._history = 1 + spiel_game.game.max_history_length() if spiel_game.history else 0
            spiel_game = spiel_game.game
        kind = spiel_game.get_type()
        if kind.dynamics not in (pyspiel.GameType.Dynamics.SEQUENTIAL, pyspiel.GameType.Dynamics.SIMULTANEOUS):
            raise ConfigError(f"env: OpenSpiel game {name!r} has {kind.dynamics} dynamics; sequential or simultaneous")
        if kind.provides_observation_tensor:
            self._tensor, shape = "observation_tensor", spiel_game.observation_tensor_shape()
        elif kind.provides_information_state_tensor:
            self._tensor, shape = "information_state_tensor", spiel_game.information_state_tensor_shape()
        else:
            raise ConfigError(f"env: OpenSpiel game {name!r} has no observation tensor")
        self.game = spiel_game
        self.simultaneous = kind.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS
        self.players = [f"player_{i}" for i in range(spiel_game.num_players())]
        A = spiel_game.num_distinct_actions()
        self.action_space = gym.spaces.Discrete(A)
        parts: dict[str, gym.spaces.Space] = {
            "observation": gym.spaces.Box(-np.inf, np.inf, tuple(shape), np.float32),
            MASK_KEY: gym.spaces.Box(0, 1, (A,), np.int8),
        }
        if self._history:
            top = max(A, spiel_game.max_chance_outcomes(), spiel_game.num_players())
            parts[HISTORY_KEY] = gym.spaces.Box(-1, top, (self._history,), np.int32)
        self.observation_space = gym.spaces.Dict(parts)
        self._shape = tuple(shape)
        self._rng = np.random.default_rng(0)
        self.state: Any = None

    def reset(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self.state = self.game.new_initial_state()
        self._chance()

    def _chance(self) -> None:
        """Play chance nodes until a player is to move (or the game ends)."""
        while self.state.is_chance_node():
            outcomes, probs = zip(*self.state.chance_outcomes())
            self.state.apply_action(int(outcomes[self._rng.choice(len(outcomes), p=np.asarray(probs))]))

    def to_move(self) -> list[int]:
        if self.state.is_terminal():
            return []
        player = self.state.current_player()
        if player == self._spiel.PlayerId.SIMULTANEOUS:
            return list(range(len(self.players)))
        return [int(player)]

    def observe(self, player: int) -> dict[str, np.ndarray]:
        obs = np.asarray(getattr(self.state, self._tensor)(player), np.float32).reshape(self._shape)
        if self._planes is not None and player:  # the player's own plane first, then the next players' in turn
            order = np.arange(self._shape[0])
            n = len(self._planes)
            order[list(self._planes)] = [self._planes[(player + i) % n] for i in range(n)]
            obs = obs[order]
        seen = {"observation": obs, MASK_KEY: np.asarray(self.state.legal_actions_mask(player), np.int8)}
        if self._history:
            moves = self.state.history()
            history = np.full(self._history, -1, np.int32)
            history[0], history[1 : 1 + len(moves)] = player, moves
            seen[HISTORY_KEY] = history
        return seen

    def play(self, moves: dict[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.state.current_player() == self._spiel.PlayerId.SIMULTANEOUS:
            self.state.apply_actions([moves[p] for p in range(len(self.players))])
        else:
            ((_, move),) = moves.items()
            self.state.apply_action(move)
        self._chance()
        rewards = np.asarray(self.state.rewards(), np.float32)
        done = np.full(len(self.players), self.state.is_terminal())
        return rewards, done, np.zeros_like(done)

    def over(self) -> bool:
        return bool(self.state.is_terminal())

    def close(self) -> None:
        self.state = None


class AecGame:
    """One PettingZoo ``AECEnv`` behind the :class:`Game` protocol; agents done early are stepped out as
    PettingZoo asks (a ``None`` action)."""

    def __init__(self, env: Any, name: str) -> None:
        self.env = env
        self.simultaneous = False
        self.players = list(env.possible_agents)
        if not self.players:
            raise ConfigError(f"env: {name!r} has no agents")
        first = self.players[0]
        obs_space, action_space = env.observation_space(first), env.action_space(first)
        for agent in self.players[1:]:
            if env.observation_space(agent) != obs_space or env.action_space(agent) != action_space:
                raise ConfigError(
                    f"env: {name!r}: agent {agent!r} has other spaces than {first!r}; agents sharing a policy need one"
                )
        if not isinstance(action_space, gym.spaces.Discrete) or int(action_space.start) != 0:
            raise ConfigError(f"env: {name!r}: turn-based envs need Discrete actions from 0, got {action_space}")
        self.action_space = action_space
        self.observation_space = (
            obs_space if isinstance(obs_space, gym.spaces.Dict) else gym.spaces.Dict({"observation": obs_space})
        )
        self._index = {agent: i for i, agent in enumerate(self.players)}

    def reset(self, seed: int) -> None:
        self.env.reset(seed=seed)
        self._skip_done()

    def _skip_done(self) -> None:
        """Step out agents that are done (PettingZoo's dead steps), so the selected agent is one that acts."""
        env = self.env
        while env.agents and (env.terminations[env.agent_selection] or env.truncations[env.agent_selection]):
            env.step(None)

    def to_move(self) -> list[int]:
        return [self._index[self.env.agent_selection]] if self.env.agents else []

    def observe(self, player: int) -> dict[str, np.ndarray]:
        obs = self.env.observe(self.players[player])
        return obs if isinstance(obs, dict) else {"observation": obs}

    def play(self, moves: dict[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ((_, move),) = moves.items()
        env = self.env
        env.step(move)
        N = len(self.players)
        rewards, terminated, truncated = np.zeros(N, np.float32), np.zeros(N, bool), np.zeros(N, bool)
        for agent, i in self._index.items():
            rewards[i] = env.rewards.get(agent, 0.0)
            terminated[i] = bool(env.terminations.get(agent, False))
            truncated[i] = bool(env.truncations.get(agent, False)) and not terminated[i]
        self._skip_done()
        return rewards, terminated, truncated

    def over(self) -> bool:
        return not self.env.agents

    def close(self) -> None:
        self.env.close()


class TurnSlot:
    """B turn-based games, every player a column; finished games restart within the step."""

    reports_alive = True

    def __init__(self, cfg: EnvConfig, num_envs: int, first: Any, make: Any, agent_id: bool = False) -> None:
        """``first``: what ``env.id`` made (an OpenSpiel game or an AEC env, reused); ``make()`` makes another."""
        wrap = _wrapper(first, cfg.id)
        if is_openspiel_game(first):  # one Game object serves every state
            self.games = [wrap(first, cfg.id) for _ in range(num_envs)]
        else:
            self.games = [wrap(first, cfg.id), *(wrap(make(), cfg.id) for _ in range(num_envs - 1))]
        one = self.games[0]
        self.name = cfg.id
        self.agents = one.players
        self.agents_per_env = N = len(one.players)
        self.num_envs = num_envs * N
        self.state_space: gym.spaces.Space | None = None
        self._agent_id = agent_id
        self.single_observation_space: gym.spaces.Space = (
            seat_space(one.observation_space, N) if agent_id else one.observation_space
        )
        self.single_action_space: gym.spaces.Space = one.action_space
        try:
            check_spaces(self.single_observation_space, self.single_action_space)
        except UnsupportedSpace as exc:
            raise ConfigError(f"env: {cfg.id!r} {exc}") from None
        self.parts = obs_parts(self.single_observation_space)
        self.mask = ACTION_MASK if any(p.name == ACTION_MASK for p in self.parts) else None
        self._out = np.zeros(self.num_envs, bool)  # players who left their game before its end
        self._seed = 0

    def reset(self, seed: int) -> Observation:
        self._seed = seed
        self._out[:] = False
        for e, g in enumerate(self.games):
            g.reset(seed + e)
        return self._observe()

    def step(self, actions: np.ndarray) -> SlotStep:
        N = self.agents_per_env
        reward = np.zeros(self.num_envs, np.float32)
        terminated = np.zeros(self.num_envs, bool)
        truncated = np.zeros(self.num_envs, bool)
        alive = np.zeros(self.num_envs, bool)
        final: dict[int, dict[int, dict[str, np.ndarray]]] = {}
        for e, g in enumerate(self.games):
            cols = slice(e * N, (e + 1) * N)
            movers = g.to_move()
            alive[[e * N + p for p in movers]] = True
            r, term, trunc = g.play({p: int(actions[e * N + p]) for p in movers})
            live = ~self._out[cols]
            reward[cols] = np.where(live, r, 0.0)
            terminated[cols], truncated[cols] = term & live, trunc & live
            self._out[cols] |= term | trunc
            if g.over():
                if truncated[cols].any():  # a time limit cut the game: keep the last observations to bootstrap
                    final[e] = {p: g.observe(p) for p in range(N)}
                self._seed += len(self.games)
                g.reset(self._seed + e)
                self._out[cols] = False
        episode_end = terminated | truncated
        final_obs = None
        if truncated.any():
            final_obs = self._observe(final)
        return SlotStep(self._observe(), reward, terminated, truncated, episode_end, final_obs, alive)

    def _observe(self, final: dict[int, dict[int, dict[str, np.ndarray]]] | None = None) -> Observation:
        """Per part ``[B * N, ...]``: each column's observation (zeros for a player out of its game)."""
        out = self.blank(self.num_envs)
        N = self.agents_per_env
        for e, g in enumerate(self.games):
            if final is not None and e not in final:
                continue
            movers = g.to_move()
            for p in range(N):
                c = e * N + p
                if final is None and self._out[c]:
                    continue
                self.write(out, c, final[e][p] if final is not None else g.observe(p), p, p in movers)
        return out

    def blank(self, rows: int) -> Observation:
        """Zeroed observation parts for ``rows`` columns."""
        return {p.name: np.zeros((rows, *p.shape), p.dtype) for p in self.parts}

    def write(self, out: Observation, row: int, obs: dict[str, Any], player: int, moving: bool) -> None:
        """Player ``player``'s observation ``obs`` into row ``row`` of ``out``, with its seat (``env.agent_id``);
        a player that does not move now may pick any action (it is not played)."""
        if self._agent_id:
            obs = {**obs, AGENT: player}
        put_observation(self.parts, out, row, obs, self.agents[player])
        if self.mask is not None and not moving:
            out[self.mask][row] = 1

    def close(self) -> None:
        for g in self.games:
            g.close()


def _wrapper(env: Any, name: str) -> Any:
    if is_openspiel_game(env):
        return OpenSpielGame
    if is_aec_env(env):
        return AecGame
    raise ConfigError(f"env: {name!r} is neither an OpenSpiel game nor a PettingZoo AECEnv")
