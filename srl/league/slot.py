"""A slot of games against the league: the learner holds one seat of each game, pool members play the others.

Each of the B games draws, when it starts, the learner's seat (uniformly) and
its opponent: one of ``league.bots`` with its share of the games; otherwise a
uniform random legal move with probability ``league.random_opponent`` (always
while the pool is empty), otherwise a pool member, uniformly or by PFSP on the
learner's last scores against each (the league worker writes them to the pool
index). The opponent's moves are made inside the slot: one batched forward per
member per step over the games it plays, with its frozen parameters from
``RUN_DIR/league``, sampled so that a game is not one fixed line of play; a
bot's moves come from the bot (:mod:`srl.league.match`). A member with memory
keeps a state per seat of each game it plays, stepped on its own moves and
forgotten when the game starts again.

The slot is then an ordinary single-agent slot of B columns: every step is one
move of the learner followed by the opponents' replies, and the reward of the
step includes what those replies brought (the -1 of a lost game). Its env
steps are the learner's moves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from srl.api.config import ConfigError, LeagueConfig
from srl.api.env import SlotStep
from srl.api.spaces import Observation
from srl.api.worker import Policy
from srl.envs.turns import TurnSlot
from srl.league.match import Opponent, RandomOpponent, opponent
from srl.league.pool import PoolIndex, read_index, read_snapshot
from srl.league.ratings import pfsp_weights
from srl.nets.memory import act_keyed, forget_keys, remembering

RANDOM = -1
"""The opponent id of a uniform random legal move; bot ``i`` of ``league.bots`` is ``RANDOM - 1 - i``."""
REFRESH_SECONDS = 2.0
"""How often a slot looks whether the pool index changed."""


class LeagueSlot:
    """B games of a :class:`~srl.envs.turns.TurnSlot`, the learner one seat of each (``agents_per_env`` 1)."""

    agents_per_env = 1
    state_space: gym.spaces.Space | None = None

    def __init__(
        self, turns: TurnSlot, folder: Path, cfg: LeagueConfig, make_policy: Callable[[], Policy], seed: int
    ) -> None:
        if turns.games[0].simultaneous:
            raise ConfigError(f"league.opponent: {turns.name!r} is a simultaneous-move game; a league needs turns")
        self.turns, self.folder, self.cfg, self._make_policy = turns, folder, cfg, make_policy
        self.games = turns.games
        self.num_envs = len(turns.games)
        self.single_observation_space = turns.single_observation_space
        self.single_action_space = turns.single_action_space
        self.parts = turns.parts
        self.rng = np.random.default_rng(seed)
        N = turns.agents_per_env
        self.seat = np.zeros(self.num_envs, np.int64)
        self.opponent = np.full(self.num_envs, RANDOM, np.int64)
        self._index = PoolIndex()
        self._index_mtime = -1.0
        self._checked = float("-inf")
        self._policies: dict[int, Policy] = {}
        self._n = N
        self._seed = 0
        self._bot_edges = np.cumsum([b.share for b in cfg.bots])  # bot i plays where u falls in [edge i-1, edge i)
        self._bots: dict[int, Opponent] = {RANDOM: RandomOpponent(seed)}
        for i, bot in enumerate(cfg.bots):
            self._bots[RANDOM - 1 - i] = opponent(bot.opponent, turns, seed, "league.bots", deterministic=False)

    # ------------------------------------------------------------------ the slot
    def reset(self, seed: int) -> Observation:
        self.rng = np.random.default_rng(seed)
        self._seed = seed
        for i, bot in self._bots.items():  # the same games again after a reset with the same seed
            bot.reseed(seed + 7 * (RANDOM - i))
        for e, g in enumerate(self.games):
            g.reset(seed + e)
            self._draw(e)
        B = self.num_envs
        self._advance(np.zeros(B, np.float32), np.zeros(B, bool), np.zeros(B, bool), {})
        return self._observe()

    def step(self, actions: np.ndarray) -> SlotStep:
        B = self.num_envs
        reward = np.zeros(B, np.float32)
        terminated, truncated = np.zeros(B, bool), np.zeros(B, bool)
        final: dict[int, dict[str, np.ndarray]] = {}
        for e, g in enumerate(self.games):
            me = int(self.seat[e])
            r, term, trunc = g.play({me: int(actions[e])})
            reward[e] += r[me]
            self._ends(e, term, trunc, terminated, truncated, final)
        self._restart(terminated | truncated)
        self._advance(reward, terminated, truncated, final)
        final_obs = None
        if truncated.any():
            final_obs = self.turns.blank(B)
            for e, obs in final.items():
                self.turns.write(final_obs, e, obs, int(self.seat[e]), False)
        end = terminated | truncated
        return SlotStep(self._observe(), reward, terminated, truncated, end, final_obs)

    def close(self) -> None:
        self.turns.close()

    # ------------------------------------------------------------------ internals
    def _advance(
        self,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        final: dict[int, dict[str, np.ndarray]],
    ) -> None:
        """Let the opponents move until the learner is to move in every game; a game that ends on their move ends
        the learner's episode (restarted games may open with an opponent's move too, which counts for the next
        episode only)."""
        ended = terminated | truncated
        while True:
            waiting = [e for e, g in enumerate(self.games) if int(self.seat[e]) not in g.to_move()]
            if not waiting:
                return
            moves = self._opponent_moves(waiting)
            over = np.zeros(self.num_envs, bool)
            for e in waiting:
                g = self.games[e]
                r, term, trunc = g.play(moves[e])
                if not ended[e]:
                    reward[e] += r[int(self.seat[e])]
                    ended[e] = over[e] = self._ends(e, term, trunc, terminated, truncated, final)
                elif g.over():  # a restarted game ended on the opponent's moves alone: start another
                    over[e] = True
            self._restart(over)

    def _ends(
        self,
        e: int,
        term: np.ndarray,
        trunc: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        final: dict[int, dict[str, np.ndarray]],
    ) -> bool:
        """Whether the move just made in game ``e`` ended the learner's episode; if so, how (a game over without
        a time limit is terminal), with its last observation when truncated."""
        g, me = self.games[e], int(self.seat[e])
        if not (term[me] or trunc[me] or g.over()):
            return False
        truncated[e] = bool(trunc[me]) and not term[me]
        terminated[e] = not truncated[e]
        if truncated[e]:
            final[e] = g.observe(me)
        return True

    def _restart(self, games: np.ndarray) -> None:
        for e in np.flatnonzero(games).tolist():
            self._seed += self.num_envs
            self.games[e].reset(self._seed + e)
            self._draw(e)

    def _draw(self, e: int) -> None:
        """The learner's seat and the opponent of game ``e``."""
        columns = np.arange(e * self._n, (e + 1) * self._n)
        for policy in self._policies.values():  # a new game: what its players remembered of the last goes
            forget_keys(policy, columns.tolist())
        for bot in self._bots.values():
            bot.forget(columns)
        self.seat[e] = self.rng.integers(self._n)
        self._refresh()
        if len(self._bot_edges):
            u = self.rng.random()
            if u < self._bot_edges[-1]:
                self.opponent[e] = RANDOM - 1 - int(np.searchsorted(self._bot_edges, u, side="right"))
                return
        members = self._index.members
        if not members or self.rng.random() < self.cfg.random_opponent:
            self.opponent[e] = RANDOM
            return
        if self.cfg.opponent == "pfsp":
            weights = pfsp_weights(np.array([m.score for m in members]), self.cfg.pfsp, self.cfg.pfsp_power)
        else:
            weights = np.full(len(members), 1.0 / len(members))
        self.opponent[e] = members[int(self.rng.choice(len(members), p=weights))].version

    def _refresh(self) -> None:
        """Re-read the pool index when it changed (looked at every ``REFRESH_SECONDS``); load new members."""
        now = time.monotonic()
        if now - self._checked < REFRESH_SECONDS:
            return
        self._checked = now
        path = self.folder / "pool.json"
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime == self._index_mtime:
            return
        index = read_index(self.folder)
        versions = {m.version for m in index.members}
        for version in [v for v in self._policies if v not in versions]:
            del self._policies[version]
        for version in versions - set(self._policies):
            policy = self._make_policy()
            policy.load_flat(read_snapshot(self.folder, version, policy.flat_size()))
            self._policies[version] = remembering(policy)
        self._index, self._index_mtime = index, mtime

    def _opponent_moves(self, games: list[int]) -> dict[int, dict[int, int]]:
        """The moves of every opponent seat to move in ``games``: one forward per member over its games."""
        rows: list[tuple[int, int]] = [(e, p) for e in games for p in self.games[e].to_move()]
        obs = self.turns.blank(len(rows))
        for i, (e, p) in enumerate(rows):
            self.turns.write(obs, i, self.games[e].observe(p), p, True)
        actions = np.zeros(len(rows), np.int64)
        ids = np.array([self.opponent[e] for e, _ in rows])
        at = np.array([e * self._n + p for e, p in rows])  # their columns of the games
        for member in np.unique(ids).tolist():
            sel = np.flatnonzero(ids == member)
            part = {k: v[sel] for k, v in obs.items()}
            policy = self._policies.get(member)
            if policy is None:  # a bot, the random player, or a member that left the pool during this game
                bot = self._bots.get(member, self._bots[RANDOM])
                actions[sel] = bot.moves(self.turns, part, at[sel])
                continue
            with torch.inference_mode():
                picked = act_keyed(policy, part, False, at[sel].tolist())["actions"]
            actions[sel] = np.asarray(picked).reshape(-1)
        moves: dict[int, dict[int, int]] = {e: {} for e in games}
        for (e, p), a in zip(rows, actions.tolist()):
            moves[e][p] = a
        return moves

    def _observe(self) -> Observation:
        out = self.turns.blank(self.num_envs)
        for e, g in enumerate(self.games):
            self.turns.write(out, e, g.observe(int(self.seat[e])), int(self.seat[e]), True)
        return out
