"""A trainer that discards every segment: for measuring the sampling path alone (``srl bench sampling``)."""

from __future__ import annotations

import numpy as np

from srl.api.worker import Reporter, Worker
from srl.base.timing import Every
from srl.system.params import ParamPublisher
from srl.system.streams import SegmentSource


class NullTrainerWorker(Worker):
    """Publishes one snapshot, then releases each segment as soon as it arrives and counts it."""

    def __init__(
        self,
        index: int,
        snapshot: np.ndarray,
        source: SegmentSource,
        publisher: ParamPublisher,
        reporter: Reporter,
        wait_timeout: float = 0.05,
        report_interval: float = 0.5,
    ) -> None:
        self.index = index
        self.snapshot, self.source, self.publisher, self.reporter = snapshot, source, publisher, reporter
        self.wait_timeout = wait_timeout
        self._reports = Every(report_interval)
        self.segments = 0

    def setup(self) -> None:
        if self.index == 0:  # one publisher per run, as with real trainers
            self.publisher.publish(0, self.snapshot)
        self._reports.restart()

    def poll(self) -> int:
        records = self.source.receive(64, self.wait_timeout)
        for actor, buf in records.tolist():
            self.source.release(actor, buf)
        self.source.ring()
        self.segments += len(records)
        if self._reports.due():
            self.reporter.report("trainer", {"trainer": self.index, "version": 0, "segments": self.segments})
        return len(records)
