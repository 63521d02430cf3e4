"""The eval worker's role: one worker beside the lead trainer while the run evaluates during training
(``run.eval_every_versions``, or by default in a game measured against a random player)."""

from __future__ import annotations

import torch

from srl.api.config import to_dict
from srl.api.worker import Worker
from srl.eval.worker import EvalWorker
from srl.runtime.build import BuildContext
from srl.runtime.topology import TRAINER_NODE, Report, Role, every_snapshot
from srl.system.checkpoint import save_checkpoint
from srl.system.params import Subscribers
from srl.system.run_dir import policy_checkpoints


def build(ctx: BuildContext) -> Worker:
    """The eval worker reads every policy's snapshots like a policy worker and saves the best policies next to
    their checkpoints."""
    from srl.evaluate import eval_seed, evaluate_policies

    plan, run_dir = ctx.plan, ctx.run_dir
    cfg = plan.cfg
    policies, subscribers = ctx.subscribers()

    def save_best(version: int, return_mean: float) -> None:
        if run_dir is None:
            return
        for k, (planned, policy) in enumerate(zip(plan.policies, policies)):
            state = {
                "version": subscribers[k].current,
                "eval_return_mean": return_mean,
                "policy_state": torch.from_numpy(policy.flat_state()),
                "config": to_dict(cfg),
                "spaces": planned.spaces,
                "policy": planned.name,
            }
            save_checkpoint(policy_checkpoints(run_dir, cfg, planned.name) / "best.pt", state)

    return EvalWorker(
        policies,
        Subscribers(subscribers),
        lambda p: evaluate_policies(plan, p, cfg.run.eval_episodes, eval_seed(cfg)),
        plan.eval_every,
        ctx.reporter,
        save_best,
        wait_timeout=max(ctx.wait_timeout, 0.0),
    )


EVAL = Role(
    "eval",
    count=lambda plan: int(plan.eval_every > 0),
    builder="srl.eval.role:build",
    seed_salt=5,
    connects=lambda plan, i: every_snapshot(plan, TRAINER_NODE, i),
    report=Report("eval", "srl.eval.worker:EvalReports"),
)
