"""Write TensorBoard scalar event files with the standard library only.

Why: ``import torch.utils.tensorboard`` costs about 0.9 s at start-up (it pulls
in tensorboard, protobuf and friends), and we measure time-to-solve from process
start. Scalars are all we log, and their on-disk format is small enough to write
by hand, so this module does that and nothing else.

Format (what TensorBoard's readers expect):

* The file is a sequence of TFRecords. Each record is
  ``uint64 length (LE) | uint32 masked_crc32c(length bytes) | payload |
  uint32 masked_crc32c(payload)``, where
  ``mask(c) = (((c >> 15) | (c << 17)) + 0xA282EAD8) mod 2**32`` and CRC32C is
  the Castagnoli CRC (reflected polynomial 0x82F63B78).
* Each payload is a protobuf ``Event``: 1 ``wall_time`` (double), 2 ``step``
  (int64), 3 ``file_version`` (string), 5 ``summary`` (``Summary``).
  ``Summary`` holds repeated 1 ``value`` (``Summary.Value``), which holds
  1 ``tag`` (string) and 2 ``simple_value`` (float32).
* The first record in a file is an ``Event`` with ``file_version =
  "brain.Event:2"``.

Writes are collected in memory and handed to the OS at most about once per
``flush_secs`` (and on :meth:`EventWriter.flush` / :meth:`EventWriter.close`),
so the logging hot path never makes a syscall, let alone an fsync. A buffer
that grows past ``max_buffer_bytes`` is written out early to bound memory.
Data still buffered when the process dies without ``close()`` is lost, the same
trade-off TensorBoard's own writer makes.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import threading
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["EventWriter", "crc32c", "masked_crc32c", "encode_record"]

FILE_VERSION = "brain.Event:2"

_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF

# --------------------------------------------------------------------- CRC32C


def _make_crc32c_table() -> tuple[int, ...]:
    poly = 0x82F63B78  # Castagnoli, bit-reflected
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC32C_TABLE = _make_crc32c_table()


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data``; pass a previous result as ``crc`` to continue it."""
    table = _CRC32C_TABLE
    c = crc ^ _U32
    for b in bytes(data):
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ _U32


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """The TFRecord-masked CRC-32C of ``data``."""
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & _U32) + 0xA282EAD8) & _U32


def encode_record(payload: bytes) -> bytes:
    """Frame ``payload`` as one TFRecord."""
    header = struct.pack("<Q", len(payload))
    return b"".join(
        (
            header,
            struct.pack("<I", masked_crc32c(header)),
            payload,
            struct.pack("<I", masked_crc32c(payload)),
        )
    )


# ------------------------------------------------------------------- protobuf

# Tags (field_number << 3 | wire_type), pre-encoded; all fit in one byte.
_EVENT_WALL_TIME = b"\x09"  # 1, fixed64
_EVENT_STEP = b"\x10"  # 2, varint
_EVENT_FILE_VERSION = b"\x1a"  # 3, length-delimited
_EVENT_SUMMARY = b"\x2a"  # 5, length-delimited
_SUMMARY_VALUE = b"\x0a"  # Summary.value = 1, length-delimited
_VALUE_TAG = b"\x0a"  # Summary.Value.tag = 1, length-delimited
_VALUE_SIMPLE = b"\x15"  # Summary.Value.simple_value = 2, fixed32


def _varint(n: int) -> bytes:
    """Protobuf varint; negative numbers as 64-bit two's complement (int64 rules)."""
    if n < 0:
        n &= _U64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len_delimited(tag: bytes, body: bytes) -> bytes:
    return tag + _varint(len(body)) + body


def _float32(value: float) -> bytes:
    """Little-endian float32; finite values beyond float32 range become +/-inf, as a cast would."""
    v = float(value)
    try:
        return struct.pack("<f", v)
    except OverflowError:  # struct refuses what a float32 cast turns into inf
        return struct.pack("<f", math.copysign(math.inf, v))


def _summary_value(tag: str, value: float) -> bytes:
    body = _len_delimited(_VALUE_TAG, tag.encode("utf-8")) + _VALUE_SIMPLE + _float32(value)
    return _len_delimited(_SUMMARY_VALUE, body)


def _event(
    wall_time: float,
    step: int | None = None,
    file_version: str | None = None,
    summary: bytes | None = None,
) -> bytes:
    parts = [_EVENT_WALL_TIME, struct.pack("<d", wall_time)]
    if step:  # proto3: a zero step is the default and is not written
        parts += [_EVENT_STEP, _varint(step)]
    if file_version is not None:
        parts.append(_len_delimited(_EVENT_FILE_VERSION, file_version.encode("utf-8")))
    if summary is not None:
        parts.append(_len_delimited(_EVENT_SUMMARY, summary))
    return b"".join(parts)


# --------------------------------------------------------------------- writer


class EventWriter:
    """Append scalar summaries to a new TensorBoard event file in ``log_dir``.

    Thread-safe. Use as a context manager or call :meth:`close`; writing after
    ``close`` raises ``ValueError``.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        *,
        flush_secs: float = 1.0,
        max_buffer_bytes: int = 1 << 20,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.srl"
        self.path = self.log_dir / name
        self._flush_secs = float(flush_secs)
        self._max_buffer_bytes = int(max_buffer_bytes)
        self._lock = threading.Lock()
        self._buffer = bytearray()
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed in close()
        self._closed = False
        self._last_flush = time.monotonic()
        # The version record goes to disk at once so readers recognise the file.
        self._buffer += encode_record(_event(time.time(), file_version=FILE_VERSION))
        self.flush()

    # -- writing ------------------------------------------------------------

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        """Log ``value`` under ``tag`` at ``step``."""
        self._append(_summary_value(tag, value), step, wall_time)

    def add_scalars(self, values: Mapping[str, float], step: int, wall_time: float | None = None) -> None:
        """Log several tagged values at ``step`` as one event. An empty mapping writes nothing."""
        if not values:
            return
        self._append(b"".join(_summary_value(t, v) for t, v in values.items()), step, wall_time)

    def _append(self, summary: bytes, step: int, wall_time: float | None) -> None:
        wt = time.time() if wall_time is None else float(wall_time)
        record = encode_record(_event(wt, step=int(step), summary=summary))
        with self._lock:
            if self._closed:
                raise ValueError(f"EventWriter for {self.path} is closed")
            self._buffer += record
            if len(self._buffer) >= self._max_buffer_bytes or time.monotonic() - self._last_flush >= self._flush_secs:
                self._write_out()

    # -- flushing -----------------------------------------------------------

    def _write_out(self) -> None:
        """Hand the buffer to the OS (no fsync). Caller holds the lock."""
        if self._buffer:
            view = memoryview(self._buffer)
            written = 0
            try:
                while written < len(view):  # raw writes may be partial
                    n = self._file.write(view[written:])
                    written += n or 0
            finally:
                view.release()
                del self._buffer[:written]
        self._last_flush = time.monotonic()

    def flush(self) -> None:
        """Write everything buffered so far to the file."""
        with self._lock:
            if not self._closed:
                self._write_out()

    def close(self) -> None:
        """Flush and close the file. Calling it again does nothing."""
        with self._lock:
            if self._closed:
                return
            try:
                self._write_out()
            finally:
                self._closed = True
                self._file.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
