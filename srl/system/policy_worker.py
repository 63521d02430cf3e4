"""The policy worker: batched inference for many actors, at the newest parameter version.

Each poll takes whatever requests are pending (up to ``max_batch`` slots, from
any of its actors), gathers their observations from the segment pool in one
copy, runs one forward pass and writes actions back in place. It serves every
policy of the run: one batch, one forward pass per policy with requests. Batches grow
by themselves when actors are many and the network is slow (auto-batching);
no request waits for a batch to fill.

A policy that can act on tensors (:class:`~srl.api.worker.DevicePolicy`) runs
on the worker's device (``workers.policy_device``) through staging buffers
(:class:`StagedForward`): the observations are gathered straight into the host
buffer, copied in once, and the answers copied out once, by the same code on the
CPU (where nothing is copied) as on a GPU. Its cap on slots per batch comes from
a cost curve the worker measures as it starts (:func:`measure_curve`,
:func:`batch_cap`) instead of a constant.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import numpy as np
import torch

from srl.api.device import torch_device
from srl.api.report import RunFacts
from srl.api.worker import DevicePolicy, Policy, Reporter, Worker, is_device_policy
from srl.base.timing import Every
from srl.system.device import Staging
from srl.system.params import ParamSubscriber
from srl.system.streams import InferenceServer, SegmentPool, acting_inputs

CAP_SHARE = 0.95
""":func:`batch_cap` takes the fewest slots whose throughput is within this share of the best measured."""
MEASURE_REPEATS = 3
"""Timed passes per batch size (the fastest counts), after one untimed pass."""
MEASURE_BUDGET = 0.25
"""Seconds: the measurement stops after the first batch size whose pass takes longer (a pass that long already
amortizes its fixed cost, and a worker's start must stay short)."""


def batch_cap(curve: Mapping[int, float], share: float = CAP_SHARE) -> int:
    """The auto-batching cap from a cost curve ``{slots: seconds per forward pass}``: the fewest slots whose
    throughput (slots per second) is within ``share`` of the best measured. Past that size a larger batch serves
    no more per second, and only makes the requests that came first wait for the ones that came last."""
    if not curve:
        raise ValueError("batch_cap: an empty cost curve")
    rates = {n: n / t if t > 0 else math.inf for n, t in curve.items()}
    best = max(rates.values())
    return min(n for n, rate in rates.items() if rate >= share * best)


def cap_sizes(most: int) -> list[int]:
    """The batch sizes (slots) a cost curve is measured at: powers of two up to ``most``, and ``most``."""
    sizes = [1 << i for i in range(most.bit_length()) if 1 << i < most]
    return [*sizes, most]


def measure_curve(
    forward: Callable[[int], object],
    sizes: Sequence[int],
    repeats: int = MEASURE_REPEATS,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[int, float]:
    """Seconds per ``forward(n)`` at each size (the fastest of ``repeats`` after an untimed pass), smallest size
    first, stopping after the first one slower than :data:`MEASURE_BUDGET`. ``forward`` must wait for its
    result (a device's work is asynchronous)."""
    curve: dict[int, float] = {}
    for n in sorted(sizes):
        forward(n)
        times = []
        for _ in range(repeats):
            t0 = clock()
            forward(n)
            times.append(clock() - t0)
        curve[n] = min(times)
        if curve[n] > MEASURE_BUDGET:
            break
    return curve


class StagedForward:
    """One policy's forward passes on a device through staging buffers: up to ``slots`` requests' observations
    (what :func:`~srl.system.streams.acting_inputs` names) gathered into the input staging, the policy's answers
    (``actions`` and its declared outputs) packed into the output staging."""

    def __init__(self, policy: DevicePolicy, pool: SegmentPool, slots: int, device: torch.device) -> None:
        layout = pool.layout
        self.policy, self.per_slot = policy, layout.fields["actions"].shape[1]
        rows = slots * self.per_slot
        inputs = {name: (pool.arrays[name].shape[4:], pool.arrays[name].dtype) for name in acting_inputs(pool)}
        names = ["actions", *(f.name for f in policy.output_fields())]
        outputs = {name: (layout.fields[name].shape[2:], np.dtype(layout.fields[name].dtype)) for name in names}
        self.inputs, self.outputs = Staging(inputs, rows, device), Staging(outputs, rows, device)

    def observations(self, slots: int) -> dict[str, np.ndarray]:
        """Where ``slots`` requests' observations go: ``[slots, per_slot, ...]`` per input, in the host staging."""
        return {
            name: view.reshape(slots, self.per_slot, *view.shape[1:])
            for name, view in self.inputs.host_views(slots * self.per_slot).items()
        }

    def __call__(self, slots: int) -> dict[str, np.ndarray]:
        """Answer the ``slots`` requests now in the input staging: one copy in, the forward pass, one copy out."""
        rows = slots * self.per_slot
        answers = self.policy.act_tensors(self.inputs.to_device(rows))
        for name, out in self.outputs.device_views(rows).items():
            out.copy_(answers[name].reshape(out.shape))
        return self.outputs.to_host(rows)


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
        device: str = "cpu",
        measure_cap: bool = False,
    ) -> None:
        """``device``: where the policies that can act on one run (the rest run as they are, on the CPU).
        ``measure_cap``: replace ``max_batch`` by :func:`batch_cap` of a cost curve measured in :meth:`setup`."""
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
        self.device = torch_device(device, "workers.policy_device")
        self.measure_cap = measure_cap
        self.staged: list[StagedForward | None] = []
        self.curve: dict[int, float] = {}  # the slowest policy's cost curve, when measured

    def setup(self) -> None:
        self._reports.restart()
        if self.device.type == "cuda" and self.device.index is not None:  # ``cuda`` alone: the current device
            torch.cuda.set_device(self.device)
        self.staged = []
        for policy, pool in zip(self.policies, self.server.pools):
            if is_device_policy(policy):
                on_device = cast(DevicePolicy, policy)
                on_device.to_device(self.device)
                self.staged.append(StagedForward(on_device, pool, self.max_batch, self.device))
            else:
                self.staged.append(None)
        for params in self.params:
            params.wait_first(self.should_stop)
        if self.measure_cap:
            self._measure_cap()
        self._t_start = time.perf_counter()

    def _measure_cap(self) -> None:
        """Cap the batches at the fewest slots that serve (nearly) as many per second as any larger batch, for every
        policy that measures (one whose pass is long and input-dependent, a generation, keeps the cap it has)."""
        caps = []
        for policy, staged in zip(self.policies, self.staged):
            if staged is None or not getattr(policy, "measure_batches", True):
                continue
            curve = measure_curve(staged, cap_sizes(self.max_batch))  # on the new staging's zeros
            caps.append(batch_cap(curve))
            if caps[-1] == min(caps):
                self.curve = curve
        if caps:
            self.max_batch = min(caps)

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
            staged = self.staged[k] if self.staged else None
            if staged is None:
                obs = self.server.observations(k, requests)
                t2 = time.perf_counter()
                outputs: Mapping[str, np.ndarray] = self.policies[k].act(obs)
            else:
                self.server.gather_into(k, requests, staged.observations(len(requests)))
                t2 = time.perf_counter()
                outputs = staged(len(requests))  # the copies in and out count as the forward pass's
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
                "batch_cap": self.max_batch,
            },
        )


class PolicyReports:
    """The policy workers' reports (the :class:`~srl.api.report.Aggregator` of their kind): each one's mean batch
    (``policy0_mean_batch``: requests per forward pass), how many versions behind the newest it acts
    (``_version_lag``), and the batch cap it measured as it started (``_batch_cap``)."""

    def __init__(self, facts: RunFacts) -> None:
        self.facts = facts
        self.newest: dict[str, Mapping[str, float]] = {}

    def handle(self, worker: str, meta: Mapping[str, float], arrays: Mapping[str, np.ndarray]) -> None:
        self.newest[worker] = dict(meta)

    def record(self) -> dict[str, float]:
        rec: dict[str, float] = {}
        for worker, stats in sorted(self.newest.items()):
            rec[f"{worker}_mean_batch"] = float(stats.get("samples", 0)) / max(1, int(stats.get("batches", 0)))
            rec[f"{worker}_version_lag"] = self.facts.policy_version - int(stats.get("version", -1))
            if "batch_cap" in stats:  # slots per forward pass at most (measured as the worker started)
                rec[f"{worker}_batch_cap"] = int(stats["batch_cap"])
        return rec

    def summary(self) -> dict[str, float]:
        return {}

    def restarted(self, worker: str) -> None:
        pass
