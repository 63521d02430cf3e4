"""The tables of docs/benchmarks.md's R2D2 section from the runs of runs.sh:

    python docs/data/r2d2/table.py runs/r2d2

Per variant and seed: the logged training return (the mean of the last 20 episodes) at the first record at or
past each of 50k, 100k, 150k and 200k env steps, the first env steps (and wall seconds) where it reached the run's target (475 where it has none), and
the final greedy evaluation; the medians over seeds below.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

MARKS = (50_000, 100_000, 150_000, 200_000)


def row(run: Path) -> dict:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    at = {}
    for mark in MARKS:
        past = [r for r in records if r["env_steps"] >= mark and "return_mean" in r]
        at[mark] = past[0]["return_mean"] if past else None
    target = summary.get("target_return") or 475  # the runs without a target to stop at: masked CartPole's 475
    solved = next((r for r in records if r.get("return_mean", -1e9) >= target), None)
    return {
        "at": at,
        "solved": None if solved is None else (solved["env_steps"], solved["wall_seconds"]),
        "eval": summary.get("final_eval_return_mean"),
        "env_steps": summary["env_steps"],
        "wall": summary["wall_seconds"],
    }


def main(root: Path) -> None:
    for variant in ("stored", "zero", "dqn", "popgym"):
        runs = sorted(root.glob(f"{variant}_*"))
        if not runs:
            continue
        rows = [row(r) for r in runs]
        print(f"## {variant}")
        for r, path in zip(rows, runs):
            marks = " / ".join("-" if r["at"][m] is None else f"{r['at'][m]:.1f}" for m in MARKS)
            solved = "no" if r["solved"] is None else f"{r['solved'][0]:,} ({r['solved'][1]:.0f} s)"
            print(f"{path.name}: {marks} | solved {solved} | eval {r['eval']} | {r['env_steps']:,} in {r['wall']:.0f} s")
        for m in MARKS:
            values = [r["at"][m] for r in rows if r["at"][m] is not None]
            if values:
                print(f"  median at {m:,}: {statistics.median(values):.1f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
