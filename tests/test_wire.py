"""Tests for srl.base.wire: round trips, and that bad input only ever raises WireError."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from srl.base.wire import ALLOWED_DTYPES, WireError, decode, encode, pack, unpack


def _header(**overrides: object) -> bytes:
    """A msgpack header for one float32 [2] array, with fields overridden."""
    header: dict[str, object] = {
        "v": 1,
        "schema": "s",
        "meta": {},
        "arrays": [["x", "float32", [2]]],
    }
    header.update(overrides)
    return msgpack.packb(header, use_bin_type=True)


def _valid() -> list[bytes]:
    return [bytes(f) for f in encode("obs", {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}, {"k": 1})]


def test_round_trip_dtypes_and_shapes() -> None:
    arrays: dict[str, np.ndarray] = {
        f"a_{name}": (np.arange(24) % 7).astype(name).reshape(2, 3, 4) for name in sorted(ALLOWED_DTYPES)
    }
    arrays["scalar"] = np.array(3.5, dtype=np.float64)
    arrays["empty"] = np.zeros((0, 5), dtype=np.int32)
    arrays["strided"] = np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2]
    arrays["fortran"] = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    arrays["bigendian"] = np.arange(4, dtype=">f4")
    meta = {"version": 7, "tags": ["a", None, True, 1.5], "nested": {"x": [1, 2]}}
    msg = decode(encode("batch", arrays, meta), expect_schema="batch")
    assert msg.schema == "batch" and msg.meta == meta
    assert set(msg.arrays) == set(arrays)
    for name, arr in arrays.items():
        got = msg.arrays[name]
        assert got.shape == arr.shape and got.dtype.name == arr.dtype.name
        np.testing.assert_array_equal(got, arr)
        assert not got.flags.writeable


def test_encode_is_zero_copy_for_contiguous() -> None:
    arr = np.arange(10, dtype=np.float32)
    frames = encode("s", {"x": arr})
    arr[0] = 42.0
    assert decode(frames).arrays["x"][0] == 42.0


def test_no_arrays_and_bytearray_frames() -> None:
    msg = decode([bytearray(f) for f in encode("ping")])
    assert msg.schema == "ping" and msg.arrays == {} and msg.meta == {}
    msg = decode([bytearray(bytes(f)) for f in encode("s", {"x": np.ones(3)})])
    assert not msg.arrays["x"].flags.writeable


@pytest.mark.parametrize(
    "arrays, meta",
    [
        ({"x": np.array([object()], dtype=object)}, None),
        ({"x": np.zeros(2, dtype=np.complex64)}, None),
        ({"x": np.zeros((1,) * 9)}, None),
        ({1: np.zeros(2)}, None),
        (None, {"x": np.float32(1.0)}),
        (None, {1: "int key"}),
        (None, {"x": {2: "nested int key"}}),
    ],
)
def test_encode_rejects(arrays: dict, meta: dict | None) -> None:
    with pytest.raises(WireError):
        encode("s", arrays, meta)


BAD_FRAME_SETS: dict[str, list[bytes]] = {
    "no frames": [],
    "garbage header": [b"\xc1\xff\x00garbage", b"\x00" * 8],
    "truncated header": [_header()[:-3], b"\x00" * 8],
    "trailing header bytes": [_header() + b"\x00", b"\x00" * 8],
    "header not a map": [msgpack.packb([1, 2, 3]), b"\x00" * 8],
    "extra key": [_header(extra=1), b"\x00" * 8],
    "version 2": [_header(v=2), b"\x00" * 8],
    "version bool": [_header(v=True), b"\x00" * 8],
    "schema not str": [_header(schema=5), b"\x00" * 8],
    "meta not map": [_header(meta=[1]), b"\x00" * 8],
    "arrays not list": [_header(arrays={"x": 1}), b"\x00" * 8],
    "object dtype": [_header(arrays=[["x", "object", [2]]]), b"\x00" * 16],
    "dtype not str": [_header(arrays=[["x", 4, [2]]]), b"\x00" * 8],
    "negative dim": [_header(arrays=[["x", "float32", [-2]]]), b""],
    "float dim": [_header(arrays=[["x", "float32", [2.0]]]), b"\x00" * 8],
    "too many dims": [_header(arrays=[["x", "uint8", [1] * 9]]), b"\x00"],
    "spec wrong length": [_header(arrays=[["x", "float32"]]), b"\x00" * 8],
    "name not str": [_header(arrays=[[1, "float32", [2]]]), b"\x00" * 8],
    "duplicate names": [_header(arrays=[["x", "uint8", [1]], ["x", "uint8", [1]]]), b"\x00", b"\x00"],
    "missing frame": [_header()],
    "extra frame": [_header(), b"\x00" * 8, b"\x00"],
    "short buffer": [_header(), b"\x00" * 7],
    "long buffer": [_header(), b"\x00" * 9],
    "huge header": [b"\x00" * (64 * 1024 + 1), b"\x00" * 8],
    "huge dims": [_header(arrays=[["x", "float64", [2**62, 2**62]]]), b"\x00" * 8],
    "zero dim beside huge dim": [_header(arrays=[["x", "float32", [0, 2**64 - 1]]]), b""],
    "zero dim overflowing size": [_header(arrays=[["x", "float32", [0, 2**62, 2**62]]]), b""],
    "ext type": [msgpack.packb(msgpack.ExtType(3, b"ab")), b""],
}


@pytest.mark.parametrize("case", sorted(BAD_FRAME_SETS))
def test_decode_rejects_malformed(case: str) -> None:
    with pytest.raises(WireError):
        decode(BAD_FRAME_SETS[case])


def test_decode_rejects_non_buffers() -> None:
    for frames in ([123], [_header(), 4.5], None, 17, [None]):
        with pytest.raises(WireError):
            decode(frames)  # type: ignore[arg-type]


def test_schema_and_fields_checks() -> None:
    frames = _valid()
    with pytest.raises(WireError, match="schema"):
        decode(frames, expect_schema="other")
    assert decode(frames, fields={"x": ("float32", (None, 3))}).arrays["x"].shape == (2, 3)
    bad_fields: list[dict[str, tuple[str, tuple[int | None, ...]]]] = [
        {"x": ("float64", (2, 3))},
        {"x": ("float32", (2, 4))},
        {"x": ("float32", (2,))},
        {"x": ("float32", (2, 3)), "y": ("int32", ())},
        {},
    ]
    for fields in bad_fields:
        with pytest.raises(WireError):
            decode(frames, fields=fields)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.binary(max_size=64), max_size=4))
def test_random_frames_only_raise_wire_error(frames: list[bytes]) -> None:
    try:
        decode(frames)
    except WireError:
        pass


_DIMS = st.lists(st.one_of(st.integers(0, 4), st.integers(-(2**63), 2**64 - 1), st.floats(), st.none()), max_size=10)
_SPECS = st.lists(
    st.lists(
        st.one_of(st.text(max_size=3), st.sampled_from(sorted(ALLOWED_DTYPES) + ["object", "V8"]), _DIMS),
        max_size=4,
    ),
    max_size=3,
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(_SPECS, st.lists(st.binary(max_size=32), max_size=4))
def test_random_headers_only_raise_wire_error(specs: list[list[object]], buffers: list[bytes]) -> None:
    """Structured fuzzing reaches the spec/shape checks that random bytes rarely hit."""
    try:
        decode([_header(arrays=specs), *buffers])
    except WireError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_message_only_raises_wire_error(data: st.DataObject) -> None:
    frames = [bytearray(f) for f in _valid()]
    index = data.draw(st.integers(0, len(frames) - 1))
    frame = frames[index]
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = data.draw(st.integers(0, max(len(frame) - 1, 0)))
        if op == "flip" and frame:
            frame[pos] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del frame[pos:]
        else:
            frame[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    if data.draw(st.booleans()):
        frames = frames[: data.draw(st.integers(0, len(frames)))]
    try:
        decode(frames, expect_schema="obs", fields={"x": ("float32", (None, 3))})
        decode(unpack(pack(frames)))
    except WireError:
        pass


def test_pack_round_trip_and_alignment() -> None:
    frames = encode("s", {"a": np.arange(3, dtype=np.uint8), "b": np.arange(5, dtype=np.float64)}, {"m": "x"})
    packed = pack(frames)
    views = unpack(packed)
    assert [bytes(v) for v in views] == [bytes(f) for f in frames]
    msg = decode(views)
    np.testing.assert_array_equal(msg.arrays["b"], np.arange(5, dtype=np.float64))
    assert msg.arrays["b"].flags.aligned
    assert unpack(pack([])) == []
    assert [bytes(v) for v in unpack(memoryview(pack([b"", b"x"])))] == [b"", b"x"]


def test_unpack_rejects_malformed() -> None:
    good = pack([b"abc", b"defgh"])
    bad = [
        b"",
        b"SRL",
        b"XXXX" + good[4:],
        good[:-1],
        good + b"\x00" * 8,
        good[:12],
        struct.pack("<4sI", b"SRLW", 65),
        struct.pack("<4sIQ", b"SRLW", 1, 2**63),
    ]
    for data in bad:
        with pytest.raises(WireError):
            unpack(data)
    with pytest.raises(WireError):
        pack([b""] * 65)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=128))
def test_unpack_random_bytes_only_raise_wire_error(data: bytes) -> None:
    try:
        unpack(b"SRLW" + data)
        unpack(data)
    except WireError:
        pass
