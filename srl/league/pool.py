"""The league's pool of frozen policies, kept in the run directory (``RUN_DIR/league``).

- ``v<version>.npy``: a member's acting-policy parameters (flat float32, as the parameter service ships them);
- ``pool.json``: the members (version, Elo, the learner's last score against it), every result the league
  worker recorded (``[a, b, points of a, games]``, players named by the version the learner had, ``-1`` the
  random player, ``-2`` and below the fixed bots, named in ``bots``), the Elo fitted to them of every player,
  and the versions ever frozen.

Both are written atomically (a reader never sees half a file) and read without pickle. The league worker is
the only writer; actors read the index when it changed and load members they do not hold yet.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from srl.base.fileio import atomic_save

INDEX = "pool.json"


@dataclass
class Member:
    version: int
    elo: float
    score: float = 0.5
    """The learner's last score against this member (1 a win, 0.5 a draw); PFSP weights come from it."""


@dataclass
class PoolIndex:
    members: list[Member] = field(default_factory=list)
    rounds: int = 0
    results: list[list[float]] = field(default_factory=list)
    """``[a, b, points a scored, games]`` per match."""
    ratings: dict[str, float] = field(default_factory=dict)
    """Fitted Elo by player (``str(version)``; the random player ``"-1"`` is the anchor at 0)."""
    frozen: list[int] = field(default_factory=list)
    """Every version ever frozen into the pool, in order."""
    bots: dict[str, int] = field(default_factory=dict)
    """The player id of every bot that ever played (by its name, ``league.bots``); ids are -2, -3, ..."""

    def bot_id(self, name: str) -> int:
        """The player id of the bot ``name``, given a new one the first time it plays."""
        if name not in self.bots:
            self.bots[name] = -2 - len(self.bots)
        return self.bots[name]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PoolIndex:
        return cls(
            [Member(int(m["version"]), float(m["elo"]), float(m.get("score", 0.5))) for m in data.get("members", [])],
            int(data.get("rounds", 0)),
            [[float(x) for x in r] for r in data.get("results", [])],
            {str(k): float(v) for k, v in data.get("ratings", {}).items()},
            [int(v) for v in data.get("frozen", [])],
            {str(k): int(v) for k, v in data.get("bots", {}).items()},
        )


def snapshot_path(folder: Path, version: int) -> Path:
    return folder / f"v{version:08d}.npy"


def read_index(folder: Path) -> PoolIndex:
    """The pool as last written (empty when there is none yet); a malformed index is one ValueError line."""
    path = folder / INDEX
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return PoolIndex()
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable league index ({exc})") from None
    try:
        return PoolIndex.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: malformed league index ({type(exc).__name__}: {exc})") from None


def write_index(folder: Path, index: PoolIndex) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(index.to_json(), indent=1).encode()

    def write(f: BinaryIO) -> None:
        f.write(text)

    atomic_save(folder / INDEX, write)


def write_snapshot(folder: Path, version: int, params: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic_save(
        snapshot_path(folder, version), lambda f: np.save(f, np.asarray(params, np.float32), allow_pickle=False)
    )


def read_snapshot(folder: Path, version: int, size: int) -> np.ndarray:
    """A member's parameters, checked against the policy's size (one ValueError line when they do not fit)."""
    path = snapshot_path(folder, version)
    try:
        params = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable league snapshot ({exc})") from None
    if params.shape != (size,) or params.dtype != np.float32:
        raise ValueError(f"{path}: {params.dtype} {params.shape} parameters, the policy has float32 ({size},)")
    return params
