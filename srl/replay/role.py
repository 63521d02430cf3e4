"""The replay's role: a keeper at the end of the sample path (``workers.path``: ``replay``), one per trainer or
per trainer node group of each policy, with its store, its worker and its trainers' batch buffers.

A replay's sampling settings are the algorithm's (``batch_size``, ``nstep``,
``gamma`` of the algorithm's typed settings: every algorithm that learns from a
replay declares them), its storage settings the ``replay`` section.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from srl.api.config import ConfigError
from srl.api.schema import FieldSpec
from srl.api.worker import Worker
from srl.replay.file import layout_difference, saved_layout
from srl.replay.store import ReplaySpec, ReplayStore
from srl.replay.worker import INSERTED, PRIORITIES, ReplayBatches, ReplayWorker, Sampling
from srl.runtime.build import BuildContext
from srl.runtime.topology import Endpoint, Hop, Layout, Report, Role, StreamKind, WorkerSpec, trainer_group
from srl.system.streams import FILLING, SAMPLE_WIDTH, PoolLayout
from srl.wiring import algorithm_class, algorithm_settings

if TYPE_CHECKING:
    from srl.runtime.fabric import Fabric
    from srl.runtime.plan import Plan

SEGMENTS = StreamKind(
    "replay", "replay{}", bound=True, channel=SAMPLE_WIDTH, segments=True, storage="srl.replay.role:STORE"
)
"""Replay ``r``'s stream of segments to insert (actors -> replay; across nodes over ZeroMQ)."""
BATCHES = StreamKind("batches", "batches{}", channel=SAMPLE_WIDTH, pool="srl.replay.role:batch_layout")
"""Trainer ``t``'s batches from the replay that feeds it (in shared memory on their node), and their priorities
back."""
REFRESH = StreamKind("refresh", "refresh{}", bound=True, mail=True)
"""Replay ``r``'s mailbox of refreshed step targets (a reanalyze worker's searches), written back to the stored
steps by key (:func:`srl.replay.worker.refresh_message`)."""
BATCH_BUFFERS = 2
"""Batch buffers per replay: the trainer trains on one while the replay fills the other."""


def sampling(plan: Plan, policy: int) -> Sampling:
    """What the algorithm's settings say about drawing batches (one clear line when they lack a field)."""
    settings = algorithm_settings(plan.policies[policy].cfg)
    missing = [f for f in ("batch_size", "nstep", "gamma") if not hasattr(settings, f)]
    if missing:
        raise ConfigError(
            f"algorithm: {plan.cfg.algorithm} learns from a replay, so its settings need {', '.join(missing)}"
        )
    beta0, beta1 = plan.cfg.replay.beta, plan.cfg.replay.beta_final
    return Sampling(
        int(settings.batch_size),
        int(settings.nstep),
        float(settings.gamma),
        beta=lambda progress: beta0 + (beta1 - beta0) * progress,
    )


def replay_spec(plan: Plan, replay: int) -> ReplaySpec:
    """The store of replay ``replay``: chunks of its policy's segments, as the ``replay`` section shapes it (an
    environment's agents together where the algorithm learns from a team's steps: ``team_items``)."""
    k = replay // replays_per_policy(plan)
    return ReplaySpec.of(plan.policies[k].layout, plan.cfg.replay, sampling(plan, k).batch_size, team(plan, k))


def team(plan: Plan, policy: int) -> int:
    """Columns per replay item of policy ``policy``: its agents of one env where the algorithm learns from a
    team's steps together (``team_items``), else 1."""
    one = plan.policies[policy]
    return one.agents_per_env if getattr(algorithm_class(one.cfg), "team_items", False) else 1


def batch_layout(plan: Plan, endpoint: Endpoint) -> PoolLayout:
    """Trainer ``endpoint.index``'s batch buffers: one row of :data:`BATCH_BUFFERS` batches of its replay's batch
    fields, plus the priorities the trainer writes back and the env steps taken in so far."""
    assert endpoint.index is not None
    k = plan.policy_of_trainer(endpoint.index)
    s = sampling(plan, k)
    spec = replay_spec(plan, replay_of_trainer(plan, endpoint.index))
    fields: dict[str, FieldSpec] = dict(spec.batch_fields(s.batch_size))
    fields[PRIORITIES] = FieldSpec((s.batch_size,), "float32")
    fields[INSERTED] = FieldSpec((1,), "int64")
    return PoolLayout(actors=1, buffers=BATCH_BUFFERS, fields=fields)


class _StoreOpener:
    """How a fabric makes a replay's store (the ``REPLAY`` stream kind's storage): in this process, or in shared
    memory that the fabric's owner creates and a (restarted) replay worker attaches to."""

    @staticmethod
    def create(plan: Plan, endpoint: Endpoint, name: str | None) -> ReplayStore:
        assert endpoint.index is not None
        spec = replay_spec(plan, endpoint.index)
        return ReplayStore.in_process(spec) if name is None else ReplayStore.create(name, spec)

    @staticmethod
    def attach(plan: Plan, endpoint: Endpoint, name: str) -> ReplayStore:
        assert endpoint.index is not None
        return ReplayStore.attach(name, replay_spec(plan, endpoint.index))


STORE = _StoreOpener()
"""The opener the :data:`SEGMENTS` stream kind names (``srl.replay.role:STORE``)."""


def build_replay(ctx: BuildContext) -> Worker:
    """Replay ``r``: its actors' segments in, batches out to each trainer it feeds."""
    plan, fabric, worker = ctx.plan, ctx.fabric, ctx.worker
    r = worker.index
    k = r // replays_per_policy(plan)
    feeds = [Endpoint(BATCHES, t) for t in trainers_of_replay(plan, r)]
    return ReplayWorker(
        r,
        fabric.storage(Endpoint(SEGMENTS, r)),
        fabric.segment_source(worker),
        [(fabric.buffers(e), fabric.channel(e), fabric.bell(e, 0)) for e in feeds],
        ctx.reporter,
        sampling(plan, k),
        # its share of the run's env steps: the replays of a policy split its actors between them
        total_env_steps=max(1, plan.cfg.run.total_env_steps // replays_per_policy(plan)),
        agents_per_env=plan.policies[k].agents_per_env,
        seed=ctx.seed,
        wait_timeout=ctx.wait_timeout,
        report_interval=max(ctx.report_interval, 0.5),
        save_path=saved_replay(ctx.run_dir, r) if plan.cfg.replay.save and ctx.run_dir is not None else None,
        save_interval=plan.cfg.run.checkpoint_interval_seconds,
        load=plan.resume is not None and ctx.incarnation == 0,
        refreshed=fabric.mailbox(Endpoint(REFRESH, r), read=True),
    )


def resumed(plan: Plan, run_dir: Path) -> list[str]:
    """Before a resumed run starts: its saved replays must fit its stores (otherwise one line naming the file and
    the difference; a replay worker that failed to load would go on empty), and the replays that start empty are
    said."""
    if plan.cfg.replay.save:
        check_saved_replays(plan, run_dir)
    return refilled(plan, run_dir)


def refilled(plan: Plan, run_dir: Path) -> list[str]:
    """What a resumed run says of the replays that start empty (none saved, or ``replay.save`` off)."""
    replays = range(replays_per_policy(plan) * len(plan.policies))
    missing = [r for r in replays if not (plan.cfg.replay.save and saved_replay(run_dir, r).exists())]
    if not missing:
        return []
    said = "replay.save is off" if not plan.cfg.replay.save else "no saved replay was found"
    return [f"replay: the resumed run refills {len(missing)} replay(s) from empty ({said})"]


def check_saved_replays(plan: Plan, run_dir: Path) -> None:
    """A resumed run's saved replays must fit its stores: otherwise one line naming the file and the difference."""
    for r in range(replays_per_policy(plan) * len(plan.policies)):
        path = saved_replay(run_dir, r)
        if not path.exists():
            continue
        try:
            difference = layout_difference(saved_layout(path), replay_spec(plan, r).describe())
        except ValueError as exc:
            raise ConfigError(f"replay.save: {exc}") from None
        if difference:
            raise ConfigError(
                f"replay.save: {path} does not fit this run: {difference} (resume with the settings it was saved "
                "with, or remove the file to refill the replay)"
            )


def saved_replay(run_dir: Path, replay: int) -> Path:
    """Where ``replay.save`` writes replay ``replay``: beside the checkpoints."""
    return run_dir / "checkpoints" / f"replay{replay}.npz"


def replay_batches(plan: Plan, fabric: Fabric, trainer: WorkerSpec, fresh: bool) -> ReplayBatches:
    """Trainer ``t``'s batches, from the replay that feeds it (``fresh``: the trainer starts the run, from no
    checkpoint)."""
    feeds = Endpoint(BATCHES, trainer.index)
    k = plan.policy_of_trainer(trainer.index)
    return ReplayBatches(
        fabric.buffers(feeds), fabric.channel(feeds), fabric.bell(feeds, 0), plan.policies[k].agents_per_env, fresh
    )


def replays_per_policy(plan: Layout) -> int:
    """Replays of each policy: one per trainer, or one per trainer node group (``replay.placement``)."""
    return plan.policy_nodes if plan.cfg.replay.placement == "node" else plan.cfg.workers.trainers


def replay_of_trainer(plan: Layout, trainer: int) -> int:
    """The replay that feeds trainer ``trainer`` (replays are numbered policy by policy, as trainers are)."""
    if plan.cfg.replay.placement == "trainer":
        return trainer
    return plan.policy_of_trainer(trainer) * plan.policy_nodes + plan.policy_trainer_node(trainer)


def trainers_of_replay(plan: Layout, replay: int) -> tuple[int, ...]:
    """The trainers replay ``replay`` feeds."""
    every = range(plan.cfg.workers.trainers * plan.policy_count)
    return tuple(t for t in every if replay_of_trainer(plan, t) == replay)


REPLAY = Role(
    "replay",
    count=lambda plan: replays_per_policy(plan) * plan.policy_count,
    builder="srl.replay.role:build_replay",
    seed_salt=8,
    group=lambda plan, r: trainer_group(plan.trainer_node(trainers_of_replay(plan, r)[0])),
    cpus=lambda plan: plan.cfg.ray.cpus_per_trainer,
    policy=lambda plan, r: r // replays_per_policy(plan),
    serves=lambda plan, r: (Endpoint(REFRESH, r),),
    hop=Hop(
        SEGMENTS,
        route=lambda plan, actor, policy: replay_of_trainer(plan, plan.trainer_of(actor, policy)),
        keeps=BATCHES,
        feeds=trainers_of_replay,
        batches="srl.replay.role:replay_batches",
    ),
    resumed="srl.replay.role:resumed",
    holds=lambda plan, r: {(Endpoint(BATCHES, t), 0): (FILLING,) for t in trainers_of_replay(plan, r)},
    report=Report("replay", "srl.replay.worker:ReplayReports"),
)
