"""The exploit and explore rules of population-based training (PBT, Jaderberg et al. 2017), as pure functions.

A member is *ready* every ``population.interval`` of its env steps. Then the exploit rule is asked which member,
if any, it copies, given every scored member's score (:class:`Truncation` by default: a member in the bottom group
copies one of the top group; the groups are of every scored member, so one round replaces only the bottom group).
A copied member then explores: each hyperparameter is perturbed by a factor, or drawn afresh from its range with
probability ``resample``, and clamped to its range (:func:`explore`).

The rule is a plugin (``population.rule: package.module:Rule``): a class built from the
:class:`~srl.api.config.population.PopulationConfig` whose ``source(member, scores, rng, barred)`` returns the
member to copy or None. The league's PFSP/Elo manager is a sibling of this one.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

import numpy as np

from srl.api.config.population import Hyperparameter, PopulationConfig


class ExploitRule(Protocol):
    """Which member a ready member copies."""

    def source(
        self, member: int, scores: Mapping[int, float], rng: np.random.Generator, barred: Collection[int] = ()
    ) -> int | None:
        """The member ``member`` copies, or None (it keeps its own weights). ``scores``: every scored member's
        score (higher is better), ``member`` included when it is scored: the whole ranking, whatever is under
        way. ``barred``: members it may not copy now, being in the middle of a copy (a target whose weights are
        about to be replaced, or a source still writing its state)."""


def group_size(members: int, quantile: float) -> int:
    """Members in each of the bottom and top groups: ``quantile`` of them rounded up, but at most half (so the two
    groups never share a member): 4 members at 0.25 give 1, 5 at 0.3 give 2, 3 at 0.5 give 1."""
    return min(math.ceil(quantile * members - 1e-9), members // 2)


def ranked(scores: Mapping[int, float]) -> list[int]:
    """The scored members from the worst to the best (ties: the lower index first)."""
    return sorted(scores, key=lambda m: (scores[m], m))


class Truncation:
    """Truncation selection: a ready member in the bottom ``quantile`` copies a member drawn uniformly from the top
    ``quantile``, among those whose score is above its own by at least ``min_gap`` (and above it at all) and not
    ``barred``. The groups are of the whole ranking, so the members of one round (ready at the same env steps, as
    members sharing a slot are) replace only the bottom group: 4 members at 0.25 replace one."""

    def __init__(self, cfg: PopulationConfig) -> None:
        self.quantile, self.min_gap = cfg.quantile, cfg.min_gap

    def source(
        self, member: int, scores: Mapping[int, float], rng: np.random.Generator, barred: Collection[int] = ()
    ) -> int | None:
        if member not in scores:
            return None
        order = ranked(scores)
        k = group_size(len(order), self.quantile)
        if member not in order[:k]:
            return None
        mine = scores[member]
        top = order[len(order) - k :]
        candidates = [m for m in top if m not in barred and scores[m] > mine and scores[m] - mine >= self.min_gap]
        if not candidates:
            return None
        return candidates[int(rng.integers(len(candidates)))]


RULES = {"truncation": "srl.population.rules:Truncation"}
"""Built-in names for ``population.rule``."""


def explore(
    values: Mapping[str, float], hyperparameters: Sequence[Hyperparameter], rng: np.random.Generator
) -> dict[str, float]:
    """New values for a member that just copied ``values``: per hyperparameter (in their order), with probability
    ``resample`` a fresh draw from its range, else the value times one of its ``perturb`` factors (drawn
    uniformly); clamped to [min, max] either way."""
    out: dict[str, float] = {}
    for h in hyperparameters:
        if rng.random() < h.resample:
            out[h.key] = h.draw(rng)
        else:
            out[h.key] = h.clamp(values[h.key] * h.perturb[int(rng.integers(len(h.perturb)))])
    return out
