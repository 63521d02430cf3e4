"""Matches in two-player turn-based games: a policy against an opponent, counted as wins, draws and losses.

The games are a :class:`~srl.envs.turns.TurnSlot` of G games, played once each
to their end. The policy takes seat ``g % 2`` in game ``g`` (first and second
mover alike); every move of its seat comes from one batched forward over the
slot, every move of the other seat from the opponent:

- ``random``: a uniform legal move;
- ``mcts:N``: OpenSpiel's MCTS bot with N simulations and random rollouts
  (OpenSpiel games only). This is the C++ ``pyspiel.MCTSBot``: the same
  algorithm and settings as the Python ``open_spiel.python.algorithms.mcts``
  bot (UCT with c = 2, one random rollout per leaf, solving proven nodes), 18x
  faster here (0.5 against 9.0 ms a move at 100 simulations), which is what
  lets a league train against it (``league.bots``);
- another policy (a run directory): its most likely legal move.

A game counts as a win for the policy when its return in that game is above the
opponent's, a draw when equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from srl.api.config import ConfigError, ExperimentConfig
from srl.api.spaces import ACTION_MASK, Observation
from srl.api.worker import Policy
from srl.envs.slots import make_slot, probe_spaces
from srl.envs.turns import TurnSlot
from srl.nets.memory import Remembering, act_keyed, forget_keys, remembering


class Opponent(Protocol):
    """Moves for the columns ``columns`` of ``slot`` (game ``c // players``, seat ``c % players``), each to move
    now and seeing its row of ``obs``."""

    def moves(self, slot: TurnSlot, obs: Observation, columns: np.ndarray) -> np.ndarray: ...

    def reseed(self, seed: int) -> None:
        """Start its random choices again from ``seed``."""

    def forget(self, columns: np.ndarray) -> None:
        """The games of these columns start afresh: what it remembers of them goes (a policy with memory)."""


class RandomOpponent:
    """A uniform legal move (every move when the game has no mask)."""

    def __init__(self, seed: int) -> None:
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def forget(self, columns: np.ndarray) -> None:
        """Nothing to forget."""

    def moves(self, slot: TurnSlot, obs: Observation, columns: np.ndarray) -> np.ndarray:
        n = int(slot.games[0].action_space.n)
        mask = obs[ACTION_MASK].astype(bool) if ACTION_MASK in obs else np.ones((len(columns), n), bool)
        return np.array([self.rng.choice(np.flatnonzero(row)) for row in mask], np.int64)


class MctsOpponent:
    """OpenSpiel's MCTS bot (UCT, c = 2, one random rollout per leaf, solving), ``simulations`` per move."""

    def __init__(self, slot: TurnSlot, simulations: int, seed: int, what: str = "--opponent") -> None:
        import pyspiel

        game = getattr(slot.games[0], "game", None)
        if game is None:
            raise ConfigError(f"{what} mcts:N: needs an OpenSpiel game (env.id srl.envs.turns:game)")
        self._make = lambda seed: pyspiel.MCTSBot(
            game, pyspiel.RandomRolloutEvaluator(1, seed), 2.0, simulations, MCTS_MEMORY_MB, True, seed, False
        )
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        self.bot = self._make(seed)

    def forget(self, columns: np.ndarray) -> None:
        """Nothing to forget: each move searches from the game's state."""

    def moves(self, slot: TurnSlot, obs: Observation, columns: np.ndarray) -> np.ndarray:
        players = slot.agents_per_env
        return np.array([self.bot.step(slot.games[c // players].state) for c in columns.tolist()], np.int64)


MCTS_MEMORY_MB = 1_000
"""The MCTS bot's tree limit (a move at 100 simulations needs well under 1 MB)."""


class PolicyOpponent:
    """A policy: its most likely legal move, or (``deterministic=False``) one sampled from it. A policy with
    memory keeps a state per column, stepped on the moves it makes there (as in training, where a waiting
    player's state stands still)."""

    def __init__(self, policy: Policy, deterministic: bool = True) -> None:
        self.policy, self.deterministic = remembering(policy), deterministic

    def reseed(self, seed: int) -> None:
        """Nothing to do: a sampling policy draws from torch's generator, like the pool members."""

    def forget(self, columns: np.ndarray) -> None:
        forget_keys(self.policy, columns.tolist())

    def moves(self, slot: TurnSlot, obs: Observation, columns: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = act_keyed(self.policy, obs, self.deterministic, columns.tolist())
        return np.asarray(out["actions"]).reshape(-1)


def opponent(spec: str, slot: TurnSlot, seed: int, what: str = "--opponent", deterministic: bool = True) -> Opponent:
    """The opponent ``spec`` names: ``random``, ``mcts:N`` or a run directory (one line naming ``what`` when
    wrong). A run directory's policy plays its most likely move, or samples with ``deterministic=False``."""
    if spec == "random":
        return RandomOpponent(seed)
    if spec.startswith("mcts:"):
        try:
            n = int(spec.split(":", 1)[1])
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"{what}: {spec!r}: expected mcts:N with N >= 1 simulations")
        return MctsOpponent(slot, n, seed, what)
    from pathlib import Path

    from srl.loaded import load_policy

    path = Path(spec)
    if not path.exists():
        raise ConfigError(f"{what}: {spec!r} is not random, mcts:N or a run directory")
    other_cfg, policy, _ = load_policy(path)
    theirs = probe_spaces(other_cfg.env)
    if theirs.obs != slot.single_observation_space or theirs.action != slot.single_action_space:
        raise ConfigError(
            f"{what}: {spec!r} plays {other_cfg.env.id!r} with other spaces ({theirs.obs}); this game has "
            f"{slot.single_observation_space}"
        )
    return PolicyOpponent(policy, deterministic)


def check_bots(cfg: ExperimentConfig) -> None:
    """Build each of ``league.bots`` once against one game: a wrong one is one line naming it, before any worker
    starts."""
    if not cfg.league.bots:
        return
    slot = match_slot(cfg, 1, "league.bots")
    try:
        for bot in cfg.league.bots:
            opponent(bot.opponent, slot, 0, "league.bots", deterministic=False)
    finally:
        slot.close()


@dataclass(frozen=True)
class MatchResult:
    wins: int
    draws: int
    losses: int

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    @property
    def points(self) -> float:
        """Wins plus half the draws."""
        return self.wins + 0.5 * self.draws

    def as_dict(self) -> dict[str, Any]:
        g = max(1, self.games)
        return {
            "games": self.games,
            "win_rate": self.wins / g,
            "draw_rate": self.draws / g,
            "loss_rate": self.losses / g,
            "score": self.points / g,
        }


def play_match(
    cfg: ExperimentConfig,
    policy: Policy,
    spec: str,
    games: int,
    seed: int,
    deterministic: bool = True,
) -> MatchResult:
    """``games`` games of ``policy`` against the opponent ``spec`` names (seats alternate by game)."""
    slot = match_slot(cfg, games, "--opponent")
    try:
        return play_games(slot, policy, opponent(spec, slot, seed), seed, deterministic)
    finally:
        slot.close()


def match_slot(cfg: ExperimentConfig, games: int, what: str) -> TurnSlot:
    """``games`` games of the config's env, checked to be a two-player turn-based game (one line naming
    ``what`` when it is not)."""
    slot = make_slot(cfg.env, games)
    if not isinstance(slot, TurnSlot) or slot.agents_per_env != 2 or slot.games[0].simultaneous:
        slot.close()
        raise ConfigError(f"{what}: {cfg.env.id!r} is not a two-player turn-based game")
    return slot


def play_games(slot: TurnSlot, policy: Policy, other: Opponent, seed: int, deterministic: bool) -> MatchResult:
    """Every game of ``slot`` once, from ``reset(seed)``: ``policy`` in seat ``g % 2`` of game ``g``. A policy
    with memory acts on every column, its state carried as in training (a waiting column's stands still)."""
    G, N = len(slot.games), slot.agents_per_env
    ours = np.arange(G) * N + np.arange(G) % 2  # the policy's column in each game
    theirs = np.arange(G) * N + 1 - np.arange(G) % 2
    policy = remembering(policy)
    other.forget(np.arange(slot.num_envs))
    obs = slot.reset(seed)
    returns = np.zeros(slot.num_envs)
    finished = np.zeros(G, bool)
    while not finished.all():
        movers = np.array(
            [not finished[c // N] and (c % N) in slot.games[c // N].to_move() for c in range(len(returns))]
        )
        with torch.inference_mode():
            actions = np.asarray(policy.act(obs, deterministic=deterministic)["actions"]).copy()
        their_cols = theirs[movers[theirs]]
        if len(their_cols):
            actions[their_cols] = other.moves(slot, {k: v[their_cols] for k, v in obs.items()}, their_cols)
        step = slot.step(actions)
        if isinstance(policy, Remembering):
            policy.carry(step.terminated, step.truncated, step.alive)
        returns += np.where(np.repeat(finished, N), 0.0, step.reward)
        finished |= step.episode_end.reshape(G, N).any(axis=1)
        obs = step.obs
    diff = returns[ours] - returns[theirs]
    return MatchResult(int((diff > 0).sum()), int((diff == 0).sum()), int((diff < 0).sum()))
