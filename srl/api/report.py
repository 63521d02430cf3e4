"""What a role's reports become: the aggregator its declaration names, and the run facts it feeds.

A worker sends reports of its role's kind (``reporter.report(kind, meta, arrays)``; the runtime stamps each with
the worker's name, as the plan names it, in ``meta["worker"]``). The controller keeps one aggregator per report
kind, made from the class the role's declaration names, and hands it every report of that kind. The aggregator
folds them into what the run records: its share of each metrics record (``metrics.jsonl`` and TensorBoard), of
the progress line and of ``summary.json``. What the whole run stops on and counts (env steps, episode returns,
policy versions, warnings) it hands on to :class:`RunFacts`.

So a new kind of worker brings its own report and its own place in the run's records, and the controller is a
clock and a table of these, keyed by report kind: it knows no role by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from srl.api.config import ExperimentConfig


class RunFacts(Protocol):
    """The run-level facts that reports feed (the controller keeps them; its stop conditions read them)."""

    cfg: ExperimentConfig

    def add_env_steps(self, worker: str, steps: int) -> None:
        """``worker`` has taken ``steps`` env steps since it started (this start: a restart counts from 0 again and
        the earlier starts' steps are kept)."""

    def add_episodes(self, returns: np.ndarray, owners: np.ndarray | None = None) -> None:
        """Episodes that ended, their returns (untransformed) and, in a run of several policies, whose agents they
        were (indices into the run's policies; None: the first policy's)."""

    def set_version(self, policy: int, version: int) -> None:
        """Policy ``policy``'s lead trainer published ``version``."""

    def warn(self, message: str) -> None:
        """A warning: printed on its own line and kept in ``summary.json``; the run goes on."""

    @property
    def policy_version(self) -> int:
        """The version every policy has reached (read by aggregators that say how far behind a worker is)."""

    def solve_by_best_policy(self) -> None:
        """The run's policies are alternatives (population members): the target is met when the best one's window
        of episodes meets it, not the mean of every episode."""


class Aggregator(Protocol):
    """Folds one report kind into the run's records. Made once per run as ``cls(facts)``."""

    def handle(self, worker: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Take one report of ``worker``."""

    def record(self) -> Mapping[str, Any]:
        """Its entries of the current metrics record (numbers go to TensorBoard too)."""

    def summary(self) -> Mapping[str, Any]:
        """Its entries of ``summary.json``."""

    def restarted(self, worker: str) -> None:
        """``worker`` is starting again: the counters of its next reports start from 0."""

    # optional: ``progress(self, record) -> str``, its part of the progress line (empty: nothing to show)
    # optional: ``final(self, final_eval) -> Mapping``, its part of the summary from the run's final evaluation


class Counts:
    """Counters each worker reports as totals since its start, kept across its restarts: a restarted worker counts
    from 0 again, and what its earlier starts counted stays in the run's totals."""

    def __init__(self) -> None:
        self._now: dict[str, dict[str, float]] = {}
        self._before: dict[str, dict[str, float]] = {}

    def set(self, worker: str, counts: Mapping[str, float]) -> None:
        """``worker``'s totals since its start, as its newest report has them."""
        self._now[worker] = dict(counts)

    def restarted(self, worker: str) -> None:
        """``worker`` starts again: its totals so far are kept."""
        kept = self._before.setdefault(worker, {})
        for key, value in self._now.pop(worker, {}).items():
            kept[key] = kept.get(key, 0) + value

    def of(self, worker: str, key: str) -> float:
        """``worker``'s total of ``key``, over all its starts."""
        return self._before.get(worker, {}).get(key, 0) + self._now.get(worker, {}).get(key, 0)

    def total(self, key: str) -> float:
        """Every worker's total of ``key``."""
        return sum(self.of(worker, key) for worker in {*self._now, *self._before})

    @property
    def workers(self) -> list[str]:
        """The workers that reported, by name."""
        return sorted({*self._now, *self._before})
