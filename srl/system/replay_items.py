"""Reads sampled items out of a replay's chunks into a batch, with their n-step targets.

Why the targets are kept per stored step: a batch then reads each step's return, discount and bootstrap row with
one gather apiece, instead of walking ``n`` steps of rewards and flags for every item it draws (a replay inserts
a step once and samples it ``samples_per_insert`` times). They are computed for the ``n`` and ``gamma`` a batch
asks for: new chunks when they are inserted, and every chunk again when a batch asks for another ``n`` or
``gamma``, so a run can change them without re-inserting anything. They live in the reading process's memory,
derived from the chunks: a restarted replay worker computes them again at its first batch.

Targets. Step ``s`` of chunk ``c`` takes ``m`` steps, at most ``n``, up to its episode's end or the chunk's
last step (:func:`srl.system.nstep.nstep`), and bootstraps from the observation after step ``s + m - 1``:

- the episode goes on: observation row ``s + m``; past the chunk's last step that is row ``T``, the segment's
  bootstrap observation (a cut, not a time limit: the discount stays ``gamma^m``);
- terminated: the discount is 0 (the observation is never valued);
- truncated by a time limit: ``final_<part>`` of that step, where the layout keeps final observations (they share
  their part's array, :attr:`ReplaySpec.obs_rows`, so this is a row like any other). Image parts keep none. There
  the observation of the truncated step itself stands in: with ``m >= 2`` the target drops that step (its reward
  out, discount ``gamma^(m-1)``), which is the exact ``m - 1``-step target, since that observation is the next
  observation of the step before; with ``m = 1`` (the item's own step was cut) it is ``r + gamma * V(s_t)``, the
  stand-in PPO uses for ``V(s_{t+1})`` there (time limits are rare in image envs).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from srl.system.nstep import nstep
from srl.system.replay_spec import ReplaySpec

__all__ = ["ItemReader"]


class ItemReader:
    """Gathers items of a replay's chunk arrays into a preallocated batch, from every step's kept target."""

    def __init__(self, spec: ReplaySpec, arrays: Mapping[str, np.ndarray]) -> None:
        """``arrays``: the store's (:meth:`ReplaySpec.arrays`); each field read through a flat view
        ``[capacity * rows, ...]`` (an observation part's ``rows`` are :attr:`ReplaySpec.obs_rows`), and for a
        part kept as frames each observation row's frames (rows of its flat view)."""
        self.spec = spec
        self._flat = {
            name[len("field_") :]: arr.reshape(-1, *arr.shape[2:])
            for name, arr in arrays.items()
            if name.startswith("field_")
        }
        self._stacks = {
            part: arrays[f"stacks_{part}"].reshape(-1, arrays[f"stacks_{part}"].shape[2]) for part in spec.frame_stacks
        }
        self._window = np.arange(spec.item_length, dtype=np.int64)[:, None]
        self._skip = spec.obs_rows - spec.steps
        """Observation rows per chunk beyond one per step: step ``c * T + s`` observes row ``c * obs_rows + s``."""
        all_steps = np.arange(spec.capacity * spec.steps, dtype=np.int64)
        self._obs_row = all_steps // spec.steps * self._skip + all_steps
        """Per step, its observation row (one gather in a batch instead of three array operations)."""
        self._parts = tuple((part, f"boot_{part}") for part in spec.obs_fields)
        self._alive = "alive" in spec.fields
        steps = spec.capacity * spec.steps
        self._returns = np.zeros(steps, np.float32)
        self._discounts = np.zeros(steps, np.float32)
        self._boot = np.zeros(steps, np.int64)
        """Per step: the flat observation row its target bootstraps from."""
        self._targets_for: tuple[int, float] | None = None
        """The ``(n, gamma)`` the kept targets are for; None until the first batch."""

    def index(self, slots: np.ndarray) -> None:
        """Compute the targets of chunks ``slots``, just written, for the ``n`` and ``gamma`` batches ask for."""
        if self._targets_for is not None:
            self._compute(slots, *self._targets_for)

    def read(self, rows: np.ndarray, n: int, gamma: float, out: Mapping[str, np.ndarray]) -> None:
        """Fill ``out`` (:meth:`ReplaySpec.batch_fields`) but for ``weights`` and ``keys`` with the items whose
        first steps are flat step rows ``rows`` (``[N]``: chunk slot * T + offset)."""
        if self._targets_for != (n, gamma):
            self._targets_for = None  # an exception inside leaves none half-computed in use
            self._compute(np.arange(self.spec.capacity), n, gamma)
            self._targets_for = (n, gamma)
        flat = self._flat
        steps = rows[None, :] if self.spec.item_length == 1 else rows[None, :] + self._window  # [L, N]
        # ndarray.take with mode="clip": the rows are valid by construction, and the default mode="raise" copies
        # through a buffer (several times slower for a batch of a few hundred).
        obs_rows = self._obs_row.take(steps, mode="clip")
        boot = self._boot.take(steps, mode="clip")
        for part, boot_part in self._parts:
            stacks = self._stacks.get(part)
            if stacks is None:
                flat[part].take(obs_rows, axis=0, out=out[part], mode="clip")
                flat[part].take(boot, axis=0, out=out[boot_part], mode="clip")
            else:  # restacked: each row's frames, then the frames themselves
                flat[part].take(stacks.take(obs_rows, axis=0, mode="clip"), axis=0, out=out[part], mode="clip")
                flat[part].take(stacks.take(boot, axis=0, mode="clip"), axis=0, out=out[boot_part], mode="clip")
        flat["actions"].take(steps, axis=0, out=out["actions"], mode="clip")
        self._returns.take(steps, out=out["returns"], mode="clip")
        self._discounts.take(steps, out=out["discounts"], mode="clip")
        if self._alive:
            flat["alive"].take(steps, axis=0, out=out["alive"], mode="clip")

    def _compute(self, slots: np.ndarray, n: int, gamma: float) -> None:
        """The n-step returns, discounts and bootstrap rows of every step of chunks ``slots``."""
        T, flat = self.spec.steps, self._flat
        steps = np.tile(np.arange(T, dtype=np.int64), len(slots))
        step_rows = np.repeat(slots.astype(np.int64) * T, T) + steps
        lengths = np.minimum(T - steps, n)
        window = step_rows[:, None] + np.minimum(np.arange(n), lengths[:, None] - 1)  # never past the chunk
        rewards = flat["rewards"][window]
        returns, discounts, taken = nstep(
            rewards, flat["terminated"][window], flat["truncated"][window], gamma, n, lengths
        )
        last = step_rows + taken  # the step each target bootstraps after
        cut = flat["truncated"][last] & ~flat["terminated"][last]
        chunk = last // T
        boot = last + chunk * self._skip + 1  # its next observation row
        if cut.any():
            if self.spec.has_final_obs:  # its final observation: row T + 1 + s of chunk c
                boot[cut] += T
            else:
                boot[cut] -= 1  # the truncated step's own observation stands in (module docstring)
                drop = np.flatnonzero(cut & (taken >= 1))
                power = np.power(np.float32(gamma), taken[drop]).astype(np.float32)
                returns[drop] -= power * rewards[drop, taken[drop]]
                discounts[drop] = power
        self._returns[step_rows] = returns
        self._discounts[step_rows] = discounts
        self._boot[step_rows] = boot
