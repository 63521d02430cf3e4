"""What every placement needs to know before starting workers: spaces, buffer layout, snapshot size."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import gymnasium as gym
import torch

from srl.api.config import ConfigError, ExperimentConfig, build
from srl.api.env import NoGlobalState, SlotGroup
from srl.api.plugins import resolve
from srl.api.schema import sample_schema
from srl.api.spaces import action_spec, describe, obs_parts
from srl.api.worker import Policy
from srl.envs.slots import probe_groups
from srl.runtime.topology import ROLES, Layout, Role, Topology, declaring, roles_of, staffed, topology_of
from srl.system.streams import PoolLayout
from srl.wiring import (
    PATH_ROLES,
    acting_policy,
    check_algorithm,
    learns_on_policy,
    reads_state,
    settings_name,
)
from srl.wiring import ROLES as ROLE_TABLE


@dataclass(frozen=True)
class PolicyPlan:
    """One policy of the run: the agents it plays, its spaces, its pool's layout and its snapshot size."""

    name: str
    cfg: ExperimentConfig
    """The run's config with this policy's ``model`` and ``ppo`` overrides (what its networks are built from)."""
    agents: tuple[str, ...]
    """The env's agent ids it plays, in column order within an environment (() for a single-agent env)."""
    obs_space: gym.spaces.Space
    action_space: gym.spaces.Space
    layout: PoolLayout
    """Its pool in one node: rows for the actors of one node group (all actors, outside Ray)."""
    param_size: int
    state_space: gym.spaces.Space | None = None
    """The env's global state when its critic reads it (``ppo.critic_input: state``): carried in segments."""
    agents_per_env: int = 1
    """Its columns per environment: a segment of B columns is B / this env steps wide."""
    envs_per_slot: int = 0
    """How many of each slot's environments it plays: its share of ``workers.envs_per_slot`` (``cfg.members``)."""

    @property
    def spaces(self) -> dict[str, Any]:
        """The spaces as checkpoints record them (a loaded policy is checked against its env with this)."""
        return describe(obs_parts(self.obs_space), action_spec(self.action_space))

    @property
    def columns_per_slot(self) -> int:
        """Its columns of one slot (the rows of one inference request)."""
        return self.envs_per_slot * self.agents_per_env

    def acting_policy(self) -> Policy:
        """A fresh acting policy of its algorithm (what actors, policy workers and evaluations run)."""
        return acting_policy(self.obs_space, self.action_space, self.cfg)


@dataclass(frozen=True)
class Plan(Layout):
    """Derived, read-only facts about one experiment: where each worker stands (:class:`Layout`), and what the
    probed environment says of each policy."""

    policies: tuple[PolicyPlan, ...]
    """The run's policies (one without ``agents`` rules), in the order of ``cfg.policy_names``."""
    agents_per_env: int = 1
    """Columns per environment, every policy's (a multi-agent env's agents)."""
    null_trainer: bool = False
    """Replace the trainer by one that discards segments (sampling benchmarks)."""
    resume: tuple[str, ...] | None = None
    """The checkpoints the trainers continue from (``srl train --resume``, a restart): one per policy."""
    start_version: int = 0
    """Policy version the run starts at (the checkpoint's when resuming)."""
    start_env_steps: int = 0
    """Env steps the run took before this process (a resumed run's): actors' exploration counts on from them."""
    game_players: int = 0
    """The players of the turn-based game the env is, as probed (0: not a turn-based game)."""

    def only(self, what: str) -> PolicyPlan:
        """The one policy of the run, for ``what``, which trains or measures one (one line when there are more)."""
        if len(self.policies) > 1:
            raise ConfigError(f"agents: {what} serves runs of one policy; the agents rules name {len(self.policies)}")
        return self.policies[0]

    @cached_property
    def topology(self) -> Topology:
        """Every worker of the run: role, index, node group, endpoints, restart policy (computed once)."""
        return topology_of(self, roles_of(self))


def make_plan(cfg: ExperimentConfig, null_trainer: bool = False) -> Plan:
    """Probe the environment once and size the streams (raises ConfigError on a bad env or agents rules, bad
    algorithm settings, or settings the algorithm's ``check`` finds unfit for the probed env)."""
    names = cfg.policy_names
    on_state = [n for n in names if reads_state(cfg.for_policy(n))]
    try:
        probed = probe_groups(cfg.env, cfg.agents, on_state, names if cfg.members > 1 else ())
    except NoGlobalState as exc:
        raise ConfigError(f"{settings_name(cfg)}.critic_input: state: {exc}") from None
    by_name = {g.policy: g for g in probed.groups}
    if cfg.stage.worker is not None:  # a wrong name is one line now, not a failing worker later
        resolve(cfg.stage.worker, {}, "stage.worker")
    policies = tuple(_policy_plan(cfg, by_name[n]) for n in names)
    vs_random = probed.turn_based and probed.agents_per_env == 2 and len(names) == 1
    path = sample_path(cfg)
    plan = Plan(
        cfg,
        policies,
        agents_per_env=1 if cfg.one_seat else probed.agents_per_env,
        game_players=probed.agents_per_env if probed.turn_based else 0,
        vs_random=vs_random,
        null_trainer=null_trainer,
        sample_path=path,
        added_roles=added_roles(cfg, path),
    )
    for hook in ("port", "slots"):  # what one role of a run may declare
        try:
            declaring(plan, hook)
        except ValueError as exc:
            raise ConfigError(f"workers.roles: {exc}") from None
    for role in staffed(plan):  # what each role of the run needs of the plan
        if role.check is not None:
            role.hook("check")(plan)
    check_algorithm(plan)  # what the algorithm needs of the probed env, one line naming its setting
    return plan


def sample_path(cfg: ExperimentConfig) -> tuple[Role, ...]:
    """The roles of ``workers.path`` (or the default path: a stage when ``stage.worker`` names one, then a replay
    when the algorithm learns from one), checked: each a role with a hop, none twice, a keeper only last, a
    replay exactly when the algorithm learns off-policy, a stage exactly when ``stage.worker`` names one."""
    on_policy = learns_on_policy(cfg)
    names = cfg.workers.path
    if names is None:
        names = ("stage",) * (cfg.stage.worker is not None) + ("replay",) * (not on_policy)
    roles: list[Role] = []
    for name in names:
        role = resolve(name, PATH_ROLES, "workers.path", callable_=False)
        if not isinstance(role, Role) or role.hop is None:
            raise ConfigError(f"workers.path: {name!r} is not a role of the sample path (a Role with a Hop)")
        if role in roles:
            raise ConfigError(f"workers.path: {name!r} is listed twice")
        roles.append(role)
    keepers = [r for r in roles if r.hop is not None and r.hop.keeps is not None]
    if keepers and keepers[0].hop is not None and keepers[0].hop.batches is None:
        raise ConfigError(f"workers.path: {keepers[0].name} keeps the segments but names no batch source (Hop.batches)")
    if keepers and roles[-1] is not keepers[0]:
        raise ConfigError(f"workers.path: {keepers[0].name} keeps the segments, so it must be the path's last role")
    _check_path_roles(cfg, names, bool(keepers), on_policy)
    return tuple(roles)


def added_roles(cfg: ExperimentConfig, path: tuple[Role, ...]) -> tuple[Role, ...]:
    """The built-in roles beyond the core's (:data:`~srl.wiring.ROLES`), then those of ``workers.roles``, checked:
    each a :class:`Role` without a hop (those go in ``workers.path``), its name and seed salt its own among the
    run's roles, none listed twice."""
    built_in = tuple(resolve(name, ROLE_TABLE, "workers.roles", callable_=False) for name in ROLE_TABLE)
    taken = {r.name: r for r in (*ROLES, *path, *built_in)}
    salts = {r.seed_salt for r in taken.values()}
    roles: list[Role] = list(built_in)
    for name in cfg.workers.roles:
        role = resolve(name, {}, "workers.roles", callable_=False)
        if not isinstance(role, Role):
            raise ConfigError(f"workers.roles: {name!r} is not a Role declaration (got {type(role).__name__})")
        if role.hop is not None:
            raise ConfigError(f"workers.roles: {name!r} stands on the sample path: list it in workers.path")
        if role.name in taken:
            said = f"is named {role.name!r}, as a role of the run already is"
            if role in built_in:
                said = "is built in: every run declares it"
            elif role in roles:
                said = "is listed twice"
            raise ConfigError(f"workers.roles: {name!r} {said}")
        if role.seed_salt in salts:
            raise ConfigError(f"workers.roles: {name!r} has seed_salt {role.seed_salt}, which another role has")
        taken[role.name] = role
        salts.add(role.seed_salt)
        roles.append(role)
    return tuple(roles)


def _check_path_roles(cfg: ExperimentConfig, names: tuple[str, ...], kept: bool, on_policy: bool) -> None:
    """A replay exactly when the algorithm learns off-policy; a stage exactly when ``stage.worker`` names one."""
    if kept and on_policy:
        raise ConfigError(
            f"workers.path: a replay serves algorithms that learn off-policy; {cfg.algorithm} learns from "
            "on-policy segments (leave replay out)"
        )
    if not kept and not on_policy:
        raise ConfigError(f"workers.path: {cfg.algorithm} learns from a replay: end the path with replay")
    if ("stage" in names) != (cfg.stage.worker is not None):
        said = "names no stage" if cfg.stage.worker is not None else "has stage, but stage.worker names no class"
        raise ConfigError(f"workers.path: {list(names)} {said}")


def _policy_plan(cfg: ExperimentConfig, group: SlotGroup) -> PolicyPlan:
    """Policy ``group.policy``'s plan: its pool holds every column of its agents in each slot (one per env when it
    holds one seat of each game), of its share of the slot's envs."""
    pcfg, w = cfg.for_policy(group.policy), cfg.workers
    with torch.device("meta"):  # shapes only: no weights, no init kernels (and no thread pool) in the controller
        policy = acting_policy(group.observation_space, group.action_space, pcfg)
        param_size = policy.flat_size()
    one_seat = cfg.one_seat
    columns = 1 if one_seat else group.agents_per_env
    envs = w.envs_per_slot // cfg.members
    alive = group.alive and not one_seat
    schema = sample_schema(
        group.observation_space, group.action_space, policy.output_fields(), group.state_space, alive=alive
    )
    nodes = Layout(cfg).nodes
    layout = PoolLayout.of(
        schema,
        w.segment_length,
        envs * columns,  # every agent of every env it plays is a column
        actors=w.actors // nodes,
        buffers=w.buffers_per_actor,
        slots=w.ring_size,
    )
    return PolicyPlan(
        group.policy,
        pcfg,
        () if one_seat else group.agents,
        group.observation_space,
        group.action_space,
        layout,
        param_size,
        group.state_space,
        columns,
        envs,
    )


def plan_from_spec(spec: Mapping[str, Any]) -> Plan:
    """Rebuild the controller's plan in a worker process from the JSON spec it was handed. Plugins named
    ``module:attr`` are imported from where the run was started (``plugin_path``: the controller's working
    directory, which a Ray worker does not start in), when that folder exists here."""
    path = spec.get("plugin_path")
    if isinstance(path, str) and path not in sys.path and os.path.isdir(path):
        sys.path.append(path)
    cfg = build(ExperimentConfig, spec["config"])
    return dataclasses.replace(
        make_plan(cfg, null_trainer=bool(spec["null_trainer"])),
        resume=None if spec["resume"] is None else tuple(str(p) for p in spec["resume"]),
        start_version=int(spec["start_version"]),
        start_env_steps=int(spec["start_env_steps"]),
    )
