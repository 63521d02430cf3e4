"""n-step returns of replay items checked against a one-item, one-step-at-a-time reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srl.algorithms.nstep import nstep

Arr = np.ndarray


def _reference(
    rewards: Arr, terminated: Arr, truncated: Arr, gamma: float, n: int, lengths: Arr | None = None
) -> tuple[list[float], list[float], list[int]]:
    """Textbook n-step return from each item's first step: walk forward, stop at the first episode end or where
    the item's data ends."""
    returns, discounts, boot = [], [], []
    for b in range(rewards.shape[0]):
        g, discount, last = 0.0, 1.0, 0
        for k in range(n if lengths is None else min(n, int(lengths[b]))):
            g += discount * float(rewards[b, k])
            discount *= gamma
            last = k
            if terminated[b, k]:
                discount = 0.0
                break
            if truncated[b, k]:
                break
        returns.append(g)
        discounts.append(discount)
        boot.append(last)
    return returns, discounts, boot


def _check(*item: Any) -> None:
    """``item``: nstep's arguments."""
    ret, disc, boot = nstep(*item)
    ref_ret, ref_disc, ref_boot = _reference(*item)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(disc, ref_disc, rtol=1e-6, atol=1e-30)  # float32 underflows below ~1e-38
    assert boot.dtype == np.int64 and boot.tolist() == ref_boot


@st.composite
def _items(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, int]:
    """A batch of items whose steps may terminate, truncate, or both, anywhere; gamma 0 and 1 included."""
    batch = draw(st.integers(1, 6))
    length = draw(st.integers(1, 7))
    n = draw(st.integers(1, length))
    gamma = draw(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0))
    cells = batch * length
    rewards = draw(st.lists(st.floats(-10, 10), min_size=cells, max_size=cells))
    term = draw(st.lists(st.booleans(), min_size=cells, max_size=cells))
    trunc = draw(st.lists(st.booleans(), min_size=cells, max_size=cells))
    shape = (batch, length)
    as_array = np.array
    return (
        as_array(rewards, np.float32).reshape(shape),
        as_array(term).reshape(shape),
        as_array(trunc).reshape(shape),
        gamma,
        n,
    )


@settings(max_examples=300, deadline=None)
@given(_items())
def test_matches_reference(item: tuple[np.ndarray, np.ndarray, np.ndarray, float, int]) -> None:
    _check(*item)


@settings(max_examples=300, deadline=None)
@given(_items(), st.data())
def test_rows_cut_short_match_reference(
    item: tuple[np.ndarray, np.ndarray, np.ndarray, float, int], data: st.DataObject
) -> None:
    """Rows whose data ends before step L - 1 (a window that runs past its chunk) stop there, undiscounted by
    any end."""
    batch, length = item[0].shape
    lengths = np.array(data.draw(st.lists(st.integers(1, length), min_size=batch, max_size=batch)), np.int64)
    _check(*item, lengths)


def test_a_cut_keeps_the_discount_and_reads_nothing_past_it() -> None:
    rewards = np.array([[1.0, 2.0, np.nan], [1.0, 2.0, 4.0]], np.float32)
    flags = np.zeros((2, 3), bool)
    ret, disc, boot = nstep(rewards, flags, flags, 0.5, 3, np.array([2, 3]))
    assert ret.tolist() == [2.0, 3.0] and disc.tolist() == [0.25, 0.125] and boot.tolist() == [1, 2]


@pytest.mark.parametrize(
    ("lengths", "match"),
    [
        (np.array([1, 0]), r"lengths must lie in \[1, 3\], got min 0"),
        (np.array([1, 4]), r"got min 1 max 4"),
        (np.array([1]), r"lengths must be \(2,\) integers"),
        (np.array([1.0, 2.0]), r"lengths must be \(2,\) integers"),
    ],
)
def test_bad_lengths_one_line(lengths: np.ndarray, match: str) -> None:
    flags = np.zeros((2, 3), bool)
    with pytest.raises(ValueError, match=match) as info:
        nstep(np.zeros((2, 3), np.float32), flags, flags, 0.9, 2, lengths)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_episode_end_at_every_position(flag: str, n: int) -> None:
    """Item b ends at step b (the last item never ends), for n = 1, a middle n and n = L."""
    length = 5
    rewards = np.random.default_rng(n).normal(size=(length + 1, length)).astype(np.float32)
    ends = np.zeros((length + 1, length), bool)
    for b in range(length):
        ends[b, b] = True
    none = np.zeros_like(ends)
    term, trunc = (ends, none) if flag == "terminated" else (none, ends)
    _check(rewards, term, trunc, 0.9, n)
    _, disc, boot = nstep(rewards, term, trunc, 0.9, n)
    # Item b takes min(b + 1, n) steps; only a termination inside them zeroes the bootstrap.
    assert boot.tolist() == [min(b, n - 1) for b in range(length + 1)]
    terminated_inside = [flag == "terminated" and b < n for b in range(length + 1)]
    assert [d == 0 for d in disc] == terminated_inside


def test_hand_computed() -> None:
    rewards = np.array([[1.0, 2.0, 4.0], [1.0, 2.0, 4.0], [1.0, 2.0, 4.0], [1.0, 2.0, 4.0]], np.float64)
    term = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0], [0, 1, 0]], bool)
    trunc = np.array([[0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 1, 0]], bool)
    ret, disc, boot = nstep(rewards, term, trunc, 0.5, 3)
    assert ret.dtype == np.float64
    np.testing.assert_allclose(ret, [1 + 1 + 1, 1 + 1, 1 + 1, 1 + 1])
    np.testing.assert_allclose(disc, [0.125, 0.0, 0.25, 0.0])  # terminated and truncated together: terminated
    assert boot.tolist() == [2, 1, 1, 1]


def test_rewards_after_the_episode_end_never_leak() -> None:
    rewards = np.array([[1.0, np.nan, np.inf]], np.float32)
    ret, disc, boot = nstep(rewards, np.array([[True, False, False]]), np.zeros((1, 3), bool), 1.0, 3)
    assert ret.tolist() == [1.0] and disc.tolist() == [0.0] and boot.tolist() == [0]


def test_integer_rewards_give_float32() -> None:
    ret, disc, _ = nstep(np.ones((2, 2), np.int64), np.zeros((2, 2), bool), np.zeros((2, 2), bool), 1.0, 2)
    assert ret.dtype == np.float32 and disc.dtype == np.float32 and ret.tolist() == [2.0, 2.0]


@pytest.mark.parametrize(
    ("shape", "gamma", "n", "match"),
    [
        ((2, 3), 0.9, 4, r"n=4 must be between 1 and the item length 3"),
        ((2, 3), 0.9, 0, r"n=0"),
        ((2, 3), 0.9, 2.0, r"n=2.0"),
        ((2, 3), 1.5, 2, r"gamma=1.5 must be in \[0, 1\]"),
        ((2, 3), -0.1, 2, r"gamma=-0.1"),
        ((2, 3), float("nan"), 2, r"gamma=nan"),
        ((6,), 0.9, 1, r"rewards must be \[B, L\]"),
    ],
)
def test_bad_input_one_line(shape: tuple[int, ...], gamma: float, n: int, match: str) -> None:
    flags = np.zeros(shape, bool)
    with pytest.raises(ValueError, match=match) as info:
        nstep(np.zeros(shape, np.float32), flags, flags, gamma, n)
    assert "\n" not in str(info.value)


def test_flag_shapes_must_match() -> None:
    with pytest.raises(ValueError, match=r"must have rewards' shape \(2, 3\)"):
        nstep(np.zeros((2, 3)), np.zeros((2, 2), bool), np.zeros((2, 3), bool), 0.9, 1)
