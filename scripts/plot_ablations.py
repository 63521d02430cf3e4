"""Draw the ablation figures of docs/benchmarks.md from lines written by scripts/ablations.py.

    python scripts/plot_ablations.py docs/data/ablation_td.jsonl --out-dir docs/img
    python scripts/plot_ablations.py docs/data/params_bench.jsonl --out-dir docs/img   # srl bench params lines

One PNG per file: the return against env steps per variant (mean over seeds, band = min..max), and for the
variance ablation also the actor's gradient-norm traces. A table of per-variant medians is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _curve(run: dict, grid: np.ndarray) -> np.ndarray:
    steps = np.asarray([s or 0 for s in run["trace"]["env_steps"]], float)
    ret = np.asarray([np.nan if r is None else r for r in run["trace"]["return_mean"]], float)
    ok = ~np.isnan(ret)
    if ok.sum() < 2:
        return np.full_like(grid, np.nan)
    curve = np.interp(grid, steps[ok], ret[ok], left=np.nan, right=np.nan)
    last = steps[ok][-1]
    curve[grid > last] = ret[ok][-1]  # a run that stopped (solved) keeps its last value
    return curve


def plot_params(rows: list[dict], out: Path) -> Path:
    """Root egress per version against readers, flat vs hierarchical (``srl bench params`` lines)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for mode in ("flat", "hierarchical"):
        pts = sorted(
            (r["readers"], r["root_bytes_per_version"] / 1e6, r["last_reader_latency_ms_median"])
            for r in rows
            if r["mode"] == mode
        )
        ax1.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
        ax2.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=mode)
    ax1.set(
        xscale="log",
        yscale="log",
        xlabel="readers (policy workers)",
        ylabel="root egress per version (MB)",
        title=f"parameter service, fan-out {rows[0]['fan_out']}, {rows[0]['snapshot_bytes'] / 1e6:.1f} MB snapshot",
    )
    ax2.set(
        xscale="log",
        xlabel="readers (policy workers)",
        ylabel="ms until the last reader holds it (median)",
        title="delivery latency (one machine, ipc)",
    )
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"params -> {out}")
    return out


def plot_file(path: Path, out_dir: Path) -> Path:
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if runs and runs[0].get("bench") == "params":
        return plot_params(runs, out_dir / f"{path.stem}.png")
    by_variant: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by_variant[r["variant"]].append(r)
    name = runs[0]["ablation"]
    env = Path(runs[0]["config"]).stem
    with_grads = name == "variance"
    fig, axes = plt.subplots(1, 2 if with_grads else 1, figsize=(12 if with_grads else 6.5, 4), squeeze=False)
    top = max(max(s or 0 for s in r["trace"]["env_steps"]) for r in runs)
    grid = np.linspace(0, top, 200)
    for variant, group in by_variant.items():
        curves = np.stack([_curve(r, grid) for r in group])
        (line,) = axes[0][0].plot(grid, np.nanmean(curves, axis=0), label=f"{variant} ({len(group)} seeds)")
        axes[0][0].fill_between(
            grid, np.nanmin(curves, axis=0), np.nanmax(curves, axis=0), alpha=0.15, color=line.get_color()
        )
        if with_grads:
            for i, r in enumerate(group):
                t = r["trace"]
                axes[0][1].plot(
                    t["env_steps"],
                    t["grad_norm_actor_applied"],
                    color=line.get_color(),
                    alpha=0.6,
                    lw=0.8,
                    label=variant if i == 0 else None,
                )
    axes[0][0].set(xlabel="env steps", ylabel="mean return (last 20 episodes)", title=f"{name} ablation: {env}")
    axes[0][0].legend(fontsize=8)
    axes[0][0].grid(alpha=0.3)
    if with_grads:
        axes[0][1].set(
            xlabel="env steps",
            ylabel="actor gradient norm applied (after clipping)",
            yscale="log",
            title="gradient norms, every seed",
        )
        axes[0][1].legend(fontsize=8)
        axes[0][1].grid(alpha=0.3)
    fig.tight_layout()
    out = out_dir / f"ablation_{name}_{env}.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"{name} ({env}) -> {out}")
    for variant, group in by_variant.items():
        print("  " + _row(variant, group))
    return out


def _cv(values: list[float]) -> float:
    """Coefficient of variation (std / mean): gradient-norm variability independent of the norms' scale."""
    return float(np.std(values) / np.mean(values)) if values else float("nan")


def _row(variant: str, group: list[dict]) -> str:
    def med(key: str) -> str:
        vals = [r[key] for r in group if r.get(key) is not None]
        return f"{statistics.median(vals):,.1f}" if vals else "-"

    solved = sum(bool(r.get("solved")) for r in group)
    finals = [r["train_return_mean"] for r in group if r.get("train_return_mean") is not None]
    grads = [_cv([g for g in r["trace"].get("grad_norm_actor_applied", []) if g is not None]) for r in group]
    return (
        f"| {variant} | {solved}/{len(group)} | {med('solved_wall_seconds')} | {med('solved_env_steps')} | "
        f"{med('final_eval_return_mean')} | {np.std(finals):.1f} | {statistics.median(grads):.3g} | "
        f"{med('bytes_published_per_version')} | {med('bytes_reduced_per_update')} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out-dir", type=Path, default=Path("docs/img"))
    args = p.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    print(
        "| variant | solved | solve s (median) | solve steps (median) | eval return (median) | "
        "train return std over seeds | applied actor grad-norm CV (median) | bytes published / version | "
        "bytes all-reduced / update |"
    )
    for path in args.files:
        plot_file(path, args.out_dir)


if __name__ == "__main__":
    main()
