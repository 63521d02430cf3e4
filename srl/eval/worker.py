"""The eval worker: plays the newest policy every few versions during training and keeps the best one.

It reads snapshots from the parameter service like a policy worker, and when
one is at least ``every`` versions past the last it evaluated, plays it
deterministically (``play`` builds its own environments; with several policies
each plays its agents), reports the returns (``eval_return_mean`` in the
metrics) and, on a new best score, writes ``checkpoints/best.pt``
atomically (through ``save_best``; one per policy): the acting networks and
the config, loadable by ``srl eval``.

The score is the mean return, or where ``play`` also plays games against a
uniform random player (``vs_random_*``: one policy in a two-player turn-based
game) their score, wins plus half the draws: self-play's returns average 0
there whatever the policy, so they cannot tell a better one. Those games'
win, draw and loss rates go into the report too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from srl.api.report import RunFacts
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
        score = float(result.get(VS_RANDOM_SCORE, mean))
        best = score > self.best
        if best:
            self.best = score
            if self.save_best is not None:
                self.save_best(version, mean)
        vs_random = {k: float(v) for k, v in result.items() if k in VS_RANDOM_KEYS}
        report = {"version": version, "return_mean": mean, "return_std": float(result["return_std"]), "best": best}
        self.reporter.report("eval", {**report, **vs_random})
        return 1


VS_RANDOM_SCORE = "vs_random_score"
VS_RANDOM_KEYS = ("vs_random_win_rate", "vs_random_draw_rate", "vs_random_loss_rate", VS_RANDOM_SCORE)
"""What an evaluation against a uniform random player reports (as ``eval_<key>`` in the metrics)."""


class EvalReports:
    """The eval worker's reports (the :class:`~srl.api.report.Aggregator` of their kind): the newest evaluation
    in the records (``eval_return_mean``, ``eval_version``, ``eval_vs_random_*``) and on the progress line, and
    in ``summary.json`` how many there were and the best (the one ``checkpoints/best.pt`` holds)."""

    def __init__(self, facts: RunFacts) -> None:
        self.evals: list[dict[str, Any]] = []

    def handle(self, worker: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.evals.append(dict(meta))

    def record(self) -> dict[str, float]:
        if not self.evals:
            return {}
        newest = self.evals[-1]
        rec = {"eval_return_mean": float(newest["return_mean"]), "eval_version": int(newest["version"])}
        rec.update({f"eval_{k}": float(v) for k, v in newest.items() if k.startswith("vs_random_")})
        return rec

    def progress(self, record: Mapping[str, Any]) -> str:
        return vs_random_text(record)

    def summary(self) -> dict[str, Any]:
        best = next((e for e in reversed(self.evals) if e.get("best")), None)  # what ``best.pt`` holds
        if best is None:
            return {"evaluations": len(self.evals)} if self.evals else {}
        return {
            "evaluations": len(self.evals),
            "best_eval_return_mean": float(best["return_mean"]),
            "best_eval_version": int(best["version"]),
            **{f"best_eval_{k}": float(v) for k, v in best.items() if k.startswith("vs_random_")},
        }

    def restarted(self, worker: str) -> None:
        pass


def vs_random_text(record: Mapping[str, Any]) -> str:
    """The progress line's part for the eval worker's games against a uniform random player (the learning signal
    of self-play, whose returns average 0): ``win 0.62 draw 0.10 loss 0.28 vs random``; empty before any."""
    if "eval_vs_random_win_rate" not in record:
        return ""
    rates = (record[f"eval_vs_random_{k}_rate"] for k in ("win", "draw", "loss"))
    return "win {:.2f} draw {:.2f} loss {:.2f} vs random  ".format(*rates)
