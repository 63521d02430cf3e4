"""End-to-end training throughput of the Ray runtime vs the local runtime, same worker layout, interleaved.

Each measurement is ``srl bench train`` in a fresh process (the Ray runtime starts a private Ray instance on
this machine, one actor node group); the steady-state FPS counts from the first env step, so start-up is not
in it. Runs alternate local / ray so slow drifts of a shared machine hit both alike.

    python scripts/bench_runtimes.py --config configs/cartpole_ppo.yaml --seconds 90 --repeats 3 \
        --out docs/data/ray_vs_local.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from srl.bench.throughput import bench_train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", required=True, help="experiment YAML (repeatable)")
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, required=True, help="JSONL file the measurements are appended to")
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for config in args.config:
        fps: dict[str, list[float]] = {"local": [], "ray": []}
        for repeat in range(args.repeats):
            for runtime in ("local", "ray"):
                result = bench_train(config, args.seconds, [f"runtime={runtime}", *args.overrides])
                result.update(runtime=runtime, repeat=repeat)
                fps[runtime].append(result["train_fps"])
                with args.out.open("a") as f:
                    f.write(json.dumps(result) + "\n")
                print(json.dumps({"config": config, "runtime": runtime, "train_fps": result["train_fps"]}), flush=True)
        local, ray = statistics.median(fps["local"]), statistics.median(fps["ray"])
        ratios = [r / loc for loc, r in zip(fps["local"], fps["ray"])]
        print(
            json.dumps(
                {
                    "config": config,
                    "median_local": local,
                    "median_ray": ray,
                    "ray_over_local_median_of_pairs": round(statistics.median(ratios), 3),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
