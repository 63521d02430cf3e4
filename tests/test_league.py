"""League math against values worked out by hand: Elo expectations and fitted ratings, PFSP draw probabilities."""

from __future__ import annotations

import numpy as np
import pytest

from srl.api.config import ConfigError
from srl.league.ratings import expected_score, fit_elo, pfsp_weights


def test_elo_expectation_is_logistic_in_the_rating_gap():
    assert expected_score(1200, 1200) == 0.5
    assert expected_score(1600, 1200) == pytest.approx(10 / 11)  # 400 points: odds of 10 to 1
    assert expected_score(1200, 1600) == pytest.approx(1 / 11)
    assert expected_score(1400, 1200) == pytest.approx(1 / (1 + 10**-0.5))  # 0.7597


def test_fitted_elo_matches_the_odds_of_the_results():
    # B scores 3 of 4 against the anchor A: odds 3, 400 * log10(3) = 190.85 points
    score, games = np.array([[0, 1], [3, 0]]), np.array([[0, 4], [4, 0]])
    assert fit_elo(score, games, prior_games=0).tolist() == pytest.approx([0.0, 400 * np.log10(3)])
    # one virtual draw with the anchor: B scores 3.5 of 5, odds 7/3
    assert fit_elo(score, games).tolist() == pytest.approx([0.0, 400 * np.log10(7 / 3)])
    # a chain: C beats B as B beats A; the ratings add up (C never met A)
    chain = fit_elo(np.array([[0, 1, 0], [3, 0, 1], [0, 3, 0]]), np.array([[0, 4, 0], [4, 0, 4], [0, 4, 0]]), 0, 0)
    assert chain.tolist() == pytest.approx([0.0, 190.849, 381.697], abs=1e-3)
    # the anchor can be anyone, and an unbeaten player stays finite thanks to the prior
    assert fit_elo(np.array([[0, 0], [5, 0]]), np.array([[0, 5], [5, 0]]), anchor=1)[1] == 0.0
    assert np.isfinite(fit_elo(np.array([[0, 0], [5, 0]]), np.array([[0, 5], [5, 0]]))).all()
    with pytest.raises(ValueError, match="symmetric"):
        fit_elo(np.array([[0, 1], [1, 0]]), np.array([[0, 2], [3, 0]]))


def test_league_ratings_of_recorded_results_put_random_at_zero():
    from srl.league.worker import ratings

    # version 10 beat random 48 of 64 (odds 3), version 20 scored 48 of 64 against version 10 (odds 3 again)
    elo = ratings([[10, -1, 48.0, 64], [20, 10, 48.0, 64]])
    # players sorted: -1, 10, 20; the table the results make
    table = fit_elo(np.array([[0, 16, 0], [48, 0, 16], [0, 48, 0]]), np.array([[0, 64, 0], [64, 0, 64], [0, 64, 0]]))
    assert [elo["-1"], elo["10"], elo["20"]] == pytest.approx(table.tolist())
    assert elo["-1"] == 0.0
    # near the odds (the virtual draws with random pull a little towards 0)
    assert elo["10"] == pytest.approx(400 * np.log10(3), abs=12)
    assert elo["20"] == pytest.approx(2 * 400 * np.log10(3), abs=20)


def test_pfsp_hard_prefers_the_opponents_the_learner_loses_to():
    w = pfsp_weights(np.array([0.0, 0.5, 1.0]), "hard", power=2)
    assert w.tolist() == pytest.approx([1 / 1.25, 0.25 / 1.25, 0.0])  # (1-p)^2 = 1, 0.25, 0
    assert pfsp_weights(np.array([0.2, 0.6]), "hard", power=1).tolist() == pytest.approx([0.8 / 1.2, 0.4 / 1.2])


def test_pfsp_variance_prefers_even_matches_and_uniform_ignores_win_rates():
    w = pfsp_weights(np.array([0.1, 0.5, 0.9]), "variance")
    assert w.tolist() == pytest.approx([0.09 / 0.43, 0.25 / 0.43, 0.09 / 0.43])
    assert pfsp_weights(np.array([0.1, 0.9]), "uniform").tolist() == [0.5, 0.5]


def test_pfsp_falls_back_to_uniform_and_refuses_bad_win_rates():
    assert pfsp_weights(np.array([1.0, 1.0]), "hard").tolist() == [0.5, 0.5]  # beats everyone: no preference
    for bad in ([], [1.5], [np.nan]):
        with pytest.raises(ValueError):
            pfsp_weights(np.array(bad))


# ---------------------------------------------------------------------------------------------- the league worker
class _Reports:
    def __init__(self) -> None:
        self.records: list[dict] = []
        self.infos: list[str] = []

    def report(self, kind, meta, arrays=None) -> None:
        if kind == "info":
            self.infos.append(meta["message"])
            return
        assert kind == "league"
        self.records.append(dict(meta))


def _worker(tmp_path, results, bots=None, **league):
    """A league worker whose matches return ``results`` in turn (the learner's (wins, draws, losses))."""
    from srl.api.config import EnvConfig, ExperimentConfig, LeagueConfig
    from srl.envs.slots import probe_spaces
    from srl.league.match import MatchResult
    from srl.league.pool import read_index
    from srl.league.worker import LeagueWorker
    from srl.wiring import acting_policy

    env = EnvConfig(id="srl.envs.turns:game", kwargs={"name": "tic_tac_toe"}, agent_id=True)
    probed = probe_spaces(env)
    cfg = ExperimentConfig(env=env)
    make = lambda: acting_policy(probed.obs, probed.action, cfg)  # noqa: E731
    queue = list(results)
    played = []

    def play(policy, other):
        played.append(type(other).__name__)
        return MatchResult(*queue.pop(0))

    reports = _Reports()
    worker = LeagueWorker(
        LeagueConfig(opponent="pfsp", **league), make(), None, tmp_path, make, play, reports, 0, bots=bots
    )
    worker.index = read_index(tmp_path)
    return worker, reports, played


def test_on_a_full_disk_a_round_freezes_nothing_and_its_index_waits_for_the_next(tmp_path, monkeypatch):
    """A round whose snapshot or index a full disk refused goes on (a warning each): no member is frozen without
    its snapshot, and a member dropped meanwhile keeps its snapshot until an index without it is written."""
    import errno

    from srl.league import worker as lw
    from srl.league.pool import read_index, snapshot_path

    real_snapshot, real_index, full = lw.write_snapshot, lw.write_index, {"now": False}

    def no_room(write):
        def call(*args):
            if full["now"]:
                raise OSError(errno.ENOSPC, "No space left on device")
            return write(*args)

        return call

    monkeypatch.setattr(lw, "write_snapshot", no_room(real_snapshot))
    monkeypatch.setattr(lw, "write_index", no_room(real_index))
    rounds = [(48, 0, 16), (60, 0, 4), (40, 0, 24), (60, 0, 4), (45, 0, 19), (60, 0, 4), (40, 0, 24)]
    worker, reports, _ = _worker(tmp_path, rounds, pool_size=1, freeze_score=0.6)
    worker.round(10)  # frozen: the pool is [v10]
    full["now"] = True
    worker.round(20)  # would freeze and drop v10: its snapshot is refused, so nothing is frozen
    assert [r["froze"] for r in reports.records] == [True, False] and len(reports.infos) == 2  # snapshot, index
    assert all("pool not written (No space left on device)" in line for line in reports.infos)
    assert [m.version for m in read_index(tmp_path).members] == [10] and not snapshot_path(tmp_path, 20).exists()
    full["now"] = False
    worker.round(30)  # frozen, v10 dropped: the index without it is written, then its snapshot goes
    assert [m.version for m in read_index(tmp_path).members] == [30]
    assert snapshot_path(tmp_path, 30).exists() and not snapshot_path(tmp_path, 10).exists()
    full["now"] = True
    worker.round(40)  # frozen in memory (its snapshot fails), so not frozen at all; the index fails too
    assert reports.records[-1]["froze"] is False and len(reports.infos) == 4


def test_the_league_freezes_when_the_learner_beats_the_pool_and_drops_the_oldest(tmp_path):
    from srl.league.pool import read_index, snapshot_path

    rounds = [
        (48, 0, 16),  # v10: vs random only (empty pool): frozen
        (60, 0, 4),
        (40, 0, 24),  # v20: random, then 40/64 = 0.625 against v10: frozen
        (60, 0, 4),
        (20, 0, 44),
        (30, 4, 30),  # v30: 0.31 and 0.5 against the pool: not frozen
        (60, 0, 4),
        (50, 0, 14),
        (45, 0, 19),  # v40: 0.78 (v10) and 0.70 (v20): frozen; the pool of 2 drops v10
    ]
    worker, reports, played = _worker(tmp_path, rounds, pool_size=2, freeze_score=0.6)
    for version in (10, 20, 30, 40):
        worker.round(version)
    index = read_index(tmp_path)
    assert [r["froze"] for r in reports.records] == [True, True, False, True]
    assert index.frozen == [10, 20, 40] and [m.version for m in index.members] == [20, 40]
    assert not snapshot_path(tmp_path, 10).exists() and snapshot_path(tmp_path, 40).exists()
    assert (
        played
        == ["RandomOpponent"]
        + ["RandomOpponent", "PolicyOpponent"]
        + ["RandomOpponent"]
        + ["PolicyOpponent"] * 2
        + ["RandomOpponent"]
        + ["PolicyOpponent"] * 2
    )
    # the learner's last scores against the members are what PFSP reads: v20 was met last at 45/64
    assert index.members[0].score == 45 / 64 and index.members[1].score == 0.5  # v40: just frozen
    # ratings: random is the anchor, every version beat it; the members carry their fitted ratings
    assert index.ratings["-1"] == 0.0 and all(index.ratings[str(v)] > 0 for v in (10, 20, 30, 40))
    assert [m.elo for m in index.members] == [index.ratings["20"], index.ratings["40"]]
    assert reports.records[-1]["pool_size"] == 2 and reports.records[-1]["rounds"] == 4


def test_the_league_plays_its_bots_every_round_and_rates_them_from_the_results(tmp_path):
    """A bot is a player of the league's ratings (id -2, named in the index), never a pool member; its win
    rate is a metric of every round."""
    from srl.league.match import RandomOpponent
    from srl.league.pool import read_index

    class Bot(RandomOpponent):
        pass

    rounds = [(60, 0, 4), (8, 0, 56), (62, 0, 2), (40, 0, 24), (32, 0, 32)]  # v10: random, bot; v20: +member
    worker, reports, played = _worker(tmp_path, rounds, bots={"mcts:100": Bot(0)})
    worker.round(10)
    worker.round(20)
    index = read_index(tmp_path)
    assert played == ["RandomOpponent", "Bot", "RandomOpponent", "PolicyOpponent", "Bot"]
    assert [r["win_rate_vs_mcts100"] for r in reports.records] == [8 / 64, 32 / 64]
    assert index.bots == {"mcts:100": -2} and [m.version for m in index.members] == [10, 20]
    assert [[int(r[0]), int(r[1])] for r in index.results] == [[10, -1], [10, -2], [20, -1], [20, 10], [20, -2]]
    # the bot beat v10 (8/64) and drew even with v20 (32/64): rated above v10, near v20
    assert index.ratings["-2"] > index.ratings["10"] and abs(index.ratings["-2"] - index.ratings["20"]) < 100


@pytest.mark.parametrize(
    ("league", "message"),
    [
        ({"bots": [{"opponent": "mcts:10", "share": 0.6}, {"opponent": "mcts:20", "share": 0.4}]}, "add up to 1"),
        ({"bots": [{"opponent": "mcts:10", "share": 0.2}, {"opponent": "mcts:10", "share": 0.1}]}, "named twice"),
        ({"bots": [{"opponent": "random", "share": 0.2}]}, "league.random_opponent"),
        ({"bots": [{"opponent": "mcts:10", "share": 0.0}]}, "share: must be in"),
        ({"opponent": "latest", "bots": [{"opponent": "mcts:10", "share": 0.2}]}, "need league.opponent"),
        ({"bots": [{"opponent": "mcts:0", "share": 0.2}]}, "league.bots: 'mcts:0': expected mcts:N"),
        ({"bots": [{"opponent": "no/such/run", "share": 0.2}]}, "league.bots: 'no/such/run' is not"),
    ],
)
def test_bad_league_bots_are_one_line(league, message):
    import srl

    cfg = {"env": {"id": "srl.envs.turns:game", "kwargs": {"name": "tic_tac_toe"}}, "league": {"opponent": "pfsp"}}
    cfg["league"].update(league)
    with pytest.raises(ConfigError, match=message):
        srl.train(cfg)
