"""The tables of docs/benchmarks.md "Population-based training", from the files runs.sh writes:
``python docs/data/population/table.py``.

``halfcheetah_rounds.jsonl`` holds PBT as it is (one copy per round of 4 members), ``halfcheetah_rounds_warmup.jsonl``
the same with a 250k warmup; ``halfcheetah.jsonl`` random
search, the shipped config and PBT before the fix of 2026-12-05 (up to two copies per round), which
``halfcheetah_warmup.jsonl`` and ``halfcheetah_min_gap.jsonl`` also predate."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _records(name: str) -> list[dict]:
    path = HERE / name
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def _picked(r: dict) -> str:
    return f"{r.get('picked', '-')} ({r['picked_train_return']:,.0f})"


def main() -> None:
    runs = _records("halfcheetah.jsonl")
    pbt = _records("halfcheetah_rounds.jsonl")
    by = {(r["method"], r["seed"]): r for r in runs}
    head = "| seed | PBT: picked (its training return) | its eval | copies | random search: picked | its eval |"
    print(head + " shipped, 1M |")
    print("|---|---|---|---|---|---|---|")
    for seed in sorted({r["seed"] for r in pbt} | {s for m, s in by if m == "random search"}):
        p, rs, sh = [x for x in pbt if x["seed"] == seed], by.get(("random search", seed)), by.get(("shipped", seed))
        cells = [_picked(p[0]), f"{p[0]['picked_eval_return']:,.0f}", str(p[0]["copies"])] if p else ["-"] * 3
        cells += [_picked(rs), f"{rs['picked_eval_return']:,.0f}"] if rs else ["-"] * 2
        cells += [f"{sh['picked_eval_return']:,.0f}" if sh else "-"]
        print(f"| {seed} | " + " | ".join(cells) + " |")
    print()
    # env steps/s are left out: the seeds ran on two days' machines, some beside other work (a run is counted in
    # env steps, so its result does not depend on them)
    groups = {
        "PBT": pbt,
        "PBT, warmup 250k": _records("halfcheetah_rounds_warmup.jsonl"),
        "random search": [r for r in runs if r["method"] == "random search"],
        "shipped PPO, 1M": [r for r in runs if r["method"] == "shipped"],
        "PBT before the fix": [r for r in runs if r["method"] == "pbt"],
        "PBT before the fix, warmup 250k": _records("halfcheetah_warmup.jsonl"),
    }
    print("| method | median eval of the picked policy | over seeds 1-3 | seeds' evals | env steps per run |")
    print("|---|---|---|---|---|")
    for name, mine in groups.items():
        if mine:
            evals = [r["picked_eval_return"] for r in sorted(mine, key=lambda r: r["seed"])]
            first = [r["picked_eval_return"] for r in mine if r["seed"] <= 3] or [float("nan")]
            steps = statistics.median(r["env_steps"] for r in mine)
            shown = " / ".join(f"{e:,.0f}" for e in evals)
            print(
                f"| {name} | {statistics.median(evals):,.0f} | {statistics.median(first):,.0f} | {shown} | "
                f"{steps / 1e6:.1f}M |"
            )
    print()
    print("Before the fix, per seed:")
    print()
    print("| method | seed | picked (its training return) | its eval | copies |")
    print("|---|---|---|---|---|")
    old = [r for r in runs if r["method"] == "pbt"]
    old += [{**r, "method": "pbt, warmup 250k"} for r in _records("halfcheetah_warmup.jsonl")]
    old += [{**r, "method": "pbt, min_gap 500"} for r in _records("halfcheetah_min_gap.jsonl")]
    for r in sorted(old, key=lambda r: (r["method"], r["seed"])):
        print(f"| {r['method']} | {r['seed']} | {_picked(r)} | {r['picked_eval_return']:,.0f} | {r['copies']} |")


if __name__ == "__main__":
    main()
