"""The stage worker: a plugin's decision on every segment, between the actors and the trainers.

Its actors submit finished buffers to it (state STAGED) instead of to a
trainer. For each it asks the plugin (:class:`~srl.api.stage.Stage`) whether
to keep it: a kept buffer goes on to the trainer its actor feeds (inside a
node only its record moves; across nodes it is sent from here, so a dropped
segment never crosses the network), a dropped one is free again at once. Kept
and dropped segments are counted and reported with the plugin's own metrics.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from srl.api.report import Counts, RunFacts
from srl.api.stage import Stage
from srl.api.worker import Reporter, Worker
from srl.base.timing import Every
from srl.system.streams import SegmentForwarder, SegmentSource


class StageWorker(Worker):
    """Keeps or drops each segment its actors submit."""

    def __init__(
        self,
        index: int,
        stage: Stage,
        source: SegmentSource,
        forwarder: SegmentForwarder,
        reporter: Reporter,
        wait_timeout: float = 0.05,
        report_interval: float = 1.0,
        max_segments: int = 64,
    ) -> None:
        self.index = index
        self.stage, self.source, self.forwarder, self.reporter = stage, source, forwarder, reporter
        self.wait_timeout = wait_timeout
        self.max_segments = max_segments
        self._reports = Every(report_interval)
        self.kept = self.dropped = 0
        self.t_decide = 0.0
        self._t_start = time.perf_counter()

    def setup(self) -> None:
        self._reports.restart()
        self._t_start = time.perf_counter()

    def poll(self) -> int:
        idle = self.forwarder.flush()  # while kept segments wait to go out, wait for new ones only briefly
        records = self.source.receive(self.max_segments, self.wait_timeout if idle else min(self.wait_timeout, 0.001))
        t0 = time.perf_counter()
        for actor, buf in records.tolist():
            if self.stage.keep(self.source.segment(actor, buf)):
                self.forwarder.forward(actor, buf)
                self.kept += 1
            else:
                self.source.release(actor, buf)
                self.dropped += 1
        self.source.ring()
        self.t_decide += time.perf_counter() - t0
        self._report()
        return len(records)

    def teardown(self) -> None:
        try:
            self._report(force=True)
        finally:
            self.forwarder.close()

    def _report(self, force: bool = False) -> None:
        if not self._reports.due(force):
            return
        meta = {f"stage_{k}": float(v) for k, v in self.stage.metrics().items()}
        meta.update(
            stage=self.index,
            kept=self.kept,
            dropped=self.dropped,
            t_total=time.perf_counter() - self._t_start,
            t_decide=self.t_decide,
        )
        take = getattr(self.stage, "episode_returns", None)  # a stage that scores reports the returns
        arrays = None if take is None else {"episode_returns": np.asarray(take(), np.float32)}
        self.reporter.report("stage", meta, arrays)


class StageReports:
    """The stage workers' reports (the :class:`~srl.api.report.Aggregator` of their kind): segments kept and
    dropped (across each worker's restarts) and the stage plugin's own numbers, as ``stage0_kept``, ...; the
    returns a stage that writes the rewards reports go to the run's counts."""

    def __init__(self, facts: RunFacts) -> None:
        self.facts = facts
        self.counts = Counts()
        self.stats: dict[str, dict[str, Any]] = {}

    def handle(self, worker: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        returns = arrays.get("episode_returns")
        if returns is not None and len(returns):
            self.facts.add_episodes(returns)
        self.counts.set(worker, {"kept": int(meta["kept"]), "dropped": int(meta["dropped"])})
        stats = {k: v for k, v in meta.items() if k not in ("stage", "worker") and not k.startswith("t_")}
        self.stats[worker] = {
            **stats,
            "kept": int(self.counts.of(worker, "kept")),
            "dropped": int(self.counts.of(worker, "dropped")),
        }

    def record(self) -> dict[str, Any]:
        return {f"{worker}_{k}": v for worker, stats in self.stats.items() for k, v in stats.items()}

    def summary(self) -> dict[str, Any]:
        return {"stages": dict(sorted(self.stats.items()))}

    def restarted(self, worker: str) -> None:
        self.counts.restarted(worker)
