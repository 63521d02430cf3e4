"""The reanalyze worker: searches steps stored in a replay again with the newest network, and sends the refreshed
search targets back to the replay, by step key (MuZero's Reanalyse; Schrittwieser et al., 2021).

It attaches to its replay's store and only reads it (the replay worker is the store's one writer): it draws
stored steps uniformly, reads their observations, and runs the acting policy on them as an evaluation does
(no exploration noise), kept at the newest snapshot. What the policy says of each step that it also stored (a
search's policy; AlphaZero's ``searched``) goes to the replay's refresh mailbox with the steps' keys; the replay
writes it to the steps whose chunk still holds them (:meth:`srl.replay.store.ReplayStore.write_steps`). A step
whose chunk was overwritten while it was read is not sent.

Pacing (``reanalyze.share``): the workers of a replay together re-search ``share`` steps per step the trainers
trained on (an item of ``replay.item_length`` steps counts its steps), each its part, counted from its own
start: ahead of it a worker waits; too few workers fall behind it (their rate is in the records).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from srl.api.report import RunFacts
from srl.api.worker import Policy, Reporter, Worker
from srl.base.timing import Every
from srl.replay.store import ReplayStore
from srl.replay.worker import refresh_message
from srl.system.params import ParamSubscriber
from srl.system.remote_records import Mailbox


class ReanalyzeWorker(Worker):
    """Re-searches stored steps of one replay (see the module's docstring)."""

    def __init__(
        self,
        store: ReplayStore,
        policy: Policy,
        params: ParamSubscriber,
        refresh: Mailbox,
        reporter: Reporter,
        share: float,
        batch: int,
        part: float,
        seed: int = 0,
        wait: float = 0.05,
        report_interval: float = 1.0,
    ) -> None:
        """``part``: this worker's part of its replay's reanalysis (1 / the replay's reanalyze workers)."""
        self.store, self.policy, self.params, self.refresh, self.reporter = store, policy, params, refresh, reporter
        self.share, self.batch, self.part, self.wait = share, batch, part, wait
        self.rng = np.random.default_rng(seed)
        spec = store.spec
        self.obs = {p: np.zeros((batch, *spec.fields[p].shape[2:]), spec.fields[p].dtype) for p in spec.obs_fields}
        self.fields = {name: np.dtype(spec.fields[name].dtype) for name in spec.carried}
        self._reports = Every(report_interval)
        self._start = 0
        self.searched = 0
        self._told = (0, 0.0)
        self.busy = 0.0

    def setup(self) -> None:
        self._start = self.store.limiter.samples
        self._reports.restart()

    def owed(self) -> float:
        """Steps this worker should have re-searched by now, less those it has."""
        trained = (self.store.limiter.samples - self._start) * self.store.spec.item_length
        return self.share * trained * self.part - self.searched

    def poll(self) -> int:
        self.params.refresh()
        if self.params.current < 0 or self.owed() < self.batch:
            self._report()
            time.sleep(self.wait)  # 0 under the inline runtime, where every worker shares one thread
            return 0
        t0 = time.perf_counter()
        keys = self.store.draw_steps(self.batch, self.rng)
        if not len(keys):
            time.sleep(self.wait)
            return 0
        live = self.store.read_steps(keys, self.obs)
        out = self.policy.act(self.obs, deterministic=True)
        fields = {name: np.asarray(out[name])[live].astype(dtype) for name, dtype in self.fields.items() if name in out}
        if fields and live.any():
            self.refresh.send(*refresh_message(keys[live], fields))
        self.searched += len(keys)
        self.busy += time.perf_counter() - t0
        self._report()
        return 1

    def teardown(self) -> None:
        self._report(force=True)

    def _report(self, force: bool = False) -> None:
        if not self._reports.due(force):
            return
        steps, busy = self.searched - self._told[0], self.busy - self._told[1]
        self._told = (self.searched, self.busy)
        self.reporter.report("reanalyze", {"steps": steps, "busy": busy, "version": self.params.current})


class ReanalyzeReports:
    """The run's side of the role: steps re-searched, in all and per second each worker spent searching, in the
    records, on the progress line and in ``summary.json`` (``reanalyze``)."""

    def __init__(self, facts: RunFacts) -> None:
        self.steps = 0
        self.busy = 0.0
        self.t0 = time.monotonic()

    def handle(self, worker: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.steps += int(meta["steps"])
        self.busy += float(meta["busy"])

    def _rates(self) -> dict[str, float]:
        wall = max(time.monotonic() - self.t0, 1e-9)
        return {
            "reanalyzed_steps": float(self.steps),
            "reanalyzed_steps_per_second": self.steps / wall,
            "reanalyze_steps_per_busy_second": self.steps / max(self.busy, 1e-9),
        }

    def record(self) -> dict[str, float]:
        return self._rates() if self.steps else {}

    def progress(self, record: Mapping[str, Any]) -> str:
        return f"reanalyzed {record['reanalyzed_steps']:,.0f}  " if "reanalyzed_steps" in record else ""

    def summary(self) -> dict[str, Any]:
        return {"reanalyze": self._rates()} if self.steps else {}

    def restarted(self, worker: str) -> None:
        pass  # a restarted worker counts from its own start; what it searched before stays counted
