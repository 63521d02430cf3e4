"""What the algorithms that learn from a replay (DQN, SAC, TD3, AlphaZero, MuZero) share: reading its batch onto the
trainer's device, moving a target network, folding a batch into observation statistics, and a learner's checkpoint
of online networks and their targets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from srl.algorithms.dqn_math import polyak_
from srl.api.config import ConfigError, ExperimentConfig
from srl.api.device import field
from srl.api.worker import Collective
from srl.nets.normalizer import RunningMeanStd

__all__ = [
    "TargetLearner",
    "batch_rows",
    "batch_tensor",
    "fold",
    "fold_observations",
    "follow",
    "frozen_copy",
    "require_batch_fits",
]


def batch_tensor(batch: Mapping[str, np.ndarray], name: str, device: torch.device) -> torch.Tensor:
    """Batch field ``name`` as a tensor on ``device`` (prefetched there, or no copy on the CPU)."""
    return field(batch, name, device)


def batch_rows(batch: Mapping[str, np.ndarray], name: str, device: torch.device) -> torch.Tensor:
    """A ``[L, N, ...]`` batch field as ``[L * N, ...]`` on ``device`` (rows are time-major: item i is row t*N+i)."""
    x = field(batch, name, device)
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def frozen_copy(target: Any, online: Any) -> Any:
    """``target`` (a new network shaped as ``online``) made a copy of it that no gradient reaches: a target
    network, moved only by :func:`follow`."""
    target.load_state_dict(online.state_dict())
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def follow(target: Any, online: Any, tau: float) -> None:
    """Move network ``target`` a fraction ``tau`` towards ``online`` (1: a copy); its buffers (observation
    statistics) are copied outright, so it normalizes as the weights it holds were trained to."""
    polyak_(target.parameters(), online.parameters(), tau)
    with torch.no_grad():
        for t, o in zip(target.buffers(), online.buffers()):
            t.copy_(o)


def fold_observations(encoder: Any, obs: Mapping[str, torch.Tensor], collective: Collective | None) -> None:
    """Fold a batch into ``encoder``'s running observation statistics, merged across data-parallel replicas."""
    inputs = getattr(encoder, "normalizer_inputs", None)
    for rms, x in [] if inputs is None else inputs(obs):
        fold(rms, x, collective)


def fold(rms: RunningMeanStd, x: torch.Tensor, collective: Collective | None) -> None:
    """Fold a batch into running statistics ``rms``, its moments merged across data-parallel replicas first, so
    every replica folds in the same."""
    mean, var, count = rms.moments(x)
    if collective is not None:
        mean, var, count = collective.merge_moments(mean, var, count)
    rms.update_moments(mean, var, count)


def require_batch_fits(section: str, batch_size: int, cfg: ExperimentConfig, items: str = "items") -> None:
    """One line naming ``<section>.batch_size`` unless a batch of that many ``items`` fits in the replay."""
    if batch_size > cfg.replay.max_size:
        raise ConfigError(
            f"{section}.batch_size: a batch of {batch_size} {items} is larger than the replay "
            f"(replay.max_size={cfg.replay.max_size})"
        )


class TargetLearner:
    """A learner of online networks, each with a target copy, one optimizer and a count of its steps (DQN,
    AlphaZero, MuZero): its checkpoint holds each network's state under its attribute's name, and data-parallel
    replicas start from rank 0's networks (weights and statistics), each target a copy of its online network."""

    pairs: tuple[tuple[str, str], ...]
    """``(online, target)`` attribute names of each network and its target (also their checkpoint keys)."""
    collective: Collective | None
    optimizer: Any
    learner_steps: int

    def state_dict(self) -> dict[str, Any]:
        nets = {name: getattr(self, name).state_dict() for pair in self.pairs for name in pair}
        return {**nets, "optimizer": self.optimizer.state_dict(), "learner_steps": self.learner_steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name in (name for pair in self.pairs for name in pair):
            getattr(self, name).load_state_dict(state[name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.learner_steps = int(state["learner_steps"])

    def synchronize(self) -> None:
        if self.collective is None:
            return
        for online, _ in self.pairs:
            tensors = getattr(self, online).state_dict().values()
            self.collective.broadcast_([t for t in tensors if t.dtype == torch.float32])
        for online, target in self.pairs:
            getattr(self, target).load_state_dict(getattr(self, online).state_dict())
