"""Snapshot dtypes on the network: float32, float16, or bfloat16 carried as its 16-bit pattern.

A parameter snapshot is float32 wherever it is computed with; ``params.transfer_dtype`` only sets how it
crosses a socket. float16 and bfloat16 both halve the bytes. float16 keeps 11 significant bits but overflows
past 65504; bfloat16 keeps float32's exponent range with 8 significant bits, which is what language-model
weights are trained and served in. NumPy has no bfloat16, so on the wire it is ``uint16``: the top half of
each float32, rounded to nearest, ties to even (what ``torch.Tensor.to(torch.bfloat16)`` does); NaN stays NaN.
Unpacking shifts the pattern back into the top half, which is exact.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

TransferDtype = Literal["float32", "float16", "bfloat16"]
TRANSFER_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
_QUIET_NAN = np.uint16(0x7FC0)


def wire_dtype(name: str) -> np.dtype:
    """The NumPy dtype a snapshot travels as (``bfloat16``: ``uint16``)."""
    if name not in TRANSFER_DTYPES:
        raise ValueError(f"transfer dtype must be one of {', '.join(TRANSFER_DTYPES)}, got {name!r}")
    return np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)


def itemsize(name: str) -> int:
    """Bytes per parameter on the wire."""
    return wire_dtype(name).itemsize


def pack(values: np.ndarray, name: str) -> np.ndarray:
    """A new array of ``values`` (float32) as they travel in ``name``."""
    if name != "bfloat16":
        return values.astype(wire_dtype(name))
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    top = bits >> 16  # in place from here: one temporary, as fast as float16's cast
    top &= 1
    top += 0x7FFF  # round half to even on the dropped 16 bits
    top += bits
    top >>= 16
    out = top.astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():  # rounding a NaN's low bits could carry it into an infinity
        out[nan] = _QUIET_NAN
    return out


def unpack_into(out: np.ndarray, wired: np.ndarray, name: str) -> None:
    """Write the float32 values of ``wired`` (as :func:`pack` made it) into ``out``."""
    if name != "bfloat16":
        np.copyto(out, wired, casting="same_kind")
        return
    np.left_shift(wired, 16, out=out.view(np.uint32), dtype=np.uint32)
