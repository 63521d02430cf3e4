"""A role of one's own: a worker that measures policy churn as the trainer publishes new policies.

Policy churn (Schaul et al., 2022, "The Phenomenon of Policy Churn") is how many states change their greedy
action from one version of a policy to the next. This worker keeps a fixed probe of observations (drawn once
from the observation space), and for each new snapshot of policy 0 reports the share of probe states whose
deterministic action changed since the snapshot it saw before. It is off the sample path: it reads snapshots as
a policy worker does. A config adds it with one line::

    workers:
      roles: [examples.policy_churn:CHURN]

and the run has a worker ``churn0`` under every runtime: placed, started, restarted when it dies, its reports in
the progress line, ``metrics.jsonl`` (``churn``, ``churn_version``) and ``summary.json`` (``churn``). Three
pieces make the role: the worker, the aggregator of its reports, and the declaration.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space

from srl.api.report import RunFacts
from srl.api.spaces import flatten_obs, obs_parts
from srl.api.worker import Policy, Reporter, Worker
from srl.runtime.build import BuildContext
from srl.runtime.topology import TRAINER_NODE, Report, Role, snapshot_endpoint
from srl.system.params import ParamSubscriber

PROBES = 256
"""Observations in the probe."""


class PolicyChurn(Worker):
    """For each new snapshot: the share of probe states whose greedy action changed since the one before."""

    def __init__(
        self, name: str, policy: Policy, params: ParamSubscriber, probe: Mapping[str, np.ndarray], reporter: Reporter
    ) -> None:
        self.name, self.policy, self.params, self.probe, self.reporter = name, policy, params, probe, reporter
        self.before: np.ndarray | None = None
        self.wait = 0.0

    def poll(self) -> int:
        if not self.params.refresh():
            time.sleep(self.wait)  # 0 under the inline runtime, where every worker shares one thread
            return 0
        actions = np.asarray(self.policy.act(self.probe, deterministic=True)["actions"], np.float64)
        if self.before is not None:  # a changed action: any of its components moved
            moved = np.abs(actions - self.before).reshape(len(actions), -1).max(axis=1) > 1e-3
            self.reporter.report("churn", {"version": self.params.current, "churn": float(moved.mean())})
        self.before = actions
        return 1


class ChurnReports:
    """The run's side of the role (an ``srl.api.report.Aggregator``): the newest churn in the records and on the
    progress line, and in the summary how many versions were measured and their mean churn."""

    def __init__(self, facts: RunFacts) -> None:
        self.churn: list[float] = []
        self.version = -1

    def handle(self, worker: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.churn.append(float(meta["churn"]))
        self.version = int(meta["version"])

    def record(self) -> dict[str, float]:
        return {"churn": self.churn[-1], "churn_version": self.version} if self.churn else {}

    def progress(self, record: Mapping[str, Any]) -> str:
        return f"churn {record['churn']:.2f}  " if "churn" in record else ""

    def summary(self) -> dict[str, Any]:
        if not self.churn:
            return {}
        return {"churn": {"versions": len(self.churn), "mean": float(np.mean(self.churn)), "last": self.churn[-1]}}

    def restarted(self, worker: str) -> None:
        pass  # a restarted worker measures again from the next snapshot after the one it starts with


def build(ctx: BuildContext) -> Worker:
    """The worker, from its record in the run's topology (``ctx.worker``): policy 0's acting policy kept at its
    newest snapshot, and a probe drawn from its observation space with the run's seed."""
    learning = ctx.plan.policies[0]
    space = batch_space(learning.obs_space, PROBES)
    space.seed(ctx.plan.cfg.seed)
    policy = learning.acting_policy()
    worker = PolicyChurn(
        ctx.worker.name,
        policy,
        ParamSubscriber(ctx.snapshots(), policy),
        flatten_obs(obs_parts(learning.obs_space), space.sample()),
        ctx.reporter,
    )
    worker.wait = ctx.wait_timeout
    return worker


CHURN = Role(
    "churn",
    count=lambda plan: 1,
    builder="examples.policy_churn:build",
    seed_salt=101,
    connects=lambda plan, index: (snapshot_endpoint(plan, TRAINER_NODE, index),),
    report=Report("churn", "examples.policy_churn:ChurnReports"),
)
"""One worker, beside the lead trainer (under Ray), reading policy 0's snapshots; restarted alone if it dies."""
