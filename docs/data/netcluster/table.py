"""The tables of docs/benchmarks.md "Across a cluster of network namespaces", from the files runs.sh writes, with
``srl plan``'s prediction for every row (same layout, same link): ``python docs/data/netcluster/table.py``."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
LINK_GBPS = {"local": None, "ray.cluster_utils": 10.0, "netcluster unshaped": 10.0}
"""Links of the settings that are not rate-limited: loopback and an unshaped veth pair, both faster than 10 Gbit/s
on this machine, which is ``srl plan``'s default."""


def _records(name: str) -> list[dict]:
    path = HERE / name
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def predict(config: str, setting: str, rate_mbit: float | None) -> tuple[float, str]:
    """``srl plan``'s env steps/s and bottleneck for the benchmark's layout: two actors inferring inline and one
    trainer, on one 2-core node (local) or on a trainer node and two actor nodes (every Ray setting)."""
    gbps = rate_mbit / 1000 if rate_mbit else LINK_GBPS.get(setting) or 10.0
    if setting == "local":
        shape = ["--nodes", "1", "--layout", "actors_per_node=2", "--layout", "trainer_nodes=0"]
    else:
        shape = ["--nodes", "3", "--layout", "actor_nodes=2", "--layout", "actors_per_node=1"]
        shape += ["--layout", "trainer_nodes=1", "--shared-cores", "2"]  # three nodes, one machine's 2 cores
    argv = [sys.executable, "-m", "srl.cli.main", "plan", "--costs", str(HERE / f"costs_{Path(config).stem}.jsonl")]
    argv += [*shape, "--layout", "policy_workers_per_node=0", "--layout", "trainers=1"]
    w = _workers(config)  # the runs' slots and batches (--layout changes the recommended layout's, which may differ)
    argv += ["--layout", f"envs_per_slot={w.envs_per_slot}", "--layout", f"batch_segments={w.batch_segments}"]
    argv += ["--cores-per-node", "2", "--link-gbps", f"{gbps:g}", "--json"]
    out = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT).stdout)
    return float(out["given"]["env_steps_per_second"]), str(out["given"]["bottleneck"])


def _workers(config: str) -> Any:
    from srl.api.config import load_config

    return load_config(ROOT / config).workers


def _trained_per_second(config: str, run: dict) -> float:
    """PPO trains one batch (``batch_segments`` segments of T x B steps) per policy version: the samples the
    trainer took in per second of training. Over a short run the env steps also count what still waits in the
    actors' pools and the queues when it stops; this does not."""
    w = _workers(config)
    return run["policy_version"] * w.batch_segments * w.segment_length * w.envs_per_slot / run["seconds"]


def main() -> None:
    rows: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for name in ("train.jsonl", "train_one_copy.jsonl", "train_20mbit_150s.jsonl"):
        for r in _records(name):
            label = {"train.jsonl": "", "train_one_copy.jsonl": ", one copy"}.get(name, ", one copy, 150 s")
            rows[(r["config"], r["setting"] + label)].append(r)
    print(
        "| config | setting | env steps/s (runs) | median | trained/s (median) | plan (bottleneck) "
        "| error against env steps/s | against trained/s "
        "| actor nodes' links: bytes sent per env step | head's link: bytes sent per version |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (config, setting), runs in rows.items():
        fps = [r["train_fps"] for r in runs]
        med = statistics.median(fps)
        trained = statistics.median(_trained_per_second(config, r) for r in runs)
        rate = (runs[0].get("shape") or {}).get("rate_mbit") or None
        pred, neck = predict(config, setting, rate)
        ran = [r for r in runs if r.get("links")]
        samples = (
            statistics.median(sum(r["links"][i]["tx_bytes"] for i in (1, 2)) / r["env_steps"] for r in ran)
            if ran
            else None
        )
        params = (
            statistics.median(r["links"][0]["tx_bytes"] / max(1, r["policy_version"]) for r in ran) if ran else None
        )
        print(
            f"| {Path(config).stem} | {setting} | {' / '.join(f'{f:,.0f}' for f in fps)} | {med:,.0f} | "
            f"{trained:,.0f} | {pred:,.0f} ({neck}) | {(pred - med) / med:+.0%} | {(pred - trained) / trained:+.0%} | "
            f"{'-' if samples is None else f'{samples:,.0f}'} | {'-' if params is None else f'{params:,.0f}'} |"
        )
    params = _records("params.jsonl")
    if params:
        print()
        print(
            "| actor nodes (actors) | mode | versions | head's link: bytes sent per version "
            "| root's count per version | ratio |"
        )
        print("|---|---|---|---|---|---|")
        for r in params:
            print(
                f"| {r['actor_nodes']} ({r['actors']}) | {r['mode']} | {r['policy_version']} | "
                f"{r['head_tx_bytes_per_version']:,.0f} | {r['root_counted_bytes_per_version']:,.0f} | "
                f"{r['head_tx_bytes_per_version'] / max(1.0, r['root_counted_bytes_per_version']):.2f} |"
            )
    faults = _records("faults.jsonl")
    if faults:
        print()
        for r in faults:
            print(json.dumps({k: v for k, v in r.items() if k not in ("config",)}))


if __name__ == "__main__":
    main()
