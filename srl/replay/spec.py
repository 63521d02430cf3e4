"""What a replay store holds and hands out: its chunks, its items, its sampled batch and its shared arrays.

A *chunk* is one column of an actor's segment: every field of the pool layout with the environment axis
removed (observation fields ``T + 1`` rows, step fields ``T``, segment-scoped fields 1). An *item* is a window
of ``item_length`` (L) consecutive steps inside one chunk, starting every ``item_stride`` (S) steps at offsets
``0, S, .., T - L``, so a chunk holds ``(T - L) / S + 1`` items and nothing is stored twice. Where the algorithm
learns from a team's steps together (``team_items``: QMIX), a chunk is one environment's ``team`` consecutive
columns instead (every agent of it, env-major as the multi-agent slots lay them out): each field gains an agent axis
after the column axis, ``[rows, B / team, team, ...]``, and an item is the team's window.

Two kinds of batch (:meth:`ReplaySpec.batch_fields`): *transitions*, each step with the n-step target the replay
computes (DQN, SAC, TD3), and, where the layout carries a recurrent policy's state (:data:`MEMORY`),
*sequences*: an item's observations, actions and rewards as they were, with the state its first step was acted
on with; a recurrent learner unrolls them and makes its own targets (R2D2).

The spec is derived from the config and the pool layout in every process alike (the controller creates the
store, the replay worker attaches to it), so both agree on every shape without sending one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from srl.api.config.errors import ConfigError
from srl.api.config.replay import ReplayConfig
from srl.api.schema import ALIVE, MEMORY, STREAM_FIELDS, FieldSpec
from srl.api.spaces import FINAL_PREFIX, STATE
from srl.base.rate_limiter import RateLimiter, least_error_buffer
from srl.base.sumtree import SumTree
from srl.system.streams import PoolLayout

__all__ = ["COUNTERS", "ReplaySpec", "Sampler"]

COUNTERS = ("next_key", "removed", "inserts", "samples", "cursor", "stale", "refused", "ignored")
"""The store's int64 counters, in one shared array: the keyed slots' two, the rate limiter's two, the fifo
cursor (the next item key a queue hands out), and the priority updates dropped as stale, refused (NaN,
infinite, negative) and ignored (a sampler without priorities)."""

Sampler = Literal["uniform", "prioritized", "fifo"]


@dataclass(frozen=True)
class ReplaySpec:
    """The shapes and settings of one replay store; build it with :meth:`of`."""

    fields: Mapping[str, FieldSpec]
    """The segment layout inserted: ``[rows, B, ...]`` per field, as in the actors' pool."""
    obs_fields: tuple[str, ...]
    """The observation parts the acting policy reads, and the env's global state where the segments carry it
    (what a sampled batch carries)."""
    capacity: int
    """Chunks kept (segment columns)."""
    item_length: int
    sampler: Sampler
    alpha: float
    beta: float
    priority_eps: float
    samples_per_insert: float
    min_size: int
    error_buffer: float
    """Resolved: the config's, or the least the rate limiter's no-deadlock bound allows."""
    max_sample_batch: int
    frame_stacks: tuple[str, ...] = ()
    """Observation parts kept as frames (:meth:`chunk_shape`) and restacked when read."""
    item_stride: int = 1
    """Steps between the starts of a chunk's consecutive items."""
    team: int = 1
    """Segment columns per chunk: 1, or an environment's agents (:meth:`teams`)."""

    @classmethod
    def of(cls, layout: PoolLayout, cfg: ReplayConfig, max_sample_batch: int, team: int = 1) -> ReplaySpec:
        """The store for segments of ``layout`` sampled in batches of at most ``max_sample_batch`` items; ``team``
        > 1: each chunk (and item) holds that many consecutive columns, an environment's agents.

        Raises ConfigError naming the ``replay`` field that cannot work with this layout, and
        NotImplementedError for items longer than a step where the layout has segment-scoped fields (the
        recurrent state at an item's start is only kept at a chunk's first step).
        """
        steps, columns = layout.fields["actions"].shape[:2]
        fields = dict(layout.fields)
        if team > 1:
            if MEMORY not in fields:
                raise ConfigError(
                    "model.core: a team's items are sequences its learner unrolls: set model.core to gru or lstm"
                )
            if cfg.frame_stacks:
                raise ConfigError("replay.frame_stacks: a team's items keep every frame (no frame stacks)")
            assert columns % team == 0, f"{columns} columns are not whole teams of {team}"
            fields = {
                k: FieldSpec((f.shape[0], f.shape[1] // team, team, *f.shape[2:]), f.dtype) for k, f in fields.items()
            }
            columns //= team
        if cfg.item_length > steps:
            raise ConfigError(f"replay.item_length: {cfg.item_length} steps do not fit in segments of {steps}")
        if layout.segment_scoped and cfg.item_length > 1:
            raise NotImplementedError(
                f"replay items of {cfg.item_length} steps with segment-scoped fields "
                f"({', '.join(sorted(layout.segment_scoped))}): their state exists only at a chunk's first step"
            )
        spare = (steps - cfg.item_length) % cfg.item_stride
        if spare:
            raise ConfigError(
                f"replay.item_stride: items of {cfg.item_length} steps every {cfg.item_stride} steps leave the last "
                f"{spare} of each segment's {steps} steps unsampled: pick a stride that divides "
                f"{steps - cfg.item_length}, or another workers.segment_length"
            )
        per_chunk = (steps - cfg.item_length) // cfg.item_stride + 1
        capacity = math.ceil(cfg.max_size / per_chunk)
        if capacity < columns:
            raise ConfigError(
                f"replay.max_size: {cfg.max_size} items hold {capacity} segment columns, fewer than one segment's "
                f"{columns}: raise it to at least {columns * per_chunk}"
            )
        for part in cfg.frame_stacks:
            if part not in layout.obs_fields:
                raise ConfigError(
                    f"replay.frame_stacks: {part!r} is not an observation part (parts: {', '.join(layout.obs_fields)})"
                )
            if len(layout.fields[part].shape) < 4:
                raise ConfigError(
                    f"replay.frame_stacks: observation part {part!r} is {list(layout.fields[part].shape[2:])}, "
                    "not a stack of frames [stack, ...frame]"
                )
            if FINAL_PREFIX + part in layout.fields:
                raise ConfigError(
                    f"replay.frame_stacks: observation part {part!r} keeps its final observations, as parts that "
                    "are not images do; frame stacks are for image parts"
                )
        # the env's global state, where the algorithm reads it (QMIX's mixer), is read as the observations are
        state = tuple(k for k in fields if k == STATE or k.startswith(f"{STATE}."))
        spec = cls(
            fields,
            (*layout.obs_fields, *state),
            capacity,
            cfg.item_length,
            cfg.sampler,
            cfg.alpha,
            cfg.beta,
            cfg.priority_eps,
            cfg.samples_per_insert,
            cfg.min_size,
            0.0,
            max_sample_batch,
            tuple(cfg.frame_stacks),
            cfg.item_stride,
            team,
        )
        return spec._with_buffer(cfg.error_buffer)

    def _with_buffer(self, error_buffer: float | None) -> ReplaySpec:
        """This spec with its error buffer resolved and checked (a queue also needs room for it)."""
        inserts, samples = self.max_insert_batch, self.max_sample_batch
        if error_buffer is None:
            error_buffer = (
                inserts + samples  # a queue's sampler also waits for unread items: see ReplayStore.can_sample
                if self.sampler == "fifo"
                else least_error_buffer(self.samples_per_insert, inserts, samples)
            )
        try:
            RateLimiter(self.samples_per_insert, self.min_size, error_buffer, inserts, samples)
        except ValueError as exc:
            raise ConfigError(f"replay.error_buffer: {exc}") from None
        spec = dataclasses.replace(self, error_buffer=float(error_buffer))
        room = error_buffer + self.min_size + self.items_per_chunk - 1
        if spec.sampler == "fifo" and spec.capacity * spec.items_per_chunk < room:
            raise ConfigError(
                f"replay.max_size: a fifo queue with error_buffer {error_buffer:g} and min_size {self.min_size} "
                f"needs room for {math.ceil(room)} items, or inserts overwrite items nobody has read"
            )
        return spec

    @property
    def steps(self) -> int:
        """T: steps per chunk."""
        return self.fields["actions"].shape[0]

    @property
    def columns(self) -> int:
        """B: chunks per inserted segment, at most."""
        return self.fields["actions"].shape[1]

    def teams(self, segment: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """A segment's fields ``[rows, b, ...]`` as chunks of :attr:`team` columns ``[rows, b / team, team, ...]``
        (views)."""
        if self.team == 1:
            return segment
        return {k: x.reshape(x.shape[0], -1, self.team, *x.shape[2:]) for k, x in segment.items()}

    @property
    def items_per_chunk(self) -> int:
        """``(T - L) / S + 1`` windows of L steps in a chunk, one every S steps."""
        return (self.steps - self.item_length) // self.item_stride + 1

    @property
    def carried(self) -> tuple[str, ...]:
        """The acting policy's own step fields besides the transition (a search's policy, whether it searched):
        stored with the rest, and carried into every batch as stored, ``[L, N, ...]``."""
        standard = {
            "actions",
            "rewards",
            "terminated",
            "truncated",
            ALIVE.name,
            MEMORY,
            *(f.name for f in STREAM_FIELDS),
        }
        return tuple(
            name
            for name, spec in self.fields.items()
            if name not in standard
            and name not in self.obs_fields
            and not name.startswith(FINAL_PREFIX)
            and spec.shape[0] == self.steps
        )

    @property
    def windows(self) -> bool:
        """Whether batches are transitions of several steps, which carry their steps' ``rewards`` and episode ends
        besides their n-step targets (a learner that unrolls a model along them: MuZero)."""
        return self.item_length > 1 and not self.sequences

    @property
    def sequences(self) -> bool:
        """Whether batches are sequences (the layout carries a recurrent policy's state) or transitions."""
        return MEMORY in self.fields

    @property
    def max_items(self) -> int:
        """Items the store holds when full."""
        return self.capacity * self.items_per_chunk

    @property
    def max_insert_batch(self) -> int:
        """Items one insert adds at most: a whole segment's."""
        return self.columns * self.items_per_chunk

    @property
    def has_final_obs(self) -> bool:
        """Whether every observation part keeps its final observation at a time limit (image parts do not)."""
        return all(FINAL_PREFIX + part in self.fields for part in self.obs_fields)

    @property
    def obs_rows(self) -> int:
        """Rows of one chunk of an observation part's array: its ``T + 1`` observations, then, where every part
        keeps final observations, the ``T`` final observations of its steps. In one array, each step's
        bootstrap observation (the next one, or the final one at a time limit) is one gather of one array."""
        return 2 * self.steps + 1 if self.has_final_obs else self.steps + 1

    def _array_of(self, name: str) -> str | None:
        """The part whose array holds field ``name`` when that is not its own (a final observation)."""
        part = name[len(FINAL_PREFIX) :]
        return part if self.has_final_obs and name == FINAL_PREFIX + part and part in self.obs_fields else None

    def chunk_views(self, arrays: Mapping[str, Any]) -> dict[str, Any]:
        """Each field's chunks ``[capacity, *chunk_shape]``, as views of :meth:`arrays`."""
        out = {}
        for name in self.fields:
            part = self._array_of(name)
            if part is not None:
                out[name] = arrays[f"field_{part}"][:, self.steps + 1 :]
            elif name in self.obs_fields and self.has_final_obs:
                out[name] = arrays[f"field_{name}"][:, : self.steps + 1]
            else:
                out[name] = arrays[f"field_{name}"]
        return out

    def chunk_shape(self, name: str) -> tuple[int, ...]:
        """One chunk of field ``name``: its segment shape without the column axis; for a frame stack ``[S, ...]``
        its frames ``[T + S, ...]``: row 0's S frames, then the newest frame of each of rows 1 .. T."""
        rows, _, *rest = self.fields[name].shape
        if name in self.frame_stacks:
            stack, *frame = rest
            return (rows - 1 + stack, *frame)
        return (rows, *rest)

    def arrays(self) -> dict[str, FieldSpec]:
        """Every array the store keeps, by the name its shared-memory segment ends in."""
        out = {}
        for name, spec in self.fields.items():
            if self._array_of(name) is not None:
                continue  # in its part's array (obs_rows)
            shape = self.chunk_shape(name)
            if name in self.obs_fields and self.has_final_obs:
                shape = (self.obs_rows, *shape[1:])
            out[f"field_{name}"] = FieldSpec((self.capacity, *shape), spec.dtype)
        for part in self.frame_stacks:  # each observation row's S frames, as flat rows of field_<part>
            out[f"stacks_{part}"] = FieldSpec((self.capacity, self.steps + 1, self.fields[part].shape[2]), "int64")
        out["counters"] = FieldSpec((len(COUNTERS),), "int64")
        out["scalars"] = FieldSpec((1,), "float64")  # the prioritized sampler's running max priority
        if self.sampler == "prioritized":
            out["tree"] = FieldSpec((SumTree.array_len(self.max_items),), "float64")
        return out

    def batch_fields(self, batch: int) -> dict[str, FieldSpec]:
        """The sampled batch of ``batch`` items, for the caller to allocate (shared memory or not).

        Transitions: ``P`` / ``boot_P`` ``[L, N, ...]`` per observation part: each step's observation and the one
        its n-step target bootstraps from; ``actions [L, N, ...]``; ``returns`` and ``discounts [L, N]`` float32
        (the target is ``returns + discounts * V(boot)``); items of several steps also carry their steps'
        ``rewards`` float32 and ``terminated`` / ``truncated`` bool ``[L, N]`` (a learner that unrolls a model along
        them, MuZero, needs each step's reward and where an episode ends inside the item).

        Sequences (:attr:`sequences`): ``P`` ``[L + 1, N, ...]``, the observations of the item's steps and the
        one after its last; ``actions``, ``rewards`` float32 and ``terminated`` / ``truncated`` bool ``[L, N]``;
        :data:`MEMORY` ``[N, state]``, the recurrent state the actor's policy acted on the item's first step with.

        Both: the acting policy's own step fields (:attr:`carried`) ``[L, N, ...]`` as stored; ``alive [L, N]`` bool
        where the layout has it (a step its agent did not take, having left the env
        early, holds no transition); ``weights [N]`` float32 importance weights; ``keys [N]`` int64, which a
        priority update names the items by. A team's items (:attr:`team` > 1) have an agent axis after ``N`` in
        every field but ``weights`` and ``keys``: ``rewards [L, N, team]``, ``MEMORY [N, team, state]``.
        """
        lead = (self.item_length, batch)
        per_step = (*lead, *self.fields["rewards"].shape[2:])  # [L, N] (and the team's agents)
        out: dict[str, FieldSpec] = {}
        for part in self.obs_fields:
            shape, dtype = self.fields[part].shape[2:], self.fields[part].dtype
            if self.sequences:
                out[part] = FieldSpec((self.item_length + 1, batch, *shape), dtype)
            else:
                out[part] = out[f"boot_{part}"] = FieldSpec((*lead, *shape), dtype)
        actions = self.fields["actions"]
        out["actions"] = FieldSpec((*lead, *actions.shape[2:]), actions.dtype)
        if self.sequences or self.windows:
            out["rewards"] = FieldSpec(per_step, "float32")
            out["terminated"] = out["truncated"] = FieldSpec(per_step, "bool")
        if self.sequences:
            out[MEMORY] = FieldSpec((batch, *self.fields[MEMORY].shape[2:]), self.fields[MEMORY].dtype)
        else:
            out["returns"] = out["discounts"] = FieldSpec(lead, "float32")
        if "alive" in self.fields:  # a multi-agent env's: which steps its agent took (it may leave early)
            out["alive"] = FieldSpec(per_step, "bool")
        for name in self.carried:
            out[name] = FieldSpec((*lead, *self.fields[name].shape[2:]), self.fields[name].dtype)
        out["weights"] = FieldSpec((batch,), "float32")
        out["keys"] = FieldSpec((batch,), "int64")
        return out

    def describe(self) -> dict[str, Any]:
        """What a saved replay must share with the store that loads it: every chunk's shape and dtype, and the
        item length and stride (items are numbered by them)."""
        fields = {name: [list(self.chunk_shape(name)), spec.dtype] for name, spec in self.fields.items()}
        return {"fields": fields, "item_length": self.item_length, "item_stride": self.item_stride}
