"""What population-based training costs a run: env steps per second of a population that copies, beside the same
members whose population worker never finds one ready (no copies), and the longest a copy held a member's trainer
up (its export or its import, ``member<i>/copy_pause_max``).

    python scripts/bench_population.py --config configs/cartpole_pbt.yaml --config configs/halfcheetah_pbt.yaml \\
        --seconds 40 --rounds 3 --out docs/data/population/overhead.jsonl

Each setting is ``srl train CONFIG`` for ``--seconds`` of training (``run.max_train_seconds``), in alternation
within a round so that the machine's noise hits both alike. One JSON line per run, with the population worker's
own CPU time as a share of the machine's over the run (``worker_cpu_share``): a run of the same members without
that worker could be faster by at most that share.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ENDLESS = ["run.target_return=null", "run.total_env_steps=1000000000000", "run.eval_episodes=0"]
NEVER = "population.interval=1000000000000"
"""An interval no member reaches: the population worker runs, reads the episodes, and copies nothing."""


def _train(config: str, sets: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``srl train`` to its summary and its last metrics record."""
    run = Path(tempfile.mkdtemp(prefix="srl-bench-population-")) / "run"
    argv = [sys.executable, "-m", "srl.cli.main", "train", config, "--quiet", "--run-dir", str(run)]
    argv += [a for s in sets for a in ("--set", s)]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
        if out.returncode != 0:
            raise RuntimeError(f"srl train failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return json.loads((run / "summary.json").read_text()), json.loads(lines[-1])
    finally:
        shutil.rmtree(run.parent, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", action="append", required=True)
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for rnd in range(args.rounds):
        for config in args.config:
            for setting, extra in (("copies", []), ("no copies", [NEVER])):
                sets = [*ENDLESS, f"run.max_train_seconds={args.seconds}", *extra]
                summary, last = _train(config, sets)
                members = summary["population"]
                pauses = [v for k, v in last.items() if k.endswith("/copy_pause_max")]
                record = {
                    "config": config,
                    "round": rnd,
                    "setting": setting,
                    "seconds": args.seconds,
                    "train_fps": summary["train_fps"],
                    "env_steps": summary["env_steps"],
                    "copies": members.get("copies", 0),
                    "copy_pause_max": max(pauses) if pauses else None,
                    # the population worker's own CPU time, a share of the machine's over the run: the most a run
                    # of the same members without it could gain
                    "worker_cpu_share": summary["cost"]["core_seconds"].get("population", 0.0)
                    / (summary["wall_seconds"] * os.cpu_count()),
                    "restarts": summary["restarts"],
                }
                print(json.dumps(record), flush=True)
                with args.out.open("a") as f:
                    f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
