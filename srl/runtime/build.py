"""Building: any worker of an experiment from its record in the topology, its plan and a fabric.

Every runtime uses :func:`build_worker`, so the workers are the same objects
whatever their placement. Each role's declaration names its builder by
``module:attr``: the core's roles (``runtime/topology.py``) name theirs here,
the other roles' packages their own. A builder is handed a
:class:`BuildContext`: it reads whom its worker serves and connects to from
the worker's record (the wiring itself is decided once, in the topology) and
asks the fabric for those endpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import zmq

from srl.api.config import ConfigError, to_dict
from srl.api.device import torch_device
from srl.api.env import GroupedSlot
from srl.api.explore import Explorer, make_explorer
from srl.api.plugins import resolve
from srl.api.worker import Policy, Reporter, TrainerPort, Worker, is_device_policy
from srl.envs.slots import make_grouped
from srl.runtime.fabric import Fabric
from srl.runtime.plan import Plan, PolicyPlan
from srl.runtime.topology import Stream, WorkerSpec, declared, keeper
from srl.system.actor_worker import ActorWorker
from srl.system.batches import BatchSource, SegmentBatches
from srl.system.checkpoint import load_checkpoint
from srl.system.collective import TorchCollective
from srl.system.control import NamedReporter
from srl.system.null_trainer import NullTrainerWorker
from srl.system.param_service import ParamServiceWorker, RemoteSnapshot
from srl.system.params import ParamPublisher, ParamSubscriber, SnapshotSource
from srl.system.policy_worker import PolicyWorker
from srl.system.prefetch import DeviceBatches
from srl.system.rewards import RewardTransform
from srl.system.run_dir import policy_checkpoints
from srl.system.streams import InferenceClient, InferenceServer, InlineInference
from srl.system.trainer_worker import TrainerWorker
from srl.wiring import algorithm_class, context, discount, make_algorithm


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
    env_steps: int = 0
    """A restarted actor: the env steps its earlier starts took (its exploration schedule counts on from them)."""

    @property
    def seed(self) -> int:
        """This worker's seed: distinct per worker (its role's ``seed_salt``, its index); a resumed run draws new
        streams (its environments do not replay the first episodes)."""
        plan, worker = self.plan, self.worker
        return (
            plan.cfg.seed * 1_000_003 + worker.role.seed_salt * 10_007 + worker.index * 101 + plan.start_version * 7_919
        )

    @property
    def reporter(self) -> Reporter:
        """Where the worker reports: each report carries its name, as the plan gave it."""
        return NamedReporter(self.fabric.reporter(), self.worker.name)

    def snapshots(self, policy: int = 0) -> SnapshotSource:
        """Where this worker reads policy ``policy``'s parameter snapshots, as its record's connections say (its
        role connects to :func:`~srl.runtime.topology.snapshot_endpoint`)."""
        p, size = self.plan.cfg.params, self.plan.policies[policy].param_size
        server = self.worker.connection(Stream.PARAMS, policy)
        if server is not None:
            return RemoteSnapshot(
                zmq.Context.instance(), self.fabric.param_address(server), size, self.fabric.token(), p.transfer_dtype
            )
        buffer = self.worker.connection(Stream.SNAPSHOTS, policy)
        assert buffer is not None, f"{self.worker.name} reads no snapshots of policy {policy}"
        return self.fabric.params(buffer.index, policy)

    def subscribers(self, stride: int = 1) -> tuple[list[Policy], list[ParamSubscriber]]:
        """A fresh acting policy of each of the run's policies, and what keeps each at its newest snapshot (its
        role connects to :func:`~srl.runtime.topology.every_snapshot`)."""
        policies = [p.acting_policy() for p in self.plan.policies]
        subscribers = [ParamSubscriber(self.snapshots(k), policy, stride) for k, policy in enumerate(policies)]
        return policies, subscribers


Builder = Callable[[BuildContext], Worker]


def build_param_root(ctx: BuildContext) -> Worker:
    """The root server: serves the lead trainer's buffer to relays (or, in flat mode, to every reader)."""
    plan, fabric, wait_timeout = ctx.plan, ctx.fabric, ctx.wait_timeout
    p, k = plan.cfg.params, ctx.worker.index
    zctx: zmq.Context = zmq.Context.instance()
    serves = ctx.worker.service(Stream.PARAMS)
    assert serves is not None
    return ParamServiceWorker(
        ctx.worker.role.name if len(plan.policies) == 1 else ctx.worker.name,
        fabric.params(policy=k),
        plan.policies[k].param_size,
        ctx.reporter,
        fabric.param_address(serves),
        fabric.token(),
        transfer_dtype=p.transfer_dtype,
        wait_timeout=wait_timeout,
        ctx=zctx,
    )


def build_relay(ctx: BuildContext) -> Worker:
    """Relay ``g``: mirrors its upstream into its group's buffer, and serves the relays below it (if any)."""
    plan, fabric, wait_timeout = ctx.plan, ctx.fabric, ctx.wait_timeout
    p, k = plan.cfg.params, ctx.worker.policy or 0
    size = plan.policies[k].param_size
    zctx: zmq.Context = zmq.Context.instance()
    upstream_at = ctx.worker.connection(Stream.PARAMS, k)
    assert upstream_at is not None
    upstream = RemoteSnapshot(zctx, fabric.param_address(upstream_at), size, fabric.token(), p.transfer_dtype)
    serves = ctx.worker.service(Stream.PARAMS)
    mirror = ctx.worker.service(Stream.SNAPSHOTS)
    assert mirror is not None
    return ParamServiceWorker(
        ctx.worker.name,
        upstream,
        size,
        ctx.reporter,
        fabric.param_address(serves) if serves is not None else None,
        fabric.token(),
        mirror=fabric.params(mirror.index, k),
        transfer_dtype=p.transfer_dtype,
        wait_timeout=wait_timeout,
        ctx=zctx,
    )


def build_worker(
    plan: Plan,
    fabric: Fabric,
    worker: WorkerSpec,
    run_dir: Path | None,
    wait_timeout: float,
    report_interval: float,
    incarnation: int = 0,
    min_version: int = 0,
    env_steps: int = 0,
) -> Worker:
    """Build ``worker`` with its role's builder (see :class:`BuildContext` for the other arguments), named as the
    plan names it."""
    ctx = BuildContext(
        plan, fabric, worker, run_dir, wait_timeout, report_interval, incarnation, min_version, env_steps
    )
    torch.manual_seed(ctx.seed)
    build: Builder = worker.role.hook("builder")
    built = build(ctx)
    built.name = worker.name
    return built


def _autotune_peers(plan: Plan, worker: WorkerSpec) -> int:
    """With ``workers.autotune``, the trainers sharing this trainer's node (so its share of the node's cores
    while it is the bottleneck); 0 when it keeps ``torch_threads``: the inline runtime (reproducible runs), an
    update on a GPU."""
    w = plan.cfg.workers
    if not w.autotune or plan.cfg.runtime == "inline" or w.trainer_device != "cpu":
        return 0
    return sum(1 for t in plan.topology.of(worker.role) if t.group == worker.group)


def build_trainer(ctx: BuildContext) -> Worker:
    """Trainer ``i`` of its policy (with ``plan.null_trainer``, one that discards every segment). Restarted, it
    continues from its policy's checkpoint in ``plan.resume`` and publishes above ``ctx.min_version``."""
    plan, fabric, run_dir, wait_timeout = ctx.plan, ctx.fabric, ctx.run_dir, ctx.wait_timeout
    index, incarnation = ctx.worker.index, ctx.incarnation
    k = plan.policy_of_trainer(index)
    policy, cfg = plan.policies[k], plan.policies[k].cfg
    per = cfg.workers.trainers
    if plan.null_trainer:
        if keeper(plan) is not None:
            raise ConfigError("srl bench sampling measures the on-policy sample path; this run's path ends in a replay")
        return NullTrainerWorker(
            index,
            policy.acting_policy().flat_state(),
            fabric.sample_consumer(index),
            ParamPublisher(fabric.params(policy=k)),
            ctx.reporter,
            wait_timeout=wait_timeout,
        )
    collective = None
    if per > 1:
        collective = TorchCollective(
            index % per, per, fabric.dist_init_method(incarnation, k), interface=fabric.dist_interface()
        )
    algo = make_algorithm(
        policy.obs_space,
        policy.action_space,
        cfg,
        seed=cfg.seed + k * 1_000_033,
        collective=collective,
        device=cfg.workers.trainer_device,
        state_space=policy.state_space,
        agents=policy.agents_per_env,
    )
    trainer = TrainerWorker(
        index,
        algo,
        DeviceBatches(
            batch_source(plan, fabric, ctx.worker, fresh=plan.resume is None and incarnation == 0),
            torch_device(cfg.workers.trainer_device, "workers.trainer_device"),
        ),
        ParamPublisher(fabric.params(policy=k)),
        ctx.reporter,
        total_env_steps=cfg.run.total_env_steps // cfg.members,  # a member's share: its schedules
        checkpoint_dir=None if run_dir is None else policy_checkpoints(run_dir, plan.cfg, policy.name),
        checkpoint_interval=cfg.run.checkpoint_interval_seconds,
        keep_checkpoints=cfg.run.keep_checkpoints,
        checkpoint_extra={"config": to_dict(plan.cfg), "spaces": policy.spaces, "policy": policy.name},
        wait_timeout=wait_timeout,
        collective=collective,
        autotune_peers=_autotune_peers(plan, ctx.worker),
        report_interval=ctx.report_interval,
        port=_port(ctx),
    )
    if plan.resume is not None and plan.resume[k]:  # every trainer of a policy starts from its lead's checkpoint
        trainer.restore(load_checkpoint(Path(plan.resume[k])))
    trainer.version = max(trainer.version, ctx.min_version)  # restarted: above every version readers hold
    return trainer


def _port(ctx: BuildContext) -> TrainerPort | None:
    """The trainer's end of the role of the run that declares one (``Role.port``)."""
    make = declared(ctx.plan, "port")
    port: TrainerPort | None = None if make is None else make(ctx)
    return port


def batch_source(plan: Plan, fabric: Fabric, trainer: WorkerSpec, fresh: bool) -> BatchSource:
    """Where trainer ``trainer``'s batches come from: the keeper that ends the sample path (a replay's batches),
    or its own sample stream's segments. ``fresh``: the trainer starts the run (no checkpoint to count on from)."""
    kept = keeper(plan)
    if kept is not None and kept.hop is not None and kept.hop.batches is not None:
        source: BatchSource = resolve(kept.hop.batches, {}, "workers.path")(plan, fabric, trainer, fresh)
        return source
    cfg = plan.policies[plan.policy_of_trainer(trainer.index)]
    w = cfg.cfg.workers
    return SegmentBatches(fabric.sample_consumer(trainer.index), w.batch_segments, w.max_policy_lag, cfg.agents_per_env)


def build_policy(ctx: BuildContext) -> Worker:
    """Policy worker ``p``: answers the requests of the actors that connect to it, for every policy."""
    plan, fabric, index = ctx.plan, ctx.fabric, ctx.worker.index
    cfg = plan.cfg
    policies, subscribers = ctx.subscribers(cfg.workers.param_version_stride)
    serves = ctx.worker.service(Stream.INFERENCE)
    assert serves is not None and serves.index is not None
    rows = [plan.actor_row(a.index) for a in plan.topology.clients_of(serves)]
    replies = {row: fabric.replies(row) for row in rows}
    pools = [fabric.pool(k) for k in range(len(plan.policies))]
    w = cfg.workers
    if w.policy_device != "cpu" and not all(is_device_policy(p) for p in policies):
        raise ConfigError(
            f"workers.policy_device: {w.policy_device}: the acting policy of algorithm {cfg.algorithm} acts on the "
            "CPU only (it has no act_tensors)"
        )
    return PolicyWorker(
        index,
        policies,
        InferenceServer(pools, fabric.requests(serves.index), replies),
        subscribers,
        ctx.reporter,
        max_batch=w.max_inference_batch,
        pull_interval=w.param_pull_interval,
        wait_timeout=ctx.wait_timeout,
        device=w.policy_device,
        measure_cap=w.measure_inference_batch and cfg.runtime != "inline",  # inline runs stay reproducible
    )


def build_actor(ctx: BuildContext) -> Worker:
    """Actor ``a``: asks its policy worker for each policy's actions (or runs the policies itself) and feeds
    each policy's trainer."""
    plan, fabric, run_dir, wait_timeout = ctx.plan, ctx.fabric, ctx.run_dir, ctx.wait_timeout
    index, incarnation, report_interval = ctx.worker.index, ctx.incarnation, ctx.report_interval
    cfg = plan.cfg
    w = cfg.workers
    pools, row = [fabric.pool(k) for k in range(len(plan.policies))], plan.actor_row(index)
    inference: InlineInference | InferenceClient
    if w.policy_workers == 0:
        policies, subscribers = ctx.subscribers(w.param_version_stride)
        inference = InlineInference(row, pools, policies, subscribers)
    else:
        server = ctx.worker.connection(Stream.INFERENCE)
        assert server is not None and server.index is not None
        inference = InferenceClient(row, pools, fabric.requests(server.index), fabric.replies(row))
    env = cfg.env
    rewards = None
    if env.normalize_reward or env.reward_clip is not None:
        rewards = lambda n: RewardTransform(n, discount(cfg), env.normalize_reward, env.reward_clip)  # noqa: E731
    make = declared(plan, "slots")  # a role that makes the actors' slots (Role.slots)
    slot_of: Callable[[int], GroupedSlot] = (lambda i: env_slot(plan)) if make is None else (lambda i: make(ctx, i))
    return ActorWorker(
        index,
        slot_of,
        w.ring_size,
        pools,
        inference,
        fabric.sample_producers(index),
        ctx.reporter,
        seed=ctx.seed + incarnation * 104_729,
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
        explorers=[_explorer(plan, policy, index) for policy in plan.policies],
        explored_steps=plan.start_env_steps // plan.cfg.workers.actors + ctx.env_steps,
        episodes=[fabric.channel(e) for e in ctx.worker.connects if e.stream is Stream.EPISODES],
    )


def env_slot(plan: Plan, members: tuple[str, ...] = ()) -> GroupedSlot:
    """An actor's slot of the run's env: ``workers.envs_per_slot`` environments, their agents grouped by policy
    (``members``: the policies of several members, ``cfg.members``, each playing its share of the envs)."""
    cfg = plan.cfg
    on_state = [p.name for p in plan.policies if p.state_space is not None]
    return make_grouped(cfg.env, cfg.workers.envs_per_slot, cfg.agents, on_state, members=members)


def _explorer(plan: Plan, policy: PolicyPlan, actor: int) -> Explorer | None:
    """What policy ``policy``'s algorithm declares to explore actor ``actor``'s columns (every slot's, numbered
    across the run), if anything."""
    cfg = policy.cfg
    count = cfg.workers.ring_size * policy.columns_per_slot
    ctx = context(policy.obs_space, policy.action_space, cfg, state_space=policy.state_space)
    total, actors = count * cfg.workers.actors, cfg.workers.actors
    return make_explorer(algorithm_class(cfg), ctx, actor * count, count, total, actors)
