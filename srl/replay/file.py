"""A saved replay: a plain ``.npz`` (numpy arrays only, read with ``allow_pickle=False``), written atomically.

Why not ``np.savez``: it takes whole arrays, and a replay's live chunks sit in its ring as up to two runs of
slots (before and after the wrap). Gathering them first would copy every field, gigabytes for an Atari
replay, in the middle of a run. Here each field is streamed into its ``.npy`` member run by run, so the only
memory a save takes is the zip's buffers; the file is a standard ``.npz`` that ``np.load`` reads.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from srl.base.fileio import atomic_save

__all__ = ["layout_difference", "ring_runs", "saved_layout", "sweep_partial_saves", "write_npz"]


def ring_runs(array: np.ndarray, start: int, count: int) -> list[np.ndarray]:
    """Views of ``count`` consecutive rows of a ring ``array`` from row ``start`` (wrapping): one or two runs."""
    start %= max(1, len(array))
    first = array[start : start + count]
    return [first] if len(first) == count else [first, array[: count - len(first)]]


def write_npz(path: str | os.PathLike[str], arrays: Mapping[str, Sequence[np.ndarray]]) -> None:
    """Write ``.npz`` member ``name`` as the concatenation (on axis 0) of the runs ``arrays[name]``, atomically."""

    def write(file: BinaryIO) -> None:
        with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, runs in arrays.items():
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    _write_member(member, runs)

    atomic_save(path, write)


def _write_member(member: Any, runs: Sequence[np.ndarray]) -> None:
    """One ``.npy``: the header of the whole, then each run's bytes (C order, no copy of a contiguous run)."""
    first = runs[0]
    header = np.lib.format.header_data_from_array_1_0(first)
    header["shape"] = first.shape if len(runs) == 1 else (sum(len(r) for r in runs), *first.shape[1:])
    header["fortran_order"] = False
    np.lib.format.write_array_header_2_0(member, header)
    for run in runs:
        if run.size:
            member.write(np.ascontiguousarray(run).reshape(-1).view(np.uint8).data)


def sweep_partial_saves(path: str | os.PathLike[str]) -> int:
    """Remove what saves of ``path`` that were killed midway left (``atomic_save``'s temporary files: gigabytes
    each for an Atari replay); how many. Only for a file with one writer, which is not saving now."""
    target = Path(path)
    removed = 0
    for stale in target.parent.glob(f".{target.name}.*.tmp"):
        stale.unlink(missing_ok=True)
        removed += 1
    return removed


def saved_layout(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The layout (``ReplaySpec.describe``) a saved replay was written with, read without its arrays; a ValueError
    in one line for a file that is not a saved replay."""
    try:
        with np.load(path, allow_pickle=False) as data:
            layout: dict[str, Any] = json.loads(str(data["layout"]))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise ValueError(f"replay file {path}: not a saved replay ({type(exc).__name__}: {exc})") from None
    return layout


def layout_difference(saved: dict[str, Any], here: dict[str, Any]) -> str | None:
    """The first way a saved replay's layout (``ReplaySpec.describe``) differs from this store's, in words; None
    when they agree."""
    if saved["item_length"] != here["item_length"]:
        return f"its items are {saved['item_length']} steps, this run's {here['item_length']}"
    if saved.get("item_stride") != here["item_stride"]:
        return f"its items start every {saved.get('item_stride', '?')} steps, this run's every {here['item_stride']}"
    a, b = saved["fields"], here["fields"]
    for name in sorted(a.keys() & b.keys()):
        if a[name] != b[name]:
            return f"its field {name!r} is {a[name][1]} {a[name][0]} per chunk, this run's {b[name][1]} {b[name][0]}"
    if a.keys() - b.keys():
        return f"its fields {sorted(a.keys() - b.keys())} are not in this run's layout"
    if b.keys() - a.keys():
        return f"this run's fields {sorted(b.keys() - a.keys())} are not in it"
    return None
