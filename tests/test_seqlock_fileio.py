"""Tests for srl.base.seqlock (no torn snapshots across processes) and srl.base.fileio."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pytest

from srl.base import shm
from srl.base.fileio import atomic_save, atomic_write_bytes, atomic_write_text
from srl.base.seqlock import VersionedBuffer

FORK = mp.get_context("fork")
SIZE = 32_768
VERSIONS = 2000


@pytest.fixture
def tag() -> Iterator[str]:
    t = shm.new_tag()
    yield t
    shm.unlink_all(t)


def test_write_read_and_monotonic_versions() -> None:
    buf = VersionedBuffer.in_process(4, np.float32)
    out = np.zeros(4, dtype=np.float32)
    assert buf.version() == -1
    assert buf.read_into(out, -1) is None
    buf.write(0, np.arange(4))
    assert buf.version() == 0
    assert buf.read_into(out, -1) == 0 and out.tolist() == [0, 1, 2, 3]
    out[:] = 9
    assert buf.read_into(out, 0) is None and out.tolist() == [9] * 4  # untouched
    buf.write(5, np.full((2, 2), 2.0))
    assert buf.read_into(out.reshape(2, 2), 0) == 5 and out.tolist() == [2] * 4
    for bad in (5, 3):
        with pytest.raises(ValueError):
            buf.write(bad, np.zeros(4))
    with pytest.raises(ValueError):
        buf.write(6, np.zeros(3))
    with pytest.raises(ValueError):
        buf.read_into(np.zeros(3, dtype=np.float32), -1)
    assert buf.version() == 5
    buf.close()
    buf.close()
    with pytest.raises(ValueError):
        buf.version()


def test_shared_attach_and_size_check(tag: str) -> None:
    name = f"srl_{tag}_params"
    writer = VersionedBuffer.create_shared(name, 3, np.int64)
    reader = VersionedBuffer.attach_shared(name, 3, np.int64)
    assert reader.version() == -1 and reader.name == name
    writer.write(1, np.array([4, 5, 6]))
    out = np.zeros(3, dtype=np.int64)
    assert reader.read_into(out, -1) == 1 and out.tolist() == [4, 5, 6]
    with pytest.raises(ValueError):
        VersionedBuffer.attach_shared(name, 4, np.int64)
    reader.close()
    writer.close()
    writer.unlink()
    assert shm.list_segments(tag) == []


def test_reader_detects_concurrent_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic seqlock checks: a busy writer or a write during the copy yields None."""
    buf = VersionedBuffer.in_process(8, np.int32)
    with pytest.raises(ValueError, match="cannot store"):
        buf.write(1, np.ones(8))
    assert buf._headers()[0] % 2 == 0
    buf.write(1, np.ones(8, dtype=np.int64))
    out = np.zeros(8, dtype=np.int32)
    header = buf._headers()
    header[0] += 1  # writer mid-write: seq odd
    assert buf.read_into(out, -1) is None
    header[0] += 1
    real_copyto = np.copyto
    calls = 0

    def copy_then_interfere(dst: np.ndarray, src: np.ndarray, **kw: Any) -> None:
        nonlocal calls
        calls += 1
        real_copyto(dst, src, **kw)
        header[0] += 2  # a whole write happened during the copy

    monkeypatch.setattr(np, "copyto", copy_then_interfere)
    assert buf.read_into(out, -1, attempts=3) is None
    assert calls == 3
    monkeypatch.undo()
    assert buf.read_into(out, -1) == 1 and out.tolist() == [1] * 8
    header[0] += 1  # a writer that died mid-write must not wedge the next one
    buf.write(2, np.full(8, 2, dtype=np.int32))
    assert buf.read_into(out, 1) == 2 and out.tolist() == [2] * 8


def _writer(name: str) -> None:
    buf = VersionedBuffer.attach_shared(name, SIZE, np.float64)
    data = np.empty(SIZE, dtype=np.float64)
    for version in range(VERSIONS):
        data.fill(version)
        buf.write(version, data)
        if version % 10 == 0:  # pauses give readers clean windows; other writes are back to back
            time.sleep(0.0005)
    buf.close()


def test_reader_never_sees_torn_snapshot(tag: str) -> None:
    name = f"srl_{tag}_hammer"
    owner = VersionedBuffer.create_shared(name, SIZE, np.float64)
    reader = VersionedBuffer.attach_shared(name, SIZE, np.float64)
    out = np.empty(SIZE, dtype=np.float32)  # versions < 2**24 are exact in float32
    proc = FORK.Process(target=_writer, args=(name,))
    proc.start()
    seen: list[int] = []
    last = -1
    deadline = time.monotonic() + 15.0
    try:
        while last < VERSIONS - 1 and time.monotonic() < deadline:
            version = reader.read_into(out, last)
            if version is None:
                continue
            assert version > last
            assert (out == version).all(), f"torn snapshot at version {version}"
            seen.append(version)
            last = version
        proc.join(10.0)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        reader.close()
        owner.close()
        owner.unlink()
    assert last == VERSIONS - 1 and len(seen) >= 2


def test_atomic_write_replaces(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    atomic_write_text(target, "old")
    atomic_write_text(target, "new ✓")
    assert target.read_text(encoding="utf-8") == "new ✓"
    atomic_write_bytes(str(target), b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"

    def write_numpy(f: BinaryIO) -> None:
        np.save(f, np.arange(3))

    atomic_save(tmp_path / "arr.npy", write_numpy)
    assert np.load(tmp_path / "arr.npy").tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["arr.npy", "summary.json"]


def test_failed_writer_leaves_old_file(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.pt"
    atomic_write_bytes(target, b"previous")

    def failing(f: BinaryIO) -> None:
        f.write(b"partial data")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_save(target, failing)
    assert target.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["ckpt.pt"]
    with pytest.raises(FileNotFoundError):
        atomic_write_text(tmp_path / "missing_dir" / "x.txt", "x")
