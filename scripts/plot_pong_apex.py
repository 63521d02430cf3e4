"""Draw the Ape-X-beside-SB3 Pong figure of docs/benchmarks.md: training return against wall time and env steps.

    python scripts/plot_pong_apex.py docs/data/pong_apex_srl.jsonl docs/data/pong_apex_sb3.jsonl \
        --out docs/img/pong_apex_sb3.png

The first file: the ``metrics.jsonl`` of an ``srl train configs/pong_apex.yaml`` run, or records kept from it
(``wall_seconds``, ``env_steps``, ``return_mean``: the mean of the last ``run.return_window`` games). The second:
``scripts/peers/sb3_pong_dqn.py --curve``, one line per finished game, drawn as the mean of the last 20 games,
the same window.
"""

from __future__ import annotations

import argparse
import json
from collections import deque
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

WINDOW = 20


def srl_curve(metrics: Path) -> tuple[list[float], list[int], list[float]]:
    seconds, steps, returns = [], [], []
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if record.get("return_mean") is not None:
            seconds.append(record["wall_seconds"])
            steps.append(record["env_steps"])
            returns.append(record["return_mean"])
    return seconds, steps, returns


def sb3_curve(path: Path) -> tuple[list[float], list[int], list[float]]:
    seconds, steps, returns, window = [], [], [], deque(maxlen=WINDOW)
    for line in path.read_text().splitlines():
        game = json.loads(line)
        window.append(game["return"])
        seconds.append(game["wall_seconds"])
        steps.append(game["env_steps"])
        returns.append(sum(window) / len(window))
    return seconds, steps, returns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("srl_metrics", type=Path)
    p.add_argument("sb3_curve", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    curves = {
        "srl Ape-X (configs/pong_apex.yaml)": srl_curve(args.srl_metrics),
        "SB3 DQN (RL Zoo)": sb3_curve(args.sb3_curve),
    }
    fig, (by_time, by_steps) = plt.subplots(1, 2, figsize=(11, 4))
    for label, (seconds, steps, returns) in curves.items():
        by_time.plot([s / 60 for s in seconds], returns, label=label)
        by_steps.plot(steps, returns, label=label)
    by_time.set(xlabel="wall minutes", ylabel=f"training return (last {WINDOW} games)", title="Pong, 2 cores")
    by_steps.set(xlabel="env steps", ylabel=f"training return (last {WINDOW} games)", title="Pong, 2 cores")
    for ax in (by_time, by_steps):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
