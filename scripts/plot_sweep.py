"""Draw the layout-sweep figure of docs/benchmarks.md from data recorded by scripts/sweep_layout.py.

    python scripts/plot_sweep.py docs/data/sweep_cartpole.jsonl --out docs/img/sweep_cartpole.png

Learning curves come from ``srl plot RUN_DIR... --out PNG``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_sweep(data: Path, out: Path) -> None:
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    by_actors: dict[int, list[tuple[int, float, float]]] = defaultdict(list)
    for r in rows:
        lay = r["layout"]
        by_actors[lay["actors"]].append((lay["ring_size"], r["full_path_steps_per_second"], r["ratio"]))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for actors, pts in sorted(by_actors.items()):
        pts.sort()
        ax1.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{actors} actor(s)")
        ax2.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=f"{actors} actor(s)")
    env = rows[0]["env"]
    ax1.set(xlabel="ring size (slots per actor)", ylabel="env steps / s", title=f"{env}: full sampling path")
    ax2.set(xlabel="ring size (slots per actor)", ylabel="full path / plain loop", title="ratio to the plain loop")
    ax2.axhline(1.0, color="grey", lw=0.8, ls="--")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    plot_sweep(args.data, args.out)
    print(args.out)


if __name__ == "__main__":
    main()
