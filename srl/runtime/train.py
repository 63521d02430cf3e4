"""``train``: run one experiment under the runtime its config names and write the run directory."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TextIO


from srl.api.config import ExperimentConfig
from srl.base.shm import sweep_stale
from srl.runtime.evaluate import evaluate
from srl.runtime.plan import make_plan
from srl.system.controller import Controller
from srl.system.run_dir import RunDir, default_run_dir


def train(cfg: ExperimentConfig, run_dir: Path | None = None, start_time: float | None = None,
          progress: TextIO | None = sys.stderr) -> dict[str, Any]:
    """Train, evaluate the final policy, write ``summary.json``; return the summary."""
    start_time = time.time() if start_time is None else start_time
    sweep_stale()  # segments left by runs that were killed with SIGKILL
    plan = make_plan(cfg)
    rd = RunDir(run_dir or default_run_dir(cfg), cfg)
    controller = Controller(cfg, rd, start_time, progress)
    try:
        if cfg.runtime == "inline":
            from srl.runtime.inline import run_inline as runner
        else:
            from srl.runtime.local import run_local as runner
        snapshot = runner(plan, controller, rd.path)
        controller.tick(force=True)
        if progress is not None:
            progress.write("\n")
        final_eval = None
        if snapshot is not None and cfg.run.eval_episodes > 0 and controller.stop_reason not in ("error", "interrupted"):
            final_eval = evaluate(plan, snapshot, cfg.run.eval_episodes, seed=cfg.seed + 999_983)
        summary = controller.summary(final_eval)
        summary["run_dir"] = str(rd.path)
        rd.write_summary(summary)
        return summary
    finally:
        rd.close()
