"""Building a replay: its store, its worker, its trainer's batch buffers, from the plan.

The replay role (``runtime/topology.py``: ``REPLAY``) names these functions. A
replay's sampling settings are the algorithm's (``batch_size``, ``nstep``,
``gamma`` of the algorithm's typed settings: every algorithm that learns from a
replay declares them), its storage settings the ``replay`` section.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from srl.api.config import ConfigError
from srl.api.schema import FieldSpec
from srl.api.worker import Worker
from srl.runtime.topology import Endpoint, Stream, WorkerSpec, replay_of_trainer, replays_per_policy, trainers_of_replay
from srl.system.replay_file import layout_difference, saved_layout
from srl.system.replay_store import ReplaySpec, ReplayStore
from srl.system.replay_worker import INSERTED, PRIORITIES, ReplayBatches, ReplayWorker, Sampling
from srl.system.streams import PoolLayout
from srl.wiring import algorithm_settings

if TYPE_CHECKING:
    from srl.runtime.build import BuildContext
    from srl.runtime.fabric import Fabric
    from srl.runtime.plan import Plan

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
    """The store of replay ``replay``: chunks of its policy's segments, as the ``replay`` section shapes it."""
    k = replay // replays_per_policy(plan)
    return ReplaySpec.of(plan.policies[k].layout, plan.cfg.replay, sampling(plan, k).batch_size)


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
"""The opener the ``REPLAY`` stream kind names (``srl.runtime.replay:STORE``)."""


def build_replay(ctx: BuildContext) -> Worker:
    """Replay ``r``: its actors' segments in, batches out to each trainer it feeds."""
    from srl.runtime.build import worker_seed

    plan, fabric, worker = ctx.plan, ctx.fabric, ctx.worker
    r = worker.index
    k = r // replays_per_policy(plan)
    feeds = [Endpoint(Stream.BATCHES, t) for t in trainers_of_replay(plan, r)]
    return ReplayWorker(
        r,
        fabric.storage(Endpoint(Stream.REPLAY, r)),
        fabric.segment_source(worker),
        [(fabric.buffers(e), fabric.channel(e), fabric.bell(e, 0)) for e in feeds],
        ctx.reporter,
        sampling(plan, k),
        # its share of the run's env steps: the replays of a policy split its actors between them
        total_env_steps=max(1, plan.cfg.run.total_env_steps // replays_per_policy(plan)),
        agents_per_env=plan.policies[k].agents_per_env,
        seed=worker_seed(plan, worker.role, r),
        wait_timeout=ctx.wait_timeout,
        report_interval=max(ctx.report_interval, 0.5),
        save_path=saved_replay(ctx.run_dir, r) if plan.cfg.replay.save and ctx.run_dir is not None else None,
        save_interval=plan.cfg.run.checkpoint_interval_seconds,
        load=plan.resume is not None and ctx.incarnation == 0,
    )


def check_saved_replays(plan: Plan, run_dir: Path) -> None:
    """A resumed run's saved replays must fit its stores: otherwise one line naming the file and the difference
    (before anything starts; a replay worker that failed to load would go on empty)."""
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
    feeds = Endpoint(Stream.BATCHES, trainer.index)
    k = plan.policy_of_trainer(trainer.index)
    return ReplayBatches(
        fabric.buffers(feeds), fabric.channel(feeds), fabric.bell(feeds, 0), plan.policies[k].agents_per_env, fresh
    )
