"""What an algorithm plugin implements, and what the runtime hands it.

An algorithm is named by ``algorithm:`` in the experiment file (``ppo``, or
``my_pkg.module:MyAlgorithm``). The named object is a class (or factory)
with two entry points, both given an :class:`AlgorithmContext`:

- ``cls.acting_policy(ctx)`` -> a :class:`~srl.api.worker.Policy`: what actors,
  policy workers, the eval worker and ``srl.load_policy`` run. Its
  ``output_fields()`` are the algorithm's declaration in the sample schema
  (e.g. ``logp``, or rollout-time ``values``);
- ``cls(ctx)`` -> an :class:`~srl.api.worker.Algorithm`: what the trainer runs.

Networks come through ``ctx.models`` (built by the runtime from ``model:``,
including a plugin encoder), so an algorithm never imports ``srl.nets`` and a
user's own network trains with any algorithm. ``ctx.args`` are the plugin's
own settings (``algorithm_args:`` in the YAML); the built-in PPO reads the
``ppo`` section instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gymnasium import spaces

if TYPE_CHECKING:  # types only: at run time the networks arrive through ``Models``, never by import
    from torch import nn

    from srl.api.config import ExperimentConfig
    from srl.api.worker import Algorithm, Collective, Policy
    from srl.nets.policy import PolicyNet, ValueNet


class Models(Protocol):
    """Network constructors for the run's spaces and ``model`` section."""

    def policy(self) -> PolicyNet:
        """A new actor: ``forward(obs) -> head output``, ``act(obs, deterministic) -> (actions, logp)``,
        ``evaluate(obs, actions) -> (logp, entropy)``, ``evaluate_features``, ``encoder``, ``flat_state`` /
        ``load_flat_state`` / ``flat_size`` (see :class:`srl.nets.policy.PolicyNet`)."""

    def value(self, shared_encoder: nn.Module | None = None) -> ValueNet:
        """A new critic ``forward(obs) -> values [N]``, with its own encoder or a head on ``shared_encoder``
        (see :class:`srl.nets.policy.ValueNet`)."""


@dataclass(frozen=True)
class AlgorithmContext:
    """Everything an algorithm is built from; the runtime fills it."""

    obs_space: spaces.Space
    action_space: spaces.Space
    cfg: ExperimentConfig
    models: Models
    args: Mapping[str, Any] = field(default_factory=dict)
    """The plugin's own settings (``algorithm_args``)."""
    seed: int = 0
    collective: Collective | None = None
    """Set for data-parallel trainers: average gradients through it."""
    device: str = "cpu"


class AlgorithmClass(Protocol):
    """The object ``algorithm:`` names."""

    def __call__(self, ctx: AlgorithmContext) -> Algorithm: ...

    def acting_policy(self, ctx: AlgorithmContext) -> Policy: ...
