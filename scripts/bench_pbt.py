"""PBT against random search on HalfCheetah-v5, both counting all 4M env steps, and the shipped PPO config at 1M.

    python scripts/bench_pbt.py --seeds 1 2 3 --out /tmp/halfcheetah.jsonl --keep /tmp/halfcheetah_seed1

- PBT: ``configs/halfcheetah_pbt.yaml`` (4 members x 1M env steps; every 50k of a member's env steps the worst
  copies the best and perturbs the learning rate, the clip range, the entropy coefficient and GAE's lambda);
- random search: the same run with an interval no member reaches: 4 fixed configs drawn from the same ranges (the
  same draws as PBT's first values, from the same seed), 1M env steps each;
- the shipped ``configs/halfcheetah_ppo.yaml`` at 1M.

Each population's policy is picked the same way, by training return (the mean of its last 20 training
episodes); its deterministic evaluation over ``--eval-episodes`` episodes is the result. The runs of a seed go in
turn (PBT, random search, shipped; ``--methods`` picks some of them), one JSON line each. ``--keep DIR``: the first PBT run's ``config.yaml``,
``metrics.jsonl`` and ``population.jsonl`` are copied there (``srl plot DIR --population`` draws its lineage).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

NEVER = "population.interval=1000000000000"
METHODS = {"pbt": "pbt", "random": "random search", "shipped": "shipped"}


def _train(config: str, sets: list[str], keep: Path | None) -> dict[str, Any]:
    run = Path(tempfile.mkdtemp(prefix="srl-bench-pbt-")) / "run"
    argv = [sys.executable, "-m", "srl.cli.main", "train", config, "--quiet", "--run-dir", str(run)]
    argv += [a for s in sets for a in ("--set", s)]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=4 * 3600)
        if out.returncode != 0:
            raise RuntimeError(f"srl train failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for name in ("config.yaml", "metrics.jsonl", "population.jsonl", "summary.json"):
                shutil.copy(run / name, keep / name)
        return dict(json.loads((run / "summary.json").read_text()))
    finally:
        shutil.rmtree(run.parent, ignore_errors=True)


def _picked(summary: dict[str, Any]) -> dict[str, Any]:
    """The member with the best training return, and its deterministic evaluation."""
    members = summary["policies"]
    name = max(members, key=lambda n: members[n]["train_return_mean"] or float("-inf"))
    return {
        "picked": name,
        "picked_train_return": members[name]["train_return_mean"],
        "picked_eval_return": members[name]["final_eval_return_mean"],
        "members": {n: [m["train_return_mean"], m["final_eval_return_mean"]] for n, m in members.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--keep", type=Path, default=None)
    p.add_argument("--set", action="append", default=[], help="key=value for the population runs (repeatable)")
    p.add_argument(
        "--methods", nargs="+", choices=list(METHODS), default=list(METHODS), help="which runs of each seed (all)"
    )
    args = p.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    keep = args.keep
    for seed in args.seeds:
        common = [f"seed={seed}", f"run.eval_episodes={args.eval_episodes}", "run.tensorboard=false"]
        runs = [
            ("pbt", "configs/halfcheetah_pbt.yaml", [*common, *args.set]),
            ("random search", "configs/halfcheetah_pbt.yaml", [*common, *args.set, NEVER]),
            ("shipped", "configs/halfcheetah_ppo.yaml", common),
        ]
        chosen = {METHODS[m] for m in args.methods}
        for method, config, sets in (r for r in runs if r[0] in chosen):
            summary = _train(config, sets, keep if method == "pbt" else None)
            if method == "pbt":
                keep = None
            record: dict[str, Any] = {
                "method": method,
                "seed": seed,
                "env_steps": summary["env_steps"],
                "wall_seconds": summary["wall_seconds"],
                "train_fps": summary["train_fps"],
            }
            if method == "shipped":
                record.update(
                    picked_train_return=summary["train_return_mean"],
                    picked_eval_return=summary["final_eval_return_mean"],
                )
            else:
                record.update(_picked(summary), copies=summary["population"].get("copies", 0))
            print(json.dumps(record), flush=True)
            with args.out.open("a") as f:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
