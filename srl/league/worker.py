"""The league worker: the population manager of self-play (the SRL paper's PBT / PSRO manager, for one learner).

Every ``league.check_every_versions`` policy versions it reads the newest
snapshot from the parameter service (like the eval worker) and plays a round:
``league.match_games`` games of the learner against each pool member, against
a uniform random legal move and against each of ``league.bots``, seats
alternating, both sides sampling. From the round it

- records the results and fits Elo ratings to all of them
  (:func:`srl.league.ratings.fit_elo`): every version of the learner that
  played a round is a player, the members among them, and so is every bot. The
  random player is the fixed anchor at 0, so a rating reads as strength over
  random play, and a bot's rating is a yardstick from outside the league;
- stores the learner's score against each member in the pool index, which the
  actors' PFSP draws read;
- freezes the learner into the pool (its parameters to ``RUN_DIR/league``)
  when the pool is empty or the learner's mean score against it reaches
  ``league.freeze_score``; a full pool drops its oldest member.

It reports ``league_*`` metrics (Elo, scores, pool size) to the controller.
The pool lives in the run directory, so a resumed run goes on with its league.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from srl.api.config import LeagueConfig
from srl.api.report import RunFacts
from srl.api.worker import Policy, Reporter, Worker
from srl.base.fileio import FULL
from srl.league.match import MatchResult, Opponent, PolicyOpponent, RandomOpponent
from srl.league.pool import Member, read_index, read_snapshot, snapshot_path, write_index, write_snapshot
from srl.league.ratings import fit_elo
from srl.system.params import ParamSubscriber

RANDOM_PLAYER = -1
"""The uniform random player's id in the results: the anchor of the ratings."""


class LeagueWorker(Worker):
    """Plays the learner against the pool every few versions, rates, and freezes."""

    def __init__(
        self,
        cfg: LeagueConfig,
        learner: Policy,
        params: ParamSubscriber,
        folder: Path,
        make_policy: Callable[[], Policy],
        play: Callable[[Policy, Opponent], MatchResult],
        reporter: Reporter,
        seed: int,
        wait_timeout: float = 0.05,
        bots: dict[str, Opponent] | None = None,
    ) -> None:
        self.cfg, self.learner, self.params, self.folder = cfg, learner, params, folder
        self._make_policy, self.play, self.reporter = make_policy, play, reporter
        self.bots = bots or {}
        self.seed, self.wait_timeout = seed, wait_timeout
        self.checked = -1
        self._members: dict[int, Policy] = {}
        self._dropped: list[int] = []  # versions out of the pool whose snapshots wait for an index without them

    def setup(self) -> None:
        self.index = read_index(self.folder)  # a resumed run goes on with its pool
        self.params.wait_first(self.should_stop)

    def poll(self) -> int:
        self.params.refresh()
        version = self.params.current
        if version < 0 or (self.checked >= 0 and version < self.checked + self.cfg.check_every_versions):
            time.sleep(self.wait_timeout)
            return 0
        self.checked = version
        self.round(version)
        return 1

    def _written(self, write: Callable[[], None]) -> bool:
        """Whether ``write`` went through; on a full disk, False and a warning (no snapshot is frozen this round,
        or the index waits for the next round, which writes it whole)."""
        try:
            write()
        except OSError as exc:
            if exc.errno not in FULL:
                raise
            self.reporter.report("info", {"message": f"pool not written ({exc.strerror}); the next round tries again"})
            return False
        return True

    def round(self, version: int) -> None:
        """One round of matches with the learner at ``version``; the pool index is rewritten once, at its end."""
        index, cfg = self.index, self.cfg
        index.rounds += 1
        vs_random = self.play(self.learner, RandomOpponent(self.seed + index.rounds * 7_919))
        index.results.append([version, RANDOM_PLAYER, vs_random.points, vs_random.games])
        scores = []
        for member in index.members:
            result = self.play(self.learner, PolicyOpponent(self._member(member.version), deterministic=False))
            member.score = result.points / result.games
            scores.append(member.score)
            index.results.append([version, member.version, result.points, result.games])
        vs_bots = {}
        for name, bot in self.bots.items():
            result = self.play(self.learner, bot)
            vs_bots[f"win_rate_vs_{metric_name(name)}"] = result.wins / result.games
            index.results.append([version, index.bot_id(name), result.points, result.games])
        index.ratings = ratings(index.results)
        for member in index.members:
            member.elo = index.ratings[str(member.version)]
        score_vs_pool = float(np.mean(scores)) if scores else 1.0
        froze = (not index.members or score_vs_pool >= cfg.freeze_score) and self._written(
            lambda: write_snapshot(self.folder, version, self.learner.flat_state())
        )
        if froze:
            index.members.append(Member(version, index.ratings[str(version)]))
            index.frozen.append(version)
        dropped = index.members[: max(0, len(index.members) - cfg.pool_size)]
        index.members = index.members[len(dropped) :]
        for member in dropped:
            self._members.pop(member.version, None)
        self._dropped += [m.version for m in dropped]
        if self._written(lambda: write_index(self.folder, index)):
            for old in self._dropped:  # after the index no longer names them
                snapshot_path(self.folder, old).unlink(missing_ok=True)
            self._dropped = []
        self.reporter.report(
            "league",
            {
                "version": version,
                "rounds": index.rounds,
                "pool_size": len(index.members),
                "frozen": len(index.frozen),
                "learner_elo": index.ratings[str(version)],
                "score_vs_pool": score_vs_pool,
                "win_rate_vs_random": vs_random.wins / vs_random.games,
                **vs_bots,
                "froze": froze,
            },
        )

    def _member(self, version: int) -> Policy:
        policy = self._members.get(version)
        if policy is None:
            policy = self._make_policy()
            policy.load_flat(read_snapshot(self.folder, version, policy.flat_size()))
            self._members[version] = policy
        return policy


def metric_name(bot: str) -> str:
    """A bot's name as it goes into a metric's name: letters, digits and underscores (``mcts:100``: ``mcts100``)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in bot.replace(":", ""))


def ratings(results: list[list[float]]) -> dict[str, float]:
    """Elo of every player in ``results`` (``[a, b, points of a, games]``), fitted with the random player at 0."""
    players = sorted({int(r[0]) for r in results} | {int(r[1]) for r in results} | {RANDOM_PLAYER})
    at = {p: i for i, p in enumerate(players)}
    score, games = np.zeros((len(players), len(players))), np.zeros((len(players), len(players)))
    for a, b, points, n in results:
        i, j = at[int(a)], at[int(b)]
        score[i, j] += points
        score[j, i] += n - points
        games[i, j] += n
        games[j, i] += n
    elo = fit_elo(score, games, anchor=at[RANDOM_PLAYER])
    return {str(p): float(elo[at[p]]) for p in players}


class LeagueReports:
    """The league worker's reports (the :class:`~srl.api.report.Aggregator` of their kind): its newest round
    (Elo ratings, scores, the pool) as ``league_<name>`` in the records and as ``league`` in ``summary.json``."""

    def __init__(self, facts: RunFacts) -> None:
        self.newest: dict[str, Any] = {}

    def handle(self, worker: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.newest = {k: v for k, v in meta.items() if k != "worker"}

    def record(self) -> dict[str, float]:
        return {f"league_{k}": float(v) for k, v in self.newest.items() if k not in ("version", "froze")}

    def summary(self) -> dict[str, Any]:
        return {"league": dict(self.newest)} if self.newest else {}

    def restarted(self, worker: str) -> None:
        pass
