"""What an algorithm plugin implements, and what the runtime hands it.

An algorithm is named by ``algorithm:`` in the experiment file (``ppo``, or
``my_pkg.module:MyAlgorithm``). The named object is a class (or factory)
with two entry points, both given an :class:`AlgorithmContext`:

- ``cls.acting_policy(ctx)`` -> a :class:`~srl.api.worker.Policy`: what actors,
  policy workers, the eval worker and ``srl.load_policy`` run. Its
  ``output_fields()`` are the algorithm's declaration in the sample schema
  (e.g. ``logp``, or rollout-time ``values``);
- ``cls(ctx)`` -> an :class:`~srl.api.worker.Algorithm`: what the trainer runs;
  its ``train`` returns a :class:`~srl.api.worker.TrainResult`.

and these declarations, each optional (:class:`AlgorithmClass` says what each
defaults to), so that the runtime asks the algorithm instead of knowing it by
name:

- ``settings``: a frozen ``kw_only`` dataclass of its settings, a docstring per
  field and checks in ``__post_init__`` (``srl.api.config.errors.check``). A
  plugin's come from ``algorithm_args:``, built into this dataclass when the run
  starts, so a wrong key or type is one line naming ``algorithm_args.<field>``;
- ``section``: the field of the experiment that holds those settings instead
  (the built-in PPO's ``ppo``), with a policy's ``policies[].ppo`` overrides applied;
- ``reads``: the other algorithm sections it reads (``lm_ppo``: ``text``), so that
  a section set for another algorithm is named as ignored;
- ``on_policy``: whether it learns from on-policy segments or from a replay;
- ``check(plan)``: checks that need the probed env (spaces, columns), once per run
  on the whole :class:`PlanView`, so one line names the setting at fault before any
  worker starts;
- ``prepare(cfg)``: work done once before the plan is made (``lm_ppo`` makes a
  missing base model and reward model there);
- ``reconfigure(settings)`` on the instance: take new settings (its typed
  section) between updates. A population's members change hyperparameters
  live through it; an algorithm without it trains in a population whose
  ``hyperparameters`` are empty only. ``live_settings``, where it names them,
  are the settings it takes that way (the DQN family's actors explore by
  settings its trainer cannot change); a population searching another is
  refused in one line.

``ctx.args`` is the typed settings object (None for a plugin without
``settings``). Networks come through ``ctx.models`` (built by the runtime from
``model:``, including a plugin encoder), so an algorithm never imports
``srl.nets`` and a user's own network trains with any algorithm.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
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

    @property
    def memory_size(self) -> int:
        """State floats per environment of a recurrent core (``model.core``), 0 without one."""

    def greedy_with_memory(self, obs: Obs, state: Tensor, /) -> tuple[Tensor, Tensor]:
        """A recurrent network's step: the best legal action of each row, and each row's next state."""

    def unroll(self, obs: Obs, seq: Any, burn_in: int = 0, /) -> Tensor:
        """Q values ``[L * n, actions]`` of sequences' time-major rows, unrolled over ``seq``
        (:class:`srl.nets.memory.Sequences`), the first ``burn_in`` rows without gradient."""


class Models(Protocol):
    """Network constructors for the run's spaces and ``model`` section."""

    def encoder(self) -> nn.Module:
        """A new observation encoder (``model.encoder``, with the ``hidden`` torso) with an int ``out_dim``, for a
        network an algorithm builds itself (MuZero's representation)."""

    def policy(self) -> ActorNet:
        """A new actor with its own encoder."""

    def value(self, shared_encoder: Any = None, normalize_values: bool = False) -> CriticNet:
        """A new critic with its own encoder, or a head on ``shared_encoder`` (an actor's ``encoder``);
        ``normalize_values``: its head predicts returns standardized by running statistics (``return_normalizer``),
        a setting of the algorithm that trains it."""

    def q(self, dueling: bool = False) -> QNet:
        """A new Q network with its own encoder (Discrete actions only); ``dueling``: value and advantage heads."""

    def twin_q(self) -> Any:
        """Two new critics of Box actions (``srl.nets.continuous.TwinQ``): ``(Q1, Q2)(obs, unit actions)``."""

    def squashed_actor(self) -> Any:
        """A new tanh-squashed Gaussian actor over Box actions (``srl.nets.continuous.SquashedActor``)."""

    def deterministic_actor(self) -> Any:
        """A new deterministic actor over Box actions (``srl.nets.continuous.DeterministicActor``)."""


@dataclass(frozen=True)
class AlgorithmContext:
    """Everything an algorithm is built from; the runtime fills it."""

    obs_space: spaces.Space
    action_space: spaces.Space
    cfg: ExperimentConfig
    models: Models
    args: Any = None
    """The algorithm's typed settings (its ``settings`` dataclass, from its ``section`` or ``algorithm_args``);
    None when it declares none."""
    seed: int = 0
    collective: Collective | None = None
    """Set for data-parallel trainers: average gradients through it."""
    device: str = "cpu"
    state_space: spaces.Space | None = None
    """The env's global state when the critic reads it (``ppo.critic_input: state``): segments then carry it as
    ``state...`` fields (and ``final_state...``), and ``models.value()`` builds the critic on it."""
    agents: int = 1
    """The policy's columns of one environment: the agents of a team (a multi-agent env's), 1 otherwise."""


class PolicyView(Protocol):
    """What an algorithm's ``check`` reads of one policy of the run (``srl.runtime.plan.PolicyPlan``)."""

    @property
    def name(self) -> str: ...

    @property
    def cfg(self) -> ExperimentConfig:
        """The run's config as this policy trains: its ``policies[]`` overrides applied."""

    @property
    def obs_space(self) -> spaces.Space: ...

    @property
    def action_space(self) -> spaces.Space: ...

    @property
    def state_space(self) -> spaces.Space | None:
        """The env's global state when the critic reads it, else None."""

    @property
    def columns_per_slot(self) -> int:
        """Its columns of one slot: a segment is ``[workers.segment_length, columns_per_slot]``."""

    @property
    def agents_per_env(self) -> int:
        """Its columns of one environment: the agents it plays in each (1 in a single-agent env)."""


class PlanView(Protocol):
    """What an algorithm's ``check`` reads of the plan (``srl.runtime.plan.Plan``): the env probed once."""

    @property
    def cfg(self) -> ExperimentConfig: ...

    @property
    def policies(self) -> Sequence[PolicyView]:
        """The run's policies, each with its spaces and its own config."""

    @property
    def game_players(self) -> int:
        """The players of the turn-based game the env is (0: it is not one)."""


class AlgorithmClass(Protocol):
    """The object ``algorithm:`` names.

    Besides the two members below it may declare, as class attributes (read by :mod:`srl.wiring`):

    - ``settings: ClassVar[type]``: its settings dataclass (none: it takes no ``algorithm_args``). Two field names
      mean something to the runtime: ``gamma``, the discount the actors' reward scaling follows (0.99 without
      one), and ``critic_input`` (``"state"``: segments carry the env's global state for the trainer);
    - ``section: ClassVar[str]``: the ``ExperimentConfig`` field its settings are read from (``"ppo"``); without
      it they come from ``algorithm_args``;
    - ``reads: ClassVar[tuple[str, ...]]``: the other algorithm sections of the experiment its code reads
      (``lm_ppo``: ``("text",)``); a section set in the config that it neither takes nor reads is named in a
      warning as the run starts, since its settings change nothing;
    - ``on_policy: ClassVar[bool]``: True (the default) when it learns from on-policy segments, False when it
      learns from a replay;
    - ``team_items: ClassVar[bool]``: True when its replay items hold every agent of an environment together, a
      team's sequences (QMIX): the batch's fields gain an agent axis after the item axis;
    - ``check(plan: PlanView) -> None`` (a static or class method): raise ConfigError naming the setting at
      fault when the probed env does not suit the settings; called once per run by ``make_plan``;
    - ``prepare(cfg: ExperimentConfig) -> None`` (a static or class method): work before the plan is made,
      called once by ``train`` after every policy's settings are checked;
    - ``trainer_dtypes: ClassVar[tuple[str, ...]]``: the ``workers.trainer_dtype`` values its update honours
      (``("float32", "bfloat16")``: it runs its forward passes under ``srl.api.device.autocast``); without it,
      float32 only, and a run asking for bfloat16 is refused.
    """

    def __call__(self, ctx: AlgorithmContext) -> Algorithm: ...

    def acting_policy(self, ctx: AlgorithmContext) -> Policy: ...
