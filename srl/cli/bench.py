"""``srl bench``: one command per measurement, one JSON object per line with ``--json``."""

from __future__ import annotations

import argparse
import json

from srl.api.config import load_config

# The sampling layout used when no config is given: two actors of two slots served by one policy worker.
DEFAULT_SAMPLING = ["runtime=local", "workers.actors=2", "workers.ring_size=2", "workers.envs_per_slot=16",
                    "workers.policy_workers=1", "run.tensorboard=false"]


def run_bench(args: argparse.Namespace) -> int:
    if args.what == "sampling":
        from srl.runtime.bench import bench_sampling

        overrides = [f"env.id={args.env}"] + ([] if args.config else DEFAULT_SAMPLING) + args.overrides
        cfg = load_config(args.config, overrides)
        result = bench_sampling(cfg, args.seconds)
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"{result['env']}: full path {result['full_path_steps_per_second']:,.0f} steps/s, "
                  f"plain loop {result['plain_loop_steps_per_second']:,.0f} steps/s, ratio {result['ratio']:.2f}")
        return 0
    if args.what == "solve":
        from srl.runtime.bench import bench_solve

        result = bench_solve(args.config or "configs/cartpole_ppo.yaml", args.runs, args.overrides)
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"{result['config']}: solved {result['solved']}/{result['runs']}, median time to solve "
                  f"{result['median_solved_wall_seconds']} s from process start")
        return 0
    raise AssertionError(args.what)
