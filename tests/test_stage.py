"""A stage between actors and trainers: its wiring in the topology, its decisions, and what a dead one held."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from srl.api.config import ConfigError, load_config
from srl.api.stage import StageContext
from srl.runtime.build import build_worker
from srl.runtime.fabric import InlineFabric, SharedFabric
from srl.runtime.plan import Plan, make_plan
from srl.runtime.ray_fabric import Endpoints, NodeFabric
from srl.runtime.topology import ACTOR, TRAINER, Endpoint, Stream
from srl.stage.role import STAGE, SUBMITTED
from srl.stage.worker import StageWorker
from srl.system.streams import FILLING, FREE, READY, STAGED

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "fresh_segments.yaml"


def _plan(*overrides: str) -> Plan:
    return make_plan(load_config(EXAMPLE, list(overrides)))


def test_actors_submit_to_a_stage_of_their_node_which_feeds_their_trainers():
    topology = _plan("workers.actors=4", "workers.trainers=2", "stage.per_node=2").topology
    names = [w.name for w in topology.workers]
    assert names.index("stage0") < names.index("actor0")  # it serves them: it starts first
    for a in range(4):
        actor = topology.get(ACTOR, a)
        assert actor.connection(SUBMITTED) == Endpoint(SUBMITTED, a % 2)
        assert actor.connection(Stream.SAMPLES) is None
    # stage s serves actors s and s + 2, which feed trainers s and s (a % 2); it reads the version of the newest
    # snapshot where its policy worker reads it
    assert topology.get(STAGE, 0).connects == (Endpoint(Stream.SAMPLES, 0), Endpoint(Stream.SNAPSHOTS))
    assert [w.name for w in topology.clients_of(Endpoint(Stream.SAMPLES, 1))] == ["stage1"]
    one = _plan("workers.actors=4", "workers.trainers=2", "stage.per_node=1").topology
    assert one.get(STAGE, 0).connects[:2] == (Endpoint(Stream.SAMPLES, 0), Endpoint(Stream.SAMPLES, 1))


def test_under_ray_each_actor_node_has_its_own_stages():
    topology = _plan(
        "runtime=ray", "ray.actor_nodes=2", "ray.actors_per_node=2", "ray.policy_workers_per_node=1"
    ).topology
    stages = topology.of(STAGE)
    assert [(w.name, w.group) for w in stages] == [("stage0", 0), ("stage1", 1)]
    assert [w.connection(Stream.SNAPSHOTS) for w in stages] == [Endpoint(Stream.SNAPSHOTS, g) for g in range(2)]
    for a in range(4):
        assert topology.get(ACTOR, a).connection(SUBMITTED) == Endpoint(SUBMITTED, a // 2)


def test_a_stage_needs_an_actor_and_a_class_that_exists():
    with pytest.raises(ConfigError, match=r"stage\.per_node: each stage worker needs an actor"):
        load_config(EXAMPLE, ["stage.per_node=3"])
    with pytest.raises(ConfigError, match=r"stage\.worker: 'examples.fresh_segments' has no attribute 'Nope'"):
        _plan("stage.worker=examples.fresh_segments:Nope")


class _KeepEven:
    """Keeps segments whose first reward is even: the test writes the reward."""

    def __init__(self, ctx: StageContext) -> None:
        self.ctx = ctx

    def keep(self, segment: Mapping[str, np.ndarray]) -> bool:
        return int(segment["rewards"][0, 0]) % 2 == 0

    def metrics(self) -> Mapping[str, float]:
        return {"index": float(self.ctx.index)}


def _submit(fabric, actor: int, reward: float) -> int:
    [producer] = fabric.sample_producers(actor)
    buf = producer.acquire()
    assert buf is not None
    fabric.pool().segment(fabric.plan.actor_row(actor), buf)["rewards"][...] = reward
    producer.submit(buf)
    return buf


def test_kept_segments_reach_their_trainer_in_place_and_dropped_ones_are_free_again():
    plan = _plan("runtime=inline", "workers.actors=2", "stage.worker=tests.test_stage:_KeepEven")
    reports: list = []
    fabric = InlineFabric(plan, lambda kind, meta, arrays: reports.append((kind, dict(meta))))
    stage = build_worker(plan, fabric, plan.topology.get(STAGE, 0), None, wait_timeout=0.0, report_interval=0.0)
    assert isinstance(stage, StageWorker)
    stage.setup()
    kept, dropped = _submit(fabric, 0, 2.0), _submit(fabric, 1, 3.0)
    state = fabric.pool().state
    assert state[0, kept] == STAGED and state[1, dropped] == STAGED
    trainer = fabric.sample_consumer(0)
    assert len(trainer.receive(8, 0.0)) == 0  # nothing reaches the trainer before the stage has decided
    assert stage.poll() == 2
    assert state[0, kept] == READY and state[1, dropped] == FREE
    records = trainer.receive(8, 0.0)
    assert records.tolist() == [[0, kept]]
    assert trainer.segment(0, kept)["rewards"][0, 0] == 2.0  # the actor's buffer itself: nothing was copied
    fabric.channel(Endpoint(SUBMITTED, 0)).send(
        (0, kept)
    )  # a repeated record for a buffer the stage passed on is ignored
    assert stage.poll() == 0
    stage.teardown()
    kind, meta = reports[-1]
    assert kind == "stage" and meta["kept"] == 1 and meta["dropped"] == 1 and meta["stage_index"] == 0.0


def _hold(state: np.ndarray, row: int, states: list[int]) -> None:
    state[row, : len(states)] = states


def test_a_dead_stage_frees_what_was_submitted_to_it_and_nothing_its_trainer_holds():
    plan = _plan("workers.actors=2", "workers.trainers=2", "workers.sample_buffers=4")
    fabric = SharedFabric(plan)
    fabric.create()
    try:
        state = fabric.pool().state
        for row in range(2):
            _hold(state, row, [FILLING, STAGED, READY, FREE])
        topology = plan.topology
        assert fabric.free_buffers(topology.get(STAGE, 0)) == 2  # both actors submit to stage0
        assert state.tolist() == [[FILLING, FREE, READY, FREE]] * 2
        assert fabric.free_buffers(topology.get(TRAINER, 1)) == 1  # actor 1's segment handed on to trainer 1
        assert fabric.free_buffers(topology.get(ACTOR, 0)) == 1  # what it was filling
        assert state.tolist() == [[FREE, FREE, READY, FREE], [FILLING, FREE, FREE, FREE]]
    finally:
        fabric.destroy()


@pytest.mark.parametrize("stage", [True, False])
def test_across_nodes_whoever_sends_a_row_holds_its_ready_buffers(stage):
    """Under Ray a READY buffer of an actor node waits to be sent: by the stage when there is one, else by the
    actor itself."""
    overrides = ["runtime=ray", "ray.actor_nodes=1", "ray.actors_per_node=2", "workers.sample_buffers=4"]
    plan = _plan(*overrides, *([] if stage else ["stage.worker=null"]))
    fabric = NodeFabric(plan, 0, Endpoints("tcp://127.0.0.1:1", "t"), "127.0.0.1")
    fabric.create()
    try:
        state = fabric.pool().state
        _hold(state, 0, [FILLING, STAGED, READY, FREE])
        if stage:
            assert fabric.free_buffers(plan.topology.get(ACTOR, 0)) == 1
            assert fabric.free_buffers(plan.topology.get(STAGE, 0)) == 2
        else:
            assert fabric.free_buffers(plan.topology.get(ACTOR, 0)) == 2  # its STAGED one cannot exist here
        assert state[0].tolist() == [FREE, FREE if stage else STAGED, FREE, FREE]
        assert fabric.free_buffers(plan.topology.get(TRAINER, 0)) == 0  # segments left as copies
    finally:
        fabric.destroy()
