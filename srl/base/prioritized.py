"""Proportional prioritized sampling with importance weights, over a ``SumTree``.

Why: a sampler that draws item i with probability P(i) = p_i^alpha / sum_k p_k^alpha
(prioritized experience replay, proportional variant) needs exactly three things beside
the tree: the exponent, a floor so that no item starves, and the running maximum at which
new items enter. It knows slots, not items or generations: whoever owns the storage maps
keys to slots and drops stale updates before they reach it. Bad priorities come from
numbers a learner computed, so they are refused and counted, never raised: one NaN TD
error must not stop a replay service.
"""

from __future__ import annotations

import math

import numpy as np

from srl.base.sumtree import SumTree

__all__ = ["PrioritizedSampler"]


def _unit_interval(name: str, value: float) -> float:
    """``value`` as a float, or a ValueError naming ``name`` when it lies outside [0, 1]."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")
    return float(value)


class PrioritizedSampler:
    """Slots ``[0, capacity)`` drawn in proportion to priority^alpha, with importance weights."""

    def __init__(
        self, capacity: int, alpha: float, beta: float, eps: float = 1e-6, array: np.ndarray | None = None
    ) -> None:
        """``eps`` floors every priority; ``array`` (see ``SumTree``) lets the tree live in shared memory."""
        self.alpha = _unit_interval("alpha", alpha)
        self.beta = beta
        if not (math.isfinite(eps) and eps > 0.0):
            raise ValueError(f"eps must be finite and > 0, got {eps}")
        self.eps = float(eps)
        self.tree = SumTree(capacity, array)
        self.max_priority = 1.0
        """The largest priority set so far (never below 1.0): new items enter at it."""
        if array is not None and self.alpha > 0.0:  # re-attached: recover it from the leaves
            top = float(self.tree.array[self.tree.array.size // 2 :].max())  # the leaf half
            self.max_priority = max(1.0, top ** (1.0 / self.alpha))
        self.refused = 0
        """Priorities refused because they were NaN, infinite or negative."""
        self._size = 0

    @property
    def beta(self) -> float:
        """Importance-weight exponent: 0 leaves the sampling bias uncorrected, 1 corrects it fully."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = _unit_interval("beta", value)

    @property
    def size(self) -> int:
        """Number of live slots, the N in the importance weights; the owner raises it as the buffer fills."""
        return self._size

    @size.setter
    def size(self, value: int) -> None:
        if not 0 <= value <= self.tree.capacity:
            raise ValueError(f"size must lie in [0, {self.tree.capacity}], got {value}")
        self._size = int(value)

    def insert(self, indices: np.ndarray) -> None:
        """Give newly written slots the running maximum priority, so each is sampled soon at least once."""
        idx = np.asarray(indices)
        self.tree.update(idx, np.full(idx.shape, self.max_priority**self.alpha))

    def set_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set slots' priorities, floored at ``eps``; NaN, infinite or negative ones are refused and counted."""
        idx = np.asarray(indices)
        p = np.asarray(priorities, dtype=np.float64)
        if p.shape != idx.shape:
            raise ValueError(f"priorities shape {p.shape} does not match indices shape {idx.shape}")
        if p.size == 0:
            return
        ok = p >= 0.0
        ok &= p < np.inf  # NaN fails both comparisons
        if not ok.all():
            self.refused += int(ok.size - np.count_nonzero(ok))
            idx, p = idx[ok], p[ok]
            if p.size == 0:
                return
        p = np.maximum(p, self.eps)
        self.max_priority = max(self.max_priority, float(p.max()))
        self.tree.update(idx, p**self.alpha)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` slots (stratified, see ``SumTree.sample``) and their importance weights.

        w_i = (N * P(i))^-beta, divided by the largest w in the batch so that weights only
        ever scale a step down (PER's normalisation). Taking that maximum over the batch
        rather than over all N slots (which needs a min tree beside the sum tree, and one
        more tree walk per update) keeps the largest weight of every batch at exactly 1;
        the price is that a batch's scale depends on which slots it drew. After the division
        N cancels (w_i = (min_j P(j) / P(i))^beta); it stays in the formula as written.
        """
        idx = self.tree.sample(n, rng)
        prob = self.tree.leaves(idx)
        prob /= self.tree.total
        w = np.multiply(prob, max(self._size, 1))
        w **= -self._beta
        w /= w.max()
        return idx, w
