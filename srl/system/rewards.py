"""Training-reward transforms applied by the actor; episode returns are always reported untransformed."""

from __future__ import annotations

import numpy as np


class RewardTransform:
    """Optional return-based scaling, then optional clipping, for the B environments of one slot.

    Scaling divides by the running standard deviation of each environment's
    discounted return (the running statistics are shared by the slot's B
    environments and updated with all of them every step).
    """

    def __init__(self, num_envs: int, gamma: float, normalize: bool, clip: float | None) -> None:
        self.gamma, self.normalize, self.clip = gamma, normalize, clip
        self.ret = np.zeros(num_envs, np.float64)
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Transformed rewards for one step; ``done`` ends the discounted-return accumulators."""
        out = reward.astype(np.float64)
        if self.normalize:
            self.ret = self.ret * self.gamma + out
            self._update(self.ret)
            out = out / np.sqrt(self.var + 1e-8)
            self.ret[done] = 0.0
        if self.clip is not None:
            out = np.clip(out, -self.clip, self.clip)
        return out.astype(np.float32)

    def stats(self) -> np.ndarray:
        """The running return statistics ``[mean, var, count]`` (what a resumed run needs to scale alike)."""
        return np.array([self.mean, self.var, self.count], np.float64)

    def load_stats(self, stats: np.ndarray) -> None:
        """Restore :meth:`stats` output; the per-episode accumulators start afresh."""
        mean, var, count = (float(v) for v in stats)
        if not (np.isfinite([mean, var, count]).all() and var >= 0 and count > 0):
            raise ValueError(f"reward statistics must be finite with var >= 0 and count > 0, got {stats.tolist()}")
        self.mean, self.var, self.count = mean, var, count

    def _update(self, x: np.ndarray) -> None:
        n = x.size
        mean, var = float(x.mean()), float(x.var())
        delta, total = mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.var = (self.var * self.count + var * n + delta**2 * self.count * n / total) / total
        self.count = total
