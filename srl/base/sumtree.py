"""A sum tree over non-negative leaf values: set leaves, and find the leaf that holds a prefix mass.

Why: proportional sampling from a million changing weights needs O(log n) updates and
draws; a cumulative sum rebuilt per batch is O(n). The usual Python sum tree walks one item
at a time; this one moves every queried item down one level per numpy call, so a batch of
256 costs one pass over the tree's depth, not 256 of them. C++ replay libraries (cpprb)
do the same work in native code, but they own their memory: this tree lives in one
preallocated float64 array that the caller may hand in, so a replay worker can keep it in
shared memory and re-attach to it after a restart with every priority intact.

Layout: ``L`` is ``capacity`` rounded up to a power of two; ``array[1]`` is the root,
node ``i`` has children ``2i`` and ``2i + 1``, and leaf ``j`` is ``array[L + j]``
(``array[0]`` is unused). Leaves past ``capacity`` stay zero. Parents are recomputed from
their children (never adjusted by a difference), so the sums do not drift over many updates.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SumTree"]

_JUMP = 10
"""Levels a draw skips with one search (see ``SumTree._descend``); measured best at 8 to 11 for 256 draws in
100k leaves."""


class SumTree:
    """Non-negative values on ``capacity`` leaves with their sums in every parent."""

    def __init__(self, capacity: int, array: np.ndarray | None = None) -> None:
        """A zeroed tree, or one that adopts ``array`` (length ``array_len(capacity)``) as it is."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self._depth = max(0, (self.capacity - 1).bit_length())
        self._leaf0 = 1 << self._depth
        n = self.array_len(self.capacity)
        if array is None:
            array = np.zeros(n, dtype=np.float64)
        elif array.dtype != np.float64 or array.shape != (n,) or not array.flags.c_contiguous:
            raise ValueError(f"array must be contiguous float64 of shape ({n},), got {array.dtype} {array.shape}")
        self.array = array
        self._pairs = array.reshape(-1, 2)  # row i holds the children (2i, 2i + 1) of node i

    @staticmethod
    def array_len(capacity: int) -> int:
        """Length of the backing array: twice ``capacity`` rounded up to a power of two."""
        return 2 << max(0, (int(capacity) - 1).bit_length())

    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self.array[1])

    def leaves(self, indices: np.ndarray) -> np.ndarray:
        """Values of the given leaves."""
        return self.array[self._leaf0 + self._check_indices(indices)]

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaves to values (for a repeated index the last value wins) and refresh their ancestors."""
        idx = self._check_indices(indices)
        vals = np.asarray(values, dtype=np.float64)
        if vals.shape != idx.shape:
            raise ValueError(f"values shape {vals.shape} does not match indices shape {idx.shape}")
        if vals.size == 0:
            return
        if not (vals.min() >= 0.0 and vals.max() < np.inf):
            bad = int(np.flatnonzero(~(np.isfinite(vals) & (vals >= 0.0)))[0])
            raise ValueError(f"values must be finite and >= 0, got {vals[bad]} at position {bad}")
        order = np.argsort(idx, kind="stable")
        idx = idx[order]
        last = np.empty(idx.size, dtype=bool)  # the last of each run of equal indices, in call order
        np.not_equal(idx[1:], idx[:-1], out=last[:-1])
        last[-1] = True
        nodes = idx[last] + self._leaf0
        self.array[nodes] = vals[order][last]
        self._refresh(nodes)

    def _refresh(self, nodes: np.ndarray) -> None:
        """Recompute the ancestors of the sorted, distinct ``nodes``, one tree level per step."""
        a = self.array
        for level in range(self._depth - 1, -1, -1):
            lo = 1 << level
            if lo <= nodes.size:  # a level no wider than the batch: recompute all of it by slices
                np.add(a[2 * lo : 4 * lo : 2], a[2 * lo + 1 : 4 * lo : 2], out=a[lo : 2 * lo])
                continue
            nodes = nodes >> 1
            pair = self._pairs.take(nodes, axis=0)
            a[nodes] = pair[:, 0] + pair[:, 1]

    def find(self, masses: np.ndarray) -> np.ndarray:
        """For each mass in [0, total], the leaf whose prefix-sum interval ``[before, before + value)`` holds it.

        A mass equal to ``total`` (or pushed past a boundary by round-off) returns the last
        leaf with a positive value: a zero leaf is never returned.
        """
        m = np.asarray(masses, dtype=np.float64)
        total = self.total
        if total <= 0.0:
            raise ValueError("find in an empty tree (total 0)")
        if m.size and not (m.min() >= 0.0 and m.max() <= total):
            raise ValueError(f"masses must lie in [0, total={total}], got min {m.min()} max {m.max()}")
        return self._descend(m)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` leaves drawn proportionally to their values, one uniform draw in each of n equal slices of the total.

        Stratified (as in prioritized experience replay) so that a batch covers the whole
        distribution with less variance than n independent draws; each draw's marginal is
        still exactly proportional to the leaf values.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        total = self.total
        if total <= 0.0:
            raise ValueError("sample from an empty tree (total 0)")
        masses = rng.random(n)
        masses += np.arange(n)
        masses *= total / n
        return self._descend(masses)

    def _descend(self, masses: np.ndarray) -> np.ndarray:
        """Walk every mass from the root to a leaf at once (``masses`` is left as it was).

        The top levels are one step: a search in the prefix sums of the nodes ``_JUMP`` levels down (one
        ``cumsum`` of 1,024 nodes costs less than ten levels of walking). From there the walk reads only left
        children: step right where the mass reaches the left child's sum. Round-off can carry a mass at a
        boundary into a zero subtree, so the few that end on a zero leaf walk again from the root, stepping
        right only into a positive child. Every step of that walk enters a positive node (a positive node
        with a zero left child always steps right, since masses are >= 0), so it can never land on a zero leaf
        or on the padding past ``capacity``.
        """
        a = self.array
        jump = min(self._depth, _JUMP)
        width = 1 << jump
        prefix = np.cumsum(a[width : 2 * width])
        node = np.searchsorted(prefix, masses, side="right")
        np.minimum(node, width - 1, out=node)
        rest = masses - np.where(node > 0, prefix.take(node - 1, mode="clip"), 0.0)
        node += width
        left = np.empty(masses.size)
        right = np.empty(masses.size, dtype=bool)
        for _ in range(self._depth - jump):
            node += node
            a.take(node, out=left, mode="clip")  # clip: in range by construction, and no buffered copy
            np.greater_equal(rest, left, out=right)
            left *= right
            rest -= left
            node += right
        lost = np.flatnonzero(a.take(node) <= 0.0)
        if lost.size:
            node[lost] = self._descend_guarded(masses[lost].copy())
        return node - self._leaf0

    def _descend_guarded(self, masses: np.ndarray) -> np.ndarray:
        """The walk of :meth:`_descend` that checks the right child at every step; ``masses`` is consumed."""
        node = np.ones(masses.size, dtype=np.int64)
        for _ in range(self._depth):
            pair = self._pairs.take(node, axis=0)
            left = pair[:, 0]
            right = masses >= left
            right &= pair[:, 1] > 0.0
            masses -= left * right
            node += node
            node += right
        return node

    def _check_indices(self, indices: np.ndarray) -> np.ndarray:
        """Indices as an int64 array, all within [0, capacity)."""
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            raise ValueError(f"indices must be integers, got {idx.dtype}")
        if idx.size and not (idx.min() >= 0 and idx.max() < self.capacity):
            raise ValueError(f"indices must lie in [0, {self.capacity}), got min {idx.min()} max {idx.max()}")
        return idx.astype(np.int64, copy=False)
