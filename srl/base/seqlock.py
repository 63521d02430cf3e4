"""A versioned snapshot buffer that readers can never observe torn (a seqlock).

Why: the parameter service keeps the newest parameter snapshot in node-local
shared memory; many readers copy it out while one writer replaces it. Locks
across processes are fragile (a reader killed while holding one blocks the
writer forever), so readers instead detect concurrent writes and retry: the
writer makes ``seq`` odd before touching the data and even afterwards, and a
copy counts only if ``seq`` was even and unchanged across it.

Layout (one buffer, shared or not)::

    bytes [0, 8)     int64 seq      even = stable, odd = write in progress
    bytes [8, 16)    int64 version  -1 until the first write; only goes up
    bytes [16, 64)   padding (keeps the data 64-byte aligned)
    bytes [64, ...)  data: ``size`` elements of ``dtype``

Ordering relies on numpy performing each header store as one aligned 8-byte
write and on the CPU not reordering stores with stores / loads with loads
(true on x86-64). There is exactly one writer; this is not enforced.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike

from srl.base.shm import ShmArray

__all__ = ["HEADER_BYTES", "VersionedBuffer"]

HEADER_BYTES = 64
_SEQ, _VERSION = 0, 1


class VersionedBuffer:
    """One writer publishes (version, data); readers copy the newest consistent snapshot."""

    def __init__(self, backing: np.ndarray, size: int, dtype: np.dtype, shm: ShmArray | None) -> None:
        """Wrap a byte array with the documented layout; use the constructors below."""
        self._shm = shm
        self._size = size
        self._dtype = dtype
        self._header: np.ndarray | None = backing[:16].view(np.int64)
        self._data: np.ndarray | None = backing[HEADER_BYTES:].view(dtype)

    @staticmethod
    def _nbytes(size: int, dtype: DTypeLike) -> tuple[int, np.dtype]:
        """Total bytes of header plus data, and the resolved dtype."""
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        dt = np.dtype(dtype)
        return HEADER_BYTES + size * dt.itemsize, dt

    @classmethod
    def in_process(cls, size: int, dtype: DTypeLike) -> VersionedBuffer:
        """A buffer in private memory, for the inline runtime and tests."""
        nbytes, dt = cls._nbytes(size, dtype)
        buf = cls(np.zeros(nbytes, dtype=np.uint8), size, dt, None)
        buf._headers()[_VERSION] = -1
        return buf

    @classmethod
    def create_shared(cls, name: str, size: int, dtype: DTypeLike) -> VersionedBuffer:
        """Create the named shared segment (the writer's side); nothing written yet."""
        nbytes, dt = cls._nbytes(size, dtype)
        shm = ShmArray.create(name, (nbytes,), np.uint8)
        buf = cls(shm.array, size, dt, shm)
        buf._headers()[_VERSION] = -1
        return buf

    @classmethod
    def attach_shared(cls, name: str, size: int, dtype: DTypeLike) -> VersionedBuffer:
        """Open an existing segment (a reader's side, or a restarted writer)."""
        nbytes, dt = cls._nbytes(size, dtype)
        shm = ShmArray.attach(name, (nbytes,), np.uint8)
        return cls(shm.array, size, dt, shm)

    @property
    def size(self) -> int:
        """Number of data elements."""
        return self._size

    @property
    def dtype(self) -> np.dtype:
        """Element dtype of the data."""
        return self._dtype

    @property
    def name(self) -> str | None:
        """The shared segment name, or None for an in-process buffer."""
        return None if self._shm is None else self._shm.name

    def _headers(self) -> np.ndarray:
        """The [seq, version] words, or a clear error after ``close``."""
        if self._header is None:
            raise ValueError("VersionedBuffer is closed")
        return self._header

    def _payload(self) -> np.ndarray:
        """The data region, or a clear error after ``close``."""
        if self._data is None:
            raise ValueError("VersionedBuffer is closed")
        return self._data

    def version(self) -> int:
        """The newest version whose data is fully written, or -1 if none (cheap)."""
        return int(self._headers()[_VERSION])

    def write(self, version: int, data: np.ndarray) -> None:
        """Publish ``data`` as ``version``; versions must strictly increase.

        Only one process may ever write a given buffer.
        """
        header, payload = self._headers(), self._payload()
        current = int(header[_VERSION])
        if version <= current:
            raise ValueError(f"version {version} is not newer than current version {current}")
        src = np.asarray(data)
        if src.size != self._size:
            raise ValueError(f"data has {src.size} elements, buffer holds {self._size}")
        if not np.can_cast(src.dtype, self._dtype, "same_kind"):
            raise ValueError(f"cannot store {src.dtype} data in a {self._dtype} buffer")
        seq = int(header[_SEQ])
        if seq % 2:  # a previous writer died mid-write; the snapshot is replaced anyway
            seq += 1
        header[_SEQ] = seq + 1
        np.copyto(payload, src.reshape(-1), casting="same_kind")
        header[_VERSION] = version
        header[_SEQ] = seq + 2

    def read_into(self, out: np.ndarray, min_version: int, *, attempts: int = 4) -> int | None:
        """Copy a snapshot newer than ``min_version`` into ``out`` and return its version.

        Returns None when there is no newer version (``out`` untouched) or when
        every attempt overlapped a write (``out`` may then hold a partial copy,
        so read into a staging buffer, not into live state).
        """
        header, payload = self._headers(), self._payload()
        if out.size != self._size or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"out must be a writable C-contiguous array of {self._size} elements")
        if not np.can_cast(self._dtype, out.dtype, "same_kind"):
            raise ValueError(f"cannot read {self._dtype} data into a {out.dtype} array")
        flat = out.reshape(-1)
        for _ in range(attempts):
            seq = int(header[_SEQ])
            if seq % 2:
                continue
            version = int(header[_VERSION])
            if version <= min_version:
                return None
            np.copyto(flat, payload, casting="same_kind")
            if int(header[_SEQ]) == seq:
                return version
        return None

    def close(self) -> None:
        """Drop this process's views and unmap; idempotent."""
        self._header = None
        self._data = None
        if self._shm is not None:
            self._shm.close()

    def unlink(self) -> None:
        """Remove the shared segment's name (writer's side); no-op in process."""
        if self._shm is not None:
            self._shm.unlink()
