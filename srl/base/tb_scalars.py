"""TensorBoard scalar events, framed by the ``tensorboard`` package's own record writer.

Why: ``torch.utils.tensorboard`` costs about 0.9 s to import, and time to solve is measured from process start,
so it is not used. The ``tensorboard`` package's ``Event`` / ``Summary`` protobufs and its ``RecordWriter`` (the
length and CRC framing) cost about 0.15 s after torch and keep the file format TensorBoard's own business. They are
imported on the first write, not when this module is: the controller's first metrics record comes
``run.log_interval_seconds`` after the start, when the workers are already stepping, so the import never delays
the first env step (and workers forked before it do not inherit it).

Why not its ``EventFileWriter``: that writes from a thread of its own, so a failed write (a full disk, a deleted
directory) surfaces there as a raw traceback, and in the caller only on a later call. Here each
:meth:`ScalarWriter.add_scalars` is one unbuffered write in the caller's thread (one per log interval), so an
``OSError`` reaches the caller at once, and the file holds every event a call returned from.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from srl.base.fileio import write_all

__all__ = ["ScalarWriter"]


class ScalarWriter:
    """Append scalar summaries to an event file in ``log_dir``, opened on the first write.

    Thread-safe. Writing after :meth:`close` raises ``ValueError``; a failed write raises ``OSError``.
    """

    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file: BinaryIO | None = None  # the event file (unbuffered), once something is written
        self._records: Any = None  # tensorboard's RecordWriter over it
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def add_scalars(self, values: Mapping[str, float], step: int, wall_time: float | None = None) -> None:
        """Log several tagged values at ``step`` as one event (float32 each). An empty mapping writes nothing."""
        if not values:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()])
        event = Event(wall_time=time.time() if wall_time is None else float(wall_time), step=int(step), summary=summary)
        with self._lock:
            if self._closed:
                raise ValueError(f"ScalarWriter for {self.log_dir} is closed")
            if self._records is None:
                self._open()
            self._records.write(event.SerializeToString())

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        """Log ``value`` under ``tag`` at ``step``."""
        self.add_scalars({tag: value}, step, wall_time)

    def close(self) -> None:
        """Close the file. Calling it again does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._file is not None:
                self._file.close()

    def _open(self) -> None:
        """The event file, named as TensorBoard's own writers name theirs, starting with its version record."""
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.summary.writer.record_writer import RecordWriter

        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{id(self)}"
        self._file = open(self.log_dir / name, "xb", buffering=0)
        self._records = RecordWriter(_WholeWrites(self._file))
        self._records.write(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())

    def __enter__(self) -> ScalarWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _WholeWrites:
    """The file ``RecordWriter`` writes each framed record to: all of it, or an ``OSError``."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file

    def write(self, data: bytes) -> None:
        write_all(self.file, data)
