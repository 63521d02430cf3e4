"""``srl bench``: one command per measurement, one JSON object per line with ``--json``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from srl.api.config import ConfigError, load_config
from srl.base.transfer import TRANSFER_DTYPES
from srl.cli import add_overrides, check_device

# The sampling layout used when no config is given: two actors of two slots served by one policy worker.
DEFAULT_SAMPLING = [
    "runtime=local",
    "workers.actors=2",
    "workers.ring_size=2",
    "workers.envs_per_slot=16",
    "workers.policy_workers=1",
    "run.tensorboard=false",
]

WHAT = {
    "env": "env-only ceiling: plain loop over one slot, Gymnasium and EnvPool",
    "sampling": "full sampling path (actors -> policy workers -> sample stream) vs a plain loop",
    "compute": "inference and PPO-update cost per sample, and the compute bound they imply",
    "train": "end-to-end training throughput and where each worker's time goes",
    "solve": "time from the program's start to solved, over several seeds",
    "params": "parameter service: root sends and bytes per version, flat vs hierarchical, as readers grow",
    "costs": "per-stage costs of a config on this machine, the input of `srl plan` (see docs/scaling.md)",
    "allreduce": "the trainers' gradient all-reduce for a config: measured at --trainers counts beside the "
    "capacity model's ring",
    "replay": "replay store: insert, uniform sample and prioritized sample+update rates for the config's chunk "
    "shapes, beside a numpy ring buffer and cpprb",
    "search": "search trees: microseconds per simulation with B trees batched vs one at a time, beside a leaf's "
    "evaluation; with --config, that config's searching policy (MuZero) in simulations per second",
}


def add_parser(sub: Any) -> None:
    b = sub.add_parser("bench", help="measure throughput (JSON out)")
    b.add_argument("what", choices=list(WHAT), help="; ".join(f"{k}: {v}" for k, v in WHAT.items()))
    b.add_argument(
        "--config", default=None, help="experiment YAML (default: built-in layout, or CartPole for train/solve)"
    )
    b.add_argument("--env", default=None, help="environment id (overrides the config's)")
    b.add_argument("--seconds", type=float, default=10.0, help="measurement time")
    b.add_argument(
        "--device",
        default=None,
        help="compute: where to measure (default cpu); costs: also measure the update and inference there "
        "(cpu, cuda, cuda:N)",
    )
    b.add_argument("--runs", type=int, default=3, help="solve: runs (seeds 1..N), each a fresh process")
    add_overrides(b)
    b.add_argument("--json", action="store_true", help="print one JSON object per measurement")
    p = b.add_argument_group("params")
    p.add_argument("--readers", default="1,2,4,8,16,32", help="comma-separated reader (policy worker) counts")
    p.add_argument("--per-group", type=int, default=4, help="readers per node group (one relay each)")
    p.add_argument("--fan-out", type=int, default=4, help="children per server in the relay tree")
    p.add_argument("--size", type=int, default=1_700_000, help="snapshot length in floats (default: ~Nature CNN)")
    p.add_argument("--versions", type=int, default=10, help="versions published per measurement")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between versions")
    p.add_argument("--dtype", choices=list(TRANSFER_DTYPES), default="float32", help="transfer dtype")
    a = b.add_argument_group("allreduce")
    a.add_argument("--trainers", default="2,4", help="comma-separated data-parallel trainer counts")
    a.add_argument("--rounds", type=int, default=30, help="reductions timed per measurement")
    s = b.add_argument_group("search")
    s.add_argument("--trees", default="1,16,64,256", help="comma-separated batch sizes (trees searched together)")
    s.add_argument("--simulations", type=int, default=32, help="simulations per search")
    s.add_argument("--actions", type=int, default=7, help="actions per node (Connect Four: 7)")
    s.add_argument("--rule", choices=["gumbel", "puct"], default="gumbel", help="the search's rule")


def run_bench(args: argparse.Namespace) -> int:
    from srl.bench import throughput

    overrides = ([f"env.id={args.env}"] if args.env else []) + args.overrides
    config = args.config or "configs/cartpole_ppo.yaml"
    if args.what == "params":
        from srl.bench.params import bench_params

        try:
            readers = [int(n) for n in args.readers.split(",")]
        except ValueError:
            raise ConfigError(f"--readers: must be comma-separated integers, got {args.readers!r}") from None
        if min(readers) < 1 or min(args.per_group, args.fan_out, args.size, args.versions) < 1:
            raise ConfigError("--readers, --per-group, --fan-out, --size and --versions must be >= 1")
        for result in bench_params(
            readers,
            per_group=args.per_group,
            fan_out=args.fan_out,
            size=args.size,
            versions=args.versions,
            interval=args.interval,
            dtype=args.dtype,
        ):
            print(json.dumps(result) if args.json else _human(result), flush=True)
        return 0
    if args.what == "allreduce":
        from srl.bench.allreduce import bench_allreduce

        try:
            worlds = [int(n) for n in args.trainers.split(",")]
        except ValueError:
            raise ConfigError(f"--trainers: must be comma-separated integers, got {args.trainers!r}") from None
        if min(worlds) < 2 or args.rounds < 1:
            raise ConfigError("--trainers must be >= 2 each and --rounds >= 1")
        for result in bench_allreduce(load_config(config, overrides), worlds, args.rounds):
            print(json.dumps(result) if args.json else _human(result), flush=True)
        return 0
    if args.what == "search":
        from srl.bench.search import bench_search

        try:
            batches = [int(n) for n in args.trees.split(",")]
        except ValueError:
            raise ConfigError(f"--trees: must be comma-separated integers, got {args.trees!r}") from None
        if min(batches) < 1 or args.simulations < 2 or args.actions < 2:
            raise ConfigError("--trees must be >= 1 each, --simulations and --actions >= 2")
        seconds = max(args.seconds / 5, 0.5)
        if args.config:
            from srl.bench.search import bench_policy_search

            results = bench_policy_search(load_config(args.config, overrides), batches, seconds)
        else:
            results = bench_search(batches, args.simulations, args.actions, args.rule, seconds)
        for result in results:
            print(json.dumps(result) if args.json else _human(result), flush=True)
        return 0
    if args.what == "replay":
        from srl.bench.replay import bench_replay

        for result in bench_replay(load_config(config, overrides)):
            print(json.dumps(result) if args.json else _human(result), flush=True)
        return 0
    if args.what == "solve":
        result = throughput.bench_solve(config, args.runs, overrides)
    elif args.what == "train":
        result = throughput.bench_train(config, args.seconds, overrides)
    else:
        defaults = DEFAULT_SAMPLING if args.what == "sampling" and not args.config else []
        cfg = load_config(args.config, defaults + overrides)
        device = check_device("--device", args.device)
        if args.what == "costs":
            from srl.bench.costs import bench_costs

            result = bench_costs(cfg, args.seconds, device)
        elif args.what == "compute":
            result = throughput.bench_compute(cfg, args.seconds, device or "cpu")
        else:
            fn = {"env": throughput.bench_env, "sampling": throughput.bench_sampling}[args.what]
            result = fn(cfg, args.seconds)
    print(json.dumps(result) if args.json else _human(result), flush=True)
    return 0


def _human(result: dict[str, Any]) -> str:
    return "  ".join(f"{k}={v}" for k, v in result.items() if not isinstance(v, (dict, list))) + (
        "".join(f"\n  {k}: {v}" for k, v in result.items() if isinstance(v, (dict, list)))
    )
