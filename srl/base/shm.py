"""Named shared-memory numpy arrays that unrelated processes on one node open by name.

Why not ``multiprocessing.shared_memory``: its resource tracker assumes the
creating process tree owns every segment; a segment attached from a process it
did not start (a spawned worker, a Ray actor) gets unlinked or warned about when
that process exits. Here a segment is simply a file in ``shm_dir()`` (a tmpfs
on Linux) mapped with ``mmap``; lifetime is explicit (``unlink`` /
``unlink_all``) with ``sweep_stale`` as the safety net after crashes.

Naming: every segment of a run is named ``srl_<tag>_<rest>`` where ``tag`` comes
from ``new_tag()`` and starts with the creator's pid, so a later process can
tell whether the run that made a segment is still alive.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import re
import secrets
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import DTypeLike

__all__ = [
    "PREFIX",
    "ShmArray",
    "list_segments",
    "new_tag",
    "pid_alive",
    "segment_path",
    "shm_dir",
    "sweep_stale",
    "unlink_all",
]

PREFIX = "srl_"
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_MAX_NAME = 200


def shm_dir() -> Path:
    """The directory holding segments: RAM-backed /dev/shm when usable."""
    dev_shm = Path("/dev/shm")
    if dev_shm.is_dir() and os.access(dev_shm, os.W_OK | os.X_OK):
        return dev_shm
    return Path(tempfile.gettempdir())


def new_tag() -> str:
    """A run tag ``<pid>_<random>``; the pid lets ``sweep_stale`` find orphans."""
    return f"{os.getpid()}_{secrets.token_hex(4)}"


def segment_path(name: str) -> Path:
    """The file path of segment ``name``, after checking the name is a plain file name.

    Exposed so other node-local objects (e.g. FIFOs) can live under the same
    naming and cleanup scheme.
    """
    if not isinstance(name, str) or len(name) > _MAX_NAME or not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"invalid segment name {name!r}: use [A-Za-z0-9_.-]+, no slashes")
    return shm_dir() / name


def _nbytes(shape: Sequence[int], dtype: np.dtype) -> int:
    """Bytes needed for the array (Python ints: no overflow)."""
    if any(int(d) < 0 for d in shape):
        raise ValueError(f"negative dimension in shape {tuple(shape)}")
    return math.prod(int(d) for d in shape) * dtype.itemsize


class ShmArray:
    """A numpy array backed by a named, mmap-ed file that any local process can open.

    Use ``create`` in exactly one process and ``attach`` elsewhere. ``close``
    only unmaps this process's view; ``unlink`` removes the name (the memory is
    freed once every process has closed it).
    """

    def __init__(self, name: str, mm: mmap.mmap, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Wrap an existing mapping; use ``create`` or ``attach`` instead."""
        self._name = name
        self._mm: mmap.mmap | None = mm
        count = math.prod(shape)
        flat = np.frombuffer(mm, dtype=dtype, count=count)
        self._array: np.ndarray | None = flat.reshape(shape)

    @classmethod
    def create(cls, name: str, shape: Sequence[int], dtype: DTypeLike) -> ShmArray:
        """Create a new zero-filled segment; fails if the name already exists."""
        path = segment_path(name)
        dt = np.dtype(dtype)
        nbytes = _nbytes(shape, dt)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # mmap of length 0 is invalid, so zero-size arrays still get 1 byte.
            os.ftruncate(fd, max(nbytes, 1))
            _reserve(fd, max(nbytes, 1), path)
            mm = mmap.mmap(fd, max(nbytes, 1), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)  # the mapping stays valid without the descriptor
        return cls(name, mm, tuple(int(d) for d in shape), dt)

    @classmethod
    def attach(cls, name: str, shape: Sequence[int], dtype: DTypeLike) -> ShmArray:
        """Open an existing segment, checking its size matches shape and dtype."""
        path = segment_path(name)
        dt = np.dtype(dtype)
        expected = max(_nbytes(shape, dt), 1)
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size != expected:
                raise ValueError(
                    f"shm segment {name!r} is {size} bytes, expected {expected} for shape {tuple(shape)} {dt.name}"
                )
            mm = mmap.mmap(fd, expected, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(name, mm, tuple(int(d) for d in shape), dt)

    @property
    def name(self) -> str:
        """The segment name (a file name in ``shm_dir()``)."""
        return self._name

    @property
    def array(self) -> np.ndarray:
        """The shared array; writes are visible to every process that attached."""
        if self._array is None:
            raise ValueError(f"shm segment {self._name!r} is closed")
        return self._array

    def close(self) -> None:
        """Unmap this process's view; idempotent.

        Views handed out earlier keep the mapping alive (mmap refuses to close
        with exported buffers); in that case the mapping is released when the
        last view is garbage collected instead.
        """
        self._array = None
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass

    def unlink(self) -> None:
        """Remove the name; processes that still have it mapped keep working."""
        segment_path(self._name).unlink(missing_ok=True)

    def __enter__(self) -> ShmArray:
        """Context manager support: closes (but does not unlink) on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the mapping."""
        self.close()

    def __repr__(self) -> str:
        """Name, shape and dtype, for logs."""
        if self._array is None:
            return f"ShmArray({self._name!r}, closed)"
        return f"ShmArray({self._name!r}, {self._array.shape}, {self._array.dtype})"


def list_segments(tag: str | None = None) -> list[str]:
    """Sorted names of srl segments in ``shm_dir()``, optionally only one run's."""
    prefix = PREFIX if tag is None else f"{PREFIX}{tag}_"
    try:
        names = os.listdir(shm_dir())
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix))


def unlink_all(tag: str) -> int:
    """Remove every segment of run ``tag``; returns how many were removed."""
    if not tag:
        raise ValueError("unlink_all needs a non-empty tag")
    return sum(_remove(name) for name in list_segments(tag))


def _reserve(fd: int, nbytes: int, path: Path) -> None:
    """Allocate the pages now: tmpfs files are sparse, and touching a page that no longer fits
    kills the process with SIGBUS far from here. A full shm dir fails at creation, in one line."""
    if not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM):
            raise OSError(
                exc.errno,
                f"not enough space in {path.parent} for {nbytes / 2**20:.1f} MiB of shared memory ({path.name})",
            ) from None
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise


def _remove(name: str) -> bool:
    """Unlink one entry, tolerating a concurrent removal."""
    try:
        os.unlink(shm_dir() / name)
    except OSError:  # already gone, or not ours to remove (sticky /dev/shm)
        return False
    return True


def _creator_pid(name: str) -> int | None:
    """The pid encoded in ``srl_<pid>_...``, or None if the name does not parse."""
    head = name[len(PREFIX) :].split("_", 1)[0]
    if not head.isdigit() or not head.isascii():
        return None
    pid = int(head)
    return pid if pid > 0 else None


def pid_alive(pid: int) -> bool:
    """True unless the pid certainly does not exist (EPERM means it does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def sweep_stale() -> int:
    """Remove segments whose creator pid is dead; returns how many were removed.

    Only unambiguous cases are removed: unparsable names and live pids are
    left alone. Pids are checked in this pid namespace, so do not share one
    ``shm_dir`` between containers with separate pid namespaces.
    """
    removed = 0
    uid = os.getuid()
    for name in list_segments():
        pid = _creator_pid(name)
        if pid is None or pid_alive(pid):
            continue
        try:
            if (shm_dir() / name).stat().st_uid != uid:  # another user's leftovers are theirs to sweep
                continue
        except OSError:
            continue
        removed += _remove(name)
    return removed
