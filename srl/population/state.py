"""What the population worker knows and decides, as plain data: counters, scores, values, the lineage.

:class:`PopulationState` takes the members' finished episodes and env steps as the actors report them, says when
a member is ready, and decides at each check (the exploit rule, then :func:`~srl.population.rules.explore`). It
is JSON: the worker writes it atomically after every decision and reads it back when it restarts or the run
resumes, so the schedule goes on where it was. Every draw comes from a generator seeded by the run's seed and the
decision's number, so a restarted worker draws what the dead one would have.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from srl.api.config.population import PopulationConfig
from srl.population.rules import ExploitRule, explore

STATE_FORMAT = "srl-population-v1"


@dataclass
class Member:
    """One member's counters and values."""

    values: dict[str, float]
    """Its hyperparameters now."""
    env_steps: int = 0
    """Env steps it took, all along (a copy keeps them)."""
    checked_at: int = 0
    """Its ``env_steps`` at its last check."""
    window_sum: float = 0.0
    window_count: int = 0
    """Returns of the episodes it finished since its last check: sum and count."""
    last_score: float | None = None
    """Its score at its last check (None before one). A member that copied keeps the score that made it copy
    until its next window is scored: the others checked in the same round rank against the same scores, so a
    round replaces only the bottom group (were it unranked, the next worst would be the bottom in its turn)."""
    source: int | None = None
    """Whom it copied last, if anyone."""


@dataclass(frozen=True)
class Decision:
    """A check's outcome for ``target``: the member it copies (``source``, None: none) and the values it goes on
    with (``new``; its old ones when it copied nobody)."""

    target: int
    source: int | None
    seq: int
    """The decision's number, 1 for the first check of the run (of any member, copying or not): ``decision`` in
    ``population.jsonl``, and the number of a copy's files in the transfer folder."""
    run_env_steps: int
    """The run's env steps when it was decided (what ``metrics.jsonl`` counts): one x axis for every record."""
    member_env_steps: int
    """The target's own env steps then (what ``population.interval`` counts)."""
    score: float
    source_score: float | None
    old: dict[str, float]
    copied: dict[str, float]
    new: dict[str, float]

    def records(self) -> list[dict[str, Any]]:
        """Its lines of ``population.jsonl``: an exploit and an explore record, or none when nothing was copied.
        The fields are named apart from ``summary.json``'s counts: ``decision`` is a check's number (of
        ``population.decisions``), where ``population.copies`` counts the exploit records."""
        if self.source is None:
            return []
        common = {
            "target": self.target,
            "run_env_steps": self.run_env_steps,
            "member_env_steps": self.member_env_steps,
            "decision": self.seq,
        }
        exploit = {
            "event": "exploit",
            **common,
            "source": self.source,
            "score": self.score,
            "source_score": self.source_score,
            "old": self.old,
        }
        return [exploit, {"event": "explore", **common, "source": self.source, "old": self.copied, "new": self.new}]


@dataclass
class PopulationState:
    """The population's counters, scores and values; decisions made by :meth:`check`."""

    cfg: PopulationConfig
    seed: int
    members: list[Member]
    """Every member, in the order of ``PopulationConfig.names``: member ``i`` is member ``i // bases`` of policy
    ``i % bases``."""
    bases: int = 1
    """The policies with a population each (a multi-agent env's ``agents`` rules'): a member copies only members
    of its own policy."""
    decisions: int = 0
    """Checks made so far (each draws from its own generator: ``[seed, decisions]``)."""
    lineage: list[dict[str, Any]] = field(default_factory=list)
    """Every exploit and explore record, in order."""

    @classmethod
    def start(cls, cfg: PopulationConfig, seed: int, bases: int = 1) -> PopulationState:
        return cls(cfg, seed, [Member(dict(v)) for v in cfg.initial_values(seed, bases)], bases)

    # ------------------------------------------------------------------ what the actors report
    def add_steps(self, member: int, steps: int) -> None:
        self.members[member].env_steps += steps

    def add_episodes(self, member: int, returns: Sequence[float]) -> None:
        self.add_window(member, float(np.sum(returns, dtype=np.float64)), len(returns))

    def add_window(self, member: int, total: float, count: int) -> None:
        """``count`` finished episodes whose returns sum to ``total``."""
        m = self.members[member]
        m.window_sum += total
        m.window_count += count

    def evaluated(self, member: int, returns: Sequence[float]) -> None:
        """``score: eval``: the returns of its evaluation now stand for its window (what it finished in training
        since its last check does not count)."""
        m = self.members[member]
        m.window_sum, m.window_count = float(np.sum(returns, dtype=np.float64)), len(returns)

    def run_env_steps(self) -> int:
        """The run's env steps: its members' summed over the teams (each member of a team, one per policy with a
        population, counts every step of the team's envs)."""
        return sum(m.env_steps for m in self.members) // self.bases

    def copies(self) -> int:
        """Copies decided so far: the exploit records of the lineage, restarts and resumes included."""
        return sum(1 for r in self.lineage if r.get("event") == "exploit")

    # ------------------------------------------------------------------ decisions
    def due(self, member: int) -> bool:
        """Its interval has passed since its last check."""
        m = self.members[member]
        return m.env_steps - m.checked_at >= self.cfg.interval

    def ready(self, member: int) -> bool:
        """Due, with enough episodes to be scored (its training episodes, or an evaluation's)."""
        return self.due(member) and self.members[member].window_count >= self.cfg.min_episodes

    def score(self, member: int) -> float | None:
        """Its episodes since its last check when there are enough of them, else its score at that check."""
        m = self.members[member]
        if m.window_count >= self.cfg.min_episodes:
            return m.window_sum / m.window_count
        return m.last_score

    def scores(self, policy: int | None = None) -> dict[int, float]:
        """Every scored member's score; of the members of policy ``policy`` only, when given."""
        out = {i: self.score(i) for i in range(len(self.members)) if policy is None or i % self.bases == policy}
        return {i: s for i, s in out.items() if s is not None}

    def check(self, member: int, rule: ExploitRule, barred: Collection[int] = ()) -> Decision:
        """Score ``member`` (it must be :meth:`ready`), ask ``rule`` whom it copies among the members of its policy
        (ranked with all of them, but never copying one of ``barred``: a member in the middle of a copy; nobody
        within its ``warmup``), explore from that member's values, and start its next window. The caller carries
        the copy out."""
        assert self.ready(member), f"member {member} is not ready"
        rng = np.random.default_rng([self.seed, 0x5EED, self.decisions])
        self.decisions += 1
        scores = self.scores(member % self.bases)
        m = self.members[member]
        source = rule.source(member, scores, rng, barred) if m.env_steps >= self.cfg.warmup else None
        old = dict(m.values)
        copied = dict(self.members[source].values) if source is not None else old
        new = explore(copied, self.cfg.hyperparameters, rng) if source is not None else old
        decision = Decision(
            member,
            source,
            self.decisions,
            self.run_env_steps(),
            m.env_steps,
            scores[member],
            None if source is None else scores[source],
            old,
            copied,
            new,
        )
        m.checked_at, m.window_sum, m.window_count = m.env_steps, 0.0, 0
        m.last_score = scores[member]
        if source is not None:
            m.values, m.source = dict(new), source
        self.lineage.extend(decision.records())
        return decision

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "seed": self.seed,
            "bases": self.bases,
            "decisions": self.decisions,
            "members": [vars(m) for m in self.members],
            "lineage": self.lineage,
        }

    @classmethod
    def from_json(cls, cfg: PopulationConfig, data: Mapping[str, Any], source: str, bases: int = 1) -> PopulationState:
        """Read back what :meth:`to_json` wrote; one ``ValueError`` naming ``source`` if it does not fit ``cfg``
        and ``bases`` policies."""
        if not isinstance(data, Mapping) or data.get("format") != STATE_FORMAT:
            raise ValueError(f"{source}: not a population state ({STATE_FORMAT})")
        members = data.get("members")
        if data.get("bases", 1) != bases:
            raise ValueError(f"{source}: holds populations of {data.get('bases', 1)} policies, the config {bases}")
        if not isinstance(members, list) or len(members) != cfg.members * bases:
            raise ValueError(f"{source}: holds {len(members or [])} members, the config {cfg.members * bases}")
        keys = {h.key for h in cfg.hyperparameters}
        try:
            built = [Member(**m) for m in members]
        except TypeError as exc:
            raise ValueError(f"{source}: a member's record does not fit ({exc})") from None
        if any(set(m.values) != keys for m in built):
            raise ValueError(f"{source}: its hyperparameters are not the config's ({', '.join(sorted(keys))})")
        return cls(cfg, int(data["seed"]), built, bases, int(data["decisions"]), list(data.get("lineage", [])))
