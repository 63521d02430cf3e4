"""The tables of docs/benchmarks.md "Population-based training", from the files runs.sh writes:
``python docs/data/population/table.py``."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _records(name: str) -> list[dict]:
    path = HERE / name
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def main() -> None:
    runs = _records("halfcheetah.jsonl")
    print("| method | seed | picked member (its training return) | deterministic eval of the picked | copies |")
    print("|---|---|---|---|---|")
    for r in runs:
        picked = f"{r.get('picked', '-')} ({r['picked_train_return']:,.0f})"
        print(f"| {r['method']} | {r['seed']} | {picked} | {r['picked_eval_return']:,.0f} | {r.get('copies', '-')} |")
    print()
    # env steps/s are left out: the seeds ran on two days' machines, some beside other work (a run is counted in
    # env steps, so its result does not depend on them)
    print("| method | median eval of the picked policy | seeds' evals | env steps per run |")
    print("|---|---|---|---|")
    for method in ("pbt", "random search", "shipped"):
        mine = [r for r in runs if r["method"] == method]
        if mine:
            evals = [r["picked_eval_return"] for r in mine]
            steps = statistics.median(r["env_steps"] for r in mine)
            shown = " / ".join(f"{e:,.0f}" for e in evals)
            print(f"| {method} | {statistics.median(evals):,.0f} | {shown} | {steps:,.0f} |")
    warm = _records("halfcheetah_warmup.jsonl")
    if warm:
        by_seed = {r["seed"]: r for r in runs if r["method"] == "random search"}
        print()
        print("| seed | PBT, warmup 250k: picked (its training return) | its eval | copies | random search's eval |")
        print("|---|---|---|---|---|")
        for r in warm:
            rs = by_seed.get(r["seed"])
            other = f"{rs['picked_eval_return']:,.0f}" if rs else "-"
            picked = f"{r['picked']} ({r['picked_train_return']:,.0f})"
            print(f"| {r['seed']} | {picked} | {r['picked_eval_return']:,.0f} | {r['copies']} | {other} |")


if __name__ == "__main__":
    main()
