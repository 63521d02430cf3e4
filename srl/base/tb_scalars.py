"""TensorBoard scalar events, written by the ``tensorboard`` package's own event writer.

Why: ``torch.utils.tensorboard`` costs about 0.9 s to import, and time to solve is measured from process start,
so scalars used to be framed by hand (TFRecords, CRC32C and protobuf bytes in ``base/tbevents.py``). The
``tensorboard`` package's ``EventFileWriter`` with its ``Event`` / ``Summary`` protobufs costs about 0.15 s after
torch and keeps the file format TensorBoard's own business, so it is what writes here. It is imported on the
first write, not when this module is: the controller's first metrics record comes ``run.log_interval_seconds``
after the start, when the workers are already stepping, so the import never delays the first env step (and
workers forked before it do not inherit it).

The writer's own thread does the file writes; :meth:`ScalarWriter.add_scalars` only queues one event, so the
caller's loop makes no syscall. Data still queued when the process dies without :meth:`ScalarWriter.close` is
lost, as with any TensorBoard writer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ScalarWriter"]


class ScalarWriter:
    """Append scalar summaries to an event file in ``log_dir``, opened on the first write.

    Thread-safe. Writing after :meth:`close` raises ``ValueError``.
    """

    def __init__(self, log_dir: str | Path, *, flush_secs: float = 1.0, max_queue: int = 100) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._flush_secs = float(flush_secs)
        self._max_queue = int(max_queue)
        self._lock = threading.Lock()
        self._writer: Any = None  # tensorboard's EventFileWriter, once something is written
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
            if self._writer is None:
                from tensorboard.summary.writer.event_file_writer import EventFileWriter

                self._writer = EventFileWriter(
                    str(self.log_dir), max_queue_size=self._max_queue, flush_secs=self._flush_secs
                )
            self._writer.add_event(event)

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        """Log ``value`` under ``tag`` at ``step``."""
        self.add_scalars({tag: value}, step, wall_time)

    def flush(self) -> None:
        """Write everything queued so far to the file."""
        with self._lock:
            if self._writer is not None and not self._closed:
                self._writer.flush()

    def close(self) -> None:
        """Flush and close the file. Calling it again does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._writer is not None:
                self._writer.close()

    def __enter__(self) -> ScalarWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
