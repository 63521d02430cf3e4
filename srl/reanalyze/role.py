"""The reanalyze role: ``reanalyze.workers`` workers dealt to the replays in turn, each beside its replay (its node
group under Ray, where it attaches to the replay's store), reading the snapshots of the replay's policy and sending
refreshed targets to the replay's refresh mailbox (:data:`srl.replay.role.REFRESH`)."""

from __future__ import annotations

from srl.api.config import ConfigError
from srl.api.worker import Worker
from srl.reanalyze.worker import ReanalyzeWorker
from srl.replay.role import REFRESH, REPLAY, SEGMENTS, replay_spec, replays_per_policy
from srl.runtime.build import BuildContext
from srl.runtime.plan import Plan
from srl.runtime.topology import Endpoint, Layout, Report, Role, snapshot_endpoint
from srl.system.params import ParamSubscriber


def _replays(plan: Layout) -> int:
    return replays_per_policy(plan) * plan.policy_count


def replay_of(plan: Layout, worker: int) -> int:
    """The replay reanalyze worker ``worker`` serves: the replays in turn."""
    return worker % _replays(plan)


def _group(plan: Layout, worker: int) -> int:
    return REPLAY.group(plan, replay_of(plan, worker))


def build(ctx: BuildContext) -> Worker:
    """Worker ``i``: its replay's store (attached, read only), the acting policy of the replay's policy kept at its
    newest snapshot, the replay's refresh mailbox."""
    plan, fabric, i = ctx.plan, ctx.fabric, ctx.worker.index
    r = replay_of(plan, i)
    k = r // replays_per_policy(plan)
    cfg = plan.cfg.reanalyze
    mine = sum(1 for j in range(cfg.workers) if replay_of(plan, j) == r)
    policy = plan.policies[k].acting_policy()
    return ReanalyzeWorker(
        fabric.storage(Endpoint(SEGMENTS, r)),
        policy,
        ParamSubscriber(ctx.snapshots(k), policy),
        fabric.mailbox(Endpoint(REFRESH, r), read=False),
        ctx.reporter,
        share=cfg.share,
        batch=cfg.batch,
        part=1.0 / mine,
        seed=ctx.seed,
        wait=ctx.wait_timeout,
        report_interval=max(ctx.report_interval, 0.5),
    )


def check(plan: Plan) -> None:
    """Reanalysis refreshes what an acting policy stored of its searches, in a replay: a run without a replay, or
    whose acting policy stores no such field, is one line."""
    cfg = plan.cfg
    if REPLAY not in plan.sample_path:
        raise ConfigError(
            f"reanalyze.workers: reanalysis re-searches steps kept in a replay; {cfg.algorithm} keeps none"
        )
    if not replay_spec(plan, 0).carried:
        raise ConfigError(
            f"reanalyze.workers: {cfg.algorithm}'s acting policy stores no search targets to refresh (reanalysis is "
            "for algorithms that act by searching: alphazero, muzero)"
        )


REANALYZE = Role(
    "reanalyze",
    count=lambda plan: plan.cfg.reanalyze.workers,
    builder="srl.reanalyze.role:build",
    seed_salt=10,
    group=_group,
    connects=lambda plan, i: (
        Endpoint(REFRESH, replay_of(plan, i)),
        snapshot_endpoint(plan, _group(plan, i), i, replay_of(plan, i) // replays_per_policy(plan)),
    ),
    report=Report("reanalyze", "srl.reanalyze.worker:ReanalyzeReports"),
    check="srl.reanalyze.role:check",
)
"""Beside its replay; restarted alone when it dies (a search it had under way is lost, nothing else)."""
