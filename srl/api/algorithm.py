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

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from gymnasium import spaces

if TYPE_CHECKING:
    from torch import Tensor, nn

    from srl.api.config import ExperimentConfig
    from srl.api.worker import Algorithm, Collective, Policy

Obs = Mapping[str, "Tensor"]
"""A batch of observation parts (``{"obs": ...}`` or ``{"obs.<key>": ...}``), each ``[N, ...]``."""


class Net(Protocol):
    """What an algorithm uses of any network it is handed (an ``nn.Module`` whose state also travels flat)."""

    @property
    def encoder(self) -> Any:
        """The observation encoder: ``encoder(obs) -> features [N, out_dim]``."""

    def parameters(self) -> Iterator[nn.Parameter]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any], /) -> Any: ...

    def to(self, device: Any, /) -> Any: ...

    def eval(self) -> Any: ...

    def flat_size(self) -> int: ...

    def flat_state(self, out: np.ndarray | None = None, /) -> np.ndarray: ...

    def load_flat_state(self, flat: np.ndarray, /) -> None: ...


class ActorNet(Net, Protocol):
    """An actor (``srl.nets.policy.PolicyNet``)."""

    def act(self, obs: Obs, deterministic: bool = False, /) -> tuple[Tensor, Tensor]:
        """Actions and their log-probs, without autograd."""

    def evaluate(self, obs: Obs, actions: Tensor, /) -> tuple[Tensor, Tensor]:
        """Log-probs and entropies of ``actions``, with gradients."""

    def legal(self, obs: Obs, rows: int | None = None, /) -> Tensor | None:
        """The legal-action mask of the first ``rows`` observations, or None when the observation has none."""

    def evaluate_features(
        self, features: Tensor, actions: Tensor, legal: Tensor | None = None, /
    ) -> tuple[Tensor, Tensor]:
        """:meth:`evaluate` from encoder features already computed (shared with a critic head), masked by
        ``legal`` (:meth:`legal`) when the observation has an action mask."""


class CriticNet(Net, Protocol):
    """A critic (``srl.nets.policy.ValueNet``); values are in return units, the head may be standardized."""

    shared: bool
    """Its encoder is the actor's (it owns only its head)."""
    return_normalizer: Any
    """Running return statistics when values are normalized, else None."""

    def __call__(self, obs: Obs, /) -> Tensor:
        """Values ``[N]``."""

    def head_output(self, features: Tensor, /) -> Tensor: ...

    def normalize(self, values: Tensor, /) -> Tensor: ...

    def denormalize(self, out: Tensor, /) -> Tensor: ...


class QNet(Net, Protocol):
    """A Q network (``srl.nets.q.QNetwork``): one value per action of a Discrete action space."""

    actions: int
    """How many actions there are (the width of the Q values)."""

    def buffers(self) -> Iterator[Tensor]:
        """Its non-learned state (observation statistics), which a target network copies with the weights."""

    def __call__(self, obs: Obs, /) -> Tensor:
        """Q values ``[N, actions]``, with gradients; illegal actions included (:meth:`legal` says which)."""

    def legal(self, obs: Obs, /) -> Tensor | None:
        """The legal-action mask ``[N, actions]`` of the observations, or None when they carry none."""

    def greedy(self, obs: Obs, /) -> Tensor:
        """The best legal action of each observation, int64 ``[N]``, without autograd."""


class Models(Protocol):
    """Network constructors for the run's spaces and ``model`` section."""

    def policy(self) -> ActorNet:
        """A new actor with its own encoder."""

    def value(self, shared_encoder: Any = None) -> CriticNet:
        """A new critic with its own encoder, or a head on ``shared_encoder`` (an actor's ``encoder``)."""

    def q(self, dueling: bool = False) -> QNet:
        """A new Q network with its own encoder (Discrete actions only); ``dueling``: value and advantage heads."""


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
    state_space: spaces.Space | None = None
    """The env's global state when the critic reads it (``ppo.critic_input: state``): segments then carry it as
    ``state...`` fields (and ``final_state...``), and ``models.value()`` builds the critic on it."""


class AlgorithmClass(Protocol):
    """The object ``algorithm:`` names."""

    def __call__(self, ctx: AlgorithmContext) -> Algorithm: ...

    def acting_policy(self, ctx: AlgorithmContext) -> Policy: ...
