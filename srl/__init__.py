"""SRL: scalable distributed reinforcement learning.

The Python API (imports stay lazy, so ``import srl`` costs nothing on the start path):

- :func:`train` runs an experiment (a YAML path, a mapping, or an ``ExperimentConfig``) and returns its summary;
- :func:`load_policy` loads a trained policy from a run directory or a checkpoint for use in your own code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from srl.api.config import ExperimentConfig
    from srl.loaded import LoadedPolicies, LoadedPolicy

__all__ = ["load_policy", "train"]


def train(
    config: str | Path | Mapping[str, Any] | ExperimentConfig,
    overrides: Sequence[str] = (),
    run_dir: str | Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Train as ``srl train`` does and return the summary (also written to ``RUN_DIR/summary.json``).

    ``config``: an experiment file, a mapping shaped like one, or an ``ExperimentConfig``; ``overrides``:
    ``key=value`` strings as for ``--set``. Bad input raises ``srl.api.config.ConfigError`` naming the field.
    Ctrl-C (or SIGTERM) stops the run as it stops ``srl train``, with a final checkpoint and ``summary.json``, and
    then raises ``KeyboardInterrupt``, so the calling script stops too.
    """
    import sys

    from srl.api.config import ExperimentConfig, config_from, load_config, notices, to_dict
    from srl.runtime.train import train as run

    with notices() as notes:
        if isinstance(config, ExperimentConfig):
            cfg = config_from(to_dict(config), list(overrides))
        elif isinstance(config, Mapping):
            cfg = config_from(config, list(overrides))
        else:
            cfg = load_config(config, list(overrides))
    summary = run(
        cfg, None if run_dir is None else Path(run_dir), progress=sys.stderr if progress else None, notes=notes
    )
    if summary["stop_reason"] == "interrupted":  # stopped cleanly and summarized; the caller's code stops too
        raise KeyboardInterrupt
    return summary


def load_policy(path: str | Path) -> LoadedPolicy | LoadedPolicies:
    """The policy of a run directory (its newest checkpoint) or of one checkpoint file, ready to ``act``; for a
    run of several policies, all of them behind one ``act`` on a dict of agents."""
    from srl.loaded import load

    return load(Path(path))
