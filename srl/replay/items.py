"""Reads sampled items out of a replay's chunks into a batch, with their n-step targets.

Why the targets are kept per stored step: a batch then reads each step's return, discount and bootstrap row with
one gather apiece, instead of walking ``n`` steps of rewards and flags for every item it draws (a replay inserts
a step once and samples it ``samples_per_insert`` times). They are computed for the ``n`` and ``gamma`` a batch
asks for: new chunks when they are inserted, and every chunk again when a batch asks for another ``n`` or
``gamma``, so a run can change them without re-inserting anything. They live in the reading process's memory,
derived from the chunks: a restarted replay worker computes them again at its first batch.

Targets. Step ``s`` of chunk ``c`` takes ``m`` steps, at most ``n``, up to its episode's end or the chunk's
last step (:func:`srl.algorithms.nstep.nstep`), and bootstraps from the observation after step ``s + m - 1``:

- the episode goes on: observation row ``s + m``; past the chunk's last step that is row ``T``, the segment's
  bootstrap observation (a cut, not a time limit: the discount stays ``gamma^m``);
- terminated: the discount is 0 (the observation is never valued);
- truncated by a time limit: ``final_<part>`` of that step, where the layout keeps final observations (they share
  their part's array, :attr:`ReplaySpec.obs_rows`, so this is a row like any other). Image parts keep none:
  there the truncated step's own observation stands in (:func:`srl.algorithms.nstep.chunk_targets`).

Sequence batches (a recurrent policy's) carry no targets: the learner unrolls them and makes its own.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from srl.algorithms.nstep import chunk_targets
from srl.api.schema import MEMORY
from srl.replay.spec import ReplaySpec

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
        self._seq_window = np.arange(spec.item_length + 1, dtype=np.int64)[:, None]
        self._skip = spec.obs_rows - spec.steps
        """Observation rows per chunk beyond one per step: step ``c * T + s`` observes row ``c * obs_rows + s``."""
        all_steps = np.arange(spec.capacity * spec.steps, dtype=np.int64)
        self._obs_row = all_steps // spec.steps * self._skip + all_steps
        """Per step, its observation row (one gather in a batch instead of three array operations)."""
        self._parts = tuple((part, f"boot_{part}") for part in spec.obs_fields)
        self._alive = "alive" in spec.fields
        ends = ("rewards", "terminated", "truncated") if spec.windows else ()
        self._carried = ("actions", *ends, *spec.carried)
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
        first steps are flat step rows ``rows`` (``[N]``: chunk slot * T + offset); a sequence batch reads no
        targets, so ``n`` and ``gamma`` are unused there."""
        if self.spec.sequences:
            self._read_sequences(rows, out)
            return
        if self._targets_for != (n, gamma):
            self._targets_for = None  # an exception inside leaves none half-computed in use
            self._compute(np.arange(self.spec.capacity), n, gamma)
            self._targets_for = (n, gamma)
        steps = rows[None, :] if self.spec.item_length == 1 else rows[None, :] + self._window  # [L, N]
        # ndarray.take with mode="clip": the rows are valid by construction, and the default mode="raise" copies
        # through a buffer (several times slower for a batch of a few hundred).
        obs_rows = self._obs_row.take(steps, mode="clip")
        boot = self._boot.take(steps, mode="clip")
        for part, boot_part in self._parts:
            self._observations(part, obs_rows, out[part])
            self._observations(part, boot, out[boot_part])
        self._steps(steps, self._carried, out)
        self._returns.take(steps, out=out["returns"], mode="clip")
        self._discounts.take(steps, out=out["discounts"], mode="clip")

    def read_observations(self, steps: np.ndarray, out: Mapping[str, np.ndarray]) -> None:
        """The observation parts that flat step rows ``steps`` ``[N]`` acted on, into ``out[part]`` ``[N, ...]``."""
        rows = self._obs_row.take(steps, mode="clip")
        for part, _ in self._parts:
            self._observations(part, rows, out[part])

    def write_steps(self, name: str, steps: np.ndarray, values: np.ndarray) -> None:
        """Overwrite step field ``name`` (one the acting policy carried) at flat step rows ``steps`` ``[N]``."""
        if name not in self.spec.carried:
            raise ValueError(f"{name!r} is not a step field the acting policy stored ({', '.join(self.spec.carried)})")
        target = self._flat[name]
        if values.shape != (len(steps), *target.shape[1:]):
            raise ValueError(f"{name!r}: {values.shape} values for {len(steps)} steps of {target.shape[1:]}")
        target[steps] = values

    def _read_sequences(self, rows: np.ndarray, out: Mapping[str, np.ndarray]) -> None:
        """Sequence items: their ``L + 1`` observation rows (consecutive in a chunk), their steps as stored, and
        the recurrent state their first step was acted on with (row ``s`` of chunk ``c``'s ``T + 1`` state rows)."""
        steps = rows[None, :] + self._window  # [L, N]
        obs_rows = self._obs_row.take(rows, mode="clip")[None, :] + self._seq_window  # [L + 1, N]
        for part, _ in self._parts:
            self._observations(part, obs_rows, out[part])
        self._steps(steps, ("rewards", "terminated", "truncated", *self._carried), out)
        self._flat[MEMORY].take(rows + rows // self.spec.steps, axis=0, out=out[MEMORY], mode="clip")

    def _observations(self, part: str, obs_rows: np.ndarray, out: np.ndarray) -> None:
        """Observation rows ``obs_rows`` of ``part`` into ``out``; a part kept as frames is restacked: each row's
        frames, then the frames themselves."""
        stacks = self._stacks.get(part)
        if stacks is None:
            self._flat[part].take(obs_rows, axis=0, out=out, mode="clip")
        else:
            self._flat[part].take(stacks.take(obs_rows, axis=0, mode="clip"), axis=0, out=out, mode="clip")

    def _steps(self, steps: np.ndarray, names: tuple[str, ...], out: Mapping[str, np.ndarray]) -> None:
        """Step fields ``names`` (and ``alive`` where the layout has it) of flat step rows ``steps`` into ``out``."""
        for name in (*names, "alive") if self._alive else names:
            self._flat[name].take(steps, axis=0, out=out[name], mode="clip")

    def _compute(self, slots: np.ndarray, n: int, gamma: float) -> None:
        """The n-step returns, discounts and bootstrap rows of every step of chunks ``slots``."""
        T, flat = self.spec.steps, self._flat
        rows = slots.astype(np.int64)[:, None] * T + np.arange(T, dtype=np.int64)  # [C, T] flat step rows
        stand_in = not self.spec.has_final_obs
        returns, discounts, boot, cut = chunk_targets(
            flat["rewards"][rows], flat["terminated"][rows], flat["truncated"][rows], gamma, n, stand_in
        )
        boot += slots.astype(np.int64)[:, None] * self.spec.obs_rows  # the chunk's observation row, flat
        if not stand_in:  # a cut bootstraps from the final observation of its last step: row T + 1 + s
            boot[cut] += T
        self._returns[rows] = returns
        self._discounts[rows] = discounts
        self._boot[rows] = boot
