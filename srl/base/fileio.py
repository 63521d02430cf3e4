"""Crash-safe file writes: a reader sees the old file or the new one, never half of one.

Why: run directories hold checkpoints, ``summary.json`` and configs that other
tools read while a run is alive or after it was killed. Writing in place could
leave a truncated file behind; instead we write a temporary file in the same
directory (same filesystem, so ``os.replace`` is atomic), fsync it, rename it
over the target, then fsync the directory so the rename itself survives a
power loss.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

__all__ = ["FULL", "atomic_save", "atomic_write_bytes", "atomic_write_text", "with_room", "write_all"]

FULL = (errno.ENOSPC, errno.EDQUOT)
"""The errors of a disk that may free up again."""
T = TypeVar("T")

PathLike = str | os.PathLike[str]


def atomic_save(path: PathLike, writer: Callable[[BinaryIO], None]) -> None:
    """Stream a file through ``writer(fileobj)`` and atomically put it at ``path``.

    For writers that want a file object (``torch.save``, ``np.save``). If
    anything fails, even an interrupt, the temporary file is removed, the
    previous file at ``path`` is left intact, and the error propagates.
    """
    target = Path(path)
    directory = target.parent
    tmp = directory / f".{target.name}.{secrets.token_hex(6)}.tmp"
    # os.open with 0o666 lets the umask decide permissions, like a plain open().
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fileobj:
            writer(fileobj)
            fileobj.flush()
            os.fsync(fileobj.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``."""

    def write(fileobj: BinaryIO) -> None:
        fileobj.write(data)

    atomic_save(path, write)


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8") -> None:
    """Atomically replace ``path`` with ``text`` encoded as ``encoding``."""
    atomic_write_bytes(path, text.encode(encoding))


def write_all(file: BinaryIO, data: bytes) -> None:
    """Write all of ``data`` to an unbuffered file, whose ``write`` may take less (a full disk takes what fits; the
    next call raises the reason), or none of it: where a write fails, the file is cut back to where it was before
    the OSError is raised, so no record is left half-written (a full disk that frees up later takes the next
    records whole). The file's size, not its position, says where the record began: a file opened to append writes
    at its end wherever its position is, and a record cut back leaves the position past the end."""
    start = os.fstat(file.fileno()).st_size
    view = memoryview(data)
    try:
        while view:
            view = view[file.write(view) or 0 :]
    except OSError:
        with contextlib.suppress(OSError):
            file.truncate(start)
            file.seek(start)
        raise


def _fsync_dir(directory: Path) -> None:
    """Persist the rename; some filesystems cannot fsync directories, which is harmless."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def with_room(write: Callable[[], T], wait: float) -> T:
    """``write()``, tried again every half second while it fails on a full disk (an error whose ``errno`` is in
    :data:`FULL`), for up to ``wait`` seconds: a run's last writes outlast a disk that is full for a moment."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return write()
        except (OSError, RuntimeError) as exc:
            if getattr(exc, "errno", None) not in FULL or time.monotonic() >= deadline:
                raise
        time.sleep(0.5)
