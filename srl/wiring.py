"""A run's plugins, wired: the algorithm class the config names, its settings, hooks and context, and the networks
it is handed.

Everything that turns ``algorithm:`` and ``model:`` into objects lives here, one
layer above the algorithms and the networks (so neither imports the other) and
below the runtimes, the evaluation and the Python API, which all build their
policies and algorithms through :func:`acting_policy` and :func:`make_algorithm`,
and ask what the algorithm declares (:func:`algorithm_settings`,
:func:`learns_on_policy`, :func:`discount`, :func:`reads_state`, :func:`prepare_algorithm`,
:func:`check_algorithm`) instead of knowing it by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gymnasium import spaces
from torch import nn

from srl.algorithms.dqn_math import dueling as dueling_rule
from srl.api.algorithm import AlgorithmClass, AlgorithmContext, PlanView
from srl.api.config import ConfigError, ExperimentConfig, build
from srl.api.config.errors import check
from srl.api.config.experiment import ALGORITHM_SECTIONS
from srl.api.plugins import resolve
from srl.api.spaces import OBS, STATE
from srl.api.worker import Algorithm, Collective, Policy
from srl.nets.continuous import ActionQ, DeterministicActor, SquashedActor, TwinQ
from srl.nets.memory import Recurrent
from srl.nets.policy import PolicyNet, ValueNet
from srl.nets.q import QNetwork

ALGORITHMS = {
    "ppo": "srl.algorithms.ppo:PPO",
    "lm_ppo": "srl.text.algorithm:LMPPO",
    "dqn": "srl.algorithms.dqn:DQN",
    "r2d2": "srl.algorithms.r2d2:R2D2",
    "qmix": "srl.algorithms.qmix:QMIX",
    "sac": "srl.algorithms.sac:SAC",
    "td3": "srl.algorithms.sac:TD3",
    "alphazero": "srl.algorithms.alphazero:AlphaZero",
    "muzero": "srl.algorithms.muzero:MuZero",
}
"""Built-in names for ``algorithm:``."""

ENCODERS = {"default": "srl.nets.policy:ObsEncoder.from_model"}
"""Built-in names for ``model.encoder`` (``default``: :class:`srl.nets.policy.ObsEncoder`, one encoder per part)."""
FEATURE_ENCODERS = {"default": "srl.nets.policy:ObsEncoder.features_from_model"}

ROLES = {
    "eval": "srl.eval.role:EVAL",
    "league": "srl.league.role:LEAGUE",
    "population": "srl.population.role:POPULATION",
    "reanalyze": "srl.reanalyze.role:REANALYZE",
}
"""The built-in roles beyond the core's (trainers, parameter servers, policy workers, actors), each a package with
its worker, role and report, in start order: every run declares them, with workers where its sections ask for
them. ``workers.roles`` adds a plugin's the same way."""
PATH_ROLES = {"stage": "srl.stage.role:STAGE", "replay": "srl.replay.role:REPLAY"}
"""Built-in names for ``workers.path``; a plugin names its own role (with a ``Hop``) as ``module:attr``."""
"""The same for a critic of actions, which joins the action before its own ``hidden`` MLP: the built-in encoder
without its torso (a plugin encoder is used as it is)."""


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
        self._features = resolve(cfg.model.encoder, FEATURE_ENCODERS, "model.encoder")

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

    def value(self, shared_encoder: nn.Module | None = None, normalize_values: bool = False) -> ValueNet:
        """The critic: on the observation (its encoder from ``model.encoder``, or the actor's), or on the global
        state (the built-in encoder over its parts, named ``state...``); with ``normalize_values`` its head
        predicts standardized returns."""
        m = self.cfg.model
        on_state = self.state_space is not None
        return ValueNet(
            self.state_space if self.state_space is not None else self.obs_space,
            hidden=m.hidden,
            activation=m.activation,
            layer_norm=m.layer_norm,
            normalize_obs=m.normalize_obs,
            shared_encoder=None if on_state else shared_encoder,
            normalize_values=normalize_values,
            encoder=None if on_state or shared_encoder is not None else self.encoder(),
            root=STATE if on_state else OBS,
        )

    def q(self, dueling: bool = False) -> QNetwork:
        """A Q network: its own encoder (``model.encoder``, with the ``hidden`` torso), then one Q value per action,
        or with ``dueling`` a value and an advantage head joined by :func:`srl.algorithms.dqn_math.dueling`."""
        return QNetwork(self.obs_space, self.action_space, self.encoder(), dueling_rule if dueling else None)

    def twin_q(self) -> TwinQ:
        """Two critics of Box actions, ``Q(s, a)`` each: the observation's features joined with the action, then
        the ``hidden`` MLP (each its own encoder and statistics)."""
        m = self.cfg.model
        return TwinQ(
            *(ActionQ(self.action_space, self._features(self.obs_space, m), m.hidden, m.activation) for _ in "12")
        )

    def squashed_actor(self) -> SquashedActor:
        """SAC's actor (a tanh-squashed Gaussian over Box actions) on its own encoder and ``hidden`` torso."""
        return SquashedActor(self.action_space, self.encoder())

    def deterministic_actor(self) -> DeterministicActor:
        """TD3's actor (``tanh`` of a linear head) on its own encoder and ``hidden`` torso."""
        return DeterministicActor(self.action_space, self.encoder())


DEFAULT_DISCOUNT = 0.99
"""The discount of an algorithm whose settings have no ``gamma`` (what the actors' reward scaling uses)."""


def algorithm_class(cfg: ExperimentConfig) -> AlgorithmClass:
    """The class ``algorithm:`` names (raises ConfigError naming the field)."""
    return resolve(cfg.algorithm, ALGORITHMS, "algorithm")


def algorithm_settings(cfg: ExperimentConfig) -> Any:
    """What the algorithm of ``cfg`` is handed as ``ctx.args``: the section its class names (``section``, e.g.
    ``ppo``: the policy's overrides are in it when ``cfg`` is a policy's), else ``algorithm_args`` built into its
    ``settings`` dataclass, else None (a class that declares no settings takes no ``algorithm_args``).

    Raises ConfigError naming the field at fault (``algorithm_args.lr: expected a number, got 'x'``).
    """
    cls = algorithm_class(cfg)
    section: str | None = getattr(cls, "section", None)
    settings: Any = getattr(cls, "settings", None)
    if section is not None:
        where = f"{cfg.algorithm!r} takes its settings from the {section} section"
        check(not cfg.algorithm_args, "algorithm_args", f"{where}, not from algorithm_args")
        fields = {f.name for f in dataclasses.fields(cfg)}
        check(section in fields, "algorithm", f"{where}, which is no section of the experiment")
        return getattr(cfg, section)
    if settings is None:
        check(not cfg.algorithm_args, "algorithm_args", f"{cfg.algorithm!r} declares no settings, so it takes none")
        return None
    if not (isinstance(settings, type) and dataclasses.is_dataclass(settings)):
        raise ConfigError(f"algorithm: {cfg.algorithm}: its settings must be a dataclass, got {settings!r}")
    return build(settings, cfg.algorithm_args, prefix="algorithm_args.")


PER_ALGORITHM_SECTIONS = (*ALGORITHM_SECTIONS, "text")
"""The experiment's sections that hold one algorithm's settings: set for another algorithm, they change nothing."""


def unread_sections(cfg: ExperimentConfig) -> list[str]:
    """One line for each algorithm section set in ``cfg`` (it differs from its defaults) that the algorithm does
    not read (its ``section`` and ``reads``): settings a user wrote that the run would drop without a word, such
    as a ``sac`` section under ``--set algorithm=td3``."""
    cls = algorithm_class(cfg)
    own: str | None = getattr(cls, "section", None)
    read = {own, *getattr(cls, "reads", ())}
    takes = f"it reads {own}" if own is not None else "it takes algorithm_args"
    out = []
    for name in PER_ALGORITHM_SECTIONS:
        given = getattr(cfg, name)
        default = type(given)()
        changed = [f.name for f in dataclasses.fields(given) if getattr(given, f.name) != getattr(default, f.name)]
        if name not in read and changed:
            ignored = ", ".join(f"{name}.{n}" for n in changed)
            out.append(f"{name}: not read by algorithm {cfg.algorithm} ({takes}); ignored: {ignored}")
    return out


def learns_on_policy(cfg: ExperimentConfig) -> bool:
    """Whether the algorithm of ``cfg`` learns from on-policy segments (its ``on_policy``, True when it does not
    say), rather than from a replay."""
    return bool(getattr(algorithm_class(cfg), "on_policy", True))


def discount(cfg: ExperimentConfig) -> float:
    """The algorithm's discount (its settings' ``gamma``), which the actors' reward scaling follows;
    :data:`DEFAULT_DISCOUNT` when its settings have none."""
    return float(getattr(algorithm_settings(cfg), "gamma", DEFAULT_DISCOUNT))


def settings_name(cfg: ExperimentConfig) -> str:
    """Where a config names the algorithm's settings: its section (``ppo``), else ``algorithm_args``."""
    return getattr(algorithm_class(cfg), "section", None) or "algorithm_args"


def reads_state(cfg: ExperimentConfig) -> bool:
    """Whether the algorithm's critic reads the env's global state (its settings' ``critic_input`` is ``state``):
    segments then carry the state for the trainer."""
    return getattr(algorithm_settings(cfg), "critic_input", "obs") == "state"


def prepare_algorithm(cfg: ExperimentConfig) -> None:
    """Before a run's plan: check every policy's settings (one line naming the field, before anything starts),
    then do the algorithm's own preparation (its ``prepare(cfg)``, when it has one)."""
    for name in cfg.policy_names:
        algorithm_settings(cfg.for_policy(name))
    prepare = getattr(algorithm_class(cfg), "prepare", None)
    if prepare is not None:
        prepare(cfg)


def check_algorithm(plan: PlanView) -> None:
    """The algorithm's checks against the probed env (its ``check(plan)``, when it has one), once per run; and
    that it computes its update in ``workers.trainer_dtype`` (its ``trainer_dtypes``, float32 only by default)."""
    cls = algorithm_class(plan.cfg)
    dtypes = getattr(cls, "trainer_dtypes", ("float32",))
    for policy in plan.policies:
        dtype = policy.cfg.workers.trainer_dtype
        if dtype not in dtypes:
            raise ConfigError(
                f"workers.trainer_dtype: {dtype}: algorithm {plan.cfg.algorithm} computes its update in "
                f"{' or '.join(dtypes)} only"
            )
    hook = getattr(cls, "check", None)
    if hook is not None:
        hook(plan)


def context(
    obs_space: spaces.Space,
    action_space: spaces.Space,
    cfg: ExperimentConfig,
    seed: int = 0,
    collective: Collective | None = None,
    device: str = "cpu",
    state_space: spaces.Space | None = None,
    agents: int = 1,
) -> AlgorithmContext:
    return AlgorithmContext(
        obs_space,
        action_space,
        cfg,
        NetModels(obs_space, action_space, cfg, state_space),
        algorithm_settings(cfg),
        seed,
        collective,
        device,
        state_space,
        agents,
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
    agents: int = 1,
) -> Algorithm:
    """What the trainer runs for this config (``state_space``: the global state its critic reads, if any;
    ``agents``: the policy's columns of one environment)."""
    return algorithm_class(cfg)(context(obs_space, action_space, cfg, seed, collective, device, state_space, agents))
