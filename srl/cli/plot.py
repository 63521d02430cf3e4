"""``srl plot RUN_DIR... [--out PNG]``: learning curves of one or several runs from their ``metrics.jsonl``.

Four panels: mean episode return vs env steps and vs wall time, env steps per
second, and mean policy lag. Needs matplotlib (``pip install 'srl[plot]'``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from srl.api.config import ConfigError

PANELS = [
    ("env_steps", "return_mean", "env steps", "mean episode return"),
    ("wall_seconds", "return_mean", "wall seconds", "mean episode return"),
    ("env_steps", "fps", "env steps", "env steps / s"),
    ("env_steps", "lag_mean", "env steps", "mean policy lag (versions)"),
]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plot", help="PNG learning curves of runs")
    p.add_argument("runs", nargs="+", type=Path, help="run directories (with metrics.jsonl)")
    p.add_argument("--out", type=Path, default=Path("curves.png"), help="output PNG")
    p.add_argument("--title", default=None, help="figure title")


def read_metrics(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        raise ConfigError(f"{run}: no metrics.jsonl (not a run directory?)") from None
    records = []
    for n, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if n != len(lines):  # a run killed mid-write may leave a torn last line; anything else is damage
                raise ConfigError(f"{path}:{n}: not a JSON record") from None
    return records


def plot_runs(runs: list[Path], out: Path, title: str | None = None) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("srl plot needs matplotlib: pip install 'srl[plot]'") from None
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for run in runs:
        records = read_metrics(run)
        for ax, (x, y, xlabel, ylabel) in zip(axes.flat, PANELS):
            pts = [(r[x], r[y]) for r in records if r.get(x) is not None and r.get(y) is not None]
            if pts:
                ax.plot(*zip(*pts), label=run.name)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def run_plot(args: argparse.Namespace) -> int:
    print(plot_runs(args.runs, args.out, args.title))
    return 0
