"""The eval worker: plays the newest policy every few versions during training and keeps the best one.

It reads snapshots from the parameter service like a policy worker, and when
one is at least ``every`` versions past the last it evaluated, plays it
deterministically (``play`` builds its own environments; with several policies
each plays its agents), reports the returns (``eval_return_mean`` in the
metrics) and, on a new best mean return, writes ``checkpoints/best.pt``
atomically (through ``save_best``; one per policy): the acting networks and
the config, loadable by ``srl eval``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from srl.api.worker import Policy, Reporter, Worker
from srl.system.params import Subscribers


class EvalWorker(Worker):
    """Evaluates every ``every`` versions."""

    def __init__(
        self,
        policies: Sequence[Policy],
        params: Subscribers,
        play: Callable[[Sequence[Policy]], dict[str, Any]],
        every: int,
        reporter: Reporter,
        save_best: Callable[[int, float], None] | None = None,
        wait_timeout: float = 0.05,
    ) -> None:
        self.name = "eval0"
        self.policies, self.params, self.play, self.every = policies, params, play, every
        self.reporter, self.save_best, self.wait_timeout = reporter, save_best, wait_timeout
        self.best = float("-inf")
        self.evaluated = -1

    def setup(self) -> None:
        self.params.wait_first(self.should_stop)

    def poll(self) -> int:
        self.params.refresh()
        version = self.params.current
        if version < 0 or (self.evaluated >= 0 and version < self.evaluated + self.every):
            time.sleep(self.wait_timeout)
            return 0
        result = self.play(self.policies)
        self.evaluated = version
        mean = float(result["return_mean"])
        best = mean > self.best
        if best:
            self.best = mean
            if self.save_best is not None:
                self.save_best(version, mean)
        self.reporter.report(
            "eval", {"version": version, "return_mean": mean, "return_std": float(result["return_std"]), "best": best}
        )
        return 1
