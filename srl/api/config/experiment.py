"""The experiment root: the top-level fields and one field per section, and the checks across sections."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from srl.api.config.cost import CostConfig
from srl.api.config.dqn import DQNConfig, QMixConfig, R2D2Config
from srl.api.config.env import EnvConfig
from srl.api.config.errors import check, did_you_mean
from srl.api.config.league import LeagueConfig
from srl.api.config.model import ModelConfig
from srl.api.config.params import ParamsConfig
from srl.api.config.parse import build, to_dict
from srl.api.config.policies import AgentRule, PolicySpec, policy_names
from srl.api.config.population import PopulationConfig
from srl.api.config.ppo import PPOConfig
from srl.api.config.ray import RayConfig
from srl.api.config.replay import ReplayConfig
from srl.api.config.run import RunConfig
from srl.api.config.sac import SACConfig, TD3Config
from srl.api.config.search import AlphaZeroConfig, MuZeroConfig, ReanalyzeConfig
from srl.api.config.stage import StageConfig
from srl.api.config.text import TextConfig
from srl.api.config.workers import WorkersConfig

ALGORITHM_SECTIONS = ("ppo", "dqn", "r2d2", "qmix", "sac", "td3", "alphazero", "muzero")
"""The typed sections an algorithm reads its settings from, whose number fields a population may search."""

FIXED_ON_RESUME = (
    "env",
    "model",
    "ppo.critic",
    "ppo.normalize_values",
    "text.model",
    "text.advantage",
    "replay.placement",  # the saved replays are one file per replay
    "population.members",  # one checkpoint folder per member
    "population.hyperparameters",  # the population's state holds each member's values of these
)
"""Settings the checkpoints were made under (the networks were built with them, the saved replays are one file
per replay): a resumed run may not change them."""


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """One experiment: the same file runs under every runtime."""

    name: str = "experiment"
    """Experiment name, used in the run directory name."""
    seed: int = 0
    """Seed of every random stream (environments, networks, sampling)."""
    runtime: Literal["inline", "local", "ray"] = "local"
    """Placement: ``inline`` runs every worker in this process (deterministic), ``local`` one process per worker,
    ``ray`` the same workers as Ray actors across a cluster (see ``ray``)."""
    algorithm: str = "ppo"
    """The learning algorithm: ``ppo`` (reads the ``ppo`` section), or ``package.module:Algorithm``, a class
    with ``acting_policy(ctx)`` and ``Algorithm(ctx)`` (see ``srl/api/algorithm.py``, ``examples/a2c.py``)."""
    algorithm_args: Mapping[str, Any] = field(default_factory=dict)
    """A plugin algorithm's own settings, built into the dataclass it declares as ``settings`` (a wrong key or type
    is one line naming ``algorithm_args.<field>``) and handed to it as ``ctx.args``; one that declares none takes
    none."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment."""
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    """Worker counts and shapes."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Network shape."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO hyper-parameters."""
    dqn: DQNConfig = field(default_factory=DQNConfig)
    """DQN hyper-parameters (``algorithm: dqn``)."""
    r2d2: R2D2Config = field(default_factory=R2D2Config)
    """R2D2 hyper-parameters (``algorithm: r2d2``)."""
    qmix: QMixConfig = field(default_factory=QMixConfig)
    """QMIX and VDN hyper-parameters (``algorithm: qmix``): a team's value mixed from its agents'."""
    sac: SACConfig = field(default_factory=SACConfig)
    """SAC hyper-parameters (``algorithm: sac``)."""
    alphazero: AlphaZeroConfig = field(default_factory=AlphaZeroConfig)
    """AlphaZero hyper-parameters and its search (``algorithm: alphazero``)."""
    muzero: MuZeroConfig = field(default_factory=MuZeroConfig)
    """MuZero hyper-parameters and its search (``algorithm: muzero``)."""
    reanalyze: ReanalyzeConfig = field(default_factory=ReanalyzeConfig)
    """Workers that search stored steps again with the newest network (``alphazero``, ``muzero``)."""
    td3: TD3Config = field(default_factory=TD3Config)
    """TD3 hyper-parameters (``algorithm: td3``)."""
    params: ParamsConfig = field(default_factory=ParamsConfig)
    """The parameter service."""
    stage: StageConfig = field(default_factory=StageConfig)
    """An optional worker between actors and trainers."""
    league: LeagueConfig = field(default_factory=LeagueConfig)
    """Self-play against a pool of past selves (two-player turn-based games)."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """The replay store of an off-policy algorithm."""
    agents: tuple[AgentRule, ...] = ()
    """Which policy plays each agent of a multi-agent env: rules ``{match: REGEX, policy: NAME}``, the first
    whose ``match`` matches an agent's whole id wins. None: every agent shares one policy (``default``)."""
    policies: tuple[PolicySpec, ...] = ()
    """Per-policy overrides of ``model`` and ``ppo``: ``{name: NAME, model: {...}, ppo: {...}}``. Each policy
    has its own trainers (``workers.trainers`` each), parameter stream and checkpoints."""
    population: PopulationConfig = field(default_factory=PopulationConfig)
    """Population-based training: ``members`` policies of the env, exploited and explored live (off by default)."""
    text: TextConfig = field(default_factory=TextConfig)
    """A language model fine-tuned by RL (``algorithm: lm_ppo``, with a text task as ``env``)."""
    run: RunConfig = field(default_factory=RunConfig)
    """Stopping and recording."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Placement on a Ray cluster; read only by ``runtime: ray``."""
    cost: CostConfig = field(default_factory=CostConfig)
    """How the run's energy is measured or modelled, and the prices of its core-hours, GPU-hours and energy."""

    def __post_init__(self) -> None:
        check(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        self._check_population()
        names = self.policy_names
        for i, spec in enumerate(self.policies):  # an override's wrong key or value is one line naming it
            build(ModelConfig, {**to_dict(self.model), **spec.model}, prefix=f"policies[{i}].model.")
            build(PPOConfig, {**to_dict(self.ppo), **spec.ppo}, prefix=f"policies[{i}].ppo.")
        check(
            len(names) == 1 or not self.league.pool,
            "league.opponent",
            "a league trains one policy; the agents rules name several",
        )
        check(len(names) == 1 or self.stage.worker is None, "stage.worker", "a stage serves runs of one policy")
        check(
            self.ppo.burn_in < self.workers.segment_length,
            "ppo.burn_in",
            f"{self.ppo.burn_in} warm-up steps leave nothing to train in segments of {self.workers.segment_length}",
        )
        check(
            self.replay.item_length <= self.workers.segment_length,
            "replay.item_length",
            f"items of {self.replay.item_length} steps do not fit in segments of {self.workers.segment_length}",
        )
        check(
            self.model.core == "none" or self.ppo.memory == "recompute" or self.model.shared_encoder,
            "ppo.memory",
            "stored states are the actor's: a critic with a core of its own needs memory: recompute (or "
            "model.shared_encoder: true)",
        )
        check(
            self.runtime != "inline" or self.workers.trainers == 1,
            "workers.trainers",
            "the inline runtime runs one trainer; use runtime: local for several",
        )
        check(
            self.runtime != "inline" or (self.params.mode == "hierarchical" and self.params.groups == 1),
            "params",
            "the inline runtime shares one buffer; relays and flat mode need runtime: local",
        )
        check(
            self.ppo.critic_input == "obs" or not self.model.shared_encoder,
            "ppo.critic_input",
            "a critic on the global state has its own encoder: needs model.shared_encoder: false",
        )
        nodes = self.ray.actor_nodes if self.runtime == "ray" else 1
        check(
            self.stage.worker is None or self.stage.per_node <= self.workers.actors // nodes,
            "stage.per_node",
            f"each stage worker needs an actor: {self.stage.per_node} per node, {self.workers.actors // nodes} actors",
        )
        if self.runtime == "ray":
            w = self.workers
            check(
                w.actors % nodes == 0,
                "workers.actors",
                f"{w.actors} actors do not split evenly over ray.actor_nodes={nodes}",
            )
            check(
                w.policy_workers % nodes == 0,
                "workers.policy_workers",
                f"{w.policy_workers} policy workers do not split evenly over ray.actor_nodes={nodes}",
            )
            if self.population.enabled:  # members are dealt over the trainer node groups, each whole
                check(
                    self.population.members >= self.ray.trainer_nodes,
                    "ray.trainer_nodes",
                    f"{self.ray.trainer_nodes} trainer node groups for {self.population.members} population "
                    "members: each group trains whole members",
                )
            else:
                check(
                    w.trainers % self.ray.trainer_nodes == 0,
                    "workers.trainers",
                    f"{w.trainers} trainers do not split evenly over ray.trainer_nodes={self.ray.trainer_nodes}",
                )
            check(
                self.params.mode == "flat" or self.params.groups == nodes,
                "params.groups",
                f"under runtime: ray there is one relay per actor node: must be {nodes}",
            )
            check(self.workers.start_method == "auto", "workers.start_method", "Ray starts the worker processes")

    def _check_population(self) -> None:
        """Each hyperparameter a number field of a typed section; members split every slot's envs evenly; no
        league or stage beside it."""
        pop = self.population
        if not pop.enabled:
            return
        sections = {f.name for f in dataclasses.fields(self) if f.name in ALGORITHM_SECTIONS}
        for i, h in enumerate(pop.hyperparameters):
            where = f"population.hyperparameters[{i}].key"
            known = ", ".join(sorted(sections))
            check(h.section in sections, where, f"{h.section!r} is no algorithm section ({known})")
            kinds = {f.name: f.type for f in dataclasses.fields(getattr(self, h.section))}
            check(h.field in kinds, where, f"{h.field!r} is not a field of {h.section}{did_you_mean(h.field, kinds)}")
            check(kinds[h.field] in ("float", "int"), where, f"{h.key} is not a number ({kinds[h.field]})")
        taken = sorted(set(self.base_policies) & set(self.policy_names))
        check(not taken, "agents", f"policy {taken[0]!r} is named like a population member" if taken else "")
        check(not self.league.pool, "population", "a league trains one learner; leave league.opponent at latest")
        check(self.stage.worker is None, "population", "a stage serves runs of one policy")
        check(
            self.workers.envs_per_slot % pop.members == 0,
            "population.members",
            f"{pop.members} members do not split workers.envs_per_slot={self.workers.envs_per_slot} evenly "
            "(each member plays its share of every slot's envs)",
        )

    def with_values(self, values: Mapping[str, float]) -> ExperimentConfig:
        """This config with ``values`` (``{"ppo.lr": 3e-4}``: fields of the algorithm's typed sections) set; an
        integer field takes the value rounded. Raises ConfigError naming the field when a value does not fit."""
        by_section: dict[str, dict[str, Any]] = {}
        for key, value in values.items():
            section, _, name = key.partition(".")
            kind = next(f.type for f in dataclasses.fields(getattr(self, section)) if f.name == name)
            by_section.setdefault(section, {})[name] = round(value) if kind == "int" else float(value)
        changed = {
            section: build(type(getattr(self, section)), {**to_dict(getattr(self, section)), **fields}, f"{section}.")
            for section, fields in by_section.items()
        }
        return dataclasses.replace(self, **changed) if changed else self

    @property
    def policy_names(self) -> tuple[str, ...]:
        """The run's policies, in order of first mention in ``agents`` (``("default",)`` without rules); with a
        population, its members (``member0``, ...; ``red-member0``, ``blue-member0``, ... of several policies)."""
        if self.population.enabled:
            return self.population.names(self.base_policies)
        return self.base_policies

    @property
    def members(self) -> int:
        """Independent copies of each base policy the run trains side by side, each on its share of every slot's
        envs and with trainers of its own (a population's members; 1 without)."""
        return self.population.members if self.population.enabled else 1

    @property
    def one_seat(self) -> bool:
        """The learning policy holds one seat of each game and the slot seats its opponents in the others (a
        league's pool): one column per env."""
        return self.league.pool

    @property
    def base_policies(self) -> tuple[str, ...]:
        """The policies the ``agents`` rules name (``("default",)`` without rules); a population has members of
        each of them."""
        return policy_names(self.agents, self.policies)

    def member_of(self, name: str) -> tuple[str, int]:
        """A population member's policy and index: ``("red", 1)`` for ``red-member1``, ``("default", 1)`` for
        ``member1`` of a run of one policy."""
        bases = self.base_policies
        i = self.population.names(bases).index(name)
        return bases[i % len(bases)], i // len(bases)

    def for_policy(self, name: str) -> ExperimentConfig:
        """This config as policy ``name`` trains: its ``model`` and ``ppo`` overrides applied; a population
        member's those of its policy and its first hyperparameter values (:meth:`with_values` for later ones)."""
        if self.population.enabled and name in self.policy_names:
            base, _ = self.member_of(name)
            values = self.population.initial_values(self.seed, len(self.base_policies))
            return self.for_policy(base).with_values(values[self.policy_names.index(name)])
        spec = next((s for s in self.policies if s.name == name), None)
        if spec is None or not (spec.model or spec.ppo):
            return self
        return dataclasses.replace(
            self,
            model=build(ModelConfig, {**to_dict(self.model), **spec.model}),
            ppo=build(PPOConfig, {**to_dict(self.ppo), **spec.ppo}),
        )
