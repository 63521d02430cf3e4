"""Checkpoints: their format, and how they are saved, listed and loaded.

A checkpoint is one ``torch.save`` file of plain data and tensors: a trainer's ``ckpt_<version>.pt`` (to continue
training, :data:`TRAINING_ENTRIES`) and the eval worker's ``best.pt`` (to act, :data:`ACTING_ENTRIES`), each policy's
in its own folder of the run directory (``srl.system.run_dir.policy_checkpoints``). It is written atomically (a
checkpoint is whole or absent) and read with ``weights_only=True``: what crossed a disk is never unpickled as
Python objects. A state handed between workers (a population member's, to another member's trainer) travels as
the same format in bytes (:func:`checkpoint_bytes`), read back the same way (:func:`load_checkpoint_bytes`).
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import torch

from srl.base.fileio import atomic_save

CHECKPOINT_FORMAT = "srl-checkpoint-v2"
"""v2: observation parts and action heads (v1 checkpoints held one Box observation and are not read)."""
ACTING_ENTRIES = ("version", "policy_state", "config", "spaces")
"""What every checkpoint of a run holds (a trainer's ``ckpt_*.pt`` and the eval worker's ``best.pt``): enough to act."""
TRAINING_ENTRIES = (*ACTING_ENTRIES, "samples", "algorithm")
"""What a trainer's checkpoint holds besides, to continue training."""


def save_checkpoint(
    path: Path, state: Mapping[str, Any], write: Callable[[Mapping[str, Any], BinaryIO], None] = torch.save
) -> None:
    """Write ``state`` (its entries, the format stamped here) to ``path`` atomically: the file is whole or, when
    the write fails, the one before it is untouched (``OSError``)."""
    stamped = {"format": CHECKPOINT_FORMAT, **state}
    atomic_save(path, lambda f: write(stamped, f))


def checkpoint_bytes(state: Mapping[str, Any]) -> bytes:
    """``state`` (its entries, the format stamped here) as the bytes of a checkpoint file: what a message carries."""
    out = io.BytesIO()
    torch.save({"format": CHECKPOINT_FORMAT, **state}, out)
    return out.getvalue()


def checkpoints(folder: Path) -> list[Path]:
    """The checkpoints in ``folder``, oldest first (names carry the zero-padded version)."""
    return sorted(folder.glob("ckpt_*.pt"))


def load_checkpoint(path: Path, entries: Sequence[str] = TRAINING_ENTRIES) -> dict[str, Any]:
    """Read a checkpoint safely (no arbitrary unpickling) and check its format and that it holds ``entries``.

    A refusal says what the file is instead (empty, truncated, not a torch file, not a checkpoint of srl, the
    entry it lacks), so that one line tells a user whether to look for another file or at the disk.
    """
    problem = _torch_file_problem(path)
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    return _read(path, str(path), entries)


def load_checkpoint_bytes(data: bytes, entries: Sequence[str], what: str) -> dict[str, Any]:
    """:func:`load_checkpoint` of a checkpoint's bytes (a message's); ``what`` names them in a refusal."""
    if data[:4] != b"PK\x03\x04":
        raise ValueError(f"{what}: not a torch file (torch.save writes a zip archive)")
    return _read(io.BytesIO(data), what, entries)


def _read(source: Path | BinaryIO, what: str, entries: Sequence[str]) -> dict[str, Any]:
    """Read weights only from ``source`` and check the format and ``entries``; a refusal names ``what``."""
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # Python objects beyond plain data and tensors, or a damaged pickle
        said = _gist(str(exc).rpartition("WeightsUnpickler error:")[2])
        raise ValueError(
            f"{what}: not loadable as weights only ({said}): it holds Python objects, or is damaged"
        ) from None
    except Exception as exc:  # torch raises many types for damaged files
        raise ValueError(f"{what}: a damaged torch file ({type(exc).__name__}: {_gist(str(exc))})") from None
    if not isinstance(state, dict) or "format" not in state:
        raise ValueError(f"{what}: not a checkpoint of srl: no 'format' entry")
    if state["format"] != CHECKPOINT_FORMAT:
        raise ValueError(f"{what}: checkpoint format {state['format']!r}; this srl reads {CHECKPOINT_FORMAT!r}")
    missing = [k for k in entries if k not in state]
    if missing:
        raise ValueError(f"{what}: not a whole checkpoint of srl: no {missing[0]!r} entry")
    return state


def _torch_file_problem(path: Path) -> str | None:
    """What keeps ``path`` from being a whole file of ``torch.save`` (a zip archive holding ``*/data.pkl``), if
    anything: asked before torch reads it, whose own errors for these cases name neither the cause nor the file."""
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError as exc:
        return f"cannot read ({exc.strerror})"
    if not head:
        return "an empty file, not a checkpoint"
    if head != b"PK\x03\x04":
        return "not a torch file (torch.save writes a zip archive)"
    if not zipfile.is_zipfile(path):
        return "a truncated file (its zip directory, at the end, is missing)"
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:  # a bad entry name raises UnicodeDecodeError
        return f"a damaged zip directory ({type(exc).__name__}: {_gist(str(exc))})"
    if not any(n.endswith("/data.pkl") for n in names):
        return "a zip archive, not a torch file (no data.pkl in it)"
    return None


def _gist(text: str) -> str:
    """The first sentence of a library's error text, on one line."""
    line = next((line for line in text.splitlines() if line.strip()), "")
    return " ".join(line.split(". ")[0].split())
