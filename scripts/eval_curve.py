"""Strength over training time: every checkpoint of a two-player run against fixed opponents, and its plot.

    python scripts/eval_curve.py RUN_DIR --opponent mcts:100 --opponent mcts:1000 --games 200 \
        --setting search= --setting alone=alphazero.search.rule=prior --jobs 2 --out curve.jsonl
    python scripts/eval_curve.py --plot curve.jsonl --out docs/img/curve.png --title "..."
    python scripts/eval_curve.py --plot "run A=a.jsonl" --plot "run B=b.jsonl" --out both.png  # side by side

Each record is one ``srl eval CHECKPOINT --opponent O --episodes G --set ...`` (seats alternating), with the
checkpoint's policy version, and the training time and env steps at which the run's metrics first show that
version. A setting is ``name=key=value,key=value`` (``name=`` for the run's own). ``--jobs`` evaluations run at
once: they are measurements of strength, not of speed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def version_times(run: Path) -> dict[int, tuple[float, int]]:
    """The wall seconds and env steps of the first metrics record of each policy version."""
    out: dict[int, tuple[float, int]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "policy_version" in record:
            out.setdefault(int(record["policy_version"]), (float(record["wall_seconds"]), int(record["env_steps"])))
    return out


def nearest(times: dict[int, tuple[float, int]], version: int) -> tuple[float, int]:
    """The record of ``version``, or of the last version logged before it (a checkpoint between two logs)."""
    before = [v for v in times if v <= version]
    return times[max(before)] if before else (0.0, 0)


def evaluate(checkpoint: Path, opponent: str, games: int, overrides: list[str]) -> dict[str, Any]:
    cmd = ["srl", "eval", str(checkpoint), "--opponent", opponent, "--episodes", str(games)]
    for o in overrides:
        cmd += ["--set", o]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_curve(args: argparse.Namespace) -> None:
    run = Path(args.run)
    times = version_times(run)
    checkpoints = [Path(c) for c in args.checkpoint] or sorted((run / "checkpoints").glob("ckpt_*.pt"))
    settings = []
    for text in args.setting or ["search="]:
        name, _, rest = text.partition("=")
        settings.append((name, [o for o in rest.split(",") if o]))
    jobs = [(c, o, s) for c in checkpoints for o in args.opponent for s in settings]

    def one(job: tuple[Path, str, tuple[str, list[str]]]) -> dict[str, Any]:
        checkpoint, opponent, (name, overrides) = job
        result = evaluate(checkpoint, opponent, args.games, overrides)
        seconds, steps = nearest(times, int(result["version"]))
        where = {"setting": name, "overrides": overrides, "train_minutes": round(seconds / 60, 2), "env_steps": steps}
        return where | result

    with ThreadPoolExecutor(args.jobs) as pool, open(args.out, "a") as out:
        for record in pool.map(one, jobs):
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(json.dumps(record), flush=True)


def plot(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    games = set()
    for item in args.plot:
        label, _, path = item.rpartition("=")
        for line in Path(path).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                games.add(r["games"])
                key = (label, r["opponent"], r["setting"])
                lines.setdefault(key, []).append((r["train_minutes"], r["score"]))
    fig, ax = plt.subplots(figsize=(10, 4))
    for (label, opponent, setting), points in sorted(lines.items()):
        points.sort()
        style = "-" if setting == "search" else "--"
        name = f"{setting} vs {opponent}" + (f" ({label})" if label else "")
        ax.plot(*zip(*points), style, marker="o", label=name)
    ax.set_xlabel("training minutes")
    ax.set_ylabel(f"score over {'/'.join(map(str, sorted(games)))} games (win 1, draw 0.5)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the points, not over them
    ax.set_title(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", nargs="?", help="run directory whose checkpoints to evaluate")
    p.add_argument("--opponent", action="append", default=[], help="random, mcts:N or a run directory")
    p.add_argument("--checkpoint", action="append", default=[], help="only these files (default: every one)")
    p.add_argument("--games", type=int, default=200)
    p.add_argument("--setting", action="append", help="name=key=value,... (repeatable; default: search=)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument(
        "--plot", action="append", help="draw this curve file ([label=]path, repeatable) instead of evaluating"
    )
    p.add_argument("--title", default="")
    p.add_argument("--out", required=True, help="curve file to append to, or the image with --plot")
    args = p.parse_args()
    if args.plot:
        plot(args)
    elif args.run and args.opponent:
        run_curve(args)
    else:
        p.error("give a run directory and at least one --opponent, or --plot")


if __name__ == "__main__":
    main()
