"""Streams and workers with in-package fakes: auto-batching, in-place answers, malformed records, back-pressure."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

from srl.api.config import ExperimentConfig
from srl.api.schema import sample_schema
from srl.base import wire
from srl.base.channel import InProcChannel
from srl.base.seqlock import VersionedBuffer
from srl.system.control import ControlReceiver, DirectReporter, ZmqReporter
from srl.system.controller import Controller
from srl.system.params import ParamPublisher, ParamSubscriber
from srl.system.policy_worker import PolicyWorker
from srl.system.streams import (
    FILLING,
    FREE,
    READY,
    InferenceClient,
    InferenceServer,
    PoolLayout,
    SampleConsumer,
    SampleProducer,
    SegmentPool,
)
from srl.system.batches import SegmentBatches
from srl.system.testing import RandomPolicy

T, B = 4, 3


def make_pool(actors: int = 3, buffers: int = 2) -> SegmentPool:
    return make_pool_of(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(5), actors, buffers)


def make_pool_of(obs: gym.spaces.Space, action: gym.spaces.Space, actors: int = 3, buffers: int = 2) -> SegmentPool:
    schema = sample_schema(obs, action, RandomPolicy(None).output_fields())
    return SegmentPool.in_process(PoolLayout.of(schema, T, B, actors, buffers, slots=2))


def make_policy_worker(pool: SegmentPool, actors: int, max_batch: int = 64):
    requests = InProcChannel(5)
    replies = {a: InProcChannel(2) for a in range(actors)}
    policy = RandomPolicy(gym.spaces.Discrete(5))
    params = VersionedBuffer.in_process(policy.flat_size(), np.float32)
    ParamPublisher(params).publish(7, np.full(4, 7.0, np.float32))
    reports: list = []
    worker = PolicyWorker(
        0,
        [policy],
        InferenceServer([pool], requests, replies),
        [ParamSubscriber(params, policy)],
        DirectReporter(lambda *r: reports.append(r)),
        max_batch=max_batch,
        wait_timeout=0.0,
    )
    worker.setup()
    return worker, policy, requests, replies


def test_auto_batching_merges_requests_of_several_actors_into_one_forward_pass():
    pool = make_pool()
    worker, policy, requests, replies = make_policy_worker(pool, actors=3)
    for actor in range(3):
        pool.arrays["obs"][actor, 1, 2] = actor + 1.0
        InferenceClient(actor, [pool], requests, replies[actor]).request(0, slot=actor % 2, buffer=1, t=2)
    assert worker.poll() == 3
    assert policy.batch_sizes == [3 * B]  # one forward pass for all three actors
    for actor in range(3):
        client = InferenceClient(actor, [pool], requests, replies[actor])
        assert client.ready(8, 0.0).tolist() == [actor % 2]
        assert (pool.arrays["version"][actor, 1, 2] == 7).all()
        assert pool.arrays["logp"][actor, 1, 2] == pytest.approx(np.full(B, -np.log(5)))
        assert ((pool.arrays["actions"][actor, 1, 2] >= 0) & (pool.arrays["actions"][actor, 1, 2] < 5)).all()
    assert pool.arrays["version"][:, 0].max() == 0  # nothing else was written


def test_auto_batching_respects_the_cap_and_leaves_the_rest_pending():
    pool = make_pool(actors=3)
    worker, policy, requests, replies = make_policy_worker(pool, actors=3, max_batch=2)
    for actor in range(3):
        InferenceClient(actor, [pool], requests, replies[actor]).request(0, 0, 0, 0)
    worker.poll()
    worker.poll()
    assert policy.batch_sizes == [2 * B, 1 * B]


def test_malformed_inference_requests_are_dropped_not_served():
    pool = make_pool(actors=2, buffers=2)
    worker, policy, requests, replies = make_policy_worker(pool, actors=2)
    for bad in [(5, 0, 0, 0, 0), (-1, 0, 0, 0, 0), (0, 0, 2, 0, 0), (0, 0, 0, T, 0), (1, 0, -3, 1, 0), (0, 7, 0, 0, 0)]:
        requests.send(bad)
    requests.send((1, 1, 1, 1, 0))
    assert worker.poll() == 1
    assert policy.batch_sizes == [B]
    assert replies[1].recv(8, 0).tolist() == [[1, 0]]
    assert replies[0].recv(8, 0).size == 0


def test_a_repeated_request_supersedes_the_first_and_only_its_reply_counts():
    """A slot asks, then asks again (its policy worker may have died): only the newest ask is served,
    and a reply carrying an older ticket is ignored by the actor."""
    pool = make_pool(actors=1)
    worker, policy, requests, replies = make_policy_worker(pool, actors=1)
    client = InferenceClient(0, [pool], requests, replies[0])
    client.request(0, 1, 0, 0)
    client.request(0, 1, 0, 0)  # the repeat
    assert worker.poll() == 1 and worker.server.superseded == 1
    assert client.ready(8, 0.0).tolist() == [1]
    replies[0].send((1, 1))  # a late reply to the first ask (ticket 1; the slot is at ticket 2)
    replies[0].send((1, 2))
    assert client.ready(8, 0.0).tolist() == [1]


def test_a_policy_worker_serves_several_policies_one_batch_each_from_their_own_pools():
    """Two policies with other spaces: each request names its policy (``policy * ring + slot``), its observations
    are read from that policy's pool and answered there by that policy, one forward pass per policy."""
    pools = [make_pool(actors=2), make_pool_of(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(7), actors=2)]
    requests, replies = InProcChannel(5), {a: InProcChannel(2) for a in range(2)}
    policies = [RandomPolicy(gym.spaces.Discrete(5)), RandomPolicy(gym.spaces.Discrete(7))]
    subscribers = []
    for version, policy in zip((3, 9), policies):
        params = VersionedBuffer.in_process(policy.flat_size(), np.float32)
        ParamPublisher(params).publish(version, np.zeros(policy.flat_size(), np.float32))
        subscribers.append(ParamSubscriber(params, policy))
    worker = PolicyWorker(
        0, policies, InferenceServer(pools, requests, replies), subscribers, DirectReporter(lambda *r: None), 64
    )
    worker.setup()
    clients = [InferenceClient(a, pools, requests, replies[a]) for a in range(2)]
    clients[0].request(0, 1, 0, 0)
    clients[0].request(1, 1, 0, 0)
    clients[1].request(1, 0, 1, 2)
    assert worker.poll() == 3
    assert policies[0].batch_sizes == [B] and policies[1].batch_sizes == [2 * B]
    assert sorted(clients[0].ready(8, 0.0).tolist()) == [1, 2 + 1]  # policy 1's answer to slot 1 is 1 * ring + 1
    assert clients[1].ready(8, 0.0).tolist() == [2 + 0]
    assert (pools[0].arrays["version"][0, 0, 0] == 3).all() and (pools[1].arrays["version"][0, 0, 0] == 9).all()
    assert (pools[1].arrays["version"][1, 1, 2] == 9).all() and (pools[0].arrays["version"][1] == 0).all()
    assert pools[0].arrays["logp"][0, 0, 0] == pytest.approx(np.full(B, -np.log(5)))  # each policy its own
    assert pools[1].arrays["logp"][1, 1, 2] == pytest.approx(np.full(B, -np.log(7)))


def test_sample_stream_round_trip_and_back_pressure():
    pool = make_pool(actors=2, buffers=2)
    channel = InProcChannel(2)
    producer, consumer = SampleProducer(pool, 1, channel), SampleConsumer(pool, channel)
    first, second = producer.acquire(), producer.acquire()
    assert {first, second} == {0, 1}
    assert producer.acquire() is None  # both in use: back-pressure
    pool.arrays["rewards"][1, first] = 3.5
    producer.submit(first)
    assert pool.state[1, first] == READY and pool.state[1, second] == FILLING
    channel.send((9, 0))  # malformed: no such actor
    channel.send((0, 5))  # malformed: no such buffer
    channel.send((1, second))  # not submitted (still FILLING): a duplicate or forged record is ignored
    records = consumer.receive(8, 0.0)
    assert records.tolist() == [[1, first]]
    assert (pool.segment(1, first)["rewards"] == 3.5).all()
    consumer.release(1, first)
    assert pool.state[1, first] == FREE
    assert producer.acquire() == first


def test_a_hand_over_rings_its_rows_bell_once_and_taking_a_buffer_empties_it():
    """The bell is what a filler with no free buffer blocks on: a hand-over of buffers rings its row's (and no
    other's) once, after their flags are set, whatever state they go back in; taking a buffer empties the bell
    before the flags are read, so it never holds more rings than its row has buffers."""
    pool = make_pool(actors=2, buffers=2)
    channel, bells = InProcChannel(2), {0: InProcChannel(1), 1: InProcChannel(1)}
    producer, consumer = SampleProducer(pool, 1, channel, bell=bells[1]), SampleConsumer(pool, channel, bells=bells)
    first, second = producer.acquire(), producer.acquire()
    producer.submit(first)
    producer.submit(second)
    assert producer.acquire() is None and len(bells[1]) == 0
    assert consumer.receive(8, 0.0).tolist() == [[1, first], [1, second]]
    consumer.release(1, first)
    consumer.release(1, second, state=7)  # back to its filler in the state that one takes it in
    assert pool.state[1, first] == FREE and pool.state[1, second] == 7 and len(bells[1]) == 0
    consumer.ring()
    consumer.ring()  # nothing released since
    assert len(bells[1]) == 1 and len(bells[0]) == 0
    assert producer.acquire() == first and len(bells[1]) == 0


def test_a_record_that_outlived_its_hand_over_is_not_taken_twice():
    """A consumer that died left a record in the pipe; its restart's cleanup freed the buffer, which the actor
    filled and handed over again with a record of its own. Both records arrive together: the segment is taken
    once, and the buffer is not released a second time while its actor fills it again."""
    pool = make_pool(actors=1, buffers=2)
    channel = InProcChannel(2)
    producer, consumer = SampleProducer(pool, 0, channel), SampleConsumer(pool, channel)
    buf = producer.acquire()
    producer.submit(buf)  # record 1
    pool.state[0, buf] = FREE  # the restart's cleanup frees it; record 1 stays in the pipe
    assert producer.acquire() == buf
    pool.arrays["rewards"][0, buf] = 2.0
    producer.submit(buf)  # record 2, the same buffer
    batches = SegmentBatches(consumer, batch_segments=2, max_policy_lag=99)
    batches.setup()
    assert batches.fill(0, 0.0) == 2
    assert batches._filled == 1 and pool.state[0, buf] == FREE  # taken once, released once
    assert producer.acquire() == buf  # the actor refills it
    assert not consumer.holds(0, buf)  # a third, stale record would now be skipped, not taken mid-fill
    assert consumer.rejected == 0


def test_param_subscriber_only_moves_forward():
    policy = RandomPolicy(gym.spaces.Discrete(2))
    buffer = VersionedBuffer.in_process(4, np.float32)
    publisher, subscriber = ParamPublisher(buffer), ParamSubscriber(buffer, policy)
    assert not subscriber.refresh() and subscriber.current == -1
    publisher.publish(0, np.zeros(4, np.float32))
    publisher.publish(3, np.full(4, 3.0, np.float32))
    assert subscriber.refresh() and subscriber.current == 3
    assert not subscriber.refresh()
    with pytest.raises(ValueError):
        publisher.publish(2, np.full(4, 2.0, np.float32))
    assert policy.loaded == [3.0]


def test_control_channel_rejects_malformed_messages_and_keeps_running(tmp_path):
    got: list = []
    from conftest import reporting

    controller = reporting(Controller(ExperimentConfig(), None, time.time(), progress=None))

    def handler(kind, meta, arrays):
        controller.handle(kind, meta, arrays)  # the real consumer: raises on well-framed but wrong content
        got.append((kind, dict(meta), dict(arrays)))

    address = f"ipc://{tmp_path}/control"
    receiver = ControlReceiver(address, handler)
    sender = ZmqReporter(address)
    try:
        raw = sender._sock
        raw.send_multipart([b"\x00garbage"])
        raw.send_multipart(wire.encode("nonsense", {}, {"a": 1}))
        header, buf = wire.encode("actor", {"x": np.arange(4, dtype=np.int32)}, {"actor": 0})
        raw.send_multipart([header, bytes(buf)[:-1]])  # truncated buffer
        sender.report("actor", {"actor": 0})  # well framed, but no env_steps
        sender.report("trainer", {"trainer": 0, "version": 1}, {"lag_hist": np.ones(3, np.float32)})  # wrong dtype
        sender.report("actor", {"actor": 1, "env_steps": 10}, {"episode_returns": np.array([1.5], np.float32)})
        handled = 0
        for _ in range(40):
            handled += receiver.drain(0.05)
            if handled:
                break
        assert handled == 1 and receiver.rejected == 5
        kind, meta, arrays = got[0]
        assert kind == "actor" and meta == {"actor": 1, "env_steps": 10, "cpu_seconds": meta["cpu_seconds"]}
        assert arrays["episode_returns"].tolist() == [1.5]
        assert controller.env_steps == 10 and list(controller.tally.window) == [1.5]
    finally:
        sender.close()
        receiver.close()


def test_a_shared_pool_holds_fields_named_like_its_own_flags():
    """A global state travels as the field ``state``; the pool's buffer flags must not collide with it."""
    from srl.api.schema import Field, SampleSchema

    schema = SampleSchema(
        [Field("state", (3,), "float32"), Field("tickets", (), "int64"), Field("actions", (), "int64")]
    )
    layout = PoolLayout.of(schema, T, B, actors=2, buffers=2)
    pool = SegmentPool.shared(layout, f"srl_{__import__('os').getpid()}_fieldnames", create=True)
    try:
        pool.arrays["state"][...] = 1.5
        assert (pool.state == FREE).all() and pool.arrays["state"].shape == (2, 2, T, B, 3)
    finally:
        pool.close(unlink=True)
