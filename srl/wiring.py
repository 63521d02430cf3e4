"""A run's plugins, wired: the algorithm class the config names, its context, and the networks it is handed.

Everything that turns ``algorithm:`` and ``model:`` into objects lives here, one
layer above the algorithms and the networks (so neither imports the other) and
below the runtimes, the evaluation and the Python API, which all build their
policies and algorithms through :func:`acting_policy` and :func:`make_algorithm`.
"""

from __future__ import annotations

from gymnasium import spaces
from torch import nn

from srl.algorithms.dqn_math import dueling as dueling_rule
from srl.api.algorithm import AlgorithmClass, AlgorithmContext
from srl.api.config import ExperimentConfig
from srl.api.plugins import resolve
from srl.api.spaces import OBS, STATE
from srl.api.worker import Algorithm, Collective, Policy
from srl.nets.memory import Recurrent
from srl.nets.policy import PolicyNet, ValueNet
from srl.nets.q import QNetwork

ALGORITHMS = {"ppo": "srl.algorithms.ppo:PPO", "lm_ppo": "srl.text.algorithm:LMPPO", "dqn": "srl.algorithms.dqn:DQN"}
"""Built-in names for ``algorithm:``."""

ENCODERS = {"default": "srl.nets.policy:ObsEncoder.from_model"}
"""Built-in names for ``model.encoder`` (``default``: :class:`srl.nets.policy.ObsEncoder`, one encoder per part)."""


class NetModels:
    """The networks of a run: actor and critic (or a Q network) for its spaces, shaped by its ``model`` section.

    Each network gets its own ``Encoder(obs_space, model)`` from what ``model.encoder`` names (built in, or
    ``package.module:Encoder``): an ``nn.Module`` with ``out_dim`` whose ``forward`` maps the observation parts
    (``{"obs": ...}`` or ``{"obs.<key>": ...}``, see :mod:`srl.api.spaces`) to features ``[N, out_dim]``.
    """

    def __init__(
        self,
        obs_space: spaces.Space,
        action_space: spaces.Space,
        cfg: ExperimentConfig,
        state_space: spaces.Space | None = None,
    ) -> None:
        """``state_space``: the env's global state, which the critic then reads instead of the observation."""
        self.obs_space, self.action_space, self.cfg, self.state_space = obs_space, action_space, cfg, state_space
        self._encoder = resolve(cfg.model.encoder, ENCODERS, "model.encoder")

    def encoder(self) -> nn.Module:
        """A new encoder for one network, with the recurrent core after it when ``model.core`` names one."""
        enc = self._encoder(self.obs_space, self.cfg.model)
        if not isinstance(enc, nn.Module) or not isinstance(getattr(enc, "out_dim", None), int):
            raise TypeError(f"model.encoder: {self.cfg.model.encoder!r} must build an nn.Module with an int out_dim")
        if self.cfg.model.core != "none":
            return Recurrent(enc, self.cfg.model.core, self.cfg.model.core_size)
        return enc

    def policy(self) -> PolicyNet:
        m = self.cfg.model
        return PolicyNet(
            self.obs_space,
            self.action_space,
            hidden=m.hidden,
            activation=m.activation,
            layer_norm=m.layer_norm,
            normalize_obs=m.normalize_obs,
            init_log_std=m.init_log_std,
            encoder=self.encoder(),
        )

    def value(self, shared_encoder: nn.Module | None = None) -> ValueNet:
        """The critic: on the observation (its encoder from ``model.encoder``, or the actor's), or on the global
        state (the built-in encoder over its parts, named ``state...``)."""
        m = self.cfg.model
        on_state = self.state_space is not None
        return ValueNet(
            self.state_space if self.state_space is not None else self.obs_space,
            hidden=m.hidden,
            activation=m.activation,
            layer_norm=m.layer_norm,
            normalize_obs=m.normalize_obs,
            shared_encoder=None if on_state else shared_encoder,
            normalize_values=self.cfg.ppo.normalize_values,
            encoder=None if on_state or shared_encoder is not None else self.encoder(),
            root=STATE if on_state else OBS,
        )

    def q(self, dueling: bool = False) -> QNetwork:
        """A Q network: its own encoder (``model.encoder``, with the ``hidden`` torso), then one Q value per action,
        or with ``dueling`` a value and an advantage head joined by :func:`srl.algorithms.dqn_math.dueling`."""
        return QNetwork(self.obs_space, self.action_space, self.encoder(), dueling_rule if dueling else None)


def algorithm_class(cfg: ExperimentConfig) -> AlgorithmClass:
    """The class ``algorithm:`` names (raises ConfigError naming the field)."""
    return resolve(cfg.algorithm, ALGORITHMS, "algorithm")


def context(
    obs_space: spaces.Space,
    action_space: spaces.Space,
    cfg: ExperimentConfig,
    seed: int = 0,
    collective: Collective | None = None,
    device: str = "cpu",
    state_space: spaces.Space | None = None,
) -> AlgorithmContext:
    return AlgorithmContext(
        obs_space,
        action_space,
        cfg,
        NetModels(obs_space, action_space, cfg, state_space),
        dict(cfg.algorithm_args),
        seed,
        collective,
        device,
        state_space,
    )


def acting_policy(obs_space: spaces.Space, action_space: spaces.Space, cfg: ExperimentConfig) -> Policy:
    """What actors, policy workers and evaluation run for this config."""
    return algorithm_class(cfg).acting_policy(context(obs_space, action_space, cfg))


def make_algorithm(
    obs_space: spaces.Space,
    action_space: spaces.Space,
    cfg: ExperimentConfig,
    seed: int,
    collective: Collective | None = None,
    device: str = "cpu",
    state_space: spaces.Space | None = None,
) -> Algorithm:
    """What the trainer runs for this config (``state_space``: the global state its critic reads, if any)."""
    return algorithm_class(cfg)(context(obs_space, action_space, cfg, seed, collective, device, state_space))
