"""Reads sampled items out of a replay's chunks into a batch, with their n-step targets.

Why at sampling time: ``n`` and ``gamma`` come with each call, so a run can change them without re-inserting
anything, and a chunk holds every step once (a target needs the steps after an item, which its chunk has).

Targets. Step ``s`` of chunk ``c`` takes ``m`` steps, at most ``n``, up to its episode's end or the chunk's
last step (:func:`srl.system.nstep.nstep`), and bootstraps from the observation after step ``s + m - 1``:

- the episode goes on: observation row ``s + m``; past the chunk's last step that is row ``T``, the segment's
  bootstrap observation (a cut, not a time limit: the discount stays ``gamma^m``);
- terminated: the discount is 0 (the observation is never valued);
- truncated by a time limit: ``final_<part>`` of that step, where the layout keeps final observations. Image
  parts keep none. There the observation of the truncated step itself stands in: with ``m >= 2`` the target
  drops that step (its reward out, discount ``gamma^(m-1)``), which is the exact ``m - 1``-step target, since
  that observation is the next observation of the step before; with ``m = 1`` (the item's own step was cut) it
  is ``r + gamma * V(s_t)``, the stand-in PPO uses for ``V(s_{t+1})`` there (time limits are rare in image envs).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from srl.api.spaces import FINAL_PREFIX
from srl.system.nstep import nstep
from srl.system.replay_spec import ReplaySpec

__all__ = ["ItemReader"]


class ItemReader:
    """Gathers items ``(chunk slot, offset)`` of a replay's chunk arrays into a preallocated batch."""

    def __init__(self, spec: ReplaySpec, chunks: Mapping[str, np.ndarray]) -> None:
        """``chunks``: field name -> ``[capacity, rows, ...]``; read through flat views ``[capacity * rows, ...]``."""
        self.spec = spec
        self._flat = {name: arr.reshape(-1, *arr.shape[2:]) for name, arr in chunks.items()}
        self._window = np.arange(spec.item_length, dtype=np.int64)[:, None]

    def read(self, slots: np.ndarray, offsets: np.ndarray, n: int, gamma: float, out: Mapping[str, np.ndarray]) -> None:
        """Fill ``out`` (:meth:`ReplaySpec.batch_fields`) but for ``weights`` and ``keys`` with the items at
        ``offsets`` of chunks ``slots`` (both ``[N]``)."""
        T = self.spec.steps
        steps = offsets[None, :] + self._window  # [L, N]
        step_rows = slots[None, :] * T + steps
        for part in self.spec.obs_fields:
            np.take(self._flat[part], step_rows + slots[None, :], axis=0, out=out[part], mode="clip")
        np.take(self._flat["actions"], step_rows, axis=0, out=out["actions"], mode="clip")
        self._targets(step_rows.ravel(), steps.ravel(), n, gamma, out)

    def _targets(
        self, step_rows: np.ndarray, steps: np.ndarray, n: int, gamma: float, out: Mapping[str, np.ndarray]
    ) -> None:
        """n-step returns, discounts and bootstrap observations of every step read (flat ``[L * N]``)."""
        T, flat = self.spec.steps, self._flat
        lengths = np.minimum(T - steps, n)
        window = step_rows[:, None] + np.minimum(np.arange(n), lengths[:, None] - 1)  # never past the chunk
        rewards = flat["rewards"][window]
        returns, discounts, taken = nstep(
            rewards, flat["terminated"][window], flat["truncated"][window], gamma, n, lengths
        )
        last = step_rows + taken  # the step each target bootstraps after
        cut = flat["truncated"][last] & ~flat["terminated"][last]
        obs_rows = last + last // T + 1  # its next observation row: chunk c has T + 1 of them
        final = self.spec.has_final_obs
        if not final and cut.any():
            obs_rows[cut] -= 1  # the truncated step's own observation stands in (module docstring)
            drop = np.flatnonzero(cut & (taken >= 1))
            power = np.power(np.float32(gamma), taken[drop]).astype(np.float32)
            returns[drop] -= power * rewards[drop, taken[drop]]
            discounts[drop] = power
        shape = out["returns"].shape
        for part in self.spec.obs_fields:
            boot = out[f"boot_{part}"]
            np.take(flat[part], obs_rows.reshape(shape), axis=0, out=boot, mode="clip")
            if final and cut.any():
                boot.reshape(-1, *boot.shape[2:])[cut] = flat[FINAL_PREFIX + part][last[cut]]
        out["returns"][...] = returns.reshape(shape)
        out["discounts"][...] = discounts.reshape(shape)
