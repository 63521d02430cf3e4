"""Sweep the sampling layout (actors x ring size) with ``srl bench sampling`` and append JSON lines to a file.

    python scripts/sweep_layout.py --env CartPole-v1 --out docs/data/sweep_cartpole.jsonl

Each point is one ``srl bench sampling`` process (full path vs plain loop, same machine, one after the other).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--actors", default="1,2,3")
    p.add_argument("--rings", default="1,2,4")
    p.add_argument("--envs-per-slot", type=int, default=16)
    p.add_argument("--policy-workers", type=int, default=1)
    p.add_argument("--seconds", type=float, default=4.0)
    args = p.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for actors, ring in itertools.product(map(int, args.actors.split(",")), map(int, args.rings.split(","))):
        cmd = [
            sys.executable,
            "-m",
            "srl.cli.main",
            "bench",
            "sampling",
            "--env",
            args.env,
            "--json",
            "--seconds",
            str(args.seconds),
            "--set",
            f"workers.actors={actors}",
            "--set",
            f"workers.ring_size={ring}",
            "--set",
            f"workers.envs_per_slot={args.envs_per_slot}",
            "--set",
            f"workers.policy_workers={args.policy_workers}",
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        with args.out.open("a") as f:
            f.write(out + "\n")
        r = json.loads(out)
        print(
            f"actors={actors} ring={ring}: full {r['full_path_steps_per_second']:,.0f} "
            f"plain {r['plain_loop_steps_per_second']:,.0f} ratio {r['ratio']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
