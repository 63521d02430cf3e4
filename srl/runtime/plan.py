"""What every placement needs to know before starting workers: spaces, buffer layout, snapshot size."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from srl.algorithms.ppo import make_acting_policy
from srl.api.batch import is_image, segment_fields
from srl.api.config import ExperimentConfig
from srl.envs.factory import action_info
from srl.envs.slots import make_slot
from srl.system.streams import PoolLayout


@dataclass(frozen=True)
class Plan:
    """Derived, read-only facts about one experiment."""

    cfg: ExperimentConfig
    obs_space: gym.spaces.Box
    action_space: gym.spaces.Space
    layout: PoolLayout
    param_size: int
    null_trainer: bool = False
    """Replace the trainer by one that discards segments (sampling benchmarks)."""
    resume: str | None = None
    """Checkpoint the trainers continue from (``srl train --resume``)."""
    start_version: int = 0
    """Policy version the run starts at (the checkpoint's when resuming)."""

    @property
    def relay_groups(self) -> int:
        """Relays of the hierarchical parameter service (one per node group; none with a single group)."""
        p = self.cfg.params
        return p.groups if p.mode == "hierarchical" and p.groups > 1 else 0


def make_plan(cfg: ExperimentConfig, null_trainer: bool = False) -> Plan:
    """Probe the environment once and size the streams (raises ConfigError on a bad env)."""
    slot = make_slot(cfg.env, 1)  # the configured backend itself validates the env and its options
    try:
        obs_space, action_space = slot.single_observation_space, slot.single_action_space
    finally:
        slot.close()
    action_shape, action_dtype = action_info(action_space)
    w = cfg.workers
    # float64 observations (MuJoCo) travel as float32: the networks compute in float32 anyway, half the bytes.
    obs_dtype = np.float32 if np.dtype(obs_space.dtype) == np.float64 else obs_space.dtype
    fields = segment_fields(obs_space.shape, obs_dtype, action_shape, action_dtype,
                            w.segment_length, w.envs_per_slot, with_final_obs=not is_image(obs_space.shape, obs_space.dtype))
    layout = PoolLayout(actors=w.actors, buffers=w.buffers_per_actor, fields=fields, slots=w.ring_size)
    with torch.device("meta"):  # shapes only: no weights, no init kernels (and no thread pool) in the controller
        param_size = make_acting_policy(obs_space, action_space, cfg).flat_size()
    return Plan(cfg, obs_space, action_space, layout, param_size, null_trainer)
