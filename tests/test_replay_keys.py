"""Tests for srl.replay.keys: FIFO overwrite, stale keys refused, uniform draws of live items."""

from __future__ import annotations

import json
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srl.replay.keys import KeyedSlots


def test_fifo_overwrite_order_and_stale_keys() -> None:
    ring = KeyedSlots(4)
    slots, keys = ring.insert(3)
    assert slots.tolist() == [0, 1, 2] and keys.tolist() == [0, 1, 2] and ring.size == 3 and not ring.full
    slots, keys = ring.insert(3)  # wraps: slots 0 and 1 now hold keys 4 and 5
    assert slots.tolist() == [3, 0, 1] and keys.tolist() == [3, 4, 5] and ring.full
    assert [s.tolist() for s in ring.oldest(4)] == [[2, 3, 0, 1], [2, 3, 4, 5]]
    assert ring.keys_of(np.arange(4)).tolist() == [4, 5, 2, 3]
    # An update sampled before the overwrite names (slot 0, key 0): dropped. Key 2 still lives.
    assert ring.live(np.array([0, 1, 2, 0]), np.array([0, 1, 2, 4])).tolist() == [False, False, True, True]


def test_wrong_slot_and_unissued_keys_are_not_live() -> None:
    ring = KeyedSlots(4)
    ring.insert(2)
    assert ring.live(np.array([1, 2, -1, 9]), np.array([0, 2, -1, 1])).tolist() == [False] * 4
    assert ring.keys_of(np.array([0, 1, 2, 3, -1, 4])).tolist() == [0, 1, -1, -1, -1, -1]


def test_fifo_queue_takes_the_oldest_once() -> None:
    ring = KeyedSlots(5)
    ring.insert(4)
    slots, keys = ring.oldest(3)
    assert keys.tolist() == [0, 1, 2]
    ring.remove_oldest(3)
    assert ring.size == 1 and not ring.live(slots, keys).any() and ring.keys_of(slots).tolist() == [-1] * 3
    ring.insert(5)  # overwrites the remaining key 3 too
    assert ring.oldest(ring.size)[1].tolist() == [4, 5, 6, 7, 8]


def test_uniform_draws_only_live_items_and_all_of_them() -> None:
    ring = KeyedSlots(10)
    ring.insert(10)
    ring.insert(7)  # wrapped: keys 7..16 live
    ring.remove_oldest(4)  # keys 11..16 live, in slots 1..6
    rng = np.random.default_rng(0)
    slots, keys = ring.uniform(6000, rng)
    assert ring.live(slots, keys).all()
    counts = np.bincount(keys - 11, minlength=6)
    assert counts.sum() == 6000 and len(counts) == 6 and counts.min() > 800  # expected 1000 each
    assert sorted(set(slots.tolist())) == [1, 2, 3, 4, 5, 6]


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, 9),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 9)), min_size=1, max_size=60),
)
def test_ring_matches_a_deque_through_wrap_arounds(capacity: int, ops: list[tuple[bool, int]]) -> None:
    ring, model, issued = KeyedSlots(capacity), deque[int](maxlen=capacity), 0
    for is_insert, n in ops:
        if is_insert:
            n = min(n, capacity)
            _, keys = ring.insert(n)
            assert keys.tolist() == list(range(issued, issued + n))
            model.extend(keys.tolist())
            issued += n
        else:
            n = min(n, len(model))
            ring.remove_oldest(n)
            for _ in range(n):
                model.popleft()
        assert ring.size == len(model) and ring.full == (len(model) == capacity)
        assert ring.oldest(ring.size)[1].tolist() == list(model)
        every = np.arange(issued)
        assert ring.live(every % capacity, every).tolist() == [k in model for k in range(issued)]
        held = {k % capacity: k for k in model}
        assert ring.keys_of(np.arange(capacity)).tolist() == [held.get(s, -1) for s in range(capacity)]


def test_state_round_trip_through_json_and_a_shared_counter_array() -> None:
    ring = KeyedSlots(6)
    ring.insert(5)
    ring.insert(4)
    ring.remove_oldest(2)
    counters = np.zeros(2, dtype=np.int64)
    back = KeyedSlots(6, counters=counters)
    back.restore(json.loads(json.dumps(ring.state())))
    assert back.state() == ring.state() and counters.tolist() == [9, 5]
    assert back.oldest(back.size)[1].tolist() == ring.oldest(ring.size)[1].tolist() == [5, 6, 7, 8]


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"capacity": 7, "next_key": 1, "removed": 0}, "replay capacity is 6, the saved replay's is 7"),
        ({"capacity": 6, "next_key": 1}, "must have keys"),
        ({"capacity": 6, "next_key": -1, "removed": 0}, "next_key"),
        ({"capacity": 6, "next_key": 1, "removed": 2}, r"removed \(2\) exceeds next_key \(1\)"),
    ],
)
def test_bad_state_is_refused(state: dict, match: str) -> None:
    ring = KeyedSlots(6)
    with pytest.raises(ValueError, match=match):
        ring.restore(state)
    assert ring.state() == {"capacity": 6, "next_key": 0, "removed": 0}


def test_bad_calls_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="capacity must be an integer >= 1, got 0"):
        KeyedSlots(0)
    ring = KeyedSlots(3)
    with pytest.raises(ValueError, match=r"insert batch \(at most capacity\) must be an integer in \[0, 3\], got 4"):
        ring.insert(4)
    with pytest.raises(ValueError, match="cannot sample from an empty replay"):
        ring.uniform(1, np.random.default_rng(0))
    ring.insert(2)
    with pytest.raises(ValueError, match=r"oldest count \(at most size\)"):
        ring.oldest(3)
    with pytest.raises(ValueError, match="one shape"):
        ring.live(np.zeros(2), np.zeros(3))
