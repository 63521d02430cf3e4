"""Tests for srl.base.shm and srl.base.channel across real processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from srl.base import shm
from srl.base.channel import (
    PIPE_DIR_MARKER,
    FifoChannel,
    InProcChannel,
    make_pipe_dir,
    sweep_stale_pipe_dirs,
    wait_any,
)
from srl.base.shm import ShmArray

FORK = mp.get_context("fork")


@pytest.fixture
def tag() -> Iterator[str]:
    """A run tag whose segments are all removed after the test."""
    t = shm.new_tag()
    yield t
    shm.unlink_all(t)


@pytest.fixture
def fifo_path(tmp_path: Path) -> Path:
    return tmp_path / "chan.fifo"


def _join(proc: mp.process.BaseProcess, timeout: float = 20.0) -> None:
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail("child process hung")
    assert proc.exitcode == 0


# --------------------------------------------------------------------- shm


def _spawn_child(name: str, own_name: str) -> None:
    seg = ShmArray.attach(name, (3, 4), np.float32)
    seg.array[:] = np.arange(12, dtype=np.float32).reshape(3, 4)
    seg.close()
    own = ShmArray.create(own_name, (2,), np.int64)
    own.array[:] = [7, 8]
    own.close()


def test_shm_create_attach_across_spawn(tag: str) -> None:
    name, child_name = f"srl_{tag}_a", f"srl_{tag}_b"
    seg = ShmArray.create(name, (3, 4), np.float32)
    assert seg.name == name and not seg.array.any()
    proc = mp.get_context("spawn").Process(target=_spawn_child, args=(name, child_name))
    proc.start()
    _join(proc, 60.0)
    np.testing.assert_array_equal(seg.array, np.arange(12, dtype=np.float32).reshape(3, 4))
    # The child's segment outlives the child (no resource tracker unlinking it).
    child = ShmArray.attach(child_name, (2,), np.int64)
    assert child.array.tolist() == [7, 8]
    child.close()
    seg.close()
    seg.close()
    assert shm.list_segments(tag) == [name, child_name]


def test_shm_errors_and_zero_size(tag: str) -> None:
    seg = ShmArray.create(f"srl_{tag}_z", (4,), np.float64)
    with pytest.raises(ValueError, match=f"srl_{tag}_z"):
        ShmArray.attach(f"srl_{tag}_z", (5,), np.float64)
    with pytest.raises(FileExistsError):
        ShmArray.create(f"srl_{tag}_z", (4,), np.float64)
    for bad in ("a/b", "..", "", "sp ace"):
        with pytest.raises(ValueError):
            ShmArray.create(bad, (1,), np.uint8)
    view = seg.array[1:]
    seg.close()  # a live view must not make close fail
    view[0] = 1.0
    with pytest.raises(ValueError):
        _ = seg.array
    seg.unlink()
    seg.unlink()
    empty = ShmArray.create(f"srl_{tag}_e", (0, 3), np.float32)
    again = ShmArray.attach(f"srl_{tag}_e", (0, 3), np.float32)
    assert empty.array.shape == again.array.shape == (0, 3)
    empty.close()
    again.close()


def test_unlink_all_only_touches_its_tag(tag: str) -> None:
    other = shm.new_tag()
    try:
        for t in (tag, tag, other):
            ShmArray.create(f"srl_{t}_{len(shm.list_segments(t))}", (1,), np.uint8).close()
        assert len(shm.list_segments(tag)) == 2
        assert shm.unlink_all(tag) == 2
        assert shm.list_segments(tag) == []
        assert len(shm.list_segments(other)) == 1
    finally:
        shm.unlink_all(other)


def test_sweep_stale_removes_only_dead_creators(tag: str) -> None:
    proc = FORK.Process(target=os._exit, args=(0,))
    proc.start()
    proc.join()
    dead = f"srl_{proc.pid}_deadbeef_seg"
    live = f"srl_{tag}_seg"
    odd = "srl_notapid_seg"
    for name in (dead, live, odd):
        ShmArray.create(name, (1,), np.uint8).close()
    try:
        assert shm.sweep_stale() >= 1
        names = shm.list_segments()
        assert dead not in names and live in names and odd in names
    finally:
        for name in (dead, odd):
            shm.segment_path(name).unlink(missing_ok=True)


def test_sweep_stale_pipe_dirs_removes_only_dead_creators_pipe_folders(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a private temp folder for this test
    proc = FORK.Process(target=make_pipe_dir)  # a run's folder, its creator gone
    proc.start()
    proc.join()
    (run,) = tmp_path.glob(f"srl-{proc.pid}-*")
    FifoChannel.create(str(run / "req0"), 4).close()
    (run / "token").write_text("0123abcd")  # what a run keeps there besides pipes
    (run / "trainers.store").write_bytes(b"\0" * 8)
    live = make_pipe_dir()  # ours: this process is alive
    FifoChannel.create(str(live / "req0"), 4).close()

    def folder(name: str, mode: int = 0o700) -> Path:
        path = tmp_path / name
        path.mkdir(mode=mode)
        path.chmod(mode)
        return path

    pipes_only, empty = folder(f"srl-{proc.pid}-pipes"), folder(f"srl-{proc.pid}-empty")  # made before the marker
    FifoChannel.create(str(pipes_only / "req0"), 4).close()
    users_file = folder(f"srl-{proc.pid}-notes")  # no marker: plain files are not ours to delete
    FifoChannel.create(str(users_file / "req0"), 4).close()
    (users_file / "notes.txt").write_text("a user's file")
    shared = folder(f"srl-{proc.pid}-shared", 0o755)  # not private: not made by mkdtemp
    subfolder = folder(f"srl-{proc.pid}-sub")
    (subfolder / PIPE_DIR_MARKER).touch()
    (subfolder / "data").mkdir()
    not_ours = folder("srl-bench-xyz")
    (tmp_path / f"srl-{proc.pid}-file").write_text("not a folder")

    assert live.name.startswith(f"srl-{os.getpid()}-") and (live / PIPE_DIR_MARKER).is_file()
    assert sweep_stale_pipe_dirs() == 3
    assert not run.exists() and not pipes_only.exists() and not empty.exists()
    assert all(p.exists() for p in (live, users_file, shared, subfolder, not_ours, tmp_path / f"srl-{proc.pid}-file"))


# ----------------------------------------------------------------- channel


def _send_range(path: str, writer: int, count: int, delay: float = 0.0) -> None:
    time.sleep(delay)
    chan = FifoChannel.open(path, 4)
    for i in range(count):
        chan.send([writer, i, i * 7, writer * 100_000 + i])
    chan.close()


def _drain(chan: FifoChannel, total: int, deadline_s: float = 10.0) -> np.ndarray:
    got: list[np.ndarray] = []
    n, deadline = 0, time.monotonic() + deadline_s
    while n < total and time.monotonic() < deadline:
        batch = chan.recv(256, 0.5)
        got.append(batch)
        n += len(batch)
    return np.concatenate(got) if got else np.empty((0, chan.width), np.int32)


def test_fifo_round_trip_across_fork(fifo_path: Path) -> None:
    chan = FifoChannel.create(fifo_path, 4)
    try:
        proc = FORK.Process(target=_send_range, args=(str(fifo_path), 1, 100))
        proc.start()
        got = _drain(chan, 100)
        _join(proc)
        assert got.dtype == np.int32 and got.shape == (100, 4)
        assert got[:, 1].tolist() == list(range(100))
    finally:
        chan.close()
        chan.unlink()
    assert not fifo_path.exists()


def test_fifo_many_writers_no_torn_records(fifo_path: Path) -> None:
    chan = FifoChannel.create(fifo_path, 4)
    procs = [FORK.Process(target=_send_range, args=(str(fifo_path), w, 1000)) for w in range(3)]
    try:
        for p in procs:
            p.start()
        got = _drain(chan, 3000)
        for p in procs:
            _join(p)
    finally:
        chan.close()
        chan.unlink()
    assert got.shape == (3000, 4)
    assert (got[:, 2] == got[:, 1] * 7).all()
    assert (got[:, 3] == got[:, 0] * 100_000 + got[:, 1]).all()
    assert {(int(w), int(i)) for w, i in got[:, :2]} == {(w, i) for w in range(3) for i in range(1000)}


def test_fifo_timeouts_batches_and_blocking(fifo_path: Path) -> None:
    chan = FifoChannel.create(fifo_path, 4)
    try:
        start = time.monotonic()
        assert chan.recv(10, 0).shape == (0, 4)
        assert time.monotonic() - start < 0.05
        start = time.monotonic()
        assert chan.recv(10, 0.2).shape == (0, 4)
        assert 0.15 <= time.monotonic() - start < 1.0
        chan.send(np.arange(20, dtype=np.int32).reshape(5, 4))
        assert chan.recv(2, None).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert chan.recv(10, 0).shape == (3, 4)
        with pytest.raises(ValueError):
            chan.send([1, 2, 3])
        with pytest.raises(ValueError):
            chan.send([1, 2, 3, 2**40])
        proc = FORK.Process(target=_send_range, args=(str(fifo_path), 9, 1, 0.2))
        proc.start()
        start = time.monotonic()
        assert chan.recv(10, None)[0, 0] == 9  # blocks until the late writer sends
        assert time.monotonic() - start >= 0.1
        _join(proc)
    finally:
        chan.close()
        chan.close()
        chan.unlink()


def test_fifo_partial_record_is_buffered(fifo_path: Path) -> None:
    chan = FifoChannel.create(fifo_path, 3)
    raw = os.open(fifo_path, os.O_RDWR | os.O_NONBLOCK)
    try:
        record = np.array([11, 22, 33], dtype="<i4").tobytes()
        os.write(raw, record[:5])
        assert chan.recv(4, 0.05).shape == (0, 3)
        assert not chan.has_buffered()
        os.write(raw, record[5:] + record[:2])
        assert chan.recv(4, 0.05).tolist() == [[11, 22, 33]]
        os.write(raw, record[2:])
        assert chan.recv(4, 0.05).tolist() == [[11, 22, 33]]
    finally:
        os.close(raw)
        chan.close()
        chan.unlink()


def test_wait_any(tmp_path: Path) -> None:
    a = FifoChannel.create(tmp_path / "a", 2)
    b = FifoChannel.create(tmp_path / "b", 2)
    c = InProcChannel(2)
    chans = [a, b, c]
    try:
        start = time.monotonic()
        assert wait_any(chans, 0.1) == []
        assert time.monotonic() - start >= 0.08
        writer = FifoChannel.open(tmp_path / "b", 2)
        writer.send([1, 2])
        writer.close()
        assert wait_any(chans, 1.0) == [1]
        c.send([3, 4])
        assert wait_any(chans, None) == [1, 2]
        assert wait_any([c], None) == [0]
        assert wait_any([InProcChannel(2)], None) == []
    finally:
        for ch in (a, b):
            ch.close()
            ch.unlink()


def test_inproc_channel() -> None:
    chan = InProcChannel(3)
    assert chan.fileno() is None
    assert chan.recv(5, None).shape == (0, 3)
    record = [1, 2, 3]
    chan.send(record)
    chan.send(np.array([[4, 5, 6], [7, 8, 9]], dtype=np.int64))
    assert len(chan) == 3
    first = chan.recv(2, 0)
    assert first.dtype == np.int32 and first.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert chan.recv(10, 1.0).tolist() == [[7, 8, 9]]
    assert chan.recv(10, 1.0).shape == (0, 3)
    with pytest.raises(ValueError):
        chan.send([1, 2])
    chan.close()


def test_fifo_single_record_fast_path_round_trips_and_checks_range(tmp_path):
    ch = FifoChannel.create(tmp_path / "fast", 3)
    try:
        ch.send((1, -2, 2**31 - 1))
        ch.send(np.array([[4, 5, 6]], np.int64))  # the general path still works alongside
        assert ch.recv(8, 0.0).tolist() == [[1, -2, 2**31 - 1], [4, 5, 6]]
        with pytest.raises(ValueError):
            ch.send((1, 2, 2**31))
        with pytest.raises(ValueError):
            ch.send((1, 2))  # wrong width goes the general path and is refused there
        assert ch.recv(8, 0.0).size == 0
    finally:
        ch.close()
        ch.unlink()
