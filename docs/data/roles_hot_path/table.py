"""Median of each side's runs per measure, from runs.jsonl (written by run.sh): `python table.py runs.jsonl`."""

import json
import statistics
import sys

MEASURE = {"train_dqn_cartpole": "train_fps"}  # the sampling benches: full_path_steps_per_second
rows: dict[tuple[str, str], list[float]] = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = MEASURE.get(r["bench"], "full_path_steps_per_second")
    rows.setdefault((r["bench"], r["side"]), []).append(float(r[key]))
print("| measure | before (median) | after (median) | after / before | runs |")
print("|---|---|---|---|---|")
for bench in dict.fromkeys(b for b, _ in rows):
    before, after = rows[(bench, "before")], rows.get((bench, "after"), [])
    b, a = statistics.median(before), statistics.median(after) if after else float("nan")
    runs = ", ".join(f"{x:,.0f}" for x in before) + " / " + ", ".join(f"{x:,.0f}" for x in after)
    print(f"| {bench} | {b:,.0f} | {a:,.0f} | {a / b:.3f} | {runs} |")
