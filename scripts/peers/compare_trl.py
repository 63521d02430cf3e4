"""srl beside TRL: throughput and the training reward against wall time.

Reads an srl run directory (``metrics.jsonl``: ``env_steps``, ``reward``, ``tokens_trained``, ``response_length``
per record) and a TRL log, ``trl_arithmetic.py``'s (GRPO, one line per optimizer step, its ``reward``) or
``trl_ppo_preference.py``'s (PPO, one line per update, its reward model's ``rm_score``), each ending with a
summary line; prints one JSON line per system with completions and completion tokens per second and the mean
training reward in windows of wall time, and plots reward against wall time (TRL's per-step rewards smoothed
over as many recent completions as srl's ``run.return_window``).

    python scripts/peers/compare_trl.py RUN_DIR TRL_JSONL --window 60 --out docs/img/rlhf_arithmetic_trl.png
    python scripts/peers/compare_trl.py RUN_DIR TRL_PPO_JSONL --smooth 500 --ylabel "reward model score" \
        --out docs/img/rlhf_preference_trl.png
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np


def srl_curve(run: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward" in r]
    summary = json.loads((run / "summary.json").read_text())
    wall = np.array([r["wall_seconds"] for r in rows])
    # ``return_mean`` is the mean reward of the run's last completions (run.return_window of them)
    reward = np.array([r["return_mean"] for r in rows])
    last = rows[-1]
    tokens = last["env_steps"] * last["response_length"]  # completions x their mean length (the latest update's)
    out = {
        "system": "srl",
        "wall_seconds": summary["wall_seconds"],
        "completions": summary["env_steps"],
        "completions_per_second": summary["env_steps"] / summary["wall_seconds"],
        "completion_tokens_per_second_end_to_end": last["tokens_per_second"],
        "approx_completion_tokens": tokens,
        "train_tokens_per_second_last_update": last["train_tokens_per_second"],
        "final_eval_return_mean": summary.get("final_eval_return_mean"),
        "initial_eval_return_mean": summary.get("initial_eval_return_mean"),
    }
    return wall, reward, out


def trl_curve(log: Path, smooth: int) -> tuple[np.ndarray, np.ndarray, dict]:
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    key = "reward" if any("step" in r and "reward" in r for r in rows) else "rm_score"  # GRPO's log, or PPO's
    steps = [r for r in rows if key in r and ("step" in r or "update" in r)]
    summary = next((r for r in reversed(rows) if r.get("summary") or "total_wall_s" in r), {})
    wall = np.array([r["wall_s"] for r in steps])
    reward = np.array([r[key] for r in steps])
    # completions per log line: each optimizer step's share of a batch (GRPO), or an update's batch (PPO)
    per_step = int(summary.get("completions_per_step", summary.get("completions_per_update", 128)))
    completions = per_step * len(steps)
    # the same smoothing as srl's return_mean: the mean over the last ``smooth`` completions
    k = max(1, round(smooth / per_step))
    reward = np.array([reward[max(0, i - k + 1) : i + 1].mean() for i in range(len(reward))])
    out = {"system": "trl", "steps": len(steps), "completions": completions, **summary}
    out["completions_per_second"] = completions / float(summary.get("total_wall_s", wall.max()))
    return wall, reward, out


def windows(wall: np.ndarray, reward: np.ndarray, width: float) -> list[tuple[float, float]]:
    edges = np.arange(0.0, wall.max() + width, width)
    return [
        (float(hi), float(reward[(wall > lo) & (wall <= hi)].mean()))
        for lo, hi in itertools.pairwise(edges)
        if ((wall > lo) & (wall <= hi)).any()
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("trl_log", type=Path)
    p.add_argument("--window", type=float, default=60.0)
    p.add_argument("--smooth", type=int, default=2000, help="TRL's reward: mean over this many recent completions")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--ylabel", default="training reward (exact match, sampled)")
    args = p.parse_args()
    trl = trl_curve(args.trl_log, args.smooth)
    name = "TRL PPOTrainer" if "completions_per_update" in trl[2] else "TRL GRPOTrainer"
    curves = {"srl": srl_curve(args.run_dir), name: trl}
    for wall, reward, info in curves.values():
        info["reward_by_wall_window"] = windows(wall, reward, args.window)
        print(json.dumps(info))
    if args.out is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for label, (wall, reward, _) in curves.items():
            ax.plot(wall, reward, label=label)
        ax.set_xlabel("wall seconds from process start")
        ax.set_ylabel(args.ylabel)
        ax.legend()
        fig.tight_layout()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=120)


if __name__ == "__main__":
    main()
