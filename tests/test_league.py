"""League math against values worked out by hand: Elo expectations and updates, PFSP draw probabilities."""

from __future__ import annotations

import numpy as np
import pytest

from srl.league.ratings import elo_update, expected_score, pfsp_weights


def test_elo_expectation_is_logistic_in_the_rating_gap():
    assert expected_score(1200, 1200) == 0.5
    assert expected_score(1600, 1200) == pytest.approx(10 / 11)  # 400 points: odds of 10 to 1
    assert expected_score(1200, 1600) == pytest.approx(1 / 11)
    assert expected_score(1400, 1200) == pytest.approx(1 / (1 + 10**-0.5))  # 0.7597


def test_elo_update_moves_both_ratings_by_the_surprise():
    # equal ratings, k = 16: a win moves each by 8, a draw by nothing
    assert elo_update(1200, 1200, 1.0) == (pytest.approx(1208), pytest.approx(1192))
    assert elo_update(1200, 1200, 0.5) == (pytest.approx(1200), pytest.approx(1200))
    # the favourite (expected 10/11) loses with k = 32: it drops 32 * 10/11 = 29.09
    a, b = elo_update(1600, 1200, 0.0, k=32)
    assert a == pytest.approx(1600 - 320 / 11) and b == pytest.approx(1200 + 320 / 11)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        elo_update(1200, 1200, 2.0)


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
