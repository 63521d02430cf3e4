"""Draw a self-play run's league: the Elo of every policy version that played a round (fitted to all the
league's results, the uniform random player fixed at 0), the members frozen into the pool marked, the fitted
rating of every bot (``league.bots``) as a level line, and the league worker's win rates against random and
the bots and its score against the pool.

    python scripts/plot_league.py RUN_DIR [RUN_DIR ...] --out docs/img/connect_four_elo.png

Reads ``RUN_DIR/league/pool.json`` and ``RUN_DIR/metrics.jsonl``; versions are placed at their env steps
(interpolated from the metrics records). Needs the ``plot`` extra.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="Connect Four self-play: the league")
    args = ap.parse_args()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for run in args.runs:
        pool = json.loads((run / "league" / "pool.json").read_text())
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        versions = np.array([r["policy_version"] for r in records], float)
        steps = np.array([r["env_steps"] for r in records], float)
        elo = sorted((int(v), e) for v, e in pool["ratings"].items() if int(v) >= 0)
        x = np.interp([v for v, _ in elo], versions, steps)
        (line,) = ax1.plot(x / 1e6, [e for _, e in elo], lw=1.2, label=f"{run.name}: every version")
        frozen = set(pool["frozen"])
        fx = [xi for xi, (v, _) in zip(x, elo) if v in frozen]
        fy = [e for v, e in elo if v in frozen]
        ax1.scatter(np.asarray(fx) / 1e6, fy, s=12, color=line.get_color(), label=f"{run.name}: frozen members")
        for bot, player in pool.get("bots", {}).items():
            ax1.axhline(pool["ratings"][str(player)], color=line.get_color(), ls=":", lw=1, label=f"{run.name}: {bot}")
        league = [r for r in records if "league_win_rate_vs_random" in r]
        ls = np.array([r["env_steps"] for r in league], float) / 1e6
        ax2.plot(
            ls, [r["league_win_rate_vs_random"] for r in league], color=line.get_color(), label=f"{run.name}: vs random"
        )
        ax2.plot(
            ls,
            [r["league_score_vs_pool"] for r in league],
            color=line.get_color(),
            ls="--",
            label=f"{run.name}: vs pool",
        )
        for key in sorted(
            {k for r in league for k in r if k.startswith("league_win_rate_vs_")} - {"league_win_rate_vs_random"}
        ):
            ax2.plot(
                ls,
                [r.get(key, np.nan) for r in league],
                color=line.get_color(),
                ls=":",
                label=f"{run.name}: vs {key.removeprefix('league_win_rate_vs_')}",
            )
    ax1.set(
        xlabel="env steps (M, learner moves)", ylabel="Elo (random = 0)", title="fitted Elo of the learner's versions"
    )
    ax2.set(
        xlabel="env steps (M, learner moves)", ylabel="score (sampled moves)", title="league rounds", ylim=(0, 1.02)
    )
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(args.title)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
