"""Run the SRL-technique ablations (several seeds each) and append one JSON line per run.

    python scripts/ablations.py critic   --seeds 1,2,3 --out docs/data/ablation_critic.jsonl
    python scripts/ablations.py td       --seeds 1,2,3 --out docs/data/ablation_td.jsonl
    python scripts/ablations.py variance --config configs/pendulum_ppo.yaml --seeds 1,2,3 \
        --set run.target_return=null --set run.total_env_steps=60000 --out docs/data/ablation_variance.jsonl
    python scripts/plot_ablations.py docs/data/ablation_*.jsonl --out-dir docs/img

Every run is a fresh ``srl train`` process on ``--config`` (CartPole by default) with the variant's
overrides; each line keeps the run's summary figures and its learning and gradient-norm traces.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from srl.bench.throughput import train_in_fresh_process

TWO_TRAINERS = ["workers.trainers=2", "workers.actors=2", "workers.batch_segments=1"]
# Staleness runs keep every segment (lags up to ~stride + pipeline) so compensation is the only difference.
KEEP_ALL = ["workers.max_policy_lag=100"]
ABLATIONS: dict[str, dict[str, list[str]]] = {
    "critic": {
        "decentralized": [*TWO_TRAINERS, "ppo.critic=decentralized"],
        "centralized": [*TWO_TRAINERS, "ppo.critic=centralized"],
    },
    "td": {
        "stride 1, plain": [*KEEP_ALL],
        "stride 1, compensated": [*KEEP_ALL, "ppo.td_compensation=true"],
        "stride 8, plain": [*KEEP_ALL, "workers.param_version_stride=8"],
        "stride 8, compensated": [*KEEP_ALL, "workers.param_version_stride=8", "ppo.td_compensation=true"],
        "stride 16, plain": [*KEEP_ALL, "workers.param_version_stride=16"],
        "stride 16, compensated": [*KEEP_ALL, "workers.param_version_stride=16", "ppo.td_compensation=true"],
        "stride 16, compensated + V-trace targets": [
            *KEEP_ALL,
            "workers.param_version_stride=16",
            "ppo.td_compensation=true",
            "ppo.vtrace_targets=true",
        ],
        "stride 32, plain": [*KEEP_ALL, "workers.param_version_stride=32"],
        "stride 32, compensated": [*KEEP_ALL, "workers.param_version_stride=32", "ppo.td_compensation=true"],
    },
    "variance": {
        "plain": [],
        "variance reduction": ["ppo.grad_clip=adaptive", "model.layer_norm=true", "ppo.normalize_values=true"],
    },
}
TRACE_KEYS = (
    "env_steps",
    "wall_seconds",
    "return_mean",
    "grad_norm_actor",
    "grad_norm_actor_applied",
    "clip_threshold_actor",
    "grad_norm_critic",
    "lag_mean",
    "is_weight_mean",
    "is_weight_truncated",
)
SUMMARY_KEYS = (
    "env_steps",
    "wall_seconds",
    "solved",
    "solved_wall_seconds",
    "solved_env_steps",
    "final_eval_return_mean",
    "train_return_mean",
    "policy_version",
    "dropped_segments",
    "lag_histogram",
    "bytes_published_per_version",
    "bytes_reduced_per_update",
)


def run_one(config: str, overrides: list[str]) -> dict:
    summary, records = train_in_fresh_process(config, overrides)
    out = {k: summary.get(k) for k in SUMMARY_KEYS}
    out["trace"] = {k: [r.get(k) for r in records] for k in TRACE_KEYS}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ablation", choices=list(ABLATIONS))
    p.add_argument("--config", default="configs/cartpole_ppo.yaml")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--set", dest="extra", action="append", default=[], help="override for every run")
    p.add_argument("--variants", default=None, help="semicolon-separated subset of the ablation's variants")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    variants = ABLATIONS[args.ablation]
    chosen = args.variants.split(";") if args.variants else list(variants)
    unknown = [v for v in chosen if v not in variants]
    if unknown:
        p.error(f"unknown variants {unknown}; {args.ablation} has {list(variants)}")
    for seed in map(int, args.seeds.split(",")):
        for name in chosen:
            overrides = [*variants[name], *args.extra, f"seed={seed}"]
            result = run_one(args.config, overrides)
            row = {
                "ablation": args.ablation,
                "config": args.config,
                "variant": name,
                "seed": seed,
                "overrides": overrides,
                **result,
            }
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(
                f"{args.ablation} / {name} / seed {seed}: solved={row['solved']} "
                f"at {row['solved_wall_seconds']} s, {row['solved_env_steps']} steps; "
                f"eval {row['final_eval_return_mean']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
