"""Wire format for every message that crosses a process or network boundary.

Why not pickle: unpickling runs arbitrary code, and a worker must be able to
receive bytes from a peer it does not trust to be bug-free without crashing or
being taken over. A message here is therefore a small msgpack header plus raw
array buffers, and ``decode`` validates everything before building zero-copy
numpy views. Any malformed input raises ``WireError`` (and nothing else), so a
receiver can log and drop a bad message with one ``except`` clause.

Frames (multipart, as ZeroMQ sends them)::

    frame 0     msgpack {"v": 1, "schema": str, "meta": dict,
                         "arrays": [[name, dtype_name, [dims...]], ...]}
    frame 1..n  the C-contiguous little-endian bytes of each array, in order

For byte streams that carry one buffer per message, ``pack`` / ``unpack`` join
the frames into a single buffer (see ``pack`` for the layout).
"""

from __future__ import annotations

import hmac
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

__all__ = [
    "ALLOWED_DTYPES",
    "MAX_DIMS",
    "MAX_FRAMES",
    "MAX_HEADER_BYTES",
    "Message",
    "WireError",
    "decode",
    "encode",
    "pack",
    "unpack",
]

VERSION = 1
MAX_HEADER_BYTES = 64 * 1024
MAX_DIMS = 8
MAX_FRAMES = 64
ALLOWED_DTYPES: frozenset[str] = frozenset(
    {
        "bool",
        "uint8",
        "int8",
        "uint16",
        "int16",
        "uint32",
        "int32",
        "uint64",
        "int64",
        "float16",
        "float32",
        "float64",
    }
)
_HEADER_KEYS = frozenset({"v", "schema", "meta", "arrays"})
_MAGIC = b"SRLW"
_PREFIX = struct.Struct("<4sI")  # magic, frame count
_LENGTH = struct.Struct("<Q")
_ALIGN = 8

Frame = bytes | memoryview | bytearray


class WireError(ValueError):
    """A message could not be encoded or failed validation on receipt."""


def check_token(token: object, expected: str) -> None:
    """Raise :class:`WireError` unless ``token`` (what a message's meta carried) is the run's ``expected`` token
    (compared in constant time)."""
    if not isinstance(token, str) or not hmac.compare_digest(token, expected):
        raise WireError("missing or wrong run token")


@dataclass(frozen=True)
class Message:
    """A decoded message; ``arrays`` are read-only views into the frames."""

    schema: str
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]


def _wire_dtype(name: str) -> np.dtype:
    """The little-endian dtype for an allowed dtype name (wire is always LE)."""
    return np.dtype(name).newbyteorder("<")


def encode(
    schema: str,
    arrays: Mapping[str, np.ndarray] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> list[bytes | memoryview]:
    """Encode a message into frames without copying contiguous arrays.

    The returned memoryviews reference the caller's arrays, so the arrays must
    not be modified until the frames have been sent.
    """
    if not isinstance(schema, str):
        raise WireError(f"schema must be str, got {type(schema).__name__}")
    specs: list[list[Any]] = []
    buffers: list[bytes | memoryview] = []
    for name, value in (arrays or {}).items():
        if not isinstance(name, str):
            raise WireError(f"array name must be str, got {type(name).__name__}")
        arr = np.asarray(value)
        if not arr.flags.c_contiguous:  # np.ascontiguousarray would turn 0-d into 1-d
            arr = arr.copy(order="C")
        if arr.dtype.name not in ALLOWED_DTYPES:
            raise WireError(f"array {name!r}: dtype {arr.dtype.name!r} not allowed")
        if arr.ndim > MAX_DIMS:
            raise WireError(f"array {name!r}: {arr.ndim} dims exceeds {MAX_DIMS}")
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        specs.append([name, arr.dtype.name, [int(d) for d in arr.shape]])
        # reshape(-1) of a contiguous array is a view; viewing as bytes gives a
        # flat 'B' buffer that every transport accepts, including for 0-d.
        buffers.append(arr.reshape(-1).view(np.uint8).data)
    meta_dict = dict(meta or {})
    _check_meta(meta_dict, "meta")
    header = {"v": VERSION, "schema": schema, "meta": meta_dict, "arrays": specs}
    try:
        packed = msgpack.packb(header, use_bin_type=True)
    except Exception as exc:  # msgpack raises TypeError/ValueError/OverflowError
        raise WireError(f"meta is not msgpack-native: {exc}") from exc
    if len(packed) > MAX_HEADER_BYTES:
        raise WireError(f"header is {len(packed)} bytes, cap is {MAX_HEADER_BYTES}")
    return [packed, *buffers]


def _check_meta(value: object, path: str) -> None:
    """Reject meta the receiver could not decode (e.g. numpy scalars, int keys).

    Checked at the sender so the error names the field instead of surfacing as
    an opaque rejection on the other side of the wire.
    """
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_meta(item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise WireError(f"{path}: key {key!r} must be str")
            _check_meta(item, f"{path}.{key}")
        return
    raise WireError(f"{path}: {type(value).__name__} is not msgpack-native")


def _as_bytes_view(frame: object, index: int) -> memoryview:
    """A flat byte view of any buffer-protocol frame, or WireError."""
    try:
        return memoryview(frame).cast("B")  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise WireError(f"frame {index} is not a contiguous byte buffer") from exc


def _unpack_header(view: memoryview) -> dict[str, Any]:
    """Parse frame 0 with strict limits so hostile input cannot exhaust memory."""
    if view.nbytes > MAX_HEADER_BYTES:
        raise WireError(f"header is {view.nbytes} bytes, cap is {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(
            view,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=MAX_HEADER_BYTES,
            max_bin_len=MAX_HEADER_BYTES,
            max_array_len=MAX_HEADER_BYTES,
            max_map_len=MAX_HEADER_BYTES,
            max_ext_len=0,
        )
    except Exception as exc:  # ExtraData, StackError, ValueError, TypeError, ...
        raise WireError(f"header is not valid msgpack: {type(exc).__name__}") from exc
    if not isinstance(header, dict):
        raise WireError(f"header must be a map, got {type(header).__name__}")
    if set(header) != _HEADER_KEYS:
        raise WireError(f"header keys {sorted(map(str, header))} != {sorted(_HEADER_KEYS)}")
    version = header["v"]
    if type(version) is not int or version != VERSION:
        raise WireError(f"header version {version!r} != {VERSION}")
    if not isinstance(header["schema"], str):
        raise WireError("header 'schema' must be a str")
    if not isinstance(header["meta"], dict):
        raise WireError("header 'meta' must be a map")
    if not isinstance(header["arrays"], list):
        raise WireError("header 'arrays' must be a list")
    return header


def _check_spec(spec: object) -> tuple[str, str, tuple[int, ...]]:
    """Validate one ``[name, dtype, dims]`` entry of the header."""
    if not isinstance(spec, list) or len(spec) != 3:
        raise WireError("array spec must be [name, dtype, dims]")
    name, dtype, dims = spec
    if not isinstance(name, str):
        raise WireError(f"array name must be str, got {type(name).__name__}")
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
        raise WireError(f"array {name!r}: dtype {dtype!r} not allowed")
    if not isinstance(dims, list) or len(dims) > MAX_DIMS:
        raise WireError(f"array {name!r}: shape must be a list of at most {MAX_DIMS} dims")
    if not all(type(d) is int and d >= 0 for d in dims):
        raise WireError(f"array {name!r}: shape {dims!r} must be non-negative ints")
    return name, dtype, tuple(dims)


def _check_fields(
    specs: list[tuple[str, str, tuple[int, ...]]],
    fields: Mapping[str, tuple[str, tuple[int | None, ...]]],
) -> None:
    """Check the arrays against the receiver's expected names, dtypes and shapes."""
    got = {name for name, _, _ in specs}
    missing, extra = set(fields) - got, got - set(fields)
    if missing:
        raise WireError(f"missing arrays {sorted(missing)}")
    if extra:
        raise WireError(f"unexpected arrays {sorted(extra)}")
    for name, dtype, shape in specs:
        want_dtype, want_shape = fields[name]
        if dtype != want_dtype:
            raise WireError(f"array {name!r}: dtype {dtype} != expected {want_dtype}")
        if len(shape) != len(want_shape) or any(w is not None and w != d for d, w in zip(shape, want_shape)):
            raise WireError(f"array {name!r}: shape {list(shape)} != expected {list(want_shape)}")


def decode(
    frames: Sequence[Frame],
    *,
    expect_schema: str | None = None,
    fields: Mapping[str, tuple[str, tuple[int | None, ...]]] | None = None,
) -> Message:
    """Validate frames and return zero-copy read-only array views.

    ``fields`` maps array name -> (dtype name, shape) where ``None`` in the
    shape accepts any size in that dimension. Raises only ``WireError``.
    """
    try:
        frames = list(frames)
    except Exception as exc:
        raise WireError("frames must be a sequence of byte buffers") from exc
    if not frames:
        raise WireError("no frames")
    header = _unpack_header(_as_bytes_view(frames[0], 0))
    schema = header["schema"]
    if expect_schema is not None and schema != expect_schema:
        raise WireError(f"schema {schema!r} != expected {expect_schema!r}")
    specs = [_check_spec(spec) for spec in header["arrays"]]
    names = [name for name, _, _ in specs]
    if len(set(names)) != len(names):
        raise WireError(f"duplicate array names in {names}")
    if len(frames) != 1 + len(specs):
        raise WireError(f"got {len(frames)} frames, header describes {1 + len(specs)}")
    if fields is not None:
        _check_fields(specs, fields)
    arrays: dict[str, np.ndarray] = {}
    for index, (name, dtype_name, shape) in enumerate(specs, start=1):
        view = _as_bytes_view(frames[index], index)
        dtype = _wire_dtype(dtype_name)
        count = math.prod(shape)
        if view.nbytes != count * dtype.itemsize:
            raise WireError(
                f"array {name!r}: buffer is {view.nbytes} bytes, "
                f"shape {list(shape)} x {dtype.itemsize} needs {count * dtype.itemsize}"
            )
        try:  # numpy rejects dims beyond intp even when another dim is 0
            if count == 0:
                arr = np.empty(shape, dtype=dtype)
            else:
                arr = np.frombuffer(view, dtype=dtype, count=count).reshape(shape)
        except (ValueError, OverflowError, MemoryError) as exc:
            raise WireError(f"array {name!r}: shape {list(shape)} rejected: {exc}") from exc
        arr.flags.writeable = False
        arrays[name] = arr
    return Message(schema=schema, meta=header["meta"], arrays=arrays)


def _padded(n: int) -> int:
    """Round up to the alignment so every payload in a packed buffer is 8-aligned."""
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def pack(frames: Sequence[Frame]) -> bytes:
    """Join frames into one buffer for transports that carry a single byte string.

    Layout (little endian): ``b"SRLW"``, uint32 frame count, one uint64 length
    per frame, then the payloads, each zero-padded to a multiple of 8 bytes so
    that arrays decoded from the packed buffer stay aligned for numpy/torch.
    """
    if len(frames) > MAX_FRAMES:
        raise WireError(f"{len(frames)} frames exceeds cap {MAX_FRAMES}")
    views = [_as_bytes_view(f, i) for i, f in enumerate(frames)]
    parts: list[bytes | memoryview] = [_PREFIX.pack(_MAGIC, len(views))]
    parts.extend(_LENGTH.pack(v.nbytes) for v in views)
    for v in views:
        parts.append(v)
        parts.append(bytes(_padded(v.nbytes) - v.nbytes))
    return b"".join(parts)


def unpack(data: bytes | memoryview | bytearray) -> list[memoryview]:
    """Split a ``pack``-ed buffer back into zero-copy frame views; only WireError."""
    view = _as_bytes_view(data, 0)
    if view.nbytes < _PREFIX.size:
        raise WireError(f"packed buffer too short ({view.nbytes} bytes)")
    magic, count = _PREFIX.unpack_from(view, 0)
    if magic != _MAGIC:
        raise WireError(f"bad magic {bytes(magic)!r}")
    if count > MAX_FRAMES:
        raise WireError(f"frame count {count} exceeds cap {MAX_FRAMES}")
    offset = _PREFIX.size + count * _LENGTH.size
    if view.nbytes < offset:
        raise WireError(f"packed buffer truncated in length table ({view.nbytes} bytes)")
    out: list[memoryview] = []
    for i in range(count):
        (length,) = _LENGTH.unpack_from(view, _PREFIX.size + i * _LENGTH.size)
        end = offset + length
        if end > view.nbytes:
            raise WireError(f"frame {i} of {length} bytes runs past end of buffer")
        out.append(view[offset:end])
        offset += _padded(length)
    if offset != view.nbytes:
        raise WireError(f"packed buffer is {view.nbytes} bytes, frames need {offset}")
    return out
