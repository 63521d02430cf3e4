"""The real game as a search's model (AlphaZero): each position rebuilt from its observation, its children stepped.

An OpenSpiel game made with ``env.kwargs.history: true`` (:func:`srl.envs.turns.game`) puts the observer's seat and
the game's history in every observation, so whoever holds the network (a policy worker, batching the rows of many
actors; an actor acting inline) rebuilds each position itself and searches on copies of it: no game object crosses
a process. The children's observations are the env's own (:class:`srl.envs.turns.OpenSpielGame` observes them, with the
mover's seat where ``env.agent_id`` adds it), so the network sees in the search what it sees in play.

Two-player zero-sum games of alternate moves (or one-player games): a child's value changes sides when the player
to move changes (discount -1), and a move's reward is the mover's. A chance node met in the search is sampled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from srl.api.config import ConfigError, EnvConfig
from srl.api.config.search import SearchConfig
from srl.envs.multiagent import AGENT
from srl.envs.turns import HISTORY_KEY, MASK_KEY, OpenSpielGame, SeatedGame, game
from srl.search.tree import Searched, Trees

GAME_ID = "srl.envs.turns:game"


@dataclass
class Children:
    """A batch of positions one move below others: the new states, their observations (the player to move's, by
    part), legal moves, the move's reward and discount, and whether the game ended."""

    states: list[Any]
    obs: dict[str, np.ndarray]
    legal: np.ndarray
    rewards: np.ndarray
    discounts: np.ndarray
    terminal: np.ndarray


class GameModel:
    """Rebuilds and steps positions of the game ``env`` makes (one line when it cannot be searched on)."""

    def __init__(self, env: EnvConfig) -> None:
        import pyspiel

        if env.id != GAME_ID:
            raise ConfigError(
                f"env.id: {env.id!r}: AlphaZero searches on the real game: it needs an OpenSpiel game ({GAME_ID})"
            )
        made = game(**env.kwargs)
        if not isinstance(made, SeatedGame) or not made.history:
            raise ConfigError("env.kwargs.history: AlphaZero rebuilds each position from its history: set it true")
        spiel = made.game
        kind = spiel.get_type()
        if kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL or spiel.num_players() > 2:
            raise ConfigError(
                f"env.kwargs.name: {spiel.get_type().short_name!r}: AlphaZero searches games of one or two players "
                "who move in turn"
            )
        if spiel.num_players() == 2 and kind.utility != pyspiel.GameType.Utility.ZERO_SUM:
            raise ConfigError(
                f"env.kwargs.name: {spiel.get_type().short_name!r}: a game of two players must be zero-sum for "
                "its values to change sides"
            )
        self.spiel = spiel
        self.view = OpenSpielGame(made, env.id)
        self.actions = spiel.num_distinct_actions()
        self.players = spiel.num_players()
        self._parts = {k: (tuple(space.shape or ()), space.dtype) for k, space in self.view.observation_space.items()}
        if env.agent_id:  # each observation says whose it is (env.agent_id): a child's says its mover's
            self._parts[AGENT] = ((), np.dtype(np.int64))

    def roots(self, history: np.ndarray) -> tuple[list[Any], np.ndarray]:
        """The positions of a batch of observations' histories ``[N, L]``, and which rows are the observer's
        move (the others are a seat waiting for the opponent: nothing to search)."""
        states, to_move = [], np.zeros(len(history), bool)
        for i, row in enumerate(np.asarray(history)):
            state = self.spiel.new_initial_state()
            for move in row[1:][row[1:] >= 0]:
                state.apply_action(int(move))
            states.append(state)
            to_move[i] = not state.is_terminal() and state.current_player() == int(row[0])
        return states, to_move

    def step(self, states: list[Any], actions: np.ndarray, rng: np.random.Generator) -> Children:
        """Each state's child after its action (a chance node after it sampled)."""
        n = len(states)
        obs = {k: np.zeros((n, *shape), dtype) for k, (shape, dtype) in self._parts.items()}
        out = Children([], obs, np.zeros((n, self.actions), bool), np.zeros(n), np.ones(n), np.zeros(n, bool))
        for i, (state, action) in enumerate(zip(states, actions)):
            mover = state.current_player()
            child = state.clone()
            child.apply_action(int(action))
            while child.is_chance_node():
                outcomes, probs = zip(*child.chance_outcomes())
                child.apply_action(int(outcomes[rng.choice(len(outcomes), p=np.asarray(probs))]))
            out.states.append(child)
            if child.is_terminal():
                out.terminal[i], out.rewards[i] = True, child.returns()[mover]
                continue
            player = child.current_player()
            out.rewards[i] = child.rewards()[mover]
            out.discounts[i] = 1.0 if player == mover else -1.0
            self.view.state = child
            for k, x in self.view.observe(player).items():
                obs[k][i] = x
            if AGENT in obs:
                obs[AGENT][i] = player
            out.legal[i] = obs[MASK_KEY][i] > 0
        return out


Evaluate = Callable[[Mapping[str, np.ndarray]], tuple[np.ndarray, np.ndarray]]
"""The network on a batch of observations (by part): logits ``[N, A]`` and values ``[N]`` (the mover's view)."""


class GameSearch:
    """Searches on the real game for a batch of observations; its trees are kept for the next batch of the same
    size (the rows to move vary from call to call, so only the last size is kept)."""

    def __init__(self, model: GameModel, settings: SearchConfig) -> None:
        self.model, self.settings = model, settings
        self._trees: Trees | None = None

    def __call__(self, evaluate: Evaluate, obs: Mapping[str, np.ndarray], rng: np.random.Generator | None) -> Searched:
        """Search every row of ``obs`` that is its observer's move; the network evaluates each simulation's new
        positions of every tree at once. ``rng``: Gumbel draws (or Dirichlet noise) and chance outcomes; None
        for a deterministic search (evaluation)."""
        model, n = self.model, len(obs[MASK_KEY])
        states, to_move = model.roots(obs[HISTORY_KEY])
        rows = np.flatnonzero(to_move)
        out = Searched(
            np.asarray(obs[MASK_KEY]).argmax(axis=1), np.zeros((n, model.actions)), np.zeros(n), to_move.copy()
        )
        if not len(rows):
            return out
        if self._trees is None or self._trees.batch != len(rows):
            self._trees = Trees(len(rows), model.actions, self.settings)
        trees = self._trees
        logits, values = evaluate({k: np.asarray(x)[rows] for k, x in obs.items()})
        trees.reset(logits, values, np.asarray(obs[MASK_KEY])[rows] > 0, rng)
        nodes = [[states[r]] for r in rows]
        draw = rng if rng is not None else np.random.default_rng(0)
        b, a = len(rows), model.actions
        for _ in range(trees.simulations):
            parents, actions = trees.select()
            grow = np.flatnonzero(~trees.revisits)
            children = model.step([nodes[t][parents[t]] for t in grow], actions[grow], draw)
            full_logits, full_values = np.zeros((b, a)), np.zeros(b)
            legal, rewards, discounts = np.ones((b, a), bool), np.zeros(b), np.ones(b)
            terminal = np.zeros(b, bool)
            legal[grow], rewards[grow] = children.legal, children.rewards
            discounts[grow], terminal[grow] = children.discounts, children.terminal
            live = np.flatnonzero(~children.terminal)
            if len(live):
                got_logits, got_values = evaluate({k: x[live] for k, x in children.obs.items()})
                full_logits[grow[live]], full_values[grow[live]] = got_logits, got_values
            for i, t in enumerate(grow):
                nodes[t].append(children.states[i])
            for t in np.flatnonzero(trees.revisits):
                nodes[t].append(None)  # its node number is spent: the lists stay indexed by node
            trees.expand(full_logits, full_values, legal, rewards, discounts, terminal)
        out.actions[rows], out.policy[rows], out.value[rows] = trees.root_action(), trees.policy(), trees.root_value()
        return out
