"""The replay store: segment columns in shared memory, sampled as items uniformly, by priority or in order.

Why this shape: an actor's segment ``[rows, B, ...]`` goes in with one copy per field into B chunk slots,
and every item (a window of L steps, see :mod:`srl.replay.spec`) is read out of its chunk, so nothing
is stored twice and n-step targets are computed when sampled (:mod:`srl.replay.items`). Every array
(chunks, sum tree, counters, running max priority) is one named shared-memory segment that the CONTROLLER
creates (:meth:`ReplayStore.create`; ``srl.base.shm.sweep_stale`` removes segments whose creator died, so a
worker must not create them) and the replay worker attaches to (:meth:`ReplayStore.attach`). A worker killed
and started again attaches to the same memory and finds every item and priority.

One process writes: the replay worker inserts, samples and updates priorities; there are no locks. The
order of writes is what makes a kill at any instant safe:

1. insert: the chunks about to be overwritten are retired first (the slots' ``removed`` counter), then the new
   data is written, then the new items get their priority (the running max), then the new chunk keys are
   published (``next_key``), then the rate limiter counts them. A half-written chunk is never live, a live
   chunk never holds half of an old one nor an old item's priority, and a kill before publishing leaves
   priorities on dead chunks, which :meth:`ReplayStore.repair` (the writer's first act after it attaches)
   zeroes, while it sets any live item at 0 to the running max and recomputes every sum of the tree.
2. sample: the batch is written, then the rate limiter counts it, then a queue moves its cursor and removes
   the chunks it has read. A kill in between hands the same items out again (at least once, never lost).

Keys: chunk keys come from :class:`srl.replay.keys.KeyedSlots` (chunk key ``k`` lives in slot
``k % capacity``); item key = chunk key * items per chunk + offset, and the priority tree's leaf of an item is
slot * items per chunk + offset. An item is live while its chunk key is, so a priority update for an item
whose chunk was overwritten since it was sampled is dropped (and counted). A stored step has a key too (chunk key
* steps per chunk + step): a search's refreshed targets (reanalysis) are written back to steps by it, with the same
rule, by the replay worker (the one writer), and a step read while its chunk was overwritten is known by its key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import numpy as np

from srl.base.prioritized import PrioritizedSampler
from srl.base.rate_limiter import RateLimiter
from srl.base.shm import ShmArray
from srl.replay.file import layout_difference, ring_runs, write_npz
from srl.replay.items import ItemReader
from srl.replay.keys import KeyedSlots
from srl.replay.spec import COUNTERS, ReplaySpec

__all__ = ["ReplayStore"]

_C = {name: i for i, name in enumerate(COUNTERS)}


class ReplayStore:
    """Chunks of segment columns; items sampled with n-step targets; samples per insert held by a rate limiter."""

    def __init__(
        self, spec: ReplaySpec, arrays: Mapping[str, np.ndarray], handles: list[ShmArray] | None = None
    ) -> None:
        """Adopt ``arrays`` (:meth:`ReplaySpec.arrays`, zeroed or holding a store's state); use the class methods."""
        self.spec = spec
        self._handles = handles or []
        self._chunks = spec.chunk_views(arrays)
        self._counters = arrays["counters"]
        self._scalars = arrays["scalars"]
        self.slots = KeyedSlots(spec.capacity, self._counters[0:2])
        self.limiter = RateLimiter(
            spec.samples_per_insert,
            spec.min_size,
            spec.error_buffer,
            spec.max_insert_batch,
            spec.max_sample_batch,
            self._counters[2:4],
        )
        self._per, self._T, self._stride = spec.items_per_chunk, spec.steps, spec.item_stride
        self._fifo = spec.sampler == "fifo"
        self._stacks = {part: arrays[f"stacks_{part}"] for part in spec.frame_stacks}
        self._reader = ItemReader(spec, arrays)
        self._batch_names = tuple(spec.batch_fields(1))
        self._checked: tuple[np.ndarray | None, ...] = ()
        """The batch arrays last checked whole (:meth:`_check_batch`), held so that their ids stay theirs."""
        self._checked_ids: tuple[int, ...] = ()
        self._priorities: PrioritizedSampler | None = None
        if spec.sampler == "prioritized":
            self._priorities = PrioritizedSampler(
                spec.max_items, spec.alpha, spec.beta, spec.priority_eps, arrays["tree"]
            )
            self._priorities.max_priority = max(1.0, float(self._scalars[0]))

    @classmethod
    def in_process(cls, spec: ReplaySpec) -> ReplayStore:
        """A store in this process's memory (the inline runtime, tests, benchmarks)."""
        return cls(spec, {name: np.zeros(f.shape, f.dtype) for name, f in spec.arrays().items()})

    @classmethod
    def create(cls, tag: str, spec: ReplaySpec) -> ReplayStore:
        """Create the shared segments ``<tag>_<array>`` (the controller, once per run); zeroed: an empty store."""
        return cls._shared(tag, spec, create=True)

    @classmethod
    def attach(cls, tag: str, spec: ReplaySpec) -> ReplayStore:
        """Attach to the segments the controller created: the replay worker (again after each restart), which
        then :meth:`repair` s it, or a reader beside it (a reanalyze worker), which writes nothing."""
        return cls._shared(tag, spec, create=False)

    @classmethod
    def _shared(cls, tag: str, spec: ReplaySpec, create: bool) -> ReplayStore:
        open_ = ShmArray.create if create else ShmArray.attach
        handles: list[ShmArray] = []
        try:
            for name, f in spec.arrays().items():
                handles.append(open_(f"{tag}_{name}", f.shape, f.dtype))
        except BaseException:
            _close(handles, unlink=create)
            raise
        arrays = {name: h.array for name, h in zip(spec.arrays(), handles)}
        return cls(spec, arrays, handles)

    def close(self, unlink: bool = False) -> None:
        """Unmap this process's view; ``unlink`` also removes the segments (the controller, at the run's end).

        A mapping closes only once no view of it is left, and nearly every attribute (the chunks, the reader's
        flat views, the sum tree, the counters, the last checked batch) holds one: a closed store keeps its
        spec alone, so that the mappings close here and not whenever the store is collected."""
        handles, spec = self._handles, self.spec
        self.__dict__.clear()
        self.spec, self._handles = spec, []
        _close(handles, unlink)

    # ---------------------------------------------------------------- sizes and the rate limiter

    @property
    def size(self) -> int:
        """Live items."""
        return self.slots.size * self.spec.items_per_chunk

    @property
    def items_per_segment(self) -> int:
        """Items one whole segment inserts (what to ask :meth:`can_insert` for)."""
        return self.spec.max_insert_batch

    @property
    def inserted_steps(self) -> int:
        """Steps of segment columns (columns times T) ever inserted, kept across restarts."""
        return self.slots.next_key * self.spec.steps * self.spec.team

    def _unread(self) -> int:
        """Items a queue has not handed out yet."""
        per = self.spec.items_per_chunk
        return self.slots.next_key * per - max(int(self._counters[_C["cursor"]]), self.slots.first * per)

    def can_insert(self, n_items: int) -> bool:
        """Whether the rate limiter lets ``n_items`` in now."""
        return self.limiter.can_insert(n_items)

    def can_sample(self, n: int) -> bool:
        """Whether the rate limiter lets ``n`` items out now (and a queue has ``n`` it has not handed out).

        A queue cannot deadlock: its limiter runs at 1 sample per insert with a buffer of at least
        ``A + B`` (largest insert and sample batches) and never loses an unread item (``ReplaySpec`` sizes
        it so), so its deficit never exceeds its unread items minus ``min_size``. While fewer than ``B`` are
        unread, an insert of ``A`` keeps the deficit under ``A + B - min_size``, within the buffer.
        """
        if not self.limiter.can_sample(n):
            return False
        return self.spec.sampler != "fifo" or self._unread() >= n

    # ---------------------------------------------------------------- insert

    def insert(self, segment: Mapping[str, np.ndarray]) -> np.ndarray:
        """Store every column of ``segment`` (the pool layout's fields, ``[rows, b, ...]``, ``b <= B``) as one chunk
        each (each team of columns, :attr:`ReplaySpec.team`); returns their chunk keys. A RuntimeError if the rate
        limiter holds it (ask :meth:`can_insert`)."""
        segment = self.spec.teams(segment)
        columns = self._check_segment(segment)
        n_items = columns * self.spec.items_per_chunk
        if not self.limiter.can_insert(n_items):
            raise RuntimeError(
                f"insert of {n_items} items is held by the rate limiter (deficit {self.limiter.deficit:g})"
            )
        self._retire(max(0, self.slots.size + columns - self.spec.capacity))
        slots = (self.slots.next_key + np.arange(columns)) % self.spec.capacity
        for name, src in segment.items():
            if name in self._stacks:
                self._write_frames(name, slots, src)
            else:
                self._chunks[name][slots] = src.swapaxes(0, 1)
        if self._stacks:
            self._restack(slots)
            self._check_frames(slots, segment)
        self._reader.index(slots)
        if self._priorities is not None:  # before publishing: the items are never live at an old item's priority
            self._priorities.insert(self._leaves(slots))
        _, keys = self.slots.insert(columns)  # published: the chunks are live from here on
        if self._priorities is not None:
            self._priorities.size = self.size
        self.limiter.inserted(n_items)
        return keys

    def _check_segment(self, segment: Mapping[str, np.ndarray]) -> int:
        """The segment's column count, after checking it carries exactly the layout's fields and shapes."""
        if set(segment) != set(self.spec.fields):
            missing, extra = set(self.spec.fields) - set(segment), set(segment) - set(self.spec.fields)
            raise ValueError(
                f"segment fields differ from the replay's: missing {sorted(missing)}, extra {sorted(extra)}"
            )
        columns = segment["actions"].shape[1] if segment["actions"].ndim > 1 else 0
        for name, spec in self.spec.fields.items():
            arr = segment[name]
            rows, _, *rest = spec.shape
            if arr.shape != (rows, columns, *rest) or arr.dtype != np.dtype(spec.dtype):
                want = ", ".join(map(str, (rows, "b", *rest)))
                raise ValueError(f"segment field {name!r} is {arr.dtype} {arr.shape}, expected {spec.dtype} ({want})")
        if not 1 <= columns <= self.spec.columns:
            raise ValueError(f"a segment has 1 to {self.spec.columns} columns, got {columns}")
        return columns

    def _write_frames(self, part: str, slots: np.ndarray, src: np.ndarray) -> None:
        """Frame stacks ``src [T + 1, b, S, ...]`` as frames: row 0's S, then the newest of each later row."""
        frames, stack = self._chunks[part], src.shape[2]
        frames[slots, :stack] = src[0]
        frames[slots, stack:] = src[1:, :, -1].swapaxes(0, 1)

    def _restack(self, slots: np.ndarray) -> None:
        """Every observation row's frames (flat rows of ``field_<part>``) for chunks ``slots``, from their flags.

        Row t's frames are ``t .. t + S - 1`` (its newest is frame ``t + S - 1``); where an episode began at row
        ``s`` of the chunk (step ``s - 1`` ended), frames before ``s + S - 1`` are the episode's first frame again.
        """
        T = self.spec.steps
        ended = self._chunks["terminated"][slots] | self._chunks["truncated"][slots]  # [b, T]
        rows = np.arange(T + 1)
        before = -(1 << 40)  # an episode that began before the chunk: no frame of any stack is clamped
        start = np.full((len(slots), T + 1), before)
        start[:, 1:] = np.where(ended, rows[1:], before)
        np.maximum.accumulate(start, axis=1, out=start)  # the row where each row's episode began, if in the chunk
        for stacks in self._stacks.values():
            stack = stacks.shape[2]
            frame = rows[:, None] + np.arange(stack)  # [T + 1, S]
            frame = np.maximum(frame[None], (start + stack - 1)[:, :, None])
            stacks[slots] = frame + (slots * (T + stack))[:, None, None]

    def _check_frames(self, slots: np.ndarray, segment: Mapping[str, np.ndarray]) -> None:
        """A ValueError naming the first observation row that the chunks' frames do not restack exactly."""
        for part, stacks in self._stacks.items():
            frames = self._chunks[part]
            restacked = frames.reshape(-1, *frames.shape[2:])[stacks[slots]]  # [b, T + 1, S, ...]
            given = segment[part].swapaxes(0, 1)
            if not np.array_equal(restacked, given):
                column, row = np.argwhere((restacked != given).reshape(*given.shape[:2], -1).any(axis=2))[0]
                raise ValueError(
                    f"replay.frame_stacks: observation part {part!r} is not a frame stack that moves on by one frame "
                    f"a step (row {row} of segment column {column} does not restack); leave it out of frame_stacks"
                )

    def _retire(self, chunks: int) -> None:
        """Make the ``chunks`` oldest chunks dead before their slots are overwritten (crash order: keys first).
        Their priorities stay until the insert sets the new items' (one process samples and inserts, so none is
        drawn in between; after a kill, :meth:`repair` zeroes a dead chunk's)."""
        if chunks:
            self.slots.remove_oldest(chunks)

    def _leaves(self, slots: np.ndarray) -> np.ndarray:
        """Every item leaf of the chunks in ``slots``, flat."""
        per = self.spec.items_per_chunk
        return (slots[:, None] * per + np.arange(per)).ravel()

    # ---------------------------------------------------------------- sample

    def sample_into(
        self,
        out: Mapping[str, np.ndarray],
        rng: np.random.Generator,
        n: int = 1,
        gamma: float = 0.99,
        beta: float | None = None,
    ) -> None:
        """Fill ``out`` (allocated from :meth:`ReplaySpec.batch_fields`; other fields in it are left alone) with
        ``len(out["keys"])`` items drawn with ``rng``, their ``n``-step targets, and importance weights at ``beta``
        (the spec's when None; a run may anneal it). A RuntimeError if the rate limiter holds it (ask
        :meth:`can_sample`)."""
        batch = self._check_batch(out)
        if self._fifo and self._unread() < batch:
            raise RuntimeError(f"sample of {batch} items is held: the queue has {self._unread()} unread")
        if beta is not None and self._priorities is not None:
            self._priorities.beta = beta
        rows = self._draw(batch, rng, out["keys"], out["weights"])
        self._reader.read(rows, n, gamma, out)
        # counted once written (the module docstring's order); a sample the limiter holds raises here, its batch
        # written for nothing (callers ask can_sample first, so that is a caller's bug, not a lost item)
        self.limiter.sampled(batch)
        if self._fifo:
            self._advance(batch)

    def _check_batch(self, out: Mapping[str, np.ndarray]) -> int:
        """The batch size, after checking ``out`` has every batch field at its shape and dtype (once per batch:
        a replay worker fills the same few buffers again and again)."""
        arrays = tuple(map(out.get, self._batch_names))
        if tuple(map(id, arrays)) == self._checked_ids:
            return len(out["keys"])
        batch = out["keys"].shape[0] if "keys" in out and out["keys"].ndim == 1 else 0
        for name, spec in self.spec.batch_fields(batch).items():
            arr = out.get(name)
            if arr is None or arr.shape != spec.shape or arr.dtype != np.dtype(spec.dtype):
                got = "missing" if arr is None else f"{arr.dtype} {arr.shape}"
                raise ValueError(f"batch field {name!r} is {got}, expected {spec.dtype} {spec.shape}")
        self._checked, self._checked_ids = arrays, tuple(map(id, arrays))
        return batch

    def _draw(self, batch: int, rng: np.random.Generator, keys: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Draw ``batch`` items by the spec's sampler into ``keys`` and their importance weights into ``weights``;
        returns the flat step rows where they start (chunk slot * T + item offset * stride)."""
        per, T = self._per, self._T
        if self._priorities is not None:
            leaves, w = self._priorities.sample(batch, rng)
            weights[...] = w
            slots, offsets = np.divmod(leaves, per)
            keys[...] = self.slots.keys_of(slots) * per + offsets
            return leaves if per == T else slots * T + offsets * self._stride
        weights[...] = 1.0
        first, end = self.slots.bounds()
        first *= per
        if self._fifo:
            start = max(int(self._counters[_C["cursor"]]), first)
            keys[...] = np.arange(start, start + batch, dtype=np.int64)
        else:
            draw = rng.random(batch)  # twice as fast as rng.integers for a few hundred; the bias is size / 2^53
            draw *= end * per - first
            np.copyto(keys, draw, casting="unsafe")  # truncates: a uniform index in [0, size)
            keys += first
        if per == T:  # items of one step: key k starts at flat row k mod (capacity * T)
            return keys % (self.spec.capacity * T)
        chunk_keys, offsets = np.divmod(keys, per)
        return (chunk_keys % self.spec.capacity) * T + offsets * self._stride

    def _advance(self, batch: int) -> None:
        """A queue hands out each item once: move its cursor, then remove the chunks it has read to the end."""
        per = self.spec.items_per_chunk
        cursor = max(int(self._counters[_C["cursor"]]), self.slots.first * per) + batch
        self._counters[_C["cursor"]] = cursor
        self.slots.remove_oldest(cursor // per - self.slots.first)

    # ---------------------------------------------------------------- stored steps, by key (reanalysis)

    def draw_steps(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` step keys drawn uniformly over the live chunks' steps (none while the store is empty)."""
        first, end = self.slots.bounds()
        if end <= first:
            return np.zeros(0, np.int64)
        return rng.integers(first, end, count) * self._T + rng.integers(0, self._T, count)

    def _step_rows(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flat step rows of step keys, and their chunk keys."""
        chunk_keys, steps = np.divmod(np.asarray(keys, np.int64), self._T)
        return (chunk_keys % self.spec.capacity) * self._T + steps, chunk_keys

    def _live(self, chunk_keys: np.ndarray) -> np.ndarray:
        """Which chunk keys are live (their chunk not overwritten since)."""
        return (chunk_keys >= 0) & self.slots.live(chunk_keys % self.spec.capacity, chunk_keys)

    def read_steps(self, keys: np.ndarray, out: Mapping[str, np.ndarray]) -> np.ndarray:
        """The observation parts of steps ``keys`` ``[N]`` into ``out[part]`` ``[N, ...]``; returns which were
        live once read (a row whose chunk was overwritten meanwhile may hold parts of either, and is not)."""
        rows, chunk_keys = self._step_rows(keys)
        self._reader.read_observations(rows, out)
        return self._live(chunk_keys)  # after the read: the insert retires a chunk before overwriting it

    def write_steps(self, keys: np.ndarray, name: str, values: np.ndarray) -> tuple[int, int]:
        """Overwrite step field ``name`` (a carried one: a search's policy) of steps ``keys``; a step whose chunk
        was overwritten since its key was drawn is left alone. Returns ``(applied, stale)``."""
        rows, chunk_keys = self._step_rows(keys)
        live = self._live(chunk_keys)
        self._reader.write_steps(name, rows[live], np.asarray(values)[live])
        return int(live.sum()), int(len(live) - live.sum())

    # ---------------------------------------------------------------- priorities

    def update_priorities(self, keys: np.ndarray, values: np.ndarray) -> tuple[int, int]:
        """Set the priorities of items ``keys`` (from a batch's ``keys``); returns ``(applied, stale)``.

        An item whose chunk was overwritten since it was sampled is stale: its update is dropped, never applied
        to the newer item in its slot. Zero is floored at ``priority_eps``; NaN, infinite and negative values are
        refused and counted (``stats()``), never raised. A sampler without priorities counts them as ignored.
        """
        keys = np.asarray(keys, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if keys.shape != values.shape or keys.ndim != 1:
            raise ValueError(f"keys {keys.shape} and priorities {values.shape} must be one [N] shape")
        per = self.spec.items_per_chunk
        chunk_keys, offsets = np.divmod(keys, per)
        live = (keys >= 0) & self.slots.live(chunk_keys % self.spec.capacity, chunk_keys)
        stale = int(keys.size - np.count_nonzero(live))
        self._counters[_C["stale"]] += stale
        if self._priorities is None:
            self._counters[_C["ignored"]] += keys.size - stale
            return 0, stale
        refused = self._priorities.refused
        leaves = (chunk_keys[live] % self.spec.capacity) * per + offsets[live]
        self._priorities.set_priorities(leaves, values[live])
        self._scalars[0] = self._priorities.max_priority
        refused = self._priorities.refused - refused
        self._counters[_C["refused"]] += refused
        return int(leaves.size - refused), stale

    def repair(self) -> None:
        """The writer's first act after attaching (the replay worker's ``setup``; attaching itself writes nothing,
        so a reader, a reanalyze worker, may attach while the writer runs). With priorities: dead chunks' 0, live
        items' at least ``eps`` (a kill between publishing a chunk and its priorities left them 0), every sum of
        the tree recomputed from its leaves."""
        if self._priorities is None:
            return
        sampler, per = self._priorities, self.spec.items_per_chunk
        every = np.arange(self.spec.max_items)
        leaves = sampler.tree.leaves(every).reshape(self.spec.capacity, per)
        live = self.slots.keys_of(np.arange(self.spec.capacity)) >= 0
        leaves[~live] = 0.0
        leaves[live[:, None] & (leaves == 0.0)] = sampler.max_priority**sampler.alpha
        sampler.tree.update(every, leaves.ravel())
        sampler.size = self.size

    # ---------------------------------------------------------------- stats, save and load

    def stats(self) -> dict[str, float]:
        """Size, counts, measured samples per insert and priority statistics, for the metrics (a reporter adds
        its ``replay_`` prefix)."""
        c = self._counters
        out = {
            "size": float(self.size),
            "inserted": float(self.limiter.inserts),
            "inserted_steps": float(self.inserted_steps),
            "sampled": float(self.limiter.samples),
            "samples_per_insert": self.limiter.measured_samples_per_insert,
            "stale_priorities": float(c[_C["stale"]]),
            "refused_priorities": float(c[_C["refused"]]),
            "ignored_priorities": float(c[_C["ignored"]]),
        }
        if self._priorities is not None:
            out["priority_max"] = self._priorities.max_priority
            out["priority_alpha_mean"] = self._priorities.tree.total / max(1, self.size)
        return out

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the live items, their priorities and every counter to ``path`` atomically (``.npz``), streamed
        from the ring without gathering a copy (:mod:`srl.replay.file`)."""
        first, count = self.slots.first, self.slots.size
        arrays = {f"field_{name}": ring_runs(chunk, first, count) for name, chunk in self._chunks.items()}
        arrays["layout"] = [np.array(json.dumps(self.spec.describe(), sort_keys=True))]
        arrays["counters"] = [self._counters.copy()]
        arrays["priorities"] = [self._live_priorities(np.arange(first, first + count) % self.spec.capacity)]
        write_npz(path, arrays)

    def _live_priorities(self, slots: np.ndarray) -> np.ndarray:
        """Priorities (not powered by alpha) of the chunks in ``slots``, ``[chunks, items per chunk]``; NaN where
        the sampler keeps none (uniform, fifo, or alpha 0, where every item weighs the same)."""
        shape = (slots.size, self.spec.items_per_chunk)
        sampler = self._priorities
        if sampler is None or sampler.alpha == 0.0:
            return np.full(shape, np.nan)
        return (sampler.tree.leaves(self._leaves(slots)) ** (1.0 / sampler.alpha)).reshape(shape)

    def load(self, path: str | os.PathLike[str]) -> None:
        """Restore a saved replay into this empty store: the newest chunks that fit, their priorities (at the
        running max where the file has none) and the counters. A ValueError in one line for a file whose layout
        differs."""
        if self.slots.next_key:
            raise ValueError(f"replay load {path}: the store is not empty ({self.size} items)")
        with np.load(path, allow_pickle=False) as data:
            difference = layout_difference(json.loads(str(data["layout"])), self.spec.describe())
            if difference:
                raise ValueError(f"replay file {path}: {difference}")
            counters, priorities = data["counters"], data["priorities"]
            chunks = len(priorities)
            kept = min(chunks, self.spec.capacity)
            next_key = int(counters[_C["next_key"]])
            keys = np.arange(next_key - kept, next_key, dtype=np.int64)
            slots = keys % self.spec.capacity
            for name, chunk in self._chunks.items():
                chunk[slots] = data[f"field_{name}"][chunks - kept :]
        if self._stacks:
            self._restack(slots)
        self._reader.index(slots)
        self._restore_counters(counters, kept)
        if self._priorities is not None:
            self._set_loaded_priorities(slots, priorities[chunks - kept :])

    def _restore_counters(self, counters: np.ndarray, kept: int) -> None:
        """The saved counters, the keyed slots' reduced to the ``kept`` newest chunks."""
        next_key = int(counters[_C["next_key"]])
        removed = max(int(counters[_C["removed"]]), next_key - kept)
        self.slots.restore({"capacity": self.spec.capacity, "next_key": next_key, "removed": removed})
        self.limiter.restore({"inserts": int(counters[_C["inserts"]]), "samples": int(counters[_C["samples"]])})
        for name in ("cursor", "stale", "refused", "ignored"):
            self._counters[_C[name]] = counters[_C[name]]

    def _set_loaded_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Loaded items' priorities; NaN (none saved) enter at the running max, like new items."""
        sampler = self._priorities
        assert sampler is not None
        known = priorities[np.isfinite(priorities)]
        if known.size:
            sampler.max_priority = max(sampler.max_priority, float(known.max()))
            self._scalars[0] = sampler.max_priority
        values = np.where(np.isfinite(priorities), priorities, sampler.max_priority)
        sampler.set_priorities(self._leaves(slots), values.ravel())
        sampler.size = self.size


def _close(handles: list[ShmArray], unlink: bool) -> None:
    for h in handles:
        h.close()
        if unlink:
            h.unlink()
