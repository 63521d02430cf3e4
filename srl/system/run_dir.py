"""The run directory contract: ``config.yaml``, ``metrics.jsonl``, TensorBoard events (``tb/``),
``checkpoints/`` and, on exit, ``summary.json`` (written atomically)."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from srl.api.config import ConfigError, ExperimentConfig, to_dict
from srl.base.fileio import atomic_write_text
from srl.base.tb_scalars import ScalarWriter


def policy_checkpoints(run_dir: Path, cfg: ExperimentConfig, policy: str) -> Path:
    """Where policy ``policy``'s checkpoints are: ``RUN_DIR/checkpoints``, or in a run of several policies
    (``agents`` rules) ``RUN_DIR/checkpoints/<policy>``."""
    folder = Path(run_dir) / "checkpoints"
    return folder if len(cfg.policy_names) == 1 else folder / policy


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
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot create the run directory ({exc.strerror})") from None
        self.checkpoints = self.path / "checkpoints"
        self.checkpoints.mkdir(exist_ok=True)
        atomic_write_text(self.path / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
        self._wandb = _start_wandb(cfg, self.path) if cfg.run.wandb_project else None
        self._metrics = open(self.path / "metrics.jsonl", "a", buffering=1)
        self._tb = ScalarWriter(self.path / "tb") if cfg.run.tensorboard else None

    def log(self, record: Mapping[str, Any], step: int) -> None:
        """Append one metrics record (JSON line) and mirror its numbers to TensorBoard."""
        clean = {k: v for k, v in record.items() if not (isinstance(v, float) and not math.isfinite(v))}
        self._metrics.write(json.dumps(clean) + "\n")
        scalars = {
            k: v
            for k, v in clean.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "env_steps"
        }
        if self._tb is not None:
            self._tb.add_scalars(scalars, step)
        if self._wandb is not None:
            self._wandb.log({**scalars, "env_steps": step}, step=step)

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        atomic_write_text(self.path / "summary.json", json.dumps(summary, indent=2) + "\n")

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        self._metrics.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
