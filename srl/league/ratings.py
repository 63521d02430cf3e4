"""Elo ratings and prioritized fictitious self-play (PFSP): the math of a league, as pure functions.

Elo (the logistic form chess uses): a player rated ``a`` is expected to score
``1 / (1 + 10 ** ((b - a) / 400))`` against one rated ``b``, where a win
scores 1, a draw 0.5 and a loss 0. A league's ratings are fitted to all its
results at once (:func:`fit_elo`), so they do not depend on the order in
which the games were played.

PFSP (Vinyals et al. 2019, AlphaStar) draws an opponent from the pool with
probability proportional to ``f(p)``, ``p`` being the learner's win rate
against it: ``hard`` is ``(1 - p) ** power`` (mostly the opponents it still
loses to), ``variance`` is ``p * (1 - p)`` (those it beats about half the
time), ``uniform`` is 1 for every opponent.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

ELO_SCALE = 400.0
"""Rating points for a 10:1 odds ratio."""


def expected_score(rating: float, opponent: float) -> float:
    """The score a player rated ``rating`` expects against one rated ``opponent`` (in [0, 1])."""
    return 1.0 / (1.0 + 10.0 ** ((opponent - rating) / ELO_SCALE))


def fit_elo(
    score: np.ndarray, games: np.ndarray, anchor: int = 0, prior_games: float = 1.0, iters: int = 500
) -> np.ndarray:
    """Elo ratings that best explain a table of results (the Bradley-Terry maximum-likelihood fit, by Hunter's
    MM iterations), with player ``anchor`` fixed at 0.

    ``score[i, j]``: the points ``i`` scored against ``j`` (a win 1, a draw 0.5); ``games[i, j]``: the games they
    played (symmetric). Every player also gets ``prior_games`` virtual draws against the anchor, which keeps
    the ratings of a player who won or lost every game finite. Unlike updating after each game, the fit does
    not depend on the order of the games and does not drift with their number.
    """
    score, games = np.asarray(score, np.float64), np.asarray(games, np.float64)
    n = len(score)
    if score.shape != (n, n) or games.shape != (n, n) or not 0 <= anchor < n:
        raise ValueError(f"fit_elo needs square score and games tables and an anchor among them, got {score.shape}")
    if np.any(score < 0) or np.any(score > games) or not np.allclose(games, games.T):
        raise ValueError("fit_elo: scores must lie in [0, games] and games must be symmetric")
    games = games.copy()
    wins = score.sum(axis=1)
    others = np.arange(n) != anchor
    games[anchor, others] += prior_games
    games[others, anchor] += prior_games
    wins[others] += 0.5 * prior_games
    wins[anchor] += 0.5 * prior_games * others.sum()
    strength = np.ones(n)
    for _ in range(iters):
        denom = (games / (strength[:, None] + strength[None, :])).sum(axis=1)
        strength = np.where(denom > 0, np.maximum(wins, 1e-12) / np.maximum(denom, 1e-300), strength)
        strength /= strength[anchor]
    return ELO_SCALE * np.log10(strength)


Weighting = Literal["hard", "variance", "uniform"]


def pfsp_weights(win_rates: np.ndarray, weighting: Weighting = "hard", power: float = 2.0) -> np.ndarray:
    """The probability of drawing each opponent, from the learner's win rate against each (values in [0, 1]).
    When every weight is 0 (``hard`` against opponents it always beats) the draw is uniform."""
    p = np.asarray(win_rates, np.float64)
    if p.ndim != 1 or p.size == 0:
        raise ValueError("pfsp_weights needs a non-empty vector of win rates")
    if np.any((p < 0) | (p > 1)) or not np.all(np.isfinite(p)):
        raise ValueError(f"win rates are in [0, 1], got {p.tolist()}")
    if weighting == "hard":
        w = (1.0 - p) ** power
    elif weighting == "variance":
        w = p * (1.0 - p)
    elif weighting == "uniform":
        w = np.ones_like(p)
    else:
        raise ValueError(f"weighting must be hard, variance or uniform, got {weighting!r}")
    total = w.sum()
    return w / total if total > 0 else np.full_like(p, 1.0 / p.size)
