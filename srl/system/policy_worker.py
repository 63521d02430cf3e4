"""The policy worker: batched inference for many actors, at the newest parameter version.

Each poll takes whatever requests are pending (up to ``max_batch`` slots, from
any of its actors), gathers their observations from the segment pool in one
copy, runs one forward pass and writes actions back in place. Batches grow
by themselves when actors are many and the network is slow (auto-batching);
no request waits for a batch to fill.
"""

from __future__ import annotations

import time

from srl.api.worker import Policy, Reporter, Worker
from srl.base.timing import Every
from srl.system.params import ParamSubscriber
from srl.system.streams import InferenceServer


class PolicyWorker(Worker):
    """Serves inference requests for its actors."""

    def __init__(
        self,
        index: int,
        policy: Policy,
        server: InferenceServer,
        params: ParamSubscriber,
        reporter: Reporter,
        max_batch: int,
        pull_interval: int = 1,
        wait_timeout: float = 0.05,
        report_interval: float = 1.0,
    ) -> None:
        self.name = f"policy{index}"
        self.index = index
        self.policy, self.server, self.params, self.reporter = policy, server, params, reporter
        self.max_batch = max_batch
        self.pull_interval = pull_interval
        self.wait_timeout = wait_timeout
        self._reports = Every(report_interval)
        self.requests = 0
        self.batches = 0
        self.samples = 0
        self.t_wait = self.t_forward = self.t_io = 0.0  # seconds waiting for requests, in the network, moving data
        self._t_start = time.perf_counter()

    def setup(self) -> None:
        self._reports.restart()
        self.params.wait_first(self.should_stop)
        self._t_start = time.perf_counter()

    def poll(self) -> int:
        t0 = time.perf_counter()
        requests = self.server.gather(self.max_batch, self.wait_timeout)
        t1 = time.perf_counter()
        self.t_wait += t1 - t0
        if len(requests) == 0:
            self._report()
            return 0
        if self.params.current < 0 or self.batches % self.pull_interval == 0:
            self.params.refresh()
        obs = self.server.observations(requests)
        t2 = time.perf_counter()
        outputs = self.policy.act(obs)
        t3 = time.perf_counter()
        self.server.answer(requests, outputs, self.params.current)
        self.t_forward += t3 - t2
        self.t_io += (t2 - t1) + (time.perf_counter() - t3)
        self.requests += len(requests)
        self.batches += 1
        self.samples += len(outputs["actions"])
        self._report()
        return len(requests)

    def teardown(self) -> None:
        self._report(force=True)

    def _report(self, force: bool = False) -> None:
        if not self._reports.due(force):
            return
        self.reporter.report(
            "policy",
            {
                "policy": self.index,
                "requests": self.requests,
                "batches": self.batches,
                "samples": self.samples,
                "superseded": self.server.superseded,
                "version": self.params.current,
                "t_total": time.perf_counter() - self._t_start,
                "t_wait": self.t_wait,
                "t_forward": self.t_forward,
                "t_io": self.t_io,
            },
        )
