"""Gymnasium spaces as the streams see them: observation parts and the action field.

Why: a Dict or Tuple observation cannot live in one array, and flattening it
into one vector (``gymnasium.spaces.flatten``) would one-hot discrete parts
on the actor, copy every image through a float vector, and hide from the
policy which numbers are pixels. Instead each leaf of the observation space
is one *part* with its own segment field (``obs`` for a plain space,
``obs.<key>`` / ``obs.<index>`` for nested ones) and its own encoder; the
actor writes each part once, in place, in its native dtype.

Supported leaves: Box (vectors, and ``[C, H, W]`` uint8 images), Discrete,
MultiDiscrete and MultiBinary, nested in Dict and Tuple to any depth.
Actions: Discrete, Box, MultiDiscrete, MultiBinary. Anything else (Graph,
Text, Sequence, OneOf) is refused with one line naming the space.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from gymnasium import spaces

OBS = "obs"
"""Field name of a plain (not nested) observation, and the prefix of nested parts."""

STATE = "state"
"""Field name of a multi-agent env's global state (PettingZoo ``state()``), carried for a centralized critic
(``ppo.critic_input: state``) and never read by the acting policy."""

ACTION_MASK = f"{OBS}.action_mask"
"""The part of a Dict observation's ``action_mask`` key (PettingZoo's classic games, OpenSpiel): 1 where an action
is legal. It travels like any part, is not encoded, and masks the Discrete head's logits, so an illegal action is
never sampled."""

GAME_HISTORY = f"{OBS}.history"
"""The part of a game's observation that carries the observer's seat and the game's history
(``srl.envs.turns:game`` with ``history: true``): what a search rebuilds the game from. Not encoded."""

FINAL_PREFIX = "final_"
"""``final_obs.<key>`` holds the true last observation of part ``obs.<key>`` where a time limit cut an episode."""

PartKind = Literal["vector", "image", "discrete", "multi_discrete", "binary"]

Observation = dict[str, np.ndarray]
"""A batch of observations as the streams carry it: part field name -> ``[B, ...]`` array."""


class UnsupportedSpace(ValueError):
    """A space the streams cannot carry; the message names it."""


@dataclass(frozen=True)
class ObsPart:
    """One leaf of the observation space: the segment field that carries it and how to encode it."""

    name: str
    """Segment field, e.g. ``obs`` or ``obs.goal``."""
    kind: PartKind
    shape: tuple[int, ...]
    """Per-environment shape on the stream (``()`` for Discrete)."""
    dtype: str
    """Dtype on the stream: float64 Boxes travel as float32 (the networks compute in float32; half the bytes)."""
    nvec: tuple[int, ...] = ()
    """Category counts: ``(n,)`` for Discrete, the ``nvec`` of a MultiDiscrete."""
    start: tuple[int, ...] = ()
    """The space's lowest value per component (Discrete and MultiDiscrete ``start``), subtracted before one-hot."""

    @property
    def final_name(self) -> str:
        """The field of this part's final observations (``final_obs``, ``final_obs.goal``)."""
        return FINAL_PREFIX + self.name


def mask_part(parts: tuple[ObsPart, ...], action: ActionSpec) -> ObsPart | None:
    """The legal-action mask among ``parts`` (:data:`ACTION_MASK`), checked against the action space; None when
    the observation has none."""
    mask = next((p for p in parts if p.name == ACTION_MASK), None)
    if mask is None:
        return None
    if action.kind != "discrete":
        raise UnsupportedSpace(
            f"observation part {ACTION_MASK!r}: action masks apply to Discrete actions, not {action.kind}"
        )
    if mask.shape != (action.nvec[0],) or mask.kind not in ("binary", "vector"):
        raise UnsupportedSpace(
            f"observation part {ACTION_MASK!r}: expected {action.nvec[0]} 0/1 entries (one per action), got "
            f"{mask.kind} of shape {mask.shape}"
        )
    if len(parts) == 1:
        raise UnsupportedSpace(f"observation part {ACTION_MASK!r}: the observation has nothing else to act on")
    return mask


def check_spaces(obs_space: spaces.Space, action_space: spaces.Space) -> None:
    """Raise :class:`UnsupportedSpace` naming what the streams cannot carry: a part, the actions, or an action
    mask that does not fit them."""
    mask_part(obs_parts(obs_space), action_spec(action_space))


def is_image(shape: tuple[int, ...], dtype: np.dtype | str) -> bool:
    """Image observations (``[C, H, W]`` uint8) go through a CNN, and are neither normalized nor kept as final obs."""
    return len(shape) == 3 and np.dtype(dtype) == np.uint8


def obs_parts(space: spaces.Space, root: str = OBS) -> tuple[ObsPart, ...]:
    """The parts of an observation space, depth first in the space's own key order, named from ``root``
    (``obs``, or :data:`STATE` for a global state)."""
    return tuple(_parts(space, root))


def _parts(space: spaces.Space, name: str) -> Iterator[ObsPart]:
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            yield from _parts(sub, f"{name}.{key}")
    elif isinstance(space, spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            yield from _parts(sub, f"{name}.{i}")
    else:
        yield _leaf(space, name)


def _leaf(space: spaces.Space, name: str) -> ObsPart:
    where = "observation" if name == OBS else f"observation part {name!r}" if name.startswith(OBS) else name
    if isinstance(space, spaces.Box):
        shape = tuple(int(d) for d in space.shape)
        if is_image(shape, space.dtype):
            return ObsPart(name, "image", shape, "uint8")
        if np.dtype(space.dtype) == np.bool_:  # boards of flags (MinAtar's): 0/1 as int8, as MultiBinary's
            return ObsPart(name, "vector", shape, "int8")
        dtype = "float32" if np.dtype(space.dtype) == np.float64 else np.dtype(space.dtype).name
        return ObsPart(name, "vector", shape, dtype)
    if isinstance(space, spaces.Discrete):
        return ObsPart(name, "discrete", (), "int64", (int(space.n),), (int(space.start),))
    if isinstance(space, spaces.MultiDiscrete):
        if space.nvec.ndim != 1:
            raise UnsupportedSpace(f"{where}: MultiDiscrete with nvec of shape {space.nvec.shape} (only 1-D)")
        nvec = tuple(int(n) for n in space.nvec)
        return ObsPart(name, "multi_discrete", (len(nvec),), "int64", nvec, tuple(int(s) for s in space.start))
    if isinstance(space, spaces.MultiBinary):
        return ObsPart(name, "binary", tuple(int(d) for d in np.atleast_1d(space.n)), "int8")
    raise UnsupportedSpace(f"{where}: {type(space).__name__} spaces are not supported ({space})")


def flatten_obs(parts: tuple[ObsPart, ...], obs: Any) -> Observation:
    """A (batch of) Gymnasium observation(s), nested dicts and tuples of arrays, as part name -> array."""
    if len(parts) == 1 and parts[0].name == OBS:
        return {OBS: obs}
    out: Observation = {}
    for part in parts:
        value = obs
        for key in part.name.split(".")[1:]:
            value = value[int(key)] if isinstance(value, tuple) else value[key]
        out[part.name] = value
    return out


@dataclass(frozen=True)
class ActionSpec:
    """The action field: per-environment shape and dtype on the stream, and the distribution that samples it."""

    kind: Literal["discrete", "box", "multi_discrete", "binary"]
    shape: tuple[int, ...]
    dtype: str
    nvec: tuple[int, ...] = ()
    """Category counts (Discrete: ``(n,)``, MultiDiscrete: its ``nvec``)."""

    @property
    def size(self) -> int:
        """Flat action dimension (Box and MultiBinary), or the number of components."""
        return int(np.prod(self.shape)) if self.shape else 1


def action_spec(space: spaces.Space) -> ActionSpec:
    """How actions of ``space`` travel and are sampled. Discrete/MultiDiscrete ``start`` offsets must be removed
    before (the env factory wraps such envs), so the policy always samples ``0..n-1``."""
    if isinstance(space, spaces.Discrete):
        _zero_start(space.start, space)
        return ActionSpec("discrete", (), "int64", (int(space.n),))
    if isinstance(space, spaces.Box):
        if not np.issubdtype(space.dtype, np.floating):
            raise UnsupportedSpace(f"action space: Box of dtype {space.dtype} is not supported (float Boxes only)")
        return ActionSpec("box", tuple(int(d) for d in space.shape), "float32")
    if isinstance(space, spaces.MultiDiscrete):
        if space.nvec.ndim != 1:
            raise UnsupportedSpace(f"action space: MultiDiscrete with nvec of shape {space.nvec.shape} (only 1-D)")
        _zero_start(space.start, space)
        nvec = tuple(int(n) for n in space.nvec)
        return ActionSpec("multi_discrete", (len(nvec),), "int64", nvec)
    if isinstance(space, spaces.MultiBinary):
        shape = tuple(int(d) for d in np.atleast_1d(space.n))
        if len(shape) != 1:
            raise UnsupportedSpace(f"action space: MultiBinary of shape {shape} (only 1-D)")
        return ActionSpec("binary", shape, "int8")
    raise UnsupportedSpace(f"action space: {type(space).__name__} spaces are not supported ({space})")


def _zero_start(start: Any, space: spaces.Space) -> None:
    if np.any(np.asarray(start) != 0):
        raise UnsupportedSpace(f"action space {space}: a nonzero start must be shifted away by the env factory")


def describe(parts: tuple[ObsPart, ...], action: ActionSpec) -> dict[str, Any]:
    """JSON-able description of the spaces (kept in checkpoints to check that a policy fits an env)."""
    return {
        "obs": [{"name": p.name, "kind": p.kind, "shape": list(p.shape), "nvec": list(p.nvec)} for p in parts],
        "action": {"kind": action.kind, "shape": list(action.shape), "nvec": list(action.nvec)},
    }


def check_fits(saved: Mapping[str, Any], parts: tuple[ObsPart, ...], action: ActionSpec, where: str) -> None:
    """Raise ValueError naming the first difference between the spaces a checkpoint was trained on and these."""
    now = describe(parts, action)
    if saved["action"] != now["action"]:
        raise ValueError(f"{where}: trained for actions {saved['action']}, this env has {now['action']}")
    if saved["obs"] != now["obs"]:
        raise ValueError(f"{where}: trained for observations {saved['obs']}, this env has {now['obs']}")
