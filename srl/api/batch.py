"""The one sample schema: named fields of trajectory segments laid out ``[T, B, ...]``.

A segment is ``segment_length`` (T) steps of one actor slot's ``envs_per_slot``
(B) environments. ``obs`` has T + 1 rows: the last row is the observation
after the final step, used to bootstrap values. ``final_obs`` (vector
observations only) holds the true last observation of an episode cut by a
time limit, so the trainer can bootstrap truncated episodes correctly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FieldSpec:
    """Shape (without the leading buffer dimensions) and dtype of one field."""

    shape: tuple[int, ...]
    dtype: str


def is_image(shape: tuple[int, ...], dtype: np.dtype | str) -> bool:
    """Image observations (``[C, H, W]`` uint8) go through a CNN and are not normalized or kept as ``final_obs``."""
    return len(shape) == 3 and np.dtype(dtype) == np.uint8


def segment_fields(
    obs_shape: tuple[int, ...],
    obs_dtype: np.dtype | str,
    action_shape: tuple[int, ...],
    action_dtype: np.dtype | str,
    T: int,
    B: int,
    with_final_obs: bool,
) -> dict[str, FieldSpec]:
    """The fields of one segment, in a fixed order."""
    obs_dtype = np.dtype(obs_dtype).name
    fields = {
        "obs": FieldSpec((T + 1, B, *obs_shape), obs_dtype),
        "actions": FieldSpec((T, B, *action_shape), np.dtype(action_dtype).name),
        "logp": FieldSpec((T, B), "float32"),
        "rewards": FieldSpec((T, B), "float32"),
        "terminated": FieldSpec((T, B), "bool"),
        "truncated": FieldSpec((T, B), "bool"),
        "version": FieldSpec((T, B), "int64"),
    }
    if with_final_obs:
        fields["final_obs"] = FieldSpec((T, B, *obs_shape), obs_dtype)
    return fields
