"""The ``population`` section: population-based training inside one run.

``members`` policies train the same env side by side, each on its own share of every actor slot's environments,
with its own trainers, parameter stream and checkpoints (``checkpoints/member<i>/``). In a multi-agent env every
policy of the ``agents`` rules has its own population: member ``k`` of each plays the ``k``-th share of the
environments (the members of one index are a team: they train together and are evaluated together), named
``<policy>-member<k>``, and a member copies only members of its own policy. Each starts from its own values of the
listed hyperparameters (fields of the algorithm's typed section: ``ppo.lr``, ``sac.tau``, ...). Every
``interval`` env steps of a member, the population worker scores it on the episodes it finished since then: a
member in the bottom ``quantile`` copies a member of the top ``quantile`` (weights, optimizer state, normalizers),
while both keep running, then mutates the copied values (explore). ``srl/population/rules.py`` has the math.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from srl.api.config.errors import check
from srl.api.config.policies import DEFAULT_POLICY

MEMBER = "member{}"
"""Member ``k``'s name (its checkpoint folder, its metrics' prefix); ``<policy>-member<k>`` in a population of
each of several policies."""


@dataclass(frozen=True, kw_only=True)
class Hyperparameter:
    """One hyperparameter the population searches: its range, its members' first values and how it mutates."""

    key: str
    """``<section>.<field>`` of the algorithm's typed section (``ppo.lr``, ``ppo.clip``, ``sac.lr``); a number."""
    min: float
    """Smallest value: draws and mutations stay at or above it (clamped)."""
    max: float
    """Largest value: draws and mutations stay at or below it (clamped)."""
    log: bool = False
    """Draw initial and resampled values log-uniformly in [min, max] (for rates and coefficients over decades)."""
    initial: tuple[float, ...] = ()
    """Each member's first value, member by member (exactly ``members`` of them, within [min, max]); empty: drawn
    from the range with the run's seed."""
    perturb: tuple[float, ...] = (0.8, 1.25)
    """An explore multiplies the copied value by one of these factors (drawn uniformly), then clamps it."""
    resample: float = 0.25
    """Probability that an explore draws a fresh value from the range instead of perturbing."""

    @property
    def section(self) -> str:
        return self.key.partition(".")[0]

    @property
    def field(self) -> str:
        return self.key.partition(".")[2]

    def draw(self, rng: np.random.Generator) -> float:
        """A value drawn from [min, max]: uniformly, or log-uniformly with ``log``."""
        if self.log:
            return float(math.exp(rng.uniform(math.log(self.min), math.log(self.max))))
        return float(rng.uniform(self.min, self.max))

    def clamp(self, value: float) -> float:
        return float(min(self.max, max(self.min, value)))

    def __post_init__(self) -> None:
        section, dot, name = self.key.partition(".")
        check(bool(dot and section and name and "." not in name), "key", f"{self.key!r} is not <section>.<field>")
        check(self.min <= self.max, "min", f"{self.min:g} is above max {self.max:g}")
        check(not self.log or self.min > 0, "log", f"a log-uniform range needs min > 0, got {self.min:g}")
        check(bool(self.perturb), "perturb", "needs at least one factor")
        check(all(f > 0 for f in self.perturb), "perturb", f"factors must be > 0, got {list(self.perturb)}")
        check(0.0 <= self.resample <= 1.0, "resample", f"must be in [0, 1], got {self.resample:g}")
        outside = [v for v in self.initial if not self.min <= v <= self.max]
        check(not outside, "initial", f"{outside[0]:g} is outside [{self.min:g}, {self.max:g}]" if outside else "")


@dataclass(frozen=True, kw_only=True)
class PopulationConfig:
    """Population-based training: ``members`` policies of one env, exploited and explored live."""

    members: int = 0
    """Members of the population; 0: no population (the run's one policy). At least 2 otherwise."""
    interval: int = 50_000
    """Env steps of a member between its readiness checks: at each, it is scored and, in the bottom quantile, it
    copies a top member. Must cover at least one of its updates."""
    warmup: int = 0
    """Env steps of a member before it may copy another: until then its checks only score it (each member's
    first values get that long to show what they learn before the fastest starters take the population over)."""
    quantile: float = 0.25
    """Share of the population in the bottom (copies) and top (copied) groups, rounded up, and never more than
    half the members: 4 members at 0.25 replace one."""
    min_gap: float = 0.0
    """A copy happens only if the source's score is at least this much above the target's."""
    min_episodes: int = 5
    """Episodes a member must have finished since its last check to be scored (``score: train``)."""
    score: Literal["train", "eval"] = "train"
    """What scores a member: ``train``, the mean undiscounted return of the training episodes it finished since
    its last check (as the actors report them, before any reward transform); ``eval``, the mean return of
    ``eval_episodes`` deterministic episodes its newest policy plays in the population worker at each check."""
    eval_episodes: int = 10
    """Episodes of each evaluation with ``score: eval`` (played at once, one env each)."""
    rule: str = "truncation"
    """The exploit rule: ``truncation`` (bottom copies top, as above) or ``package.module:Rule``, a class built
    from this config with ``source(member, scores, rng, barred)`` (see ``srl/population/rules.py``)."""
    hyperparameters: tuple[Hyperparameter, ...] = ()
    """What each member may change. Empty: members differ only by seed, and exploits copy without mutating."""

    @property
    def enabled(self) -> bool:
        return self.members > 0

    def names(self, bases: Sequence[str] = (DEFAULT_POLICY,)) -> tuple[str, ...]:
        """The members' policy names for the run's policies ``bases`` (the ``agents`` rules' policies), member
        by member: ``member<k>`` for one policy, else member ``k`` of each policy in turn (``red-member0``,
        ``blue-member0``, ``red-member1``, ...), the order of a slot's groups. Member ``i`` of that list is member
        ``i // len(bases)`` of policy ``bases[i % len(bases)]``."""
        if len(bases) == 1:
            return tuple(MEMBER.format(k) for k in range(self.members))
        return tuple(f"{b}-{MEMBER.format(k)}" for k in range(self.members) for b in bases)

    def initial_values(self, seed: int, bases: int = 1) -> tuple[dict[str, float], ...]:
        """The first values of each of the ``members * bases`` members (in the order of :meth:`names`): listed
        (member ``k`` of every policy takes the ``k``-th), or drawn from the ranges by a generator of ``seed``
        (hyperparameter by hyperparameter, member by member), so every process of a run computes the same."""
        rng = np.random.default_rng([seed, 0x9B7])
        values: list[dict[str, float]] = [{} for _ in range(self.members * bases)]
        for h in self.hyperparameters:
            for i in range(self.members * bases):
                values[i][h.key] = float(h.initial[i // bases]) if h.initial else h.draw(rng)
        return tuple(values)

    def __post_init__(self) -> None:
        check(self.members == 0 or self.members >= 2, "members", f"a population needs at least 2, got {self.members}")
        check(self.interval >= 1, "interval", f"must be >= 1, got {self.interval}")
        check(self.warmup >= 0, "warmup", f"must be >= 0, got {self.warmup}")
        check(0.0 < self.quantile <= 0.5, "quantile", f"must be in (0, 0.5], got {self.quantile:g}")
        check(self.min_gap >= 0, "min_gap", f"must be >= 0, got {self.min_gap:g}")
        check(self.min_episodes >= 1, "min_episodes", f"must be >= 1, got {self.min_episodes}")
        check(self.eval_episodes >= 1, "eval_episodes", f"must be >= 1, got {self.eval_episodes}")
        check(
            self.score != "eval" or self.eval_episodes >= self.min_episodes,
            "eval_episodes",
            f"{self.eval_episodes} episodes score no member: min_episodes is {self.min_episodes}",
        )
        keys = [h.key for h in self.hyperparameters]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        check(not twice, "hyperparameters", f"{', '.join(twice)} listed twice")
        for i, h in enumerate(self.hyperparameters):
            check(
                not h.initial or len(h.initial) == self.members,
                f"hyperparameters[{i}].initial",
                f"{len(h.initial)} values for {self.members} members",
            )
