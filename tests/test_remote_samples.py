"""The sample stream across nodes (ZeroMQ TCP on loopback) and the run token on every network receiver."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
import zmq

from srl.api.schema import Field, sample_schema
from srl.base import wire
from srl.system.control import ControlReceiver, ZmqReporter
from srl.system.remote_samples import SEGMENT, SampleReceiver, SampleSender
from srl.system.streams import FREE, PoolLayout, SegmentPool

TOKEN = "a" * 32


@pytest.fixture
def ends():
    ctx = zmq.Context()
    pool = SegmentPool.in_process(PoolLayout.of(_schema(4), 8, 2, actors=2, buffers=3, slots=2))
    receiver = SampleReceiver(pool.layout.fields, "tcp://127.0.0.1:*", TOKEN, ctx, queue=8)
    sender = SampleSender(pool, 1, 7, receiver.address, TOKEN, ctx)
    yield pool, sender, receiver, ctx
    sender.close()
    receiver.close()
    ctx.destroy(linger=0)


def _schema(obs_dim: int):
    return sample_schema(gym.spaces.Box(-1, 1, (obs_dim,)), gym.spaces.Discrete(2), [Field("logp", (), "float32")])


def _receive(receiver: SampleReceiver, n: int, timeout: float = 5.0) -> np.ndarray:
    got, deadline = [], time.monotonic() + timeout
    while sum(len(r) for r in got) < n and time.monotonic() < deadline:
        got.append(receiver.receive(n, 0.05))
    return np.concatenate(got) if got else np.zeros((0, 2), np.int32)


def _until(cond, what: str, timeout: float = 5.0) -> None:
    """Until ``cond()`` holds (the network's background threads move things along); fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _acquire(sender: SampleSender, what: str = "no buffer came back", timeout: float = 5.0) -> int:
    """A buffer from ``sender``, waiting for one to come back (a credit) at most ``timeout``."""
    deadline = time.monotonic() + timeout
    while (buf := sender.acquire()) is None:
        assert time.monotonic() < deadline, what
        time.sleep(0.005)
    return buf


def _fill(pool: SegmentPool, sender: SampleSender, row: int, value: float) -> int:
    buf = _acquire(sender)
    for arr in pool.segment(row, buf).values():
        arr[...] = value
    sender.submit(buf)
    return buf


def test_segments_arrive_intact_and_their_buffers_come_back_with_the_trainers_credit(ends):
    pool, sender, receiver, _ = ends
    for value in (1.0, 2.0):
        _fill(pool, sender, 1, value)
    records = _receive(receiver, 2)
    assert len(records) == 2
    assert not (pool.state[1] == FREE).all()  # received, not yet taken: the buffers are still the sender's
    seen = sorted(float(receiver.segment(*r)["obs"].mean()) for r in records.tolist())
    assert seen == [1.0, 2.0]
    assert set(receiver.segment(*records[0].tolist())) == set(pool.layout.fields)
    for r in records.tolist():
        receiver.release(*r)
    _until(lambda: sender.flush() or (pool.state[1] == FREE).all(), "the credits did not come back")
    assert receiver.received == 2 and receiver.rejected == 0 and sender.rejected == 0
    assert (pool.state[0] == FREE).all()  # another actor's row was never touched


def test_a_sender_has_no_more_segments_out_than_its_pool_row_holds(ends):
    """The trainer reads nothing (busy with its update): after as many segments as the row has buffers the actor
    gets no buffer, however much room the network has; each segment the trainer takes gives one back, at once
    (the next one goes out on its submit, not a segment later). So the policy lag is bounded as inside a node."""
    pool, sender, receiver, _ = ends
    buffers = pool.layout.buffers
    for _ in range(buffers):
        _fill(pool, sender, 1, 0.0)
    _until(lambda: sender.flush() or sender.unsent == 0, "the segments did not go out")
    for _ in range(20):  # as long as one cares to look: nothing comes back
        assert sender.acquire() is None
    assert sender.awaiting == buffers
    for i in range(20):  # the trainer takes one; its buffer comes back and the next segment goes out on submit
        (record,) = _receive(receiver, 1).tolist()
        receiver.release(*record)
        sender.submit(_acquire(sender, f"no buffer back after segment {i}"))
        assert sender.sent == buffers + i + 1 and sender.awaiting == buffers, f"segment {i} was held back"


def test_a_parked_sender_sleeps_on_its_bell_until_the_trainer_takes_a_segment(ends):
    """Every buffer is out: the actor blocks on the sender's bell (the socket's descriptor) for as long as it is
    told to, instead of looking every millisecond; the trainer's credit wakes it and the next acquire hands out
    the buffer that came back."""
    from srl.base.channel import wait_any

    pool, sender, receiver, _ = ends
    for _ in range(pool.layout.buffers):
        _fill(pool, sender, 1, 0.0)
    records = _receive(receiver, pool.layout.buffers)
    assert sender.acquire() is None and sender.bell is not None and sender.bell.fileno() is not None
    t0 = time.monotonic()
    assert wait_any([sender.bell], 0.3) == []  # nothing moved: it sleeps the whole timeout
    assert time.monotonic() - t0 >= 0.25
    receiver.release(*records[0].tolist())
    woke = None
    deadline = time.monotonic() + 5.0
    while woke is None and time.monotonic() < deadline:
        if wait_any([sender.bell], 2.0):
            woke = sender.acquire()
    assert woke is not None


def test_a_trainer_that_dies_gives_the_segments_it_held_back_to_their_sender(ends):
    """The trainer received segments and died before taking them: their credits will never come, so when the
    connection drops the sender frees those buffers (counted as lost); a trainer that binds the address again
    gets the next segments, and its credits free them as before."""
    pool, sender, receiver, ctx = ends
    for _ in range(pool.layout.buffers):
        _fill(pool, sender, 1, 0.0)
    assert len(_receive(receiver, pool.layout.buffers)) == pool.layout.buffers
    assert sender.acquire() is None
    address = receiver.address
    receiver.close()  # its process died: the connection drops
    buf = _acquire(sender, "the lost segments' buffers did not come back")
    assert sender.lost == pool.layout.buffers and sender.awaiting == 0
    again = SampleReceiver(pool.layout.fields, address, TOKEN, ctx, queue=8)
    try:
        sender.submit(buf)
        (record,) = _receive(again, 1).tolist()
        again.release(*record)
        _until(lambda: sender.flush() or sender.awaiting == 0, "the new trainer's credit did not come back")
    finally:
        again.close()


def test_sample_messages_without_the_token_or_malformed_are_rejected_and_the_receiver_keeps_going(ends):
    pool, sender, receiver, ctx = ends
    intruder = ctx.socket(zmq.DEALER)
    intruder.setsockopt(zmq.LINGER, 0)
    intruder.connect(receiver.address)
    segment = {name: np.zeros(spec.shape, spec.dtype) for name, spec in pool.layout.fields.items()}
    ok = {"token": TOKEN, "actor": 0, "buffer": 0, "seq": 1}
    bad = [
        wire.encode(SEGMENT, segment, {**ok, "token": None}),  # no token
        wire.encode(SEGMENT, segment, {**ok, "token": "b" * 32}),  # another run's token
        [b"\x00garbage"],  # not a message at all
        wire.encode(SEGMENT, {**segment, "obs": np.zeros((3, 3), np.float32)}, ok),  # wrong shape
        wire.encode("param_get", {}, {"token": TOKEN}),  # wrong kind
        wire.encode(SEGMENT, segment, {**ok, "seq": "1"}),  # no credit could name it
    ]
    for frames in bad:
        intruder.send_multipart(frames)
    buf = sender.acquire()
    pool.segment(1, buf)["rewards"][...] = 3.0
    sender.submit(buf)
    deadline = time.monotonic() + 5.0
    good = np.zeros((0, 2), np.int32)
    while (receiver.rejected < len(bad) or not len(good)) and time.monotonic() < deadline:
        got = receiver.receive(8, 0.05)
        good = got if len(got) else good
    assert receiver.rejected == len(bad)
    assert len(good) == 1 and float(receiver.segment(*good[0].tolist())["rewards"].mean()) == 3.0
    intruder.close()


def test_reports_without_the_run_token_are_rejected(tmp_path):
    got = []
    receiver = ControlReceiver(
        "tcp://127.0.0.1:*", lambda kind, meta, arrays: got.append((kind, dict(meta))), token=TOKEN
    )
    good, intruder = ZmqReporter(receiver.address, token=TOKEN), ZmqReporter(receiver.address)
    other = ZmqReporter(receiver.address, token="b" * 32)
    try:
        intruder.report("error", {"worker": "trainer0", "message": "stop the run"})
        other.report("actor", {"actor": 0, "env_steps": 10**9})
        good.report("info", {"worker": "actor0", "message": "hello"})
        deadline = time.monotonic() + 5.0
        while (not got or receiver.rejected < 2) and time.monotonic() < deadline:
            receiver.drain(0.05)
        assert len(got) == 1 and got[0][0] == "info" and "token" not in got[0][1]  # the token is not passed on
        assert {k: v for k, v in got[0][1].items() if k != "cpu_seconds"} == {"worker": "actor0", "message": "hello"}
        assert 0 < got[0][1]["cpu_seconds"] <= time.process_time()  # what the sending process spent
        assert receiver.rejected == 2
    finally:
        for r in (good, intruder, other):
            r.close()
        receiver.close()


def test_a_dict_observation_schema_crosses_intact_field_by_field():
    """Every declared field (observation parts, a segment-scoped field) travels in its own dtype and shape."""
    from srl.api.schema import Scope
    from srl.envs.testing import goal_grid

    env = goal_grid()
    schema = sample_schema(
        env.observation_space,
        env.action_space,
        [Field("logp", (), "float32"), Field("h0", (3,), "float32", Scope.SEGMENT)],
    )
    ctx = zmq.Context()
    pool = SegmentPool.in_process(PoolLayout.of(schema, 4, 2, actors=1, buffers=2, slots=1))
    receiver = SampleReceiver(pool.layout.fields, "tcp://127.0.0.1:*", TOKEN, ctx, queue=4)
    sender = SampleSender(pool, 0, 0, receiver.address, TOKEN, ctx)
    try:
        rng = np.random.default_rng(0)
        buf = sender.acquire()
        sent = {}
        for name, arr in pool.segment(0, buf).items():
            arr[...] = rng.integers(0, 2, arr.shape) if arr.dtype == bool else rng.integers(0, 3, arr.shape)
            sent[name] = arr.copy()
        sender.submit(buf)
        records, deadline = np.zeros((0, 2), np.int32), time.monotonic() + 5.0
        while not len(records) and time.monotonic() < deadline:
            sender.flush()  # until the connection is up, the segment waits in its buffer (the actor's acquire does this)
            records = receiver.receive(1, 0.05)
        assert len(records) == 1
        got = receiver.segment(*records[0].tolist())
        assert set(got) == set(sent) >= {"obs.goal", "obs.position", "final_obs.goal", "actions", "h0"}
        for name, value in sent.items():
            assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
            np.testing.assert_array_equal(got[name], value)
        assert got["h0"].shape == (1, 2, 3) and got["obs.position"].shape == (5, 2, 2)
    finally:
        sender.close()
        receiver.close()
        ctx.destroy(linger=0)


def test_a_stage_forwards_staged_buffers_across_nodes_and_holds_them_until_the_trainer_takes_them(ends):
    """A stage's forwarder sends a kept buffer of its row from where it is (STAGED in the pool) and frees it once the
    trainer's credit for it is back; until the segment is out ``flush`` says something still waits."""
    from srl.system.remote_samples import RemoteForwarder
    from srl.system.streams import STAGED

    pool, sender, receiver, _ = ends
    forwarder = RemoteForwarder({1: sender})
    pool.state[1, 2] = STAGED
    pool.segment(1, 2)["rewards"][...] = 5.0
    forwarder.forward(1, 2)
    _until(forwarder.flush, "the kept segment did not go out")
    (record,) = _receive(receiver, 1).tolist()
    assert float(receiver.segment(*record)["rewards"].mean()) == 5.0
    assert pool.state[1, 2] != FREE  # out, not yet taken
    receiver.release(*record)
    _until(lambda: forwarder.flush() and pool.state[1, 2] == FREE, "the credit did not free the buffer")


def test_record_channels_cross_nodes_with_the_token_and_never_block_their_writer():
    """A bound kind's channel across nodes (the population's episodes and commands): records arrive whole and in
    order, a read takes only what it asks for and keeps the rest, a message without the run's token or of the
    wrong width is dropped and counted, and a writer whose reader is away drops and counts instead of blocking."""
    from srl.system.remote_records import RecordReader, RecordWriter

    ctx = zmq.Context.instance()
    reader = RecordReader(5, "tcp://127.0.0.1:*", "token", ctx)
    writer = RecordWriter(5, reader.address, "token", ctx)
    try:
        writer.send(np.arange(10).reshape(2, 5))
        writer.send((10, 11, 12, 13, 14))
        for bad, record in ((RecordWriter(5, reader.address, "wrong", ctx), (1, 2, 3, 4, 5)),
                            (RecordWriter(4, reader.address, "token", ctx), (1, 2, 3, 4))):  # fmt: skip
            bad.send(record)
            bad.close()
        got = [reader.recv(1, 5.0)]
        while sum(len(g) for g in got) < 3:
            got.append(reader.recv(10, 5.0))
        assert len(got[0]) == 1 and np.concatenate(got).tolist() == np.arange(15).reshape(3, 5).tolist()
        deadline = time.monotonic() + 5.0
        while reader.rejected < 2 and time.monotonic() < deadline:
            assert not len(reader.recv(10, 0.1))
        assert reader.rejected == 2 and reader.received == 3
        with pytest.raises(TypeError):
            reader.send((0, 0, 0, 0, 0))
        nobody = RecordWriter(5, "tcp://127.0.0.1:9", "token", ctx, queue=2)  # nothing listens there
        for _ in range(10):
            nobody.send((1, 1, 1, 1, 1))
        assert nobody.dropped >= 6 and nobody.sent + nobody.dropped == 10
        nobody.close()
    finally:
        writer.close()
        reader.close()


def test_a_mailbox_carries_a_state_of_tens_of_megabytes_from_another_process_and_drops_strangers(tmp_path):
    """A mailbox (a population's commands and answers): a 48 MB payload written by another process arrives whole
    with its meta; a message without the run's token, or not of the mailbox's schema, is dropped and counted; a
    reader restarted on the same ipc path gets what its writer sends (what went out as the old one closed may be
    lost: a protocol over mail sends again what was not answered)."""
    import multiprocessing

    from srl.system.remote_records import MailReader, MailWriter

    address = f"ipc://{tmp_path}/mail_test"
    ctx = zmq.Context.instance()
    reader = MailReader(address, "token", ctx)
    payload = np.random.default_rng(0).integers(0, 256, 48 << 20, dtype=np.uint8).tobytes()
    spawn = multiprocessing.get_context("spawn")
    received = spawn.Event()  # the writer's process lives until its message is in: its socket's linger is short
    child = spawn.Process(target=_send_mail, args=(address, payload, received))
    child.start()
    try:
        stranger = MailWriter(address, "wrong", ctx)
        stranger.send({"op": "state", "seq": 1})
        odd = ctx.socket(zmq.PUSH)
        odd.connect(address)
        odd.send_multipart([b"not a wire message"])
        got: list = []
        deadline = time.monotonic() + 60.0
        while not got and time.monotonic() < deadline:
            got = reader.recv(1.0)
        assert [(meta, len(data)) for meta, data in got] == [({"op": "state", "seq": 7, "member": 2}, len(payload))]
        assert got[0][1] == payload
        received.set()
        while reader.rejected < 2 and time.monotonic() < deadline:
            assert reader.recv(0.1) == []
        assert reader.rejected == 2
        child.join(30.0)
        assert child.exitcode == 0
        writer = MailWriter(address, "token", ctx)
        reader.close()
        again = MailReader(address, "token", ctx)  # a restarted reader: the same address
        got = []
        while not got and time.monotonic() < deadline:  # what went out as the old reader closed is lost: sent again
            writer.send({"seq": 8}, b"x")
            got = again.recv(0.2)
        assert got[0] == ({"seq": 8}, b"x")
        for end in (writer, again, stranger, odd):
            end.close()
    finally:
        received.set()
        child.join(5.0)
        if child.is_alive():
            child.kill()


def _send_mail(address: str, payload: bytes, received) -> None:
    from srl.system.remote_records import MailWriter

    writer = MailWriter(address, "token", zmq.Context.instance())
    writer.send({"op": "state", "seq": 7, "member": 2}, payload)
    received.wait(120.0)
    writer.close()


def test_segments_lost_across_nodes_are_counted_as_dropped_across_an_actors_restarts() -> None:
    """What an actor's senders lost (the trainer's connection dropped before it took them) is in the run's
    ``dropped_segments``, and stays there when the actor starts again and counts from 0."""
    import time

    from srl.api.config import load_config
    from srl.system.controller import Controller

    from conftest import reporting

    controller = reporting(Controller(load_config("configs/cartpole_ppo.yaml"), None, time.time(), progress=None))
    controller.handle("actor", {"worker": "actor0", "env_steps": 64, "lost_segments": 3}, {})
    controller.note_restart("actor0", "killed", dropped_segments=1)
    controller.handle("actor", {"worker": "actor0", "env_steps": 32, "lost_segments": 2}, {})
    assert controller.summary(None)["dropped_segments"] == 3 + 1 + 2


def test_a_mailbox_in_a_pipe_folder_too_deep_for_a_socket_path_still_binds_and_leaves_no_file(tmp_path):
    """A Unix socket's path holds 107 bytes: a mailbox of a pipe folder deeper than that (a long TMPDIR) is a Linux
    abstract socket named after its path instead, reached the same way by every worker; a short one stays a file
    in the folder."""
    from srl.base.channel import IPC_PATH_MAX, ipc_address
    from srl.system.remote_records import MailReader, MailWriter

    assert ipc_address(tmp_path, "mail_x") == f"ipc://{tmp_path}/mail_x"
    deep = tmp_path / ("d" * (IPC_PATH_MAX - len(str(tmp_path))))
    deep.mkdir()
    address = ipc_address(deep, "mail_refresh0")
    assert address.startswith("ipc://@srl-") and address == ipc_address(deep, "mail_refresh0")
    assert address != ipc_address(deep, "mail_refresh1")
    ctx = zmq.Context.instance()
    reader, writer = MailReader(address, "token", ctx), MailWriter(address, "token", ctx)
    try:
        got: list = []
        deadline = time.monotonic() + 30.0
        while not got and time.monotonic() < deadline:
            writer.send({"seq": 1}, b"x")
            got = reader.recv(0.2)
        assert got[0] == ({"seq": 1}, b"x")
        assert not list(deep.iterdir())
    finally:
        writer.close()
        reader.close()
