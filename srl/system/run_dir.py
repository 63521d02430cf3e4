"""The run directory contract: ``config.yaml``, ``metrics.jsonl``, TensorBoard events (``tb/``),
``checkpoints/`` (with the controller's ``controller.json``), ``errors.log`` (each worker failure with its traceback)
and, on exit, ``summary.json`` (written atomically).

A run directory can be lost while the run writes to it: deleted or moved, a full disk, a network filesystem that
fails. Every write of the controller's goes through :class:`RunDir` (or :func:`write_run_file`), which turns that
into :class:`RunDirError`, one line naming the directory, the reason and what was not written; the controller ends
the run with it. A deleted directory raises nothing on a file held open, so each write first checks that
``metrics.jsonl`` is still the file the run opened.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import yaml

from srl.api.config import ConfigError, ExperimentConfig, to_dict
from srl.base.fileio import FULL, atomic_write_text, write_all
from srl.base.tb_scalars import ScalarWriter


class RunDirError(RuntimeError):
    """The run directory cannot be written (deleted or moved, a network filesystem that failed)."""


class RunDirFull(RunDirError):
    """The disk under the run directory is full (or its quota spent) now: this write was skipped, nothing of it
    left half-written, and the next one is tried again."""

    errno = errno.ENOSPC  # what :func:`srl.base.fileio.with_room` waits out


FINAL_WAIT = 30.0
"""Seconds a run's last writes (its final checkpoint, counters and summary) wait for a full disk to free up."""


def _lost_line(path: Path, reason: str, what: str) -> str:
    return f"run directory {path}: {reason} ({what} not written)"


def write_run_file(path: Path, text: str) -> None:
    """Atomically write ``text`` to ``path``, a file of the run directory; a failure raises RunDirError
    (RunDirFull on a full disk, the file as it was)."""
    try:
        atomic_write_text(path, text)
    except OSError as exc:
        error = RunDirFull if exc.errno in FULL else RunDirError
        raise error(_lost_line(path.parent, exc.strerror or str(exc), path.name)) from None


def policy_checkpoints(run_dir: Path, cfg: ExperimentConfig, policy: str) -> Path:
    """Where policy ``policy``'s checkpoints are: ``RUN_DIR/checkpoints``, or in a run of several policies
    (``agents`` rules) ``RUN_DIR/checkpoints/<policy>``."""
    folder = Path(run_dir) / "checkpoints"
    return folder if len(cfg.policy_names) == 1 else folder / policy


@dataclass(frozen=True)
class RunCounters:
    """What a resumed run takes over from the controller of the processes before it.

    Why a file of its own beside the checkpoints (``checkpoints/controller.json``) and not fields in them: the
    trainers write the checkpoints, these numbers live in the controller, and reports run from the workers to
    the controller only. The controller rewrites it with every metrics record, so it is never older than the
    last record, and a resumed run's records go on from the last one's wall time and episodes.
    """

    wall_seconds: float
    """Seconds the run's processes have run, from each one's start."""
    env_steps: int | None
    """Env steps the run's processes have taken (what ``run.total_env_steps`` counts); None in a file written
    before the count was kept there (the checkpoints' count stands in)."""
    episodes: int
    """Episodes finished."""
    returns: list[float]
    """The newest episode returns (the window of ``run.return_window``), oldest first."""
    policy_returns: dict[str, list[float]]
    """Each policy's window, by policy name."""
    spent: dict[str, float] = field(default_factory=dict)
    """What the run's processes spent (:meth:`srl.system.cost.CostLedger.spent`): core-seconds per role, GPU-seconds,
    joules; empty in a file written before it was kept."""

    @staticmethod
    def parse(data: Any) -> RunCounters:
        """The counters in ``data`` (a decoded JSON object); ValueError naming the first field at fault."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        wall, policies = data.get("wall_seconds"), data.get("policy_returns")
        if not _is_number(wall) or wall < 0:
            raise ValueError("wall_seconds: a number >= 0 expected")
        episodes, steps = _count(data, "episodes"), _count(data, "env_steps") if "env_steps" in data else None
        if not isinstance(policies, dict):
            raise ValueError("policy_returns: an object expected")
        by_policy = {str(k): _numbers(v, f"policy_returns.{k}") for k, v in policies.items()}
        spent = data.get("spent", {})
        if not isinstance(spent, dict) or not all(_is_number(v) and v >= 0 for v in spent.values()):
            raise ValueError("spent: an object of numbers >= 0 expected")
        returns = _numbers(data.get("returns"), "returns")
        return RunCounters(
            float(wall), steps, episodes, returns, by_policy, {str(k): float(v) for k, v in spent.items()}
        )


def _count(data: dict[str, Any], field: str) -> int:
    value = data.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{field}: an integer >= 0 expected")
    return value


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(values: Any, field: str) -> list[float]:
    if not isinstance(values, list) or not all(_is_number(v) for v in values):
        raise ValueError(f"{field}: a list of numbers expected")
    return [float(v) for v in values]


@dataclass(frozen=True)
class Resume:
    """What a resumed run continues from (``srl train --resume``; read by
    :func:`srl.runtime.train.resume_config`)."""

    checkpoints: tuple[Path, ...]
    """Each policy's newest checkpoint, in the order of ``cfg.policy_names``."""
    versions: tuple[int, ...]
    """Each policy's version in it: the trainers publish on from there, and the progress line shows it until they
    report."""
    env_steps: int
    """Env steps the run took before: the controller's count (it saved it with every metrics record), so the
    budget and the records count on from the last record; for a run saved without it, its checkpoints' count."""
    counters: RunCounters | None
    """The controller's counters (None: the run saved none, and wall time, episodes and windows start at 0)."""


COUNTERS = "checkpoints/controller.json"
"""Where in a run directory the controller keeps its :class:`RunCounters`."""


def read_counters(run_dir: Path) -> RunCounters | None:
    """The counters a resumed run continues from; None when the run saved none (it counts from zero then).

    Raises ConfigError (one line) when the file is there but unreadable."""
    path = Path(run_dir) / COUNTERS
    try:
        return RunCounters.parse(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigError(f"{path}: not readable ({exc}); remove it to resume with counters from zero") from None


def default_run_dir(cfg: ExperimentConfig, root: Path = Path("runs")) -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>`` (a numeric suffix avoids collisions)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = root / f"{cfg.name}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = root / f"{cfg.name}-{stamp}-{n}"
    return path


def _start_wandb(cfg: ExperimentConfig, path: Path) -> Any:
    """A Weights & Biases run mirroring this run directory (``run.wandb_project``)."""
    try:
        import wandb  # type: ignore[import-not-found]  # an optional extra
    except ImportError:
        raise ConfigError("run.wandb_project: Weights & Biases is not installed (pip install wandb)") from None
    # The id follows the directory, so ``srl train --resume`` continues the same W&B run.
    run_id = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    return wandb.init(
        project=cfg.run.wandb_project, name=path.name, dir=str(path), config=to_dict(cfg), resume="allow", id=run_id
    )


class RunDir:
    """Owns the files of one run."""

    def __init__(self, path: Path, cfg: ExperimentConfig, resume: bool = False) -> None:
        """A new run directory, or with ``resume`` an existing one continued (metrics appended, config rewritten)."""
        self.path = Path(path)
        if resume:
            if not (self.path / "config.yaml").exists():
                raise ConfigError(f"{self.path}: not a run directory (no config.yaml)")
        elif (self.path / "config.yaml").exists():
            # Sharing a directory would mix two runs' metrics and let one run's checkpoint rotation delete the other's.
            raise ConfigError(f"{self.path}: already holds a run; choose another run directory")
        self.checkpoints = self.path / "checkpoints"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self.checkpoints.mkdir(exist_ok=True)
            atomic_write_text(self.path / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
            # unbuffered: a record is one write, and a failed one leaves nothing queued to fail again at close
            self._metrics = open(self.path / "metrics.jsonl", "ab", buffering=0)
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot create the run directory ({exc.strerror or exc})") from None
        self._identity = _identity(os.fstat(self._metrics.fileno()))
        self._wandb = _start_wandb(cfg, self.path) if cfg.run.wandb_project else None
        self._tb = ScalarWriter(self.path / "tb") if cfg.run.tensorboard else None
        self.lost: str | None = None
        """Why the directory was lost (the first :class:`RunDirError`); later writes raise it without trying."""

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """Around a write of ``what``: raise RunDirError when the directory is gone (deleted or moved: its
        ``metrics.jsonl`` is no longer the file this run opened) or the write fails; RunDirFull, and the directory
        not taken as lost, when the disk is full."""
        if self.lost is None:
            try:
                if _identity(os.stat(self.path / "metrics.jsonl")) == self._identity:
                    try:
                        yield
                    except OSError as exc:
                        if exc.errno in FULL:  # not lost: later writes are tried again
                            raise RunDirFull(_lost_line(self.path, exc.strerror or "disk full", what)) from None
                        raise
                    return
                reason = "deleted or moved"
            except FileNotFoundError:
                reason = "deleted or moved"
            except OSError as exc:
                reason = exc.strerror or str(exc)
            self.lost = _lost_line(self.path, reason, what)
        raise RunDirError(self.lost)

    def log(self, record: Mapping[str, Any], step: int) -> None:
        """Append one metrics record (JSON line) and mirror its numbers to TensorBoard. Raises RunDirError."""
        clean = {k: v for k, v in record.items() if not (isinstance(v, float) and not math.isfinite(v))}
        scalars = {
            k: v
            for k, v in clean.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "env_steps"
        }
        with self._writing("metrics"):
            write_all(self._metrics, (json.dumps(clean) + "\n").encode())
            if self._tb is not None:
                self._tb.add_scalars(scalars, step)
        if self._wandb is not None:
            self._wandb.log({**scalars, "env_steps": step}, step=step)

    def write_counters(self, counters: RunCounters) -> None:
        """Replace ``checkpoints/controller.json`` (atomically: a run killed meanwhile leaves the previous one).
        Raises RunDirError."""
        with self._writing(COUNTERS):
            atomic_write_text(self.path / COUNTERS, json.dumps(asdict(counters)) + "\n")

    def log_failure(self, worker: str, message: str, traceback: str) -> None:
        """Append a worker's failure to ``errors.log``: when, which worker, its error line and its traceback.
        Raises RunDirError."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self._writing("errors.log"), open(self.path / "errors.log", "a", encoding="utf-8") as f:
            f.write(f"{stamp} {worker}: {message}\n{traceback.rstrip()}\n\n")

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        """Raises RunDirError."""
        with self._writing("summary.json"):
            atomic_write_text(self.path / "summary.json", json.dumps(summary, indent=2) + "\n")

    def close(self) -> None:
        """Close every file; a lost directory raises nothing here (its error is the run's already)."""
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        with contextlib.suppress(OSError):
            self._metrics.close()
        if self._tb is not None:
            with contextlib.suppress(OSError):
                self._tb.close()
            self._tb = None


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino
