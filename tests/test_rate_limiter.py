"""Tests for srl.base.rate_limiter: both sides held and released, the ratio kept, no deadlock."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srl.base.rate_limiter import RateLimiter, least_error_buffer

MIN_SIZE = 50


def tightest_buffer(spi: float, max_insert: int, max_sample: int) -> float:
    """The smallest float error buffer the constructor accepts (the proof's bound, exactly)."""
    exact = Fraction(spi)
    least = max((exact * max_insert + max_sample) / 2, exact * (max_insert - 1))
    buf = float(least)
    return buf if Fraction(buf) >= least else math.nextafter(buf, math.inf)


def limiter(spi: float, max_insert: int, max_sample: int, min_size: int = MIN_SIZE) -> RateLimiter:
    """A limiter at the tightest buffer its batch sizes allow, where a deadlock would show first."""
    return RateLimiter(spi, min_size, tightest_buffer(spi, max_insert, max_sample), max_insert, max_sample)


def assert_in_band(lim: RateLimiter) -> None:
    """Once filled, samples stay within the error buffer of ``spi`` per insert beyond ``min_size``."""
    if lim.inserts >= lim.min_size:
        assert abs(lim.samples - lim.samples_per_insert * (lim.inserts - lim.min_size)) <= lim.error_buffer + 1e-9
    else:
        assert lim.samples == 0


def batch(frac: float, largest: int) -> int:
    """A batch size in ``[1, largest]``; fractions 0 and 1 give the extremes, where bounds bite."""
    return 1 + round(frac * (largest - 1))


def step(lim: RateLimiter, n: int, m: int, fast_inserter: bool) -> str:
    """Move the fast side if it may, else the other one; return which side moved."""
    can_insert, can_sample = lim.can_insert(n), lim.can_sample(m)
    assert can_insert or can_sample, f"deadlock at {lim.state()} for insert {n}, sample {m}"
    if can_insert and (fast_inserter or not can_sample):
        lim.inserted(n)
        return "insert"
    lim.sampled(m)
    return "sample"


@pytest.mark.parametrize("spi", [0.25, 1.0, 8.0])
@pytest.mark.parametrize(("max_insert", "max_sample"), [(1, 1), (5, 32), (40, 256), (256, 3)])
@pytest.mark.parametrize("fast_inserter", [True, False])
def test_fast_side_is_held_and_released_and_the_ratio_holds(
    spi: float, max_insert: int, max_sample: int, fast_inserter: bool
) -> None:
    lim = limiter(spi, max_insert, max_sample)
    rng = np.random.default_rng(0)
    fast = "insert" if fast_inserter else "sample"
    moves = []  # sides that moved once the replay was filled
    for _ in range(3000):
        n, m = int(rng.integers(1, max_insert + 1)), int(rng.integers(1, max_sample + 1))
        filled = lim.inserts >= lim.min_size
        side = step(lim, n, m, fast_inserter)
        moves += [side] if filled else []
        assert_in_band(lim)
    # The fast side was held (the slow side moved), and moved again afterwards (released).
    held = moves.index("sample" if fast_inserter else "insert")
    assert fast in moves[held:]
    beyond = lim.inserts - lim.min_size
    assert beyond > 0
    assert abs(lim.measured_samples_per_insert - spi) <= lim.error_buffer / beyond + 1e-12


def test_filling_to_min_size_is_never_held_and_sampling_waits_for_it() -> None:
    lim = limiter(8.0, 7, 16)
    while lim.inserts + 7 <= MIN_SIZE:
        assert not lim.can_sample(1)
        lim.inserted(7)
    assert not lim.can_sample(1)
    lim.inserted(MIN_SIZE - lim.inserts)
    assert lim.inserts == MIN_SIZE and lim.can_sample(1) and lim.measured_samples_per_insert == 0.0


@settings(max_examples=200, deadline=None)
@given(
    spi=st.one_of(st.sampled_from([0.1, 1 / 3, 0.25, 1.0, 2.5, 8.0, 32.0]), st.floats(0.01, 64.0)),
    min_size=st.integers(1, 40),
    max_insert=st.integers(1, 64),
    max_sample=st.integers(1, 256),
    slack=st.sampled_from([0.0, 0.5, 3.0]),
    moves=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.booleans()), min_size=50, max_size=300),
)
@pytest.mark.slow
def test_every_reached_state_lets_some_side_move(
    spi: float, min_size: int, max_insert: int, max_sample: int, slack: float, moves: list
) -> None:
    buf = tightest_buffer(spi, max_insert, max_sample) + slack
    lim = RateLimiter(spi, min_size, buf, max_insert, max_sample)
    for n_frac, m_frac, fast_inserter in moves:
        step(lim, batch(n_frac, max_insert), batch(m_frac, max_sample), fast_inserter)
        assert_in_band(lim)


@settings(max_examples=300, deadline=None)
@given(
    spi=st.floats(0.01, 64.0),
    max_insert=st.integers(1, 64),
    max_sample=st.integers(1, 256),
    inserts=st.integers(0, 10**9),
    samples=st.integers(0, 10**10),
    n_frac=st.floats(0, 1),
    m_frac=st.floats(0, 1),
)
def test_any_restored_counters_let_some_side_move(
    spi: float, max_insert: int, max_sample: int, inserts: int, samples: int, n_frac: float, m_frac: float
) -> None:
    lim = limiter(spi, max_insert, max_sample)
    with pytest.raises(ValueError, match="error_buffer"):  # the bound is the proof's, not looser
        RateLimiter(spi, MIN_SIZE, math.nextafter(lim.error_buffer, 0.0), max_insert, max_sample)
    lim.restore({"inserts": inserts, "samples": samples})
    assert lim.can_insert(batch(n_frac, max_insert)) or lim.can_sample(batch(m_frac, max_sample))


def test_state_round_trip_through_json() -> None:
    lim = limiter(0.25, 4, 32)
    for i in range(500):
        step(lim, 1 + i % 4, 1 + i % 32, fast_inserter=i % 3 == 0)
    saved = json.loads(json.dumps(lim.state()))
    back = limiter(0.25, 4, 32)
    back.restore(saved)
    assert back.state() == lim.state() and back.deficit == lim.deficit
    for n in range(1, 5):
        assert back.can_insert(n) == lim.can_insert(n)
    for m in range(1, 33):
        assert back.can_sample(m) == lim.can_sample(m)


def test_two_views_of_one_counter_array_share_the_state() -> None:
    counters = np.zeros(2, dtype=np.int64)
    inserter = RateLimiter(1.0, 2, 2.0, 2, 2, counters=counters)
    sampler = RateLimiter(1.0, 2, 2.0, 2, 2, counters=counters)
    inserter.inserted(2)
    inserter.inserted(2)
    assert not inserter.can_insert(1) and sampler.can_sample(2)
    sampler.sampled(2)
    assert inserter.can_insert(2) and counters.tolist() == [4, 2]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"samples_per_insert": 0.0}, "samples_per_insert"),
        ({"samples_per_insert": -1.0}, "samples_per_insert"),
        ({"samples_per_insert": float("nan")}, "samples_per_insert"),
        ({"min_size": 0}, "min_size"),
        ({"min_size": 2.5}, "min_size"),
        ({"error_buffer": -1.0}, "error_buffer"),
        ({"error_buffer": 3.0}, "error_buffer"),  # below (1 * 4 + 4) / 2
        ({"max_insert_batch": 0}, "max_insert_batch"),
        ({"max_sample_batch": 0}, "max_sample_batch"),
        ({"counters": np.zeros(3, dtype=np.int64)}, "counters"),
    ],
)
def test_bad_settings_name_the_field_in_one_line(kwargs: dict, field: str) -> None:
    args = {
        "samples_per_insert": 1.0,
        "min_size": 10,
        "error_buffer": 4.0,
        "max_insert_batch": 4,
        "max_sample_batch": 4,
    }
    with pytest.raises(ValueError) as err:
        RateLimiter(**(args | kwargs))
    assert str(err.value).startswith(field) and "\n" not in str(err.value)


def test_insert_crossing_min_size_needs_the_second_bound() -> None:
    # spi 8, batches 10 and 1: (1) alone asks 40.5, but I = min_size - 1 with an insert of 10
    # needs 72, else neither side could move.
    with pytest.raises(ValueError, match="error_buffer must be >= 72"):
        RateLimiter(8.0, 5, 40.5, 10, 1)
    RateLimiter(8.0, 5, 72.0, 10, 1)


def test_held_moves_and_bad_batches_are_caller_bugs() -> None:
    lim = limiter(1.0, 2, 2, min_size=2)
    with pytest.raises(RuntimeError, match="sample of 1 items is held"):
        lim.sampled(1)
    with pytest.raises(ValueError, match=r"insert batch must be an integer in \[1, 2\], got 3"):
        lim.can_insert(3)
    with pytest.raises(ValueError, match="sample batch"):
        lim.can_sample(0)
    while lim.can_insert(2):
        lim.inserted(2)
    with pytest.raises(RuntimeError, match="insert of 2 items is held"):
        lim.inserted(2)


@pytest.mark.parametrize(
    "state",
    [{"inserts": 1}, {"inserts": -1, "samples": 0}, {"inserts": 1.5, "samples": 0}, {"inserts": 3, "samples": True}],
)
def test_bad_state_is_refused(state: dict) -> None:
    lim = limiter(1.0, 1, 1)
    with pytest.raises(ValueError, match="rate limiter state"):
        lim.restore(state)
    assert lim.state() == {"inserts": 0, "samples": 0}


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-3, 1e3), st.integers(1, 5000), st.integers(1, 5000))
def test_least_error_buffer_is_the_bound_and_is_accepted(spi: float, max_insert: int, max_sample: int) -> None:
    """What a replay derives as its default buffer is the proof's bound rounded up, so the constructor takes it,
    and nothing below it."""
    least = least_error_buffer(spi, max_insert, max_sample)
    assert least == tightest_buffer(spi, max_insert, max_sample)
    RateLimiter(spi, MIN_SIZE, least, max_insert, max_sample)
    with pytest.raises(ValueError, match="error_buffer must be >="):
        RateLimiter(spi, MIN_SIZE, math.nextafter(least, 0.0), max_insert, max_sample)
