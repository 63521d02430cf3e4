"""Building: any worker of an experiment from its record in the topology, its plan and a fabric.

Every runtime uses :func:`build_worker`, so the workers are the same objects
whatever their placement. Each role's declaration (``runtime/topology.py``)
names its builder here; a builder reads whom its worker serves and connects
to from the worker's record (the wiring itself is decided once, in the
topology) and asks the fabric for those endpoints.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import zmq

from srl.api.config import ConfigError, to_dict
from srl.api.env import Slot
from srl.api.plugins import resolve
from srl.api.stage import StageClass, StageContext
from srl.api.worker import Worker
from srl.base.fileio import atomic_save
from srl.envs.slots import make_slot
from srl.envs.turns import TurnSlot
from srl.runtime.fabric import Fabric
from srl.runtime.plan import Plan
from srl.runtime.topology import EVAL, LEAGUE, Role, Stream, WorkerSpec
from srl.system.actor_worker import ActorWorker
from srl.system.collective import TorchCollective
from srl.system.eval_worker import EvalWorker
from srl.system.null_trainer import NullTrainerWorker
from srl.system.param_service import ParamServiceWorker, RemoteSnapshot
from srl.system.params import ParamPublisher, ParamSubscriber, SnapshotSource
from srl.system.policy_worker import PolicyWorker
from srl.system.rewards import RewardTransform
from srl.system.stage_worker import StageWorker
from srl.system.streams import InferenceClient, InferenceServer, InlineInference
from srl.system.trainer_worker import CHECKPOINT_FORMAT, TrainerWorker, load_checkpoint
from srl.wiring import acting_policy, make_algorithm


@dataclass(frozen=True)
class BuildContext:
    """What a builder is handed: the worker's record and where it runs."""

    plan: Plan
    fabric: Fabric
    worker: WorkerSpec
    run_dir: Path | None
    wait_timeout: float
    """Bound on waits on streams (0 when workers share one thread)."""
    report_interval: float
    """Actors report every this many seconds (0: every poll, which makes stopping at a step budget exact)."""
    incarnation: int = 0
    """How many times this worker was started before: a restarted actor draws fresh environment seeds."""
    min_version: int = 0
    """A restarted trainer publishes at least this version (above every version readers already hold)."""


Builder = Callable[[BuildContext], Worker]


def _param_source(plan: Plan, fabric: Fabric, role: Role, index: int) -> SnapshotSource:
    """Where reader ``role``/``index`` (a policy worker, the eval worker, or an actor inferring inline) loads
    snapshots from, as its record says: the root server itself in flat mode, or a node-local buffer."""
    p = plan.cfg.params
    source = plan.topology.get(role, index)
    server = source.connection(Stream.PARAMS)
    if server is not None:
        return RemoteSnapshot(
            zmq.Context.instance(), fabric.param_address(server), plan.param_size, fabric.token(), p.transfer_dtype
        )
    buffer = source.connection(Stream.SNAPSHOTS)
    assert buffer is not None, f"{source.name} reads no snapshots"
    return fabric.params(buffer.index)


def build_param_root(ctx: BuildContext) -> Worker:
    """The root server: serves the lead trainer's buffer to relays (or, in flat mode, to every reader)."""
    plan, fabric, wait_timeout = ctx.plan, ctx.fabric, ctx.wait_timeout
    p = plan.cfg.params
    zctx: zmq.Context = zmq.Context.instance()
    serves = ctx.worker.service(Stream.PARAMS)
    assert serves is not None
    return ParamServiceWorker(
        ctx.worker.role.name,
        fabric.params(),
        plan.param_size,
        fabric.reporter(),
        fabric.param_address(serves),
        fabric.token(),
        transfer_dtype=p.transfer_dtype,
        wait_timeout=wait_timeout,
        ctx=zctx,
    )


def build_relay(ctx: BuildContext) -> Worker:
    """Relay ``g``: mirrors its upstream into its group's buffer, and serves the relays below it (if any)."""
    plan, fabric, wait_timeout, index = ctx.plan, ctx.fabric, ctx.wait_timeout, ctx.worker.index
    p = plan.cfg.params
    zctx: zmq.Context = zmq.Context.instance()
    upstream_at = ctx.worker.connection(Stream.PARAMS)
    assert upstream_at is not None
    upstream = RemoteSnapshot(
        zctx, fabric.param_address(upstream_at), plan.param_size, fabric.token(), p.transfer_dtype
    )
    serves = ctx.worker.service(Stream.PARAMS)
    return ParamServiceWorker(
        ctx.worker.name,
        upstream,
        plan.param_size,
        fabric.reporter(),
        fabric.param_address(serves) if serves is not None else None,
        fabric.token(),
        mirror=fabric.params(index),
        transfer_dtype=p.transfer_dtype,
        wait_timeout=wait_timeout,
        ctx=zctx,
    )


def build_eval(ctx: BuildContext) -> Worker:
    """The eval worker reads snapshots like a policy worker and saves its best policy next to the checkpoints."""
    from srl.evaluate import eval_seed, play

    plan, fabric, run_dir, wait_timeout = ctx.plan, ctx.fabric, ctx.run_dir, ctx.wait_timeout
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
        ParamSubscriber(_param_source(plan, fabric, EVAL, 0), policy),
        lambda p: play(cfg, p, cfg.run.eval_episodes, eval_seed(cfg)),
        cfg.run.eval_every_versions,
        fabric.reporter(),
        save_best,
        wait_timeout=max(wait_timeout, 0.0),
    )


def build_league(ctx: BuildContext) -> Worker:
    """The league worker reads snapshots like the eval worker and keeps the pool in ``RUN_DIR/league``."""
    from srl.league.match import match_slot, play_games
    from srl.system.league_worker import LeagueWorker

    plan, fabric = ctx.plan, ctx.fabric
    cfg = plan.cfg
    learner = acting_policy(plan.obs_space, plan.action_space, cfg)
    slot = match_slot(cfg, cfg.league.match_games, "league.opponent")
    seed = worker_seed(plan, LEAGUE, 0)
    return LeagueWorker(
        cfg.league,
        learner,
        ParamSubscriber(_param_source(plan, fabric, LEAGUE, 0), learner),
        league_folder(ctx.run_dir),
        lambda: acting_policy(plan.obs_space, plan.action_space, cfg),
        lambda policy, other: play_games(slot, policy, other, seed, deterministic=False),
        fabric.reporter(),
        seed,
        wait_timeout=max(ctx.wait_timeout, 0.0),
    )


def league_folder(run_dir: Path | None) -> Path:
    if run_dir is None:
        raise ConfigError("league.opponent: a league keeps its pool in the run directory; this run has none")
    return run_dir / "league"


def worker_seed(plan: Plan, role: Role, index: int) -> int:
    """Distinct per worker; a resumed run draws new streams (its environments do not replay the first episodes)."""
    return plan.cfg.seed * 1_000_003 + role.seed_salt * 10_007 + index * 101 + plan.start_version * 7_919


def build_worker(
    plan: Plan,
    fabric: Fabric,
    worker: WorkerSpec,
    run_dir: Path | None,
    wait_timeout: float,
    report_interval: float,
    incarnation: int = 0,
    min_version: int = 0,
) -> Worker:
    """Build ``worker`` with its role's builder (see :class:`BuildContext` for the other arguments)."""
    torch.manual_seed(worker_seed(plan, worker.role, worker.index))
    ctx = BuildContext(plan, fabric, worker, run_dir, wait_timeout, report_interval, incarnation, min_version)
    return _builder(worker.role)(ctx)


def _builder(role: Role) -> Builder:
    """The function a role's declaration names (``module:attr``)."""
    module, _, attr = role.builder.partition(":")
    return getattr(importlib.import_module(module), attr)


def build_trainer(ctx: BuildContext) -> Worker:
    """Trainer ``i`` (with ``plan.null_trainer``, one that discards every segment). Restarted, it continues from
    the checkpoint in ``plan.resume`` and publishes above ``ctx.min_version``."""
    plan, fabric, run_dir, wait_timeout = ctx.plan, ctx.fabric, ctx.run_dir, ctx.wait_timeout
    index, incarnation = ctx.worker.index, ctx.incarnation
    cfg = plan.cfg
    if plan.null_trainer:
        snapshot = acting_policy(plan.obs_space, plan.action_space, cfg).flat_state()
        return NullTrainerWorker(
            index,
            snapshot,
            fabric.sample_consumer(index),
            ParamPublisher(fabric.params()),
            fabric.reporter(),
            wait_timeout=wait_timeout,
        )
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
        state_space=plan.state_space,
    )
    trainer = TrainerWorker(
        index,
        algo,
        fabric.sample_consumer(index),
        ParamPublisher(fabric.params()),
        fabric.reporter(),
        batch_segments=cfg.workers.batch_segments,
        max_policy_lag=cfg.workers.max_policy_lag,
        total_env_steps=cfg.run.total_env_steps,
        checkpoint_dir=None if run_dir is None else run_dir / "checkpoints",
        checkpoint_interval=cfg.run.checkpoint_interval_seconds,
        keep_checkpoints=cfg.run.keep_checkpoints,
        checkpoint_extra={"config": to_dict(cfg), "spaces": plan.spaces},
        wait_timeout=wait_timeout,
        collective=collective,
        agents_per_env=plan.agents_per_env,
    )
    if plan.resume is not None:  # every trainer starts from the lead trainer's checkpoint
        trainer.restore(load_checkpoint(Path(plan.resume)))
    trainer.version = max(trainer.version, ctx.min_version)  # restarted: above every version readers hold
    return trainer


def build_policy(ctx: BuildContext) -> Worker:
    """Policy worker ``p``: answers the requests of the actors that connect to it."""
    plan, fabric, wait_timeout, index, role = ctx.plan, ctx.fabric, ctx.wait_timeout, ctx.worker.index, ctx.worker.role
    cfg = plan.cfg
    policy = acting_policy(plan.obs_space, plan.action_space, cfg)
    serves = ctx.worker.service(Stream.INFERENCE)
    assert serves is not None and serves.index is not None
    rows = [plan.actor_row(a.index) for a in plan.topology.clients_of(serves)]
    replies = {row: fabric.replies(row) for row in rows}
    return PolicyWorker(
        index,
        policy,
        InferenceServer(fabric.pool(), fabric.requests(serves.index), replies),
        ParamSubscriber(_param_source(plan, fabric, role, index), policy, cfg.workers.param_version_stride),
        fabric.reporter(),
        max_batch=cfg.workers.max_inference_batch,
        pull_interval=cfg.workers.param_pull_interval,
        wait_timeout=wait_timeout,
    )


def build_stage(ctx: BuildContext) -> Worker:
    """Stage worker ``s``: the class ``stage.worker`` names decides on each segment its actors submit."""
    plan, fabric, index = ctx.plan, ctx.fabric, ctx.worker.index
    cfg = plan.cfg
    assert cfg.stage.worker is not None
    make: StageClass = resolve(cfg.stage.worker, {}, "stage.worker")
    snapshots = _param_source(plan, fabric, ctx.worker.role, index)
    stage = make(StageContext(index, plan.layout.fields, dict(cfg.stage.args), cfg, snapshots.version))
    return StageWorker(
        index,
        stage,
        fabric.stage_consumer(index),
        fabric.stage_forwarder(index),
        fabric.reporter(),
        wait_timeout=ctx.wait_timeout,
        report_interval=max(ctx.report_interval, 0.5),
    )


def build_actor(ctx: BuildContext) -> Worker:
    """Actor ``a``: asks its policy worker for actions (or runs the policy itself) and feeds its trainer."""
    plan, fabric, run_dir, wait_timeout = ctx.plan, ctx.fabric, ctx.run_dir, ctx.wait_timeout
    index, role, incarnation, report_interval = ctx.worker.index, ctx.worker.role, ctx.incarnation, ctx.report_interval
    cfg = plan.cfg
    w = cfg.workers
    pool, row = fabric.pool(), plan.actor_row(index)
    inference: InlineInference | InferenceClient
    if w.policy_workers == 0:
        policy = acting_policy(plan.obs_space, plan.action_space, cfg)
        inference = InlineInference(
            row,
            pool,
            policy,
            ParamSubscriber(_param_source(plan, fabric, role, index), policy, w.param_version_stride),
        )
    else:
        server = ctx.worker.connection(Stream.INFERENCE)
        assert server is not None and server.index is not None
        inference = InferenceClient(row, pool, fabric.requests(server.index), fabric.replies(row))
    env = cfg.env
    rewards = None
    if env.normalize_reward or env.reward_clip is not None:
        rewards = lambda n: RewardTransform(n, cfg.ppo.gamma, env.normalize_reward, env.reward_clip)  # noqa: E731

    def slot_of(i: int) -> Slot:
        slot = make_slot(env, w.envs_per_slot, state=plan.state_space is not None)
        if not cfg.league.pool:
            return slot
        from srl.league.slot import LeagueSlot

        assert isinstance(slot, TurnSlot)
        folder = league_folder(run_dir)
        make_policy = lambda: acting_policy(plan.obs_space, plan.action_space, cfg)  # noqa: E731
        return LeagueSlot(slot, folder, cfg.league, make_policy, worker_seed(plan, role, index) + i * 31)

    return ActorWorker(
        index,
        slot_of,
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
