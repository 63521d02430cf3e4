"""Exploration per environment column, in the actor: what an algorithm may declare beside its acting policy.

Why in the actor and not in the policy: a policy worker answers one batch made of many actors' slots and
cannot tell whose a row is, while exploration schedules are per environment (Ape-X gives env ``i`` of all
``N`` envs of the run its own rate). So the acting policy stays what evaluation and ``srl.load_policy`` run
(greedy, for a Q-learner), and the actor, which knows its columns, replaces some of its answers.

An algorithm class (what ``algorithm:`` names) may define, as a static or class method::

    explorer(ctx, first, count, total, actors) -> Explorer | None

``ctx`` is the :class:`~srl.api.algorithm.AlgorithmContext`; the actor's columns are the run-global columns
``[first, first + count)`` of ``total`` (every column of every actor: one per env and agent), and the run has
``actors`` actors. Without that method, or when it answers None, actors act as their policy answers. The actor
calls :func:`make_explorer` once, then :meth:`Explorer.explore` on each slot's actions before it steps the
slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from srl.api.algorithm import AlgorithmContext

__all__ = ["Explorer", "make_explorer"]


class Explorer(Protocol):
    """One actor's exploration over its own columns."""

    def explore(
        self,
        actions: np.ndarray,
        obs: Mapping[str, np.ndarray],
        columns: slice,
        env_steps: int,
        rng: np.random.Generator,
    ) -> None:
        """Replace some of ``actions`` in place by random legal actions.

        ``actions`` ``[rows, ...]`` and the observation parts ``obs`` (``[rows, ...]`` each, an action mask part
        among them where the env has one) are one slot's: row ``r`` is the actor's local column
        ``columns.start + r``. ``env_steps`` are the env steps this actor has taken so far (what a schedule
        runs on); ``rng`` is the actor's own generator, so a seeded run explores alike every time.
        """

    def stats(self) -> Mapping[str, float]:
        """Scalars an actor reports with its metrics (e.g. ``epsilon``: the mean rate over its columns now)."""


def make_explorer(
    algorithm: Any, ctx: AlgorithmContext, first: int, count: int, total: int, actors: int
) -> Explorer | None:
    """The explorer algorithm class ``algorithm`` declares for the actor that owns the run-global columns
    ``[first, first + count)`` of ``total``, or None when it declares none."""
    if not (0 <= first and count >= 1 and first + count <= total and actors >= 1):
        raise ValueError(
            f"explorer: columns [{first}, {first + count}) must lie in [0, {total}), with actors={actors} >= 1"
        )
    factory = getattr(algorithm, "explorer", None)
    return None if factory is None else factory(ctx, first, count, total, actors)
