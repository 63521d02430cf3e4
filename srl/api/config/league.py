"""The ``league`` section: self-play against a pool of past selves in two-player turn-based games."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Literal

from srl.api.config.errors import check


@dataclass(frozen=True, kw_only=True)
class Bot:
    """A fixed opponent the league trains against besides the pool (AlphaStar's league has such players too)."""

    opponent: str
    """``mcts:N`` (OpenSpiel's MCTS bot with N simulations) or a run directory (its policy, sampling)."""
    share: float
    """Share of the training games it plays (drawn per game)."""

    def __post_init__(self) -> None:
        check(0.0 < self.share < 1.0, "share", f"must be in (0, 1), got {self.share}")
        check(self.opponent != "random", "opponent", "random moves have their own share: league.random_opponent")
        check(bool(self.opponent.strip()), "opponent", "must name mcts:N or a run directory")

    @property
    def name(self) -> str:
        """Its name in the league's metrics and results: the spec, or a run directory's folder name."""
        return self.opponent if self.opponent.startswith("mcts:") else PurePath(self.opponent).name


@dataclass(frozen=True, kw_only=True)
class LeagueConfig:
    """Who the learner plays. ``latest``: itself, every seat of every game learning (plain self-play, no pool).
    ``uniform`` or ``pfsp``: in each game the learner takes one seat (drawn per game) and a frozen member of the
    pool plays the others; the league worker plays the learner against the pool, rates everyone by Elo and
    freezes the learner into the pool when it beats the pool often enough. The pool lives in ``RUN_DIR/league``."""

    opponent: Literal["latest", "uniform", "pfsp"] = "latest"
    """How actors draw each game's opponent: the learner itself, uniformly from the pool, or by PFSP (weighted by
    the learner's score against each member; see :mod:`srl.league.ratings`)."""
    pfsp: Literal["hard", "variance"] = "hard"
    """PFSP weighting: ``hard`` favours members the learner still loses to, ``variance`` even matches."""
    pfsp_power: float = 2.0
    """Exponent of the ``hard`` weighting ``(1 - score) ** power``."""
    random_opponent: float = 0.1
    """Share of training games against a uniform random legal move (always on while the pool is empty)."""
    pool_size: int = 8
    """Members kept; the oldest leaves when a new one enters a full pool."""
    check_every_versions: int = 10
    """The league worker plays a round of matches every this many policy versions."""
    match_games: int = 64
    """Games per opponent in a round (seats alternate; both sides sample their moves)."""
    freeze_score: float = 0.6
    """The learner is frozen into the pool when its mean score against the pool (win 1, draw 0.5) reaches this."""
    bots: tuple[Bot, ...] = ()
    """Fixed opponents, each playing its ``share`` of the training games (the rest go to the pool and to random
    moves as above). The league worker plays each of them in every round too, so their ratings anchor the
    learner's Elo from outside the league."""

    @property
    def pool(self) -> bool:
        """Opponents come from a pool (and a league worker keeps it)."""
        return self.opponent != "latest"

    def __post_init__(self) -> None:
        check(self.pfsp_power > 0, "pfsp_power", f"must be > 0, got {self.pfsp_power}")
        check(0.0 <= self.random_opponent < 1.0, "random_opponent", f"must be in [0, 1), got {self.random_opponent}")
        check(self.pool_size >= 1, "pool_size", f"must be >= 1, got {self.pool_size}")
        check(self.check_every_versions >= 1, "check_every_versions", f"must be >= 1, got {self.check_every_versions}")
        check(self.match_games >= 2, "match_games", f"must be >= 2, got {self.match_games}")
        check(0.0 < self.freeze_score <= 1.0, "freeze_score", f"must be in (0, 1], got {self.freeze_score}")
        check(not self.bots or self.pool, "bots", "need league.opponent uniform or pfsp (a bot takes a seat)")
        shares = sum(b.share for b in self.bots)
        check(shares < 1.0, "bots", f"their shares add up to {shares:g}; they must leave some games to the pool")
        names = [b.name for b in self.bots]
        twice = sorted({n for n in names if names.count(n) > 1})
        check(not twice, "bots", f"{', '.join(twice)} named twice")
