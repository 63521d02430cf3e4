"""How workers wait: an actor whose slots are all parked and a replay with nothing to do block until a buffer
comes back (its pool row's bell rings), instead of waking every millisecond to look at the flags; and a buffer
handed back wakes them at once. Real pipes and shared memory (a local run's fabric), in this process.

The assertions never race a clock: an idle poll must block for at least its ``wait_timeout`` (a lower bound, which
a slow machine only lengthens), and a wake-up must come long before a ``wait_timeout`` of minutes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from srl.api.config import load_config
from srl.api.worker import TrainResult, Worker
from srl.runtime.build import build_worker
from srl.runtime.fabric import SharedFabric
from srl.runtime.plan import Plan, make_plan
from srl.replay.role import REPLAY, replay_batches
from srl.runtime.topology import ACTOR, TRAINER
from srl.system.control import ControlReceiver
from srl.system.params import ParamPublisher
from srl.system.streams import READY

DQN = "configs/cartpole_dqn.yaml"
IDLE_WAIT = 0.2
"""``wait_timeout`` of the idle polls measured: each must block this long."""
IDLE_POLLS = 3
LONG_WAIT = 120.0
"""``wait_timeout`` while a hand-back is due: a poll that only timed out would take this long."""


@pytest.fixture
def run() -> Iterator[tuple[Plan, SharedFabric]]:
    """A one-actor DQN run's fabric (one segment of 256 items fills ``min_size``), its controller end absorbing
    reports."""
    plan = make_plan(load_config(DQN, ["replay.min_size=256"]))
    fabric = SharedFabric(plan)
    fabric.create()
    receiver = ControlReceiver(fabric.control_address, lambda *report: None)
    try:
        yield plan, fabric
    finally:
        fabric.destroy()
        receiver.close()


def _build(plan: Plan, fabric: SharedFabric, role: object, wait_timeout: float) -> Worker:
    worker = build_worker(plan, fabric, plan.topology.get(role, 0), None, wait_timeout, report_interval=3600.0)
    worker.setup()
    return worker


def _idle_polls(worker: Worker) -> tuple[float, float]:
    """Wall and CPU seconds of :data:`IDLE_POLLS` polls with nothing to do."""
    worker.wait_timeout = IDLE_WAIT
    wall, cpu = time.monotonic(), time.thread_time()
    for _ in range(IDLE_POLLS):
        assert worker.poll() == 0
    return time.monotonic() - wall, time.thread_time() - cpu


def _poll_while(worker: Worker, hand_back: Callable[[], None]) -> float:
    """Seconds one poll with a long ``wait_timeout`` blocks while another thread hands a buffer back."""
    worker.wait_timeout = LONG_WAIT
    later = threading.Timer(0.2, hand_back)
    later.start()
    try:
        t0 = time.monotonic()
        worker.poll()
        return time.monotonic() - t0
    finally:
        later.join()


def _assert_idle_polls_block(worker: Worker) -> None:
    wall, cpu = _idle_polls(worker)
    assert wall >= 0.9 * IDLE_POLLS * IDLE_WAIT, f"{IDLE_POLLS} idle polls returned after {wall:.3f} s"
    assert cpu <= 0.1 * wall, f"{cpu:.3f} CPU seconds over {wall:.3f} s of waiting"


def test_a_replay_with_nothing_to_do_sleeps_until_its_trainer_hands_a_batch_back(run) -> None:
    plan, fabric = run
    replay = _build(plan, fabric, REPLAY, wait_timeout=0.0)
    producer = fabric.sample_producers(0)[0]
    producer.submit(producer.acquire())  # one segment: min_size
    replay.poll()  # inserts it, fills both of the trainer's batch buffers
    batches = replay_batches(plan, fabric, plan.topology.get(TRAINER, 0), fresh=True)
    state = batches.consumer.pool.state[0]
    assert state.tolist() == [READY, READY]
    _assert_idle_polls_block(replay)  # both batches wait for the trainer, no segment comes: nothing to do

    def train_one() -> None:
        assert batches.fill(0, 0.0) == 1
        batches.done(TrainResult({}))

    assert _poll_while(replay, train_one) < LONG_WAIT / 4
    if state.tolist() != [READY, READY]:  # the hand-back woke it; what it handed back is sampled again
        replay.poll()
    assert state.tolist() == [READY, READY]
    replay.teardown()


def test_an_actor_whose_slots_are_all_parked_sleeps_until_a_buffer_comes_back(run) -> None:
    plan, fabric = run
    ParamPublisher(fabric.params()).publish(0, plan.policies[0].acting_policy().flat_state())
    actor = _build(plan, fabric, ACTOR, wait_timeout=0.0)
    while len(actor.parked) < actor.ring_size:  # fill every buffer of its row
        actor.poll()
    _assert_idle_polls_block(actor)
    replay = fabric.segment_source(plan.topology.get(REPLAY, 0))
    records = replay.receive(8, 0.0)
    assert len(records) == plan.cfg.workers.buffers_per_actor

    def take_one() -> None:
        replay.release(*(int(x) for x in records[0]))
        replay.ring()

    assert _poll_while(actor, take_one) < LONG_WAIT / 4
    actor.poll()
    assert len(actor.parked) == actor.ring_size - 1  # it took the buffer
    assert np.count_nonzero(fabric.pool().state[0] == READY) == len(records) - 1
    actor.teardown()
