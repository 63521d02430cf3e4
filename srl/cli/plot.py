"""``srl plot RUN_DIR... [--out PNG]``: learning curves of one or several runs from their ``metrics.jsonl``.

Four panels: mean episode return vs env steps and vs wall time, env steps per
second, and mean policy lag. Needs matplotlib (``pip install 'srl[plot]'``).
Each run's ``config.yaml`` names what it trained: the legend shows its env id and
the default title its env ids and algorithms, so a run directory's name (which
comes from the config file it started from) cannot mislead.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from srl.api.config import ConfigError
from srl.api.config.load import yaml_problem

PANELS = [
    ("env_steps", "return_mean", "env steps", "mean episode return"),
    ("wall_seconds", "return_mean", "wall seconds", "mean episode return"),
    ("env_steps", "fps", "env steps", "env steps / s"),
    ("env_steps", "lag_mean", "env steps", "mean policy lag (versions)"),
]
MAX_TICKS = 6
"""At most this many x ticks per panel, so labels like ``1.25M`` never run into each other."""
SUFFIXES = ((1e9, "B"), (1e6, "M"), (1e3, "k"))


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plot", help="PNG learning curves of runs")
    p.add_argument("runs", nargs="+", type=Path, help="run directories (with metrics.jsonl)")
    p.add_argument("--out", type=Path, default=Path("curves.png"), help="output PNG")
    p.add_argument("--title", default=None, help="figure title (default: the runs' algorithms and env ids)")


def short_number(value: float, _pos: object = None) -> str:
    """A tick label of at most three significant digits with a k / M / B suffix: 1500000 -> ``1.5M``.

    The signature is matplotlib's ``FuncFormatter``'s (value, tick position)."""
    for scale, suffix in SUFFIXES:
        if float(f"{abs(value) / scale:.3g}") >= 1:  # rounded first, so 999,999 reads 1M, not 1e+03k
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


@dataclass(frozen=True)
class RunInfo:
    """What a run trained, from its ``config.yaml`` (``None`` where the run directory has none)."""

    name: str
    env_id: str | None
    algorithm: str | None
    seed: int | None


def run_info(run: Path) -> RunInfo:
    """Read the env id, algorithm and seed of ``run`` from its saved config, as written: a plot of an older run
    does not need the config to pass today's checks."""
    path = run / "config.yaml"
    try:
        data = yaml.safe_load(path.read_text()) if path.is_file() else {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {yaml_problem(exc)}") from None
    data = data if isinstance(data, dict) else {}
    env = data.get("env")
    env = env if isinstance(env, dict) else {}
    env_id, algorithm, seed = env.get("id"), data.get("algorithm"), data.get("seed")
    return RunInfo(
        run.name,
        None if env_id is None else str(env_id),
        None if algorithm is None else str(algorithm),
        seed if isinstance(seed, int) else None,
    )


def legend_labels(runs: list[RunInfo]) -> list[str]:
    """``CartPole-v1 (run name)``; runs of one env id that differ in seed also show it: ``CartPole-v1 seed 2 (...)``."""
    seeds: dict[str | None, set[int | None]] = {}
    for r in runs:
        seeds.setdefault(r.env_id, set()).add(r.seed)
    labels = []
    for r in runs:
        seed = f" seed {r.seed}" if len(seeds[r.env_id]) > 1 and r.seed is not None else ""
        labels.append(f"{r.env_id}{seed} ({r.name})" if r.env_id is not None else r.name)
    return labels


def default_title(runs: list[RunInfo]) -> str:
    """``ppo on CartPole-v1, Pendulum-v1``: the algorithms and env ids of the runs, most common first."""
    envs = _most_common_first(r.env_id for r in runs)
    algorithms = _most_common_first(r.algorithm for r in runs)
    if not envs:
        return ""
    return f"{', '.join(algorithms)} on {', '.join(envs)}" if algorithms else ", ".join(envs)


def _most_common_first(values: Any) -> list[str]:
    return [v for v, _ in Counter(v for v in values if v is not None).most_common()]


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


def draw(runs: list[Path], title: str | None = None) -> Any:
    """The figure of ``runs`` (a matplotlib ``Figure``); ``title`` None gives :func:`default_title`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, MaxNLocator
    except ImportError:
        raise ConfigError("srl plot needs matplotlib: pip install 'srl[plot]'") from None
    infos = [run_info(run) for run in runs]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for run, label in zip(runs, legend_labels(infos)):
        records = read_metrics(run)
        for ax, (x, y, _, _) in zip(axes.flat, PANELS):
            pts = [(r[x], r[y]) for r in records if r.get(x) is not None and r.get(y) is not None]
            if pts:
                ax.plot(*zip(*pts), label=label)
    for ax, (_, y, xlabel, ylabel) in zip(axes.flat, PANELS):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=MAX_TICKS))
        ax.xaxis.set_major_formatter(FuncFormatter(short_number))
        if y == "fps":
            ax.yaxis.set_major_formatter(FuncFormatter(short_number))
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    title = default_title(infos) if title is None else title
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_runs(runs: list[Path], out: Path, title: str | None = None) -> Path:
    fig = draw(runs, title)
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def run_plot(args: argparse.Namespace) -> int:
    print(plot_runs(args.runs, args.out, args.title))
    return 0
