"""Networks of the actor-critic algorithms for Box actions that learn from a replay (SAC, TD3).

Every network works in the unit box ``[-1, 1]^D``: the algorithms map env actions into it and back
(:func:`srl.algorithms.sac_math.unscale`, ``rescale``), so nothing here knows an action's bounds.

- :class:`ActionQ`: ``Q(s, a)``: the observation's features (the run's encoder with no torso of its own) joined
  with the action, then the ``hidden`` MLP and one output. :class:`TwinQ` holds two, for clipped double-Q.
- :class:`SquashedActor`: SAC's actor, a Gaussian over pre-tanh actions with a state-dependent log-std (squashed
  softly into ``[LOG_STD_MIN, LOG_STD_MAX]``, so a gradient step cannot make it collapse or explode).
- :class:`DeterministicActor`: TD3's, ``tanh`` of a linear head.

Like the other networks they travel as one flat vector, observation statistics included.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from gymnasium import spaces
from torch import Tensor, nn

from srl.api.spaces import UnsupportedSpace
from srl.nets.mlp import init_linear, mlp
from srl.nets.normalizer import RunningMeanStd
from srl.nets.policy import Flattened

__all__ = ["LOG_STD_MAX", "LOG_STD_MIN", "ActionQ", "DeterministicActor", "SquashedActor", "TwinQ", "box_dims"]

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
"""The squashed actor's log-std range (std from 0.0067 to 7.4 before the tanh)."""


def box_dims(action_space: spaces.Space) -> int:
    """The number of action dimensions of a Box (flattened); UnsupportedSpace for any other space."""
    if not isinstance(action_space, spaces.Box):
        raise UnsupportedSpace(f"a continuous-action network needs a Box action space, not {action_space}")
    return math.prod(action_space.shape)


class _Encoded(Flattened):
    """A network reading the observation parts through its own encoder (``out_dim`` features)."""

    encoder: nn.Module

    @property
    def obs_normalizer(self) -> RunningMeanStd | None:
        """The normalizer of a plain vector observation (or None), shipped inside ``flat_state``."""
        return getattr(self.encoder, "obs_normalizer", None)

    def _features(self, obs: Mapping[str, Tensor]) -> Tensor:
        out: Tensor = self.encoder.forward(obs)
        return out


class ActionQ(_Encoded):
    """``Q(s, a)`` ``[N]`` for unit-box actions ``[N, D]``."""

    def __init__(self, action_space: spaces.Space, encoder: nn.Module, hidden: Sequence[int], activation: str) -> None:
        """``encoder``: an ``nn.Module`` with ``out_dim`` (features of the observation, before any torso)."""
        super().__init__()
        self.encoder = encoder
        self.dims = box_dims(action_space)
        width = int(encoder.out_dim) + self.dims  # type: ignore[arg-type]
        self.torso = mlp(width, hidden, activation)
        self.head: nn.Linear = init_linear(nn.Linear(int(hidden[-1]) if len(hidden) else width, 1), 1.0)
        self._init_flat()

    def forward(self, obs: Mapping[str, Tensor], actions: Tensor) -> Tensor:
        x = torch.cat((self._features(obs), actions.reshape(len(actions), self.dims)), dim=-1)
        out: Tensor = self.head(self.torso(x)).squeeze(-1)
        return out


class TwinQ(Flattened):
    """Two independent :class:`ActionQ` (each its own encoder and statistics): clipped double-Q's pair."""

    def __init__(self, q1: ActionQ, q2: ActionQ) -> None:
        super().__init__()
        self.q1, self.q2 = q1, q2
        self._init_flat()

    def forward(self, obs: Mapping[str, Tensor], actions: Tensor) -> tuple[Tensor, Tensor]:
        return self.q1(obs, actions), self.q2(obs, actions)


class SquashedActor(_Encoded):
    """SAC's actor: the mean and log-std ``[N, D]`` of a Gaussian over pre-tanh actions."""

    def __init__(self, action_space: spaces.Space, encoder: nn.Module) -> None:
        """``encoder``: an ``nn.Module`` with ``out_dim`` (the observation's features after the ``hidden`` torso)."""
        super().__init__()
        self.encoder = encoder
        self.dims = box_dims(action_space)
        width = int(encoder.out_dim)  # type: ignore[arg-type]
        self.mean: nn.Linear = init_linear(nn.Linear(width, self.dims), 0.01)
        self.log_std: nn.Linear = init_linear(nn.Linear(width, self.dims), 0.01)
        self._init_flat()

    def forward(self, obs: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        features = self._features(obs)
        squashed = torch.tanh(self.log_std(features))  # into (-1, 1), then onto the range: smooth at both ends
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (squashed + 1.0)
        return self.mean(features), log_std


class DeterministicActor(_Encoded):
    """TD3's actor: unit-box actions ``tanh(W features + b)`` ``[N, D]``."""

    def __init__(self, action_space: spaces.Space, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.dims = box_dims(action_space)
        self.head: nn.Linear = init_linear(nn.Linear(int(encoder.out_dim), self.dims), 0.01)  # type: ignore[arg-type]
        self._init_flat()

    def forward(self, obs: Mapping[str, Tensor]) -> Tensor:
        return torch.tanh(self.head(self._features(obs)))
