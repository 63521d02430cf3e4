"""Wiring: build any worker of an experiment from its plan and a fabric.

Every runtime uses this one function, so the workers are the same objects
whatever their placement. Actor ``a`` is served by a policy worker of its own
node group (``a % policy_workers`` on one machine; see ``Plan.policy_of``), or
runs the policy itself when there are none, and feeds trainer ``a % trainers``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import zmq

from srl.api.config import to_dict
from srl.api.worker import Worker
from srl.base.fileio import atomic_save
from srl.envs.slots import make_slot
from srl.runtime.fabric import Fabric
from srl.runtime.plan import Plan
from srl.system.actor_worker import ActorWorker
from srl.system.collective import TorchCollective
from srl.system.eval_worker import EvalWorker
from srl.system.null_trainer import NullTrainerWorker
from srl.system.param_service import ParamServiceWorker, RemoteSnapshot, relay_parent
from srl.system.params import ParamPublisher, ParamSubscriber, SnapshotSource
from srl.system.policy_worker import PolicyWorker
from srl.system.rewards import RewardTransform
from srl.system.streams import InferenceClient, InferenceServer, InlineInference
from srl.system.trainer_worker import CHECKPOINT_FORMAT, TrainerWorker, load_checkpoint
from srl.wiring import acting_policy, make_algorithm

ROLES = ("trainer", "policy", "actor", "param_root", "relay", "eval")


def worker_roles(plan: Plan) -> list[tuple[str, int]]:
    """Every worker of the run, in start order (trainers publish the first snapshot)."""
    w, p = plan.cfg.workers, plan.cfg.params
    has_root = p.mode == "flat" or plan.relay_groups > 0
    return (
        [("trainer", i) for i in range(w.trainers)]
        + ([("param_root", 0)] if has_root else [])
        + [("relay", g) for g in range(plan.relay_groups)]
        + [("policy", i) for i in range(w.policy_workers)]
        + [("actor", i) for i in range(w.actors)]
        + ([("eval", 0)] if plan.cfg.run.eval_every_versions > 0 else [])
    )


def _param_source(plan: Plan, fabric: Fabric, role: str, index: int) -> SnapshotSource:
    """Where reader ``role``/``index`` (a policy worker, the eval worker, or an actor inferring inline) loads
    snapshots from: its node group's buffer, or the root server itself in flat mode."""
    p = plan.cfg.params
    if p.mode == "flat":
        return RemoteSnapshot(
            zmq.Context.instance(), fabric.param_address("root"), plan.param_size, fabric.token(), p.transfer_dtype
        )
    return fabric.params(plan.param_group(role, index))


def _param_service(plan: Plan, fabric: Fabric, role: str, index: int, wait_timeout: float) -> Worker:
    """The root server (serving the trainer's buffer) or relay ``index`` (mirroring into its group's buffer)."""
    p = plan.cfg.params
    ctx = zmq.Context.instance()
    if role == "param_root":
        return ParamServiceWorker(
            "param_root",
            fabric.params(),
            plan.param_size,
            fabric.reporter(),
            fabric.param_address("root"),
            fabric.token(),
            transfer_dtype=p.transfer_dtype,
            wait_timeout=wait_timeout,
            ctx=ctx,
        )
    upstream = RemoteSnapshot(
        ctx, fabric.param_address(relay_parent(index, p.fan_out)), plan.param_size, fabric.token(), p.transfer_dtype
    )
    has_children = any(relay_parent(g, p.fan_out) == f"relay{index}" for g in range(plan.relay_groups))
    return ParamServiceWorker(
        f"relay{index}",
        upstream,
        plan.param_size,
        fabric.reporter(),
        fabric.param_address(f"relay{index}") if has_children else None,
        fabric.token(),
        mirror=fabric.params(index),
        transfer_dtype=p.transfer_dtype,
        wait_timeout=wait_timeout,
        ctx=ctx,
    )


def _eval_worker(plan: Plan, fabric: Fabric, run_dir: Path | None, wait_timeout: float) -> Worker:
    """The eval worker reads snapshots like policy worker 0 and saves its best policy next to the checkpoints."""
    from srl.evaluate import eval_seed, play

    cfg = plan.cfg
    policy = acting_policy(plan.obs_space, plan.action_space, cfg)

    def save_best(version: int, return_mean: float) -> None:
        if run_dir is None:
            return
        state = {
            "format": CHECKPOINT_FORMAT,
            "version": version,
            "eval_return_mean": return_mean,
            "policy_state": torch.from_numpy(policy.flat_state()),
            "config": to_dict(cfg),
            "spaces": plan.spaces,
        }
        atomic_save(run_dir / "checkpoints" / "best.pt", lambda f: torch.save(state, f))

    return EvalWorker(
        policy,
        ParamSubscriber(_param_source(plan, fabric, "eval", 0), policy),
        lambda p: play(cfg, p, cfg.run.eval_episodes, eval_seed(cfg)),
        cfg.run.eval_every_versions,
        fabric.reporter(),
        save_best,
        wait_timeout=max(wait_timeout, 0.0),
    )


def worker_seed(plan: Plan, role: str, index: int) -> int:
    """Distinct per worker; a resumed run draws new streams (its environments do not replay the first episodes)."""
    return plan.cfg.seed * 1_000_003 + ROLES.index(role) * 10_007 + index * 101 + plan.start_version * 7_919


def build_worker(
    plan: Plan,
    fabric: Fabric,
    role: str,
    index: int,
    run_dir: Path | None,
    wait_timeout: float,
    report_interval: float,
    incarnation: int = 0,
) -> Worker:
    """Build worker ``role``/``index``. With ``plan.null_trainer`` the trainer discards every segment.

    ``wait_timeout`` bounds waits on streams (0 when workers share one thread); actors report every
    ``report_interval`` seconds (0: every poll, which makes stopping at a step budget exact).
    ``incarnation`` counts restarts of this worker: a restarted actor draws fresh environment seeds.
    """
    cfg = plan.cfg
    torch.manual_seed(worker_seed(plan, role, index))
    if role == "trainer" and plan.null_trainer:
        snapshot = acting_policy(plan.obs_space, plan.action_space, cfg).flat_state()
        return NullTrainerWorker(
            index,
            snapshot,
            fabric.sample_consumer(index),
            ParamPublisher(fabric.params()),
            fabric.reporter(),
            wait_timeout=wait_timeout,
        )
    if role == "trainer":
        collective = None
        if cfg.workers.trainers > 1:
            collective = TorchCollective(
                index, cfg.workers.trainers, fabric.dist_init_method(incarnation), interface=fabric.dist_interface()
            )
        algo = make_algorithm(
            plan.obs_space,
            plan.action_space,
            cfg,
            seed=cfg.seed,
            collective=collective,
            device=cfg.workers.trainer_device,
        )
        trainer = TrainerWorker(
            index,
            algo,
            fabric.sample_consumer(index),
            ParamPublisher(fabric.params()),
            fabric.reporter(),
            batch_segments=cfg.ppo.batch_segments,
            max_policy_lag=cfg.ppo.max_policy_lag,
            total_env_steps=cfg.run.total_env_steps,
            checkpoint_dir=None if run_dir is None else run_dir / "checkpoints",
            checkpoint_interval=cfg.run.checkpoint_interval_seconds,
            keep_checkpoints=cfg.run.keep_checkpoints,
            checkpoint_extra={"config": to_dict(cfg), "spaces": plan.spaces},
            wait_timeout=wait_timeout,
            collective=collective,
        )
        if plan.resume is not None:  # every trainer starts from the lead trainer's checkpoint
            trainer.restore(load_checkpoint(Path(plan.resume)))
        return trainer
    if role == "eval":
        return _eval_worker(plan, fabric, run_dir, wait_timeout)
    if role in ("param_root", "relay"):
        return _param_service(plan, fabric, role, index, wait_timeout)
    if role == "policy":
        policy = acting_policy(plan.obs_space, plan.action_space, cfg)
        rows = [plan.actor_row(a) for a in plan.served_actors(index)]
        replies = {row: fabric.replies(row) for row in rows}
        return PolicyWorker(
            index,
            policy,
            InferenceServer(fabric.pool(), fabric.requests(index), replies),
            ParamSubscriber(_param_source(plan, fabric, role, index), policy, cfg.workers.param_version_stride),
            fabric.reporter(),
            max_batch=cfg.workers.max_inference_batch,
            pull_interval=cfg.workers.param_pull_interval,
            wait_timeout=wait_timeout,
        )
    if role == "actor":
        w = cfg.workers
        pool, row = fabric.pool(), plan.actor_row(index)
        if w.policy_workers == 0:
            policy = acting_policy(plan.obs_space, plan.action_space, cfg)
            inference = InlineInference(
                row,
                pool,
                policy,
                ParamSubscriber(_param_source(plan, fabric, role, index), policy, w.param_version_stride),
            )
        else:
            inference = InferenceClient(row, pool, fabric.requests(plan.policy_of(index)), fabric.replies(row))
        env = cfg.env
        rewards = None
        if env.normalize_reward or env.reward_clip is not None:
            rewards = lambda n: RewardTransform(n, cfg.ppo.gamma, env.normalize_reward, env.reward_clip)  # noqa: E731
        return ActorWorker(
            index,
            lambda slot: make_slot(env, w.envs_per_slot),
            w.ring_size,
            pool,
            inference,
            fabric.sample_producer(index),
            fabric.reporter(),
            seed=worker_seed(plan, role, index) + incarnation * 104_729,
            make_reward_transform=rewards,
            wait_timeout=wait_timeout,
            report_interval=report_interval,
            nonfinite=env.nonfinite,
            env_name=f"env {env.id}",
            request_timeout=w.request_timeout_seconds,
            reward_stats=None if run_dir is None else run_dir / "checkpoints" / f"rewards_actor{index}.npy",
            restore_reward_stats=plan.resume is not None or incarnation > 0,
            save_interval=cfg.run.checkpoint_interval_seconds,
            row=row,
        )
    raise ValueError(f"unknown worker role {role!r}")
