"""The policy worker: batched inference for many actors, at the newest parameter version.

Each poll takes whatever requests are pending (up to ``max_batch`` slots, from
any of its actors), gathers their observations from the segment pool in one
copy, runs one forward pass and writes actions back in place. It serves every
policy of the run: one batch, one forward pass per policy with requests. Batches grow
by themselves when actors are many and the network is slow (auto-batching);
no request waits for a batch to fill.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from srl.api.worker import Policy, Reporter, Worker
from srl.base.timing import Every
from srl.system.params import ParamSubscriber
from srl.system.streams import InferenceServer


class PolicyWorker(Worker):
    """Serves inference requests for its actors."""

    def __init__(
        self,
        index: int,
        policies: Sequence[Policy],
        server: InferenceServer,
        params: Sequence[ParamSubscriber],
        reporter: Reporter,
        max_batch: int,
        pull_interval: int = 1,
        wait_timeout: float = 0.05,
        report_interval: float = 1.0,
    ) -> None:
        self.name = f"policy{index}"
        self.index = index
        self.policies, self.server, self.params, self.reporter = policies, server, params, reporter
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
        for params in self.params:
            params.wait_first(self.should_stop)
        self._t_start = time.perf_counter()

    def poll(self) -> int:
        t0 = time.perf_counter()
        batches = self.server.gather(self.max_batch, self.wait_timeout)
        t1 = time.perf_counter()
        self.t_wait += t1 - t0
        if not batches:
            self._report()
            return 0
        served = 0
        pull = self.batches % self.pull_interval == 0
        for k, requests in batches:
            params = self.params[k]
            if params.current < 0 or pull:
                params.refresh()
            t1 = time.perf_counter()
            obs = self.server.observations(k, requests)
            t2 = time.perf_counter()
            outputs = self.policies[k].act(obs)
            t3 = time.perf_counter()
            self.server.answer(k, requests, outputs, params.current)
            self.t_forward += t3 - t2
            self.t_io += (t2 - t1) + (time.perf_counter() - t3)
            served += len(requests)
            self.samples += len(outputs["actions"])
        self.requests += served
        self.batches += 1
        self._report()
        return served

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
                "version": min(p.current for p in self.params),
                "t_total": time.perf_counter() - self._t_start,
                "t_wait": self.t_wait,
                "t_forward": self.t_forward,
                "t_io": self.t_io,
            },
        )
