"""Item keys for a fixed-capacity replay ring, so a priority update never lands on the wrong item.

Why: a priority update arrives after its batch was sampled, by which time the slot it
names may hold a newer item. Matching updates by slot alone (as SRL's replay did) gives
the new item the old item's priority. Here every insert gets a new int64 key, one more
than the last (2**63 keys outlast any run), so a key names one item for the replay's
whole life, and an update carrying ``(slot, key)`` is applied only while the slot still
holds that key.

The key is also the slot's generation: a slot's occupants have strictly increasing keys,
so a separate per-slot counter would say nothing the key does not.

Removal is only ever of the oldest items (overwritten when full, or taken by a FIFO
queue sampler), so the live keys are always one contiguous range ``[first, next_key)``,
and key ``k`` lives in slot ``k % capacity``. Two int64 counters therefore describe the
whole ring, and there is no per-slot key array that could disagree with them::

    counters[0]  next_key  keys handed out so far   (written only by the inserter)
    counters[1]  removed   keys taken from the head (written only by a FIFO consumer)
    first = max(removed, next_key - capacity)

Each counter has one writer and only grows, which is what a shared-memory ring needs.
"""

from __future__ import annotations

import numpy as np

__all__ = ["KeyedSlots"]

_NEXT, _REMOVED = 0, 1
_STATE_KEYS = ("capacity", "next_key", "removed")
Batch = tuple[np.ndarray, np.ndarray]


class KeyedSlots:
    """A FIFO ring of ``capacity`` slots; every item in it has a key unique over the ring's life."""

    def __init__(self, capacity: int, counters: np.ndarray | None = None) -> None:
        """An empty ring; ``counters`` is an int64 array of 2 to keep its state in."""
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        self.capacity = int(capacity)
        if counters is None:
            counters = np.zeros(2, dtype=np.int64)
        elif counters.shape != (2,) or counters.dtype != np.int64:
            raise ValueError(f"counters must be an int64 array of shape (2,), got {counters.dtype} {counters.shape}")
        self._counters = counters

    @property
    def next_key(self) -> int:
        """The key the next insert gets (also how many items were ever inserted)."""
        return int(self._counters[_NEXT])

    @property
    def first(self) -> int:
        """The oldest live key (``next_key`` when the ring is empty)."""
        return max(int(self._counters[_REMOVED]), self.next_key - self.capacity)

    def bounds(self) -> tuple[int, int]:
        """``(first, next_key)`` from one read of the counters: the live keys are ``first .. next_key - 1``."""
        next_key, removed = self._counters.tolist()  # in the order of _NEXT, _REMOVED
        return max(removed, next_key - self.capacity), next_key

    @property
    def size(self) -> int:
        """Live items."""
        return self.next_key - self.first

    @property
    def full(self) -> bool:
        """Whether the next insert overwrites the oldest item."""
        return self.size == self.capacity

    def _count(self, n: int, most: int, what: str) -> int:
        """``n`` if ``0 <= n <= most``, else a one-line ValueError (a caller bug)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= most:
            raise ValueError(f"{what} must be an integer in [0, {most}], got {n!r}")
        return int(n)

    def _range(self, start: int, n: int) -> Batch:
        """Slots and keys of the ``n`` consecutive keys from ``start``."""
        keys = np.arange(start, start + n, dtype=np.int64)
        return keys % self.capacity, keys

    def insert(self, n: int) -> Batch:
        """Claim the next ``n`` slots in FIFO order, overwriting the oldest items when full."""
        n = self._count(n, self.capacity, "insert batch (at most capacity)")
        batch = self._range(self.next_key, n)
        self._counters[_NEXT] += n
        return batch

    def keys_of(self, slots: np.ndarray) -> np.ndarray:
        """The key each slot holds now, -1 where it is empty."""
        slots = np.asarray(slots, dtype=np.int64)
        last = self.next_key - 1
        keys = last - (last - slots) % self.capacity
        return np.where((keys >= self.first) & (slots >= 0) & (slots < self.capacity), keys, -1)

    def live(self, slots: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """True where the slot still holds that key; an update elsewhere is for a removed item."""
        slots = np.asarray(slots, dtype=np.int64)
        keys = np.asarray(keys, dtype=np.int64)
        if slots.shape != keys.shape:
            raise ValueError(f"slots and keys must have one shape, got {slots.shape} and {keys.shape}")
        return (keys >= self.first) & (keys < self.next_key) & (keys % self.capacity == slots)

    def oldest(self, n: int) -> Batch:
        """The ``n`` oldest items in insertion order (a FIFO queue's next batch), left in place."""
        return self._range(self.first, self._count(n, self.size, "oldest count (at most size)"))

    def remove_oldest(self, n: int) -> None:
        """Drop the ``n`` oldest items, once a FIFO queue consumer has read them."""
        self._counters[_REMOVED] = self.first + self._count(n, self.size, "removal count (at most size)")

    def uniform(self, n: int, rng: np.random.Generator) -> Batch:
        """``n`` live items drawn uniformly with replacement."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay")
        keys = self.first + rng.integers(0, self.size, size=self._count(n, 2**62, "sample batch"), dtype=np.int64)
        return keys % self.capacity, keys

    def state(self) -> dict[str, int]:
        """Capacity and counters, for a checkpoint saved beside the replay's items."""
        return {"capacity": self.capacity, "next_key": self.next_key, "removed": int(self._counters[_REMOVED])}

    def restore(self, state: dict[str, int]) -> None:
        """Load counters from :meth:`state`; the items' layout needs the same capacity."""
        if sorted(state) != sorted(_STATE_KEYS):
            raise ValueError(f"replay keys state must have keys {sorted(_STATE_KEYS)}, got {sorted(state)}")
        if state["capacity"] != self.capacity:
            raise ValueError(f"replay capacity is {self.capacity}, the saved replay's is {state['capacity']!r}")
        next_key, removed = (self._count(state[k], 2**62, f"replay keys state {k}") for k in ("next_key", "removed"))
        if removed > next_key:
            raise ValueError(f"replay keys state removed ({removed}) exceeds next_key ({next_key})")
        self._counters[:] = (next_key, removed)
