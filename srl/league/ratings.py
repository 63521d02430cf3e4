"""Elo ratings and prioritized fictitious self-play (PFSP): the math of a league, as pure functions.

Elo (the logistic form chess uses): a player rated ``a`` is expected to score
``1 / (1 + 10 ** ((b - a) / 400))`` against one rated ``b``, where a win
scores 1, a draw 0.5 and a loss 0; after a game each rating moves by
``k * (score - expected)``, so the two changes cancel.

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


def elo_update(rating: float, opponent: float, score: float, k: float = 16.0) -> tuple[float, float]:
    """Both ratings after one game in which the first player scored ``score`` (1 win, 0.5 draw, 0 loss)."""
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"a game's score is in [0, 1], got {score}")
    delta = k * (score - expected_score(rating, opponent))
    return rating + delta, opponent - delta


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
