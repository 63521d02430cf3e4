"""The declared sample schema: the named fields trajectory segments carry, laid out ``[T, B, ...]``.

A segment is ``segment_length`` (T) steps of one actor slot's ``envs_per_slot``
(B) environments. Nothing downstream knows the fields by heart: the segment
pool, the actor's in-place writes, the inference answer, the wire format and
the cross-node sample stream, the trainer's batch and the checkpoints all work
from the :class:`SampleSchema` a run declares. Its fields come from three
places:

- the environment's spaces: one field per observation part (``obs`` or
  ``obs.<key>``), ``actions``, ``rewards``, ``terminated``, ``truncated``, and
  for vector observations ``final_obs...``, the true last observation of an
  episode cut by a time limit (so the trainer bootstraps it correctly);
- the acting policy's outputs (``logp``; an algorithm that wants rollout-time
  values declares ``values`` through the policy it builds; a policy with
  memory declares its recurrent state, :data:`MEMORY`);
- the streams themselves: ``version``, the policy version that acted.

Adding a field is one :class:`Field` in one of those declarations.

Scopes say how many rows a field has per segment: ``STEP`` one per step (T),
``OBSERVATION`` one more for the bootstrap observation (T + 1), ``SEGMENT``
one per segment, written at its first step (e.g. the recurrent state a
segment starts from).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from srl.api.spaces import STATE, ActionSpec, ObsPart, action_spec, obs_parts


class Scope(enum.Enum):
    """Rows of a field per segment."""

    STEP = "step"
    """T rows: one per step."""
    OBSERVATION = "observation"
    """T + 1 rows: the observation before each step, and the one after the last (to bootstrap)."""
    SEGMENT = "segment"
    """One row, written at the segment's first step."""

    def rows(self, T: int) -> int:
        return {Scope.STEP: T, Scope.OBSERVATION: T + 1, Scope.SEGMENT: 1}[self]


@dataclass(frozen=True)
class Field:
    """One declared field: per-environment shape, dtype and scope."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scope: Scope = Scope.STEP
    acting: bool = True
    """For ``OBSERVATION`` fields: the acting policy reads it (an observation part). False: carried for the
    trainer only (a centralized critic's global state), never gathered for inference."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)  # "f4", np.float32 -> "float32"


@dataclass(frozen=True)
class FieldSpec:
    """The concrete layout of one segment field: its full shape ``[rows, B, ...]`` and dtype."""

    shape: tuple[int, ...]
    dtype: str


class SampleSchema:
    """An ordered, duplicate-free set of fields; :meth:`segment` lays them out for T steps of B envs."""

    def __init__(self, fields: Iterable[Field]) -> None:
        self.fields: dict[str, Field] = {}
        for f in fields:
            if f.name in self.fields and self.fields[f.name] != f:
                raise ValueError(f"sample field {f.name!r} declared twice, differently: {self.fields[f.name]} vs {f}")
            self.fields[f.name] = f

    def segment(self, T: int, B: int) -> dict[str, FieldSpec]:
        """Every field's layout in one segment, in declaration order."""
        return {f.name: FieldSpec((f.scope.rows(T), B, *f.shape), f.dtype) for f in self.fields.values()}

    def __contains__(self, name: object) -> bool:
        return name in self.fields

    def __repr__(self) -> str:
        return f"SampleSchema({list(self.fields)})"


def env_fields(parts: tuple[ObsPart, ...], action: ActionSpec, state_parts: tuple[ObsPart, ...] = ()) -> list[Field]:
    """What the environment contributes. Image observations keep no final obs: a time limit in an image env
    bootstraps from V(s_t) (rare there, and a second frame stack per step would double the bytes). A global
    state (``state_parts``) is observation-scoped but not acted on, and keeps its final rows too."""
    fields = [Field(p.name, p.shape, p.dtype, Scope.OBSERVATION) for p in parts]
    fields += [Field(p.name, p.shape, p.dtype, Scope.OBSERVATION, acting=False) for p in state_parts]
    fields += [
        Field("actions", action.shape, action.dtype),
        Field("rewards", (), "float32"),
        Field("terminated", (), "bool"),
        Field("truncated", (), "bool"),
    ]
    if not any(p.kind == "image" for p in parts):
        fields += [Field(p.final_name, p.shape, p.dtype) for p in parts]
    fields += [Field(p.final_name, p.shape, p.dtype) for p in state_parts if p.kind != "image"]
    return fields


STREAM_FIELDS = (Field("version", (), "int64"),)
"""What the inference stream contributes: the policy version that answered each step."""


MEMORY = "memory"
"""The recurrent state of a policy with memory (``model.core``), declared by its acting policy with
:func:`memory_field`. Row t holds the state step t starts from (zeros after an episode's end), row T the one the
bootstrap observation is seen with. The policy reads row t with the observations and returns the next state,
which the answer writes to row t + 1 (:func:`srl.system.streams.write_answer`: a re-asked request recomputes
the same row from the same input); the actor zeroes it where an episode ended and carries row T into the next
segment's row 0. The trainer unrolls each segment from row 0, or reads every row (``ppo.memory: stored``)."""


def memory_field(size: int) -> Field:
    """The :data:`MEMORY` field of a state of ``size`` floats per environment."""
    return Field(MEMORY, (int(size),), "float32", Scope.OBSERVATION, acting=False)


ALIVE = Field("alive", (), "bool")
"""Declared by multi-agent slots: whether the column's agent acted at each step (a policy learns from those
steps only; a critic from every step)."""


def sample_schema(
    obs_space: spaces.Space,
    action_space: spaces.Space,
    policy_fields: Iterable[Field],
    state_space: spaces.Space | None = None,
    alive: bool = False,
) -> SampleSchema:
    """A run's schema: what its env's spaces (and, for a centralized critic, its global state; for a
    multi-agent env, which agents acted), its acting policy's outputs and the streams declare."""
    state = () if state_space is None else obs_parts(state_space, STATE)
    env = env_fields(obs_parts(obs_space), action_spec(action_space), state) + ([ALIVE] if alive else [])
    return SampleSchema([*env, *policy_fields, *STREAM_FIELDS])
