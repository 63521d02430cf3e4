"""Tests for srl.base.tbevents: files we write must read back in TensorBoard's own reader."""

from __future__ import annotations

import math
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from srl.base.tbevents import EventWriter, crc32c, encode_record, masked_crc32c


def _load(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def _records(path: Path) -> list[bytes]:
    """Split a TFRecord file into payloads, checking both CRCs of every record."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        assert hcrc == masked_crc32c(header)
        payload = data[pos + 12 : pos + 12 + length]
        (pcrc,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
        assert pcrc == masked_crc32c(payload)
        out.append(payload)
        pos += 16 + length
    assert pos == len(data)
    return out


def _event_pb():
    from tensorboard.compat.proto.event_pb2 import Event

    return Event


# ---------------------------------------------------------------------- CRC


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0x00000000),
        (b"123456789", 0xE3069283),
        (b"a", 0xC1D04330),
        (bytes(32), 0x8A9136AA),  # RFC 3720 B.4: 32 bytes of zeros
        (b"\xff" * 32, 0x62A8AB43),  # RFC 3720 B.4: 32 bytes of 0xFF
        (bytes(range(32)), 0x46DD794E),  # RFC 3720 B.4: incrementing
    ],
)
def test_crc32c_known_vectors(data: bytes, expected: int) -> None:
    assert crc32c(data) == expected


def test_crc32c_incremental_and_mask() -> None:
    assert crc32c(b"6789", crc32c(b"12345")) == crc32c(b"123456789")
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tb_masked

    for data in (b"", b"x", b"123456789", bytes(range(256)) * 3):
        assert masked_crc32c(data) == tb_masked(data)


# ----------------------------------------------------------------- encoding


def test_event_bytes_parse_with_real_protobuf(tmp_path: Path) -> None:
    Event = _event_pb()
    with EventWriter(tmp_path) as w:
        w.add_scalar("loss/é", 0.25, step=7, wall_time=123.5)
        w.add_scalars({"a": 1.5, "b": -2.0}, step=-3, wall_time=1.0)
        w.add_scalar("zero_step", 3.0, step=0, wall_time=2.0)
        w.add_scalar("big", 1e300, step=2**40, wall_time=3.0)
        w.add_scalar("nan", float("nan"), step=1, wall_time=4.0)
        w.add_scalar("np", np.float64(0.5), step=np.int64(9), wall_time=5.0)
        w.add_scalars({}, step=1)  # writes nothing
    (path,) = tmp_path.iterdir()
    events = [Event.FromString(p) for p in _records(path)]
    assert len(events) == 7

    assert events[0].file_version == "brain.Event:2"
    assert not events[0].HasField("summary")

    e = events[1]
    assert (e.wall_time, e.step) == (123.5, 7)
    assert [(v.tag, v.simple_value) for v in e.summary.value] == [("loss/é", 0.25)]

    e = events[2]
    assert (e.wall_time, e.step) == (1.0, -3)
    assert [(v.tag, v.simple_value) for v in e.summary.value] == [("a", 1.5), ("b", -2.0)]

    assert events[3].step == 0 and events[3].summary.value[0].simple_value == 3.0
    assert events[4].step == 2**40 and events[4].summary.value[0].simple_value == math.inf
    assert math.isnan(events[5].summary.value[0].simple_value)
    assert events[6].step == 9 and events[6].summary.value[0].simple_value == 0.5


def test_encode_record_layout() -> None:
    rec = encode_record(b"hello")
    assert rec[:8] == struct.pack("<Q", 5)
    assert rec[12:17] == b"hello"
    assert len(rec) == 8 + 4 + 5 + 4


# ------------------------------------------------------------------- writer


def test_file_name_and_directory_creation(tmp_path: Path) -> None:
    log_dir = tmp_path / "nested" / "run"
    w = EventWriter(str(log_dir))
    try:
        name = w.path.name
        assert w.path.parent == log_dir and w.path.exists()
        prefix = "events.out.tfevents."
        assert name.startswith(prefix) and name.endswith(f".{socket.gethostname()}.{os.getpid()}.srl")
        assert name[len(prefix) :].split(".")[0].isdigit()
        # The version record is on disk before anything else is logged.
        assert len(_records(w.path)) == 1
    finally:
        w.close()


def test_tensorboard_reads_scalars(tmp_path: Path) -> None:
    expected = {
        "train/loss": [(0, 1.0), (10, 0.5), (20, 0.1 + 1e-9)],
        "eval/return": [(5, -3.25), (15, 200.123)],
    }
    with EventWriter(tmp_path) as w:
        w.add_scalar("train/loss", 1.0, step=0, wall_time=1000.0)
        w.add_scalars({"train/loss": 0.5, "eval/return": -3.25}, step=10, wall_time=1001.0)
        w.add_scalar("eval/return", 200.123, step=15, wall_time=1002.0)
        w.add_scalar("train/loss", 0.1 + 1e-9, step=20)
    # add_scalars put both tags at step 10; fix up the expectation for eval/return.
    expected["eval/return"] = [(10, -3.25), (15, 200.123)]

    acc = _load(tmp_path)
    assert sorted(acc.Tags()["scalars"]) == sorted(expected)
    for tag, pairs in expected.items():
        got = acc.Scalars(tag)
        assert [s.step for s in got] == [s for s, _ in pairs]
        assert [s.value for s in got] == pytest.approx([v for _, v in pairs], rel=1e-6)
    assert [s.wall_time for s in acc.Scalars("train/loss")][:2] == [1000.0, 1001.0]


def test_tensorboard_reads_many_events(tmp_path: Path) -> None:
    n = 1000
    with EventWriter(tmp_path) as w:
        for i in range(n):
            w.add_scalar("x", i * 0.5, step=i)
            if i % 10 == 0:
                w.add_scalars({"y": -i, "z": i * i}, step=i)
    acc = _load(tmp_path)
    xs = acc.Scalars("x")
    assert [s.step for s in xs] == list(range(n))
    assert [s.value for s in xs] == [i * 0.5 for i in range(n)]
    assert [s.value for s in acc.Scalars("z")] == pytest.approx([float(np.float32(i * i)) for i in range(0, n, 10)])
    assert len(acc.Scalars("y")) == n // 10


def test_buffering_defers_writes_until_flush(tmp_path: Path) -> None:
    w = EventWriter(tmp_path, flush_secs=3600)
    try:
        size0 = w.path.stat().st_size
        for i in range(50):
            w.add_scalar("x", float(i), step=i)
        assert w.path.stat().st_size == size0  # nothing written in the hot path
        w.flush()
        assert len(_records(w.path)) == 51
    finally:
        w.close()


def test_buffer_written_after_interval_or_size(tmp_path: Path) -> None:
    with EventWriter(tmp_path / "t", flush_secs=0.0) as w:
        w.add_scalar("x", 1.0, step=1)
        assert len(_records(w.path)) == 2  # interval elapsed: written at once
    with EventWriter(tmp_path / "s", flush_secs=3600, max_buffer_bytes=200) as w:
        for i in range(20):
            w.add_scalar("x", float(i), step=i)
        assert 2 < len(_records(w.path)) < 21  # size cap forced early writes


def test_close_is_idempotent_and_final(tmp_path: Path) -> None:
    w = EventWriter(tmp_path)
    w.add_scalar("x", 1.0, step=1)
    w.close()
    w.close()
    w.flush()  # harmless after close
    assert w.closed
    with pytest.raises(ValueError):
        w.add_scalar("x", 2.0, step=2)
    assert len(_records(w.path)) == 2


def test_import_is_light() -> None:
    code = (
        "import sys, srl.base.tbevents\n"
        "heavy = [m for m in ('torch', 'tensorboard', 'google.protobuf', 'numpy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert not [m for m in sys.modules if m.startswith('srl.') and not m.startswith('srl.base')]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
