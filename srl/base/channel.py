"""Tiny fixed-width integer notifications between workers.

Why: on one node, bulk data (observations, actions, trajectory segments) stays
in shared memory and only slot ids need to travel. A record is a row of
``width`` int32 words; a FIFO write of one record is atomic (smaller than
PIPE_BUF), so many writers can share one channel without locks and readers
never see torn records.

``recv(max_records, timeout)`` semantics shared by all channels:
``timeout=0`` never waits, ``None`` waits for at least one record, ``t > 0``
waits at most ``t`` seconds for the first record; after the first record
arrives, whatever else is already available (up to ``max_records``) is
returned without further waiting.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import select
import shutil
import stat
import struct
import tempfile
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from srl.base.shm import pid_alive

__all__ = ["Channel", "FifoChannel", "InProcChannel", "make_pipe_dir", "sweep_stale_pipe_dirs", "wait_any"]

_WORD = np.dtype("<i4")
_SEND_DEADLINE_S = 10.0
_PIPE_SIZE = 1 << 20


class Channel(ABC):
    """A stream of ``width``-word int32 records from any writers to one reader."""

    def __init__(self, width: int) -> None:
        """Store the record width shared by every writer and the reader."""
        if width < 1:
            raise ValueError(f"channel width must be >= 1, got {width}")
        self.width = width

    def _records(self, record: Sequence[int] | np.ndarray) -> np.ndarray:
        """Normalize one record or a 2-D batch to a C-contiguous [n, width] int32 array."""
        arr = np.asarray(record)
        if arr.ndim == 1:
            arr = arr.reshape(1, -1)
        if arr.ndim != 2 or arr.shape[1] != self.width:
            raise ValueError(f"record shape {arr.shape} does not match channel width {self.width}")
        if arr.dtype != _WORD:
            if not np.issubdtype(arr.dtype, np.integer) and arr.size:
                raise ValueError(f"records must be integers, got {arr.dtype}")
            info = np.iinfo(np.int32)
            if arr.size and (arr.min() < info.min or arr.max() > info.max):
                raise ValueError("record value out of int32 range")
        return np.ascontiguousarray(arr, dtype=_WORD)

    def _empty(self) -> np.ndarray:
        """A [0, width] result."""
        return np.empty((0, self.width), dtype=np.int32)

    @abstractmethod
    def send(self, record: Sequence[int] | np.ndarray) -> None:
        """Send one record, or every row of a 2-D [n, width] array."""

    @abstractmethod
    def recv(self, max_records: int, timeout: float | None) -> np.ndarray:
        """Receive up to ``max_records`` records as an int32 [n, width] array."""

    def fileno(self) -> int | None:
        """A descriptor that polls readable when records may be waiting, or None."""
        return None

    def has_buffered(self) -> bool:
        """True if a record can be returned without touching any descriptor."""
        return False

    @abstractmethod
    def close(self) -> None:
        """Release this end of the channel; idempotent."""


class InProcChannel(Channel):
    """A deque-backed channel for the single-process (inline) runtime.

    Waiting is pointless with one thread (nothing else could fill the channel
    meanwhile), so every ``recv`` on an empty channel returns at once, whatever
    the timeout, instead of deadlocking.
    """

    def __init__(self, width: int) -> None:
        """An empty channel."""
        super().__init__(width)
        self._queue: deque[np.ndarray] = deque()

    def send(self, record: Sequence[int] | np.ndarray) -> None:
        """Append records (copied, so later caller edits do not leak in)."""
        self._queue.extend(self._records(record).copy())

    def recv(self, max_records: int, timeout: float | None) -> np.ndarray:
        """Pop up to ``max_records`` records; never blocks."""
        n = min(max_records, len(self._queue))
        if n <= 0:
            return self._empty()
        return np.stack([self._queue.popleft() for _ in range(n)])

    def has_buffered(self) -> bool:
        """True when records are queued."""
        return bool(self._queue)

    def __len__(self) -> int:
        """Number of queued records."""
        return len(self._queue)

    def close(self) -> None:
        """Drop queued records."""
        self._queue.clear()


class FifoChannel(Channel):
    """A channel over a named pipe, shared by any processes on the node.

    The descriptor is opened ``O_RDWR | O_NONBLOCK``: on Linux that never blocks
    in ``open`` (no need for a peer to be present), every opener can both write
    and read, and the pipe never reports EOF, so writers may come and go.
    """

    def __init__(self, path: Path, width: int, fd: int) -> None:
        """Wrap an open FIFO descriptor; use ``create`` or ``open`` instead."""
        super().__init__(width)
        self.path = path
        self._fd = fd
        self._rec_bytes = width * _WORD.itemsize
        if self._rec_bytes > select.PIPE_BUF:
            raise ValueError(f"record of {self._rec_bytes} bytes exceeds PIPE_BUF, writes not atomic")
        self._pending = bytearray()
        self._pack = struct.Struct(f"<{width}i").pack  # the channel's int32 words, little-endian like _WORD

    @classmethod
    def create(cls, path: str | os.PathLike[str], width: int, large: bool = True) -> FifoChannel:
        """Make the FIFO (fails if ``path`` exists) and open it; the caller owns ``unlink``. ``large``: enlarge the
        pipe to absorb bursts (a channel whose records are bounded by a few keeps the OS default, and the user's
        pipe memory for the others)."""
        p = Path(path)
        os.mkfifo(p, 0o600)
        try:
            chan = cls.open(p, width)
        except BaseException:
            p.unlink(missing_ok=True)
            raise
        try:  # optional (Linux only, capped by the OS)
            set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
            if large and set_size is not None:
                fcntl.fcntl(chan._fd, set_size, _PIPE_SIZE)
        except OSError:
            pass
        return chan

    @classmethod
    def open(cls, path: str | os.PathLike[str], width: int) -> FifoChannel:
        """Open an existing FIFO made by ``create``."""
        p = Path(path)
        fd = os.open(p, os.O_RDWR | os.O_NONBLOCK)
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                raise ValueError(f"{p} is not a FIFO")
            return cls(p, width, fd)
        except BaseException:
            os.close(fd)
            raise

    def _checked_fd(self) -> int:
        """The descriptor, or a clear error after ``close``."""
        if self._fd < 0:
            raise ValueError(f"channel {self.path} is closed")
        return self._fd

    def send(self, record: Sequence[int] | np.ndarray) -> None:
        """Write records; each ``os.write`` holds whole records and at most PIPE_BUF bytes."""
        fd = self._checked_fd()
        if type(record) is tuple and len(record) == self.width:  # the per-step case: one record, no numpy
            try:
                data = memoryview(self._pack(*record))
            except struct.error:
                raise ValueError(f"record {record} is not {self.width} int32 values") from None
        else:
            data = memoryview(self._records(record).tobytes())
        chunk = (select.PIPE_BUF // self._rec_bytes) * self._rec_bytes
        deadline = time.monotonic() + _SEND_DEADLINE_S
        while data:
            try:
                written = os.write(fd, data[:chunk])
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"channel {self.path} stayed full for {_SEND_DEADLINE_S:.0f} s; is its reader alive?"
                    ) from None
                _poll_one(fd, select.POLLOUT, min(remaining, 0.1))
                continue
            data = data[written:]

    def recv(self, max_records: int, timeout: float | None) -> np.ndarray:
        """Read as many whole records as are available, up to ``max_records``."""
        fd = self._checked_fd()
        if max_records <= 0:
            return self._empty()
        want = max_records * self._rec_bytes
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while True:
            if len(self._pending) < want:
                self._read_available(fd, min(want - len(self._pending), _PIPE_SIZE))
            if len(self._pending) >= self._rec_bytes:
                break
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return self._empty()
            _poll_one(fd, select.POLLIN, wait)
        n = min(len(self._pending) // self._rec_bytes, max_records) * self._rec_bytes
        # The copy ends the temporary buffer export before the bytearray shrinks.
        out = np.frombuffer(self._pending, dtype=_WORD, count=n // 4).astype(np.int32)
        del self._pending[:n]
        return out.reshape(-1, self.width)

    def _read_available(self, fd: int, nbytes: int) -> None:
        """Non-blocking read of up to ``nbytes`` into the pending buffer."""
        try:
            chunk = os.read(fd, nbytes)
        except BlockingIOError:
            return
        self._pending += chunk

    def fileno(self) -> int | None:
        """The FIFO descriptor, for ``wait_any``."""
        return self._fd if self._fd >= 0 else None

    def has_buffered(self) -> bool:
        """True when a whole record is already in the local buffer."""
        return len(self._pending) >= self._rec_bytes

    def close(self) -> None:
        """Close the descriptor; idempotent. Does not remove the path."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def unlink(self) -> None:
        """Remove the FIFO path (the creator's job); open descriptors keep working."""
        self.path.unlink(missing_ok=True)


def _poll_one(fd: int, events: int, timeout: float | None) -> bool:
    """Wait until ``fd`` is ready for ``events`` or the timeout (seconds) passes."""
    poller = select.poll()
    poller.register(fd, events)
    return bool(poller.poll(_to_ms(timeout)))


def _to_ms(timeout: float | None) -> int | None:
    """poll() takes milliseconds; round up so short timeouts still wait."""
    if timeout is None:
        return None
    return max(0, int(timeout * 1000 + 0.999))


def wait_any(channels: Sequence[Channel], timeout: float | None) -> list[int]:
    """Indices of channels with data ready, waiting up to ``timeout`` for any.

    In-process channels count as ready when non-empty; since nothing can fill
    them while we wait, only descriptor-backed channels are polled. With no
    descriptors to poll the call returns at once.
    """
    ready = {i for i, ch in enumerate(channels) if ch.has_buffered()}
    by_fd: dict[int, list[int]] = {}
    for i, ch in enumerate(channels):
        fd = ch.fileno()
        if fd is not None:
            by_fd.setdefault(fd, []).append(i)
    if by_fd:
        poller = select.poll()
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        wait = 0.0 if ready else timeout
        for fd, _ in poller.poll(_to_ms(wait)):
            ready.update(by_fd.get(fd, []))
    return sorted(ready)


# --------------------------------------------------------------------------- pipe folders
PIPE_DIR_PREFIX = "srl-"
PIPE_DIR_MARKER = ".srl-pipe-dir"
"""Empty file :func:`make_pipe_dir` puts in every pipe folder: it marks the folder as made by srl, so the sweep
may remove the other files a run keeps there (its token, torch.distributed's file store), not only its pipes."""
_PIPE_DIR_NAME = re.compile(rf"{re.escape(PIPE_DIR_PREFIX)}(\d+)-[a-z0-9_]+")


def make_pipe_dir() -> Path:
    """A new private folder for a run's named pipes, ``srl-<pid>-<random>`` in the temp folder: the pid lets
    :func:`sweep_stale_pipe_dirs` find the folders of processes that died without removing them."""
    folder = Path(tempfile.mkdtemp(prefix=f"{PIPE_DIR_PREFIX}{os.getpid()}-"))
    (folder / PIPE_DIR_MARKER).touch(mode=0o600)
    return folder


IPC_PATH_MAX = 107
"""Bytes of a Unix socket's path (``sockaddr_un.sun_path`` less its NUL): longer ``ipc://`` paths cannot bind."""


def ipc_address(folder: Path, name: str) -> str:
    """The ZeroMQ ``ipc://`` address of socket ``name`` of a run's pipe folder: its file there where the path fits
    :data:`IPC_PATH_MAX`; else (a deep temp folder) a Linux abstract socket named after that path, which leaves
    no file and goes with its last socket. Only for sockets whose messages carry the run's token: an abstract
    socket has no folder's permissions in front of it."""
    path = f"{folder}/{name}"
    if len(path.encode()) <= IPC_PATH_MAX:
        return f"ipc://{path}"
    return f"ipc://@srl-{hashlib.sha256(path.encode()).hexdigest()[:32]}"


def sweep_stale_pipe_dirs() -> int:
    """Remove pipe folders whose creating process is dead (killed with SIGKILL, or a node agent lost with its
    node on a machine that simulates several); returns how many.

    A folder is removed only when all of this holds: its name is ``srl-<pid>-<random>`` with ``<pid>`` not alive;
    it is a real folder (not a link) of this user, private (mode 0700, as :func:`make_pipe_dir` makes it); it holds
    no subfolder and no link; and it holds either the marker :data:`PIPE_DIR_MARKER` (then its plain files are
    the run's own: the token, a file store) or nothing but FIFOs and sockets (folders made before the marker).
    An empty folder counts as one (a creator killed between ``mkdtemp`` and the marker)."""
    removed = 0
    for folder in Path(tempfile.gettempdir()).glob(f"{PIPE_DIR_PREFIX}*-*"):
        match = _PIPE_DIR_NAME.fullmatch(folder.name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        try:
            if not _is_stale_pipe_dir(folder):
                continue
        except OSError:  # gone meanwhile
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed += 1
    return removed


def _is_stale_pipe_dir(folder: Path) -> bool:
    """Whether ``folder`` is a pipe folder of this user that :func:`sweep_stale_pipe_dirs` may remove."""
    st = folder.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return False
    modes = {e.name: e.lstat().st_mode for e in folder.iterdir()}
    if any(not (stat.S_ISREG(m) or stat.S_ISFIFO(m) or stat.S_ISSOCK(m)) for m in modes.values()):
        return False  # a subfolder or a link: not something a run puts there
    return PIPE_DIR_MARKER in modes or all(stat.S_ISFIFO(m) or stat.S_ISSOCK(m) for m in modes.values())
