"""The ``agents`` and ``policies`` sections: which policy plays each agent of a multi-agent env.

``agents`` is a list of rules ``{match: REGEX, policy: NAME}`` over the env's agent ids; an agent plays the
policy of the first rule whose ``match`` matches its whole id. With no rules every agent shares one policy
(:data:`DEFAULT_POLICY`). ``policies`` lists per-policy overrides of the ``model`` and ``ppo`` sections. Each
policy has its own trainers, parameter stream and checkpoints; actors and policy workers serve them all.

Whether each rule matches some agent, and each agent some rule, is known only once the env's agents are:
:func:`map_agents` checks it when the run is planned.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from srl.api.config.errors import ConfigError, check

DEFAULT_POLICY = "default"
"""The one policy of a run without ``agents`` rules."""

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


@dataclass(frozen=True, kw_only=True)
class AgentRule:
    """Agents whose id matches ``match`` (the whole id, a Python regex) play policy ``policy``."""

    match: str
    """A regular expression over agent ids (``adversary_.*``), matched against the whole id."""
    policy: str
    """The policy those agents play (a name: letters, digits, ``_`` and ``-``)."""

    def __post_init__(self) -> None:
        try:
            re.compile(self.match)
        except re.error as exc:
            raise ConfigError(f"match: {self.match!r} is not a regular expression ({exc})") from None
        check(bool(_NAME.fullmatch(self.policy)), "policy", f"{self.policy!r} is not a name ([A-Za-z][A-Za-z0-9_-]*)")


@dataclass(frozen=True, kw_only=True)
class PolicySpec:
    """One policy's own settings: overrides of the run's ``model`` and ``ppo`` sections."""

    name: str
    """The policy's name, as ``agents`` rules give it (also its checkpoint folder and metric prefix)."""
    model: Mapping[str, Any] = field(default_factory=dict)
    """Fields of ``model`` that differ for this policy (``{hidden: [128, 128]}``)."""
    ppo: Mapping[str, Any] = field(default_factory=dict)
    """Fields of ``ppo`` that differ for this policy (``{lr: 0.001}``)."""

    def __post_init__(self) -> None:
        check(bool(_NAME.fullmatch(self.name)), "name", f"{self.name!r} is not a name ([A-Za-z][A-Za-z0-9_-]*)")


def policy_names(rules: Sequence[AgentRule], specs: Sequence[PolicySpec]) -> tuple[str, ...]:
    """The run's policies in order of first mention (the rules first); one line for a policy listed twice in
    ``policies`` or listed there without a rule that gives it agents."""
    other = next((s.name for s in specs if s.name != DEFAULT_POLICY), None)
    if not rules and other is not None:
        raise ConfigError(
            f"policies: without agents rules every agent plays policy {DEFAULT_POLICY!r}; "
            f"{other!r} would have no agents"
        )
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        check(spec.name not in seen, f"policies[{i}].name", f"policy {spec.name!r} is named twice")
        seen.add(spec.name)
    names = tuple(dict.fromkeys(r.policy for r in rules)) or (DEFAULT_POLICY,)
    for i, spec in enumerate(specs):
        check(spec.name in names, f"policies[{i}].name", f"no agents rule plays policy {spec.name!r}")
    return names


def map_agents(rules: Sequence[AgentRule], agents: Sequence[str], env: str) -> dict[str, tuple[str, ...]]:
    """Policy name -> the agent ids it plays, in the env's agent order (the first matching rule wins). One line
    for a rule that matches no agent and for an agent that no rule maps."""
    if not rules:
        return {DEFAULT_POLICY: tuple(agents)}
    out: dict[str, list[str]] = {r.policy: [] for r in rules}
    used = [False] * len(rules)
    for agent in agents:
        k = next((i for i, r in enumerate(rules) if re.fullmatch(r.match, agent)), None)
        if k is None:
            raise ConfigError(f"agents: agent {agent!r} of env {env!r} matches no rule (its agents: {_ids(agents)})")
        used[k] = True
        out[rules[k].policy].append(agent)
    for i, rule in enumerate(rules):
        check(
            used[i] or any(re.fullmatch(rule.match, a) for a in agents),
            f"agents[{i}].match",
            f"{rule.match!r} matches no agent of env {env!r} (its agents: {_ids(agents)})",
        )
    empty = [name for name, ids in out.items() if not ids]
    if empty:
        raise ConfigError(f"agents: policy {empty[0]!r} plays no agent (earlier rules take every agent it matches)")
    return {name: tuple(ids) for name, ids in out.items()}


def _ids(agents: Sequence[str]) -> str:
    shown = ", ".join(agents[:8])
    return shown + (f", ... ({len(agents)} in all)" if len(agents) > 8 else "")
