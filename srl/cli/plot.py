"""``srl plot RUN_DIR... [--out PNG]``: learning curves of one or several runs from their ``metrics.jsonl``.

Four panels: mean episode return vs env steps and vs wall time, env steps per
second, and mean policy lag. With ``--population`` (one run of a population):
its lineage (who copied whom, when, from ``population.jsonl``), each member's
schedule of every searched hyperparameter, and each member's return, all on the
run's env steps. Needs
matplotlib (``pip install 'srl[plot]'``).
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
    p.add_argument(
        "--population",
        action="store_true",
        help="one population's run: its lineage, each member's hyperparameters and returns",
    )


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


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("srl plot needs matplotlib: pip install 'srl[plot]'") from None
    return plt


def _steps_axis(ax: Any, xlabel: str) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.set_xlabel(xlabel)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=MAX_TICKS))
    ax.xaxis.set_major_formatter(FuncFormatter(short_number))
    ax.grid(alpha=0.3)


RUN_STEPS = "env steps (the run's)"
"""The x axis of every panel of a population's figure: the run's env steps, as ``metrics.jsonl`` counts them."""


def read_lineage(run: Path) -> list[dict[str, Any]]:
    """A population's ``population.jsonl`` records (a torn last line of a killed run is left out); one line
    naming a record without ``run_env_steps`` (an older srl wrote the member's steps only: no shared x axis)."""
    path = run / "population.jsonl"
    if not path.exists():
        raise ConfigError(f"{run}: no population.jsonl (not a population's run?)")
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            break
        if not isinstance(record, dict) or "run_env_steps" not in record:
            raise ConfigError(f"{path}:{n}: no run_env_steps (written by an older srl)")
        out.append(record)
    return out


def draw_population(run: Path, title: str | None = None) -> Any:
    """One population's figure: the lineage (each member a row, each copy an arrow from its source's row to its
    target's), then per searched hyperparameter each member's value, then each member's mean episode return, all
    against one x axis: the run's env steps, from 0 to the run's last (every member trains to the end)."""
    plt = _pyplot()
    cfg = _population_config(run)
    members, keys = cfg.policy_names, [h.key for h in cfg.population.hyperparameters]
    logs = {h.key for h in cfg.population.hyperparameters if h.log}
    lineage, records = read_lineage(run), read_metrics(run)
    fig, axes = plt.subplots(2 + len(keys), 1, figsize=(10, 3.0 * (2 + len(keys))), squeeze=False, sharex=True)
    axes = axes[:, 0]
    colors = [plt.get_cmap("tab10")(i % 10) for i in range(len(members))]
    end = max([r.get("env_steps") or 0 for r in records] + [r["run_env_steps"] for r in lineage] + [1])
    _draw_lineage(axes[0], lineage, members, colors, end)
    panels = [(f"/{k}", k, k in logs) for k in keys] + [("/return_mean", "mean episode return", False)]
    for ax, (suffix, ylabel, log) in zip(axes[1:], panels):
        for i, name in enumerate(members):
            pts = [(r["env_steps"], r[name + suffix]) for r in records if r.get(name + suffix) is not None]
            if pts:
                ax.plot(
                    *zip(*pts),
                    color=colors[i],
                    label=name,
                    drawstyle="steps-post" if suffix != "/return_mean" else "default",
                )
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
    for ax in axes:
        _steps_axis(ax, RUN_STEPS)
        ax.tick_params(labelbottom=True)  # shared, but each panel keeps its labels: they are read apart
    axes[0].set_xlim(0, end)
    axes[-1].legend(fontsize=8, ncol=min(4, len(members)))
    bases = cfg.base_policies
    size = f"{cfg.population.members} for each of {len(bases)} policies" if len(bases) > 1 else len(members)
    fig.suptitle(title if title is not None else f"population of {size}: {cfg.algorithm} on {cfg.env.id}")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))  # room for the title above the first panel
    return fig


def _draw_lineage(ax: Any, lineage: list[dict[str, Any]], members: list[str], colors: list[Any], end: int) -> None:
    """Each member a row from 0 to ``end``, each copy an arrow from its source's row to its target's at the run's
    env steps when it was decided."""
    for i in range(len(members)):
        ax.hlines(i, 0, end, color=colors[i], lw=2)
    for r in lineage:
        if r.get("event") == "exploit":
            x, src, dst = r["run_env_steps"], r["source"], r["target"]
            ax.annotate("", (x, dst), (x, src), arrowprops={"arrowstyle": "->", "color": colors[src], "lw": 1.2})
    ax.set_yticks(range(len(members)), members)
    ax.set_ylim(-0.5, len(members) - 0.5)
    ax.set_title("lineage: arrows from the copied member to the one that copied it")


def _population_config(run: Path) -> Any:
    from srl.api.config import load_config

    saved = run / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"{run}: no config.yaml (not a run directory?)")
    cfg = load_config(saved)
    if not cfg.population.enabled:
        raise ConfigError(f"{run}: not a population's run (population.members is 0)")
    return cfg


def draw(runs: list[Path], title: str | None = None) -> Any:
    """The figure of ``runs`` (a matplotlib ``Figure``); ``title`` None gives :func:`default_title`."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter, MaxNLocator

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


def plot_runs(runs: list[Path], out: Path, title: str | None = None, population: bool = False) -> Path:
    if population and len(runs) != 1:
        raise ConfigError(f"--population: draws one run, got {len(runs)}")
    fig = draw_population(runs[0], title) if population else draw(runs, title)
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def run_plot(args: argparse.Namespace) -> int:
    """Draw, then say where the PNG went by its full path: without ``--out`` it lands in the current folder,
    which a user running ``srl plot`` from a script or another folder would not guess."""
    out = plot_runs(args.runs, args.out, args.title, args.population)
    print(f"srl plot: wrote {out.absolute()}")
    return 0
