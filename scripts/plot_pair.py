"""Draw an srl run beside a peer's on one task: training return against wall time and against env steps.

    python scripts/plot_pair.py runs/hc_sac/metrics.jsonl sb3_halfcheetah_sac.jsonl --out docs/img/hc_sac_sb3.png \
        --title "HalfCheetah-v5, 2 cores" --srl-label "srl SAC" --peer-label "SB3 SAC (RL Zoo)"

The first file: an ``srl train`` run's ``metrics.jsonl``, or records kept from it (``wall_seconds``, ``env_steps``,
``return_mean``: the mean of the last ``run.return_window`` episodes). The second: a peer script's ``--curve``
(``scripts/peers/sb3_*.py``), one line per finished episode (``wall_seconds``, ``env_steps``, ``return``), drawn as
the mean of its last ``--window`` episodes: give the srl run's ``run.return_window`` (20 unless set), so that both
curves average alike; or a peer's own log points, already means (``return_mean``, as
``scripts/peers/benchmarl_qmix.py`` and ``pymarlzooplus_qmix.py`` write), drawn as they are. More seeds of either
(``--srl-seed``, ``--peer-seed``) are drawn in the same colour.
"""

from __future__ import annotations

import argparse
import json
from collections import deque
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

Curve = tuple[list[float], list[int], list[float]]
"""Wall seconds, env steps and the windowed training return of each point."""


def srl_curve(metrics: Path) -> Curve:
    """The points of an srl run's metrics that carry a return (none does before the first finished episode)."""
    seconds, steps, returns = [], [], []
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if record.get("return_mean") is not None:
            seconds.append(record["wall_seconds"])
            steps.append(record["env_steps"])
            returns.append(record["return_mean"])
    return seconds, steps, returns


def peer_curve(path: Path, window: int) -> Curve:
    """One point per finished episode of the peer: the mean return of its last ``window`` episodes (or the peer's
    own means, one per log point, where it writes ``return_mean``)."""
    seconds, steps, returns = [], [], []
    last: deque[float] = deque(maxlen=window)
    for line in path.read_text().splitlines():
        episode = json.loads(line)
        if "return" not in episode:
            if episode.get("return_mean") is not None:
                seconds.append(episode["wall_seconds"])
                steps.append(episode["env_steps"])
                returns.append(episode["return_mean"])
            continue
        last.append(episode["return"])
        seconds.append(episode["wall_seconds"])
        steps.append(episode["env_steps"])
        returns.append(sum(last) / len(last))
    return seconds, steps, returns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("srl_metrics", type=Path)
    p.add_argument("peer_curve", type=Path)
    p.add_argument("--srl-seed", type=Path, action="append", default=[], help="another srl run (any number)")
    p.add_argument("--peer-seed", type=Path, action="append", default=[], help="another peer run (any number)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--window", type=int, default=20, help="peer episodes averaged (the srl run's run.return_window)")
    p.add_argument("--title", default="", help="the task and machine, over both panels")
    p.add_argument("--srl-label", default="srl")
    p.add_argument("--peer-label", default="peer")
    args = p.parse_args()
    if args.window < 1:
        p.error(f"--window: must be >= 1, got {args.window}")
    curves = {
        args.srl_label: [srl_curve(path) for path in [args.srl_metrics, *args.srl_seed]],
        args.peer_label: [peer_curve(path, args.window) for path in [args.peer_curve, *args.peer_seed]],
    }
    fig, (by_time, by_steps) = plt.subplots(1, 2, figsize=(11, 4))
    for colour, (label, runs) in enumerate(curves.items()):
        for k, (seconds, steps, returns) in enumerate(runs):
            style = {"color": f"C{colour}", "label": label if k == 0 else None, "lw": 1.2 if len(runs) == 1 else 0.9}
            by_time.plot([s / 60 for s in seconds], returns, **style)
            by_steps.plot(steps, returns, **style)
    ylabel = f"training return (last {args.window} episodes)"
    by_time.set(xlabel="wall minutes", ylabel=ylabel, title=args.title)
    by_steps.set(xlabel="env steps", ylabel=ylabel, title=args.title)
    for ax in (by_time, by_steps):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
