"""The networked parameter service: long-poll delivery, root egress counts, tokens, malformed messages."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import zmq

from srl.base import transfer, wire
from srl.base.seqlock import VersionedBuffer
from srl.system.param_service import ParamServer, ParamServiceWorker, RemoteSnapshot

SIZE = 1000
TOKEN = "run-token"


def _pump(server: ParamServer | None, clients: list[RemoteSnapshot], until, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        if server is not None:
            server.poll()
        for c in clients:
            c.pump()
        time.sleep(0.001)


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.term()


def test_readers_get_each_new_version_and_root_counts_one_send_per_reader(ctx, tmp_path) -> None:
    root = VersionedBuffer.in_process(SIZE, np.float32)
    server = ParamServer(ctx, root, SIZE, f"ipc://{tmp_path}/root", TOKEN)
    readers = [RemoteSnapshot(ctx, server.address, SIZE, TOKEN) for _ in range(3)]
    try:
        for version in range(3):
            root.write(version, np.full(SIZE, version + 0.5, np.float32))
            _pump(server, readers, lambda: all(r.version() == version for r in readers))
        out = np.empty(SIZE, np.float32)
        assert readers[0].read_into(out, 1) == 2 and np.all(out == 2.5)
        assert readers[0].read_into(out, 2) is None
        assert server.sends == 9 and server.bytes_sent == 9 * SIZE * 4
    finally:
        for r in readers:
            r.close()
        server.close()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_relay_tree_root_sends_once_per_relay(ctx, tmp_path, dtype) -> None:
    """root -> relay (mirrors into its node buffer, serves 4 readers): the root sends once per version, and a
    16-bit snapshot arrives as the one rounding of the trainer's floats (the relay's re-packing is exact)."""
    root = VersionedBuffer.in_process(SIZE, np.float32)
    server = ParamServer(ctx, root, SIZE, f"ipc://{tmp_path}/root", TOKEN, transfer_dtype=dtype)
    node = VersionedBuffer.in_process(SIZE, np.float32)
    relay = ParamServiceWorker(
        "relay0",
        RemoteSnapshot(ctx, server.address, SIZE, TOKEN, dtype),
        SIZE,
        reporter=_Sink(),
        server_address=f"ipc://{tmp_path}/relay0",
        token=TOKEN,
        mirror=node,
        transfer_dtype=dtype,
        wait_timeout=0.0,
        ctx=ctx,
    )
    relay.setup()
    readers = [RemoteSnapshot(ctx, relay.server.address, SIZE, TOKEN, dtype) for _ in range(4)]
    try:
        values = np.linspace(-1, 1, SIZE, dtype=np.float32) * np.float32(1.001)
        for version in range(5):
            root.write(version, values + version)

            def done() -> bool:
                relay.poll()
                return node.version() == version and all(r.version() == version for r in readers)

            _pump(server, readers, done)
        assert server.sends == 5  # one relay, five versions: independent of the four readers below it
        assert relay.server.sends == 20 and server.bytes_sent == 5 * SIZE * 2
        want = torch.from_numpy(values + 4).to(getattr(torch, dtype)).float().numpy()
        out = np.empty(SIZE, np.float32)
        assert node.read_into(out, -1) == 4 and readers[0].read_into(got := np.empty(SIZE, np.float32), -1) == 4
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(got, want)
        assert not np.array_equal(want, values + 4)  # the rounding is there to see
    finally:
        for r in readers:
            r.close()
        relay.teardown()
        server.close()


class _Sink:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict]] = []

    def report(self, kind, meta, arrays=None) -> None:
        self.records.append((kind, dict(meta)))


def test_requests_without_the_token_or_malformed_are_rejected_and_the_server_keeps_serving(ctx, tmp_path) -> None:
    root = VersionedBuffer.in_process(SIZE, np.float32)
    root.write(0, np.ones(SIZE, np.float32))
    server = ParamServer(ctx, root, SIZE, f"ipc://{tmp_path}/root", TOKEN)
    intruder = ctx.socket(zmq.DEALER)
    intruder.setsockopt(zmq.LINGER, 0)
    intruder.connect(server.address)
    good = RemoteSnapshot(ctx, server.address, SIZE, TOKEN)
    try:
        intruder.send_multipart(wire.encode("param_get", None, {"token": "guess", "since": -1}))
        intruder.send_multipart(wire.encode("param_get", None, {"since": -1}))
        intruder.send_multipart([b"not a header"])
        intruder.send_multipart(wire.encode("param_get", None, {"token": TOKEN, "since": "x"}))
        _pump(server, [], lambda: server.rejected == 4)
        _pump(server, [good], lambda: good.version() == 0)
        assert server.sends == 1  # only the reader with the token got the snapshot
        assert not intruder.poll(100)
    finally:
        intruder.close()
        good.close()
        server.close()


def test_reader_rejects_a_snapshot_of_the_wrong_shape(ctx, tmp_path) -> None:
    fake = ctx.socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    address = f"ipc://{tmp_path}/fake"
    fake.bind(address)
    reader = RemoteSnapshot(ctx, address, SIZE, TOKEN)
    try:
        reader.pump()
        identity, *_ = fake.recv_multipart()
        fake.send_multipart(
            [identity, *wire.encode("param_snapshot", {"params": np.zeros(SIZE + 1, np.float32)}, {"version": 3})]
        )
        deadline = time.monotonic() + 5
        while reader.rejected == 0 and time.monotonic() < deadline:
            reader.pump()
            time.sleep(0.001)
        assert reader.rejected == 1 and reader.version() == -1
    finally:
        reader.close()
        fake.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["flat", "hierarchical"])
def test_local_run_root_egress_follows_the_topology(tmp_path, mode) -> None:
    """3 policy workers in 3 groups, fan-out 2: flat -> the root serves 3 readers; hierarchical -> the root
    serves relays 0 and 1, relay 0 serves relay 2, and each policy worker reads its group's shared buffer."""
    from srl.api.config import load_config
    from srl.runtime.train import train

    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        [
            f"params.mode={mode}",
            "params.groups=3",
            "params.fan_out=2",
            "workers.policy_workers=3",
            "workers.actors=3",
            "run.target_return=null",
            "run.total_env_steps=20000",  # about 39 versions, however fast the machine
            "run.eval_episodes=0",
        ],
    )
    summary = train(cfg, tmp_path / "run", progress=None)
    service = summary["param_service"]
    versions = summary["policy_version"]
    assert versions >= 3 and summary["env_steps"] > 0
    root = service["param_root"]
    assert root["rejected"] == 0
    if mode == "flat":
        assert set(service) == {"param_root"}
        assert 3 <= root["sends"] <= 3 * (versions + 1)  # one copy per reader per version (skips allowed)
    else:
        assert set(service) == {"param_root", "relay0", "relay1", "relay2"}
        # every send arrives, except at most the last one to each relay, still in flight when the run stopped
        assert 0 <= root["sends"] - service["relay0"]["received"] - service["relay1"]["received"] <= 2
        assert 0 <= service["relay0"]["sends"] - service["relay2"]["received"] <= 1
        assert "sends" not in service["relay1"]  # a leaf relay serves nobody over the network
        assert root["sends"] <= 2 * (versions + 1)
        assert all(service[f"relay{g}"]["received"] >= 2 for g in range(3))


@pytest.mark.slow
def test_bench_params_root_egress_flat_grows_hierarchical_stays_at_the_relays() -> None:
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "srl.cli.main",
            "bench",
            "params",
            "--readers",
            "2,8",
            "--per-group",
            "2",
            "--fan-out",
            "2",
            "--size",
            "10000",
            "--versions",
            "3",
            "--interval",
            "0.2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {(r["mode"], r["readers"]): r for r in map(json.loads, proc.stdout.strip().splitlines())}
    assert all(r["delivered_fraction"] == 1.0 for r in rows.values())
    assert rows["flat", 2]["root_sends_per_version"] == 2 and rows["flat", 8]["root_sends_per_version"] == 8
    # 8 readers in 4 groups under a fan-out of 2: the root serves 2 relays, which serve the other 2.
    assert rows["hierarchical", 2]["root_sends_per_version"] == 1
    assert rows["hierarchical", 8]["root_sends_per_version"] == 2
    assert rows["hierarchical", 8]["relay_sends_per_version"] == 2
    assert rows["flat", 8]["root_bytes_per_version"] == 8 * 10000 * 4


def test_a_departed_reader_costs_no_send(ctx, tmp_path) -> None:
    root = VersionedBuffer.in_process(SIZE, np.float32)
    server = ParamServer(ctx, root, SIZE, f"ipc://{tmp_path}/root", TOKEN)
    gone = RemoteSnapshot(ctx, server.address, SIZE, TOKEN)
    stays = RemoteSnapshot(ctx, server.address, SIZE, TOKEN)
    try:
        gone.pump()
        _pump(server, [], lambda: len(server._pending) == 1)
        (gone_id,) = server._pending
        stays.pump()
        _pump(server, [], lambda: len(server._pending) == 2)

        def routed() -> bool:
            """Whether the server's socket still routes to the departed reader (ROUTER_MANDATORY says when not)."""
            try:
                server._sock.send_multipart([gone_id, b""], flags=zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:
                    return False
                raise
            return True

        monitor = server._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            gone.close()
            assert monitor.poll(30_000), "the server never saw the reader go"  # its I/O thread dropped the pipe
        finally:
            server._sock.disable_monitor()
            monitor.close()
        # The I/O thread reports the disconnect before the socket has taken the pipe's end: wait for that too.
        _pump(None, [], lambda: not routed(), timeout=30.0)
        root.write(0, np.ones(SIZE, np.float32))
        _pump(server, [stays], lambda: stays.version() == 0)
        server.poll()
        assert server.sends == 1  # to the reader that stayed
        assert len(server._pending) <= 1  # at most that reader's next request; the departed one's is gone
    finally:
        stays.close()
        server.close()


def test_a_reader_asking_again_while_its_copy_is_on_the_wire_gets_no_second_copy(ctx, tmp_path) -> None:
    """A reader re-asks after ``REASK_SECONDS`` without an answer; on a thin link its copy may still be on the
    way. The server sends each version once per subscriber: the repeated request is answered by the next
    version, and a reconnected reader (a new identity) is served at once."""
    root = VersionedBuffer.in_process(SIZE, np.float32)
    server = ParamServer(ctx, root, SIZE, f"ipc://{tmp_path}/root", TOKEN)
    reader = ctx.socket(zmq.DEALER)
    reader.setsockopt(zmq.LINGER, 0)
    reader.connect(server.address)

    def ask(since: int) -> None:
        reader.send_multipart(wire.encode("param_get", None, {"token": TOKEN, "since": since}))
        _pump(server, [], lambda: reader.getsockopt(zmq.EVENTS) & zmq.POLLIN or server._pending)

    def versions() -> list[int]:
        got = []
        while reader.poll(200):
            frames = reader.recv_multipart()
            got.append(
                wire.decode(frames, expect_schema="param_snapshot", fields={"params": ("float32", (SIZE,))}).meta[
                    "version"
                ]
            )
        return got

    again = RemoteSnapshot(ctx, server.address, SIZE, TOKEN)
    try:
        root.write(0, np.zeros(SIZE, np.float32))
        ask(-1)
        _pump(server, [], lambda: server.sends == 1)
        ask(-1)  # again, as if the copy had not arrived yet
        for _ in range(20):
            server.poll()
        assert server.sends == 1
        root.write(1, np.ones(SIZE, np.float32))
        _pump(server, [], lambda: server.sends == 2)
        assert versions() == [0, 1]  # one copy of each version
        _pump(server, [again], lambda: again.version() == 1)  # another subscriber is served its own copy
        assert server.sends == 3 and server.bytes_sent == 3 * SIZE * 4
    finally:
        again.close()
        reader.close()
        server.close()


def test_bfloat16_packing_is_torchs_rounding() -> None:
    """Round half to even on the dropped bits, infinities and signed zeros kept, NaN kept NaN, subnormals and
    the float32 extremes: every value packs to the pattern torch's own conversion gives, and unpacks exactly."""
    rng = np.random.default_rng(0)
    spread = (rng.standard_normal(20_000) * 10.0 ** rng.integers(-40, 38, 20_000)).astype(np.float32)
    ties = (np.arange(1, 2001, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # exactly halfway, both parities
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4e38, -3.4e38, 1e-40, -1e-45], np.float32)
    values = np.concatenate([spread, ties, special])
    packed = transfer.pack(values, "bfloat16")
    want = torch.from_numpy(values).to(torch.bfloat16)
    assert packed.dtype == np.uint16 and packed.nbytes == values.size * 2
    finite = ~np.isnan(values)
    np.testing.assert_array_equal(packed[finite], want.view(torch.int16).numpy().view(np.uint16)[finite])
    out = np.empty_like(values)
    transfer.unpack_into(out, packed, "bfloat16")
    np.testing.assert_array_equal(out, want.float().numpy())  # NaN where torch has NaN
    with pytest.raises(ValueError, match="transfer dtype must be one of"):
        transfer.wire_dtype("int8")
