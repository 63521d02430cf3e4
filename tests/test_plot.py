"""``srl plot`` draws PNG curves from run directories and refuses what is not one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from srl.api.config import ConfigError, load_config
from srl.cli.plot import draw, short_number
from srl.runtime.train import train


def test_plot_writes_a_png_for_several_runs(tmp_path):
    for seed in (1, 2):
        cfg = load_config(
            "configs/cartpole_ppo.yaml",
            [
                "runtime=inline",
                f"seed={seed}",
                "run.total_env_steps=1500",
                "run.target_return=null",
                "run.eval_episodes=0",
                "run.log_interval_seconds=0.05",
            ],
        )
        train(cfg, tmp_path / f"run{seed}", progress=None)
    out = tmp_path / "curves.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "srl.cli.main",
            "plot",
            str(tmp_path / "run1"),
            str(tmp_path / "run2"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert proc.stdout == f"srl plot: wrote {out}\n"


def test_plot_says_where_it_wrote_the_default_file(tmp_path):
    """Without ``--out`` the PNG lands in the current folder: the one line says so, by its full path."""
    run = _fake_run(tmp_path / "run", "CartPole-v1")
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "plot", str(run)], capture_output=True, text=True, timeout=120, cwd=work
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"srl plot: wrote {work / 'curves.png'}\n" and (work / "curves.png").is_file()


def test_plot_refuses_a_directory_without_metrics(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "plot", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"srl: error: {tmp_path}: no metrics.jsonl (not a run directory?)"


@pytest.mark.parametrize(
    "value, label",
    [
        (0, "0"),
        (999, "999"),
        (1000, "1k"),
        (1250, "1.25k"),
        (100_000, "100k"),
        (999_999, "1M"),
        (1_500_000, "1.5M"),
        (2e9, "2B"),
        (-1500, "-1.5k"),
        (0.5, "0.5"),
    ],
)
def test_tick_labels_are_short(value, label):
    assert short_number(value) == label


def _fake_run(path: Path, env_id: str | None, seed: int = 1, steps: int = 2_400_000) -> Path:
    path.mkdir(parents=True)
    records = [
        {"env_steps": s, "wall_seconds": s / 5000, "return_mean": s / 10_000, "fps": 5000.0, "lag_mean": 0.5}
        for s in range(0, steps + 1, steps // 20)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if env_id is not None:
        (path / "config.yaml").write_text(f"name: cartpole_ppo\nseed: {seed}\nalgorithm: ppo\nenv:\n  id: {env_id}\n")
    return path


def test_the_legend_shows_each_runs_env_and_the_title_what_was_trained(tmp_path):
    runs = [
        _fake_run(tmp_path / "cartpole_ppo-1", "Pendulum-v1"),
        _fake_run(tmp_path / "cartpole_ppo-2", "CartPole-v1", seed=1),
        _fake_run(tmp_path / "cartpole_ppo-3", "CartPole-v1", seed=2),
        _fake_run(tmp_path / "old", None),
    ]
    fig = draw(runs)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [
        "Pendulum-v1 (cartpole_ppo-1)",
        "CartPole-v1 seed 1 (cartpole_ppo-2)",
        "CartPole-v1 seed 2 (cartpole_ppo-3)",
        "old",
    ]
    assert fig._suptitle.get_text() == "ppo on CartPole-v1, Pendulum-v1"
    assert draw(runs[:1], title="mine")._suptitle.get_text() == "mine"
    assert draw(runs[3:])._suptitle is None  # no config: nothing to name


def test_step_ticks_are_few_and_short_at_millions_of_steps(tmp_path):
    fig = draw([_fake_run(tmp_path / "run", "CartPole-v1")])
    fig.canvas.draw()
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        assert 3 <= len(labels) <= 8 and all(len(label) <= 5 for label in labels), labels
    assert "1M" in [t.get_text() for t in fig.axes[0].get_xticklabels()]


@pytest.mark.slow
def test_plot_population_draws_the_lineage_the_schedules_and_the_returns(tmp_path):
    """A short population run (copies at every 2,000 member steps): one lineage panel, one per searched
    hyperparameter, one of returns, each member's curve in each; and one line for a run that is no population."""
    from srl.cli.plot import draw_population

    lr = "{key: ppo.lr, min: 1.0e-6, max: 1.0e-2, log: true, initial: [1.0e-3, 1.0e-6]}"
    settings = [
        "runtime=inline",
        "population.members=2",
        "population.interval=2000",
        f"population.hyperparameters=[{lr}]",
    ]
    settings += ["run.total_env_steps=12000", "run.target_return=null", "run.eval_episodes=0"]
    run = tmp_path / "run"
    train(load_config("configs/cartpole_ppo.yaml", [*settings, "run.log_interval_seconds=0.05"]), run, progress=None)
    fig = draw_population(run)
    lineage, schedule, returns = fig.axes
    copies = sum(1 for line in (run / "population.jsonl").read_text().splitlines() if '"exploit"' in line)
    assert copies >= 1 and len(lineage.texts) == copies  # one arrow per copy
    assert schedule.get_yscale() == "log" and len(schedule.get_lines()) == 2 and len(returns.get_lines()) == 2
    out = tmp_path / "population.png"
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "plot", str(run), "--population", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    train(
        load_config("configs/cartpole_ppo.yaml", ["runtime=inline", *settings[4:]]), tmp_path / "plain", progress=None
    )
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "plot", str(tmp_path / "plain"), "--population"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.strip().endswith("not a population's run (population.members is 0)")


def _fake_population(path: Path, end: int = 12_000) -> Path:
    """A population run of 2 members as the run directory holds it: a copy at 4,000 of the run's env steps (2,000
    of the member's), metrics to ``end``."""
    from srl.api.config import ExperimentConfig, build, to_dict

    lr = {"key": "ppo.lr", "min": 1e-6, "max": 1e-2, "log": True, "initial": [1e-3, 1e-6]}
    cfg = build(ExperimentConfig, {"population": {"members": 2, "interval": 2000, "hyperparameters": [lr]}})
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    records = [
        {"env_steps": s, "member0/ppo.lr": 1e-3, "member1/ppo.lr": 1e-6 if s < 4000 else 8e-4,
         "member0/return_mean": s / 100, "member1/return_mean": 20.0}
        for s in range(0, end + 1, 1000)
    ]  # fmt: skip
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    common = {"target": 1, "source": 0, "run_env_steps": 4000, "member_env_steps": 2000, "decision": 2}
    lineage = [
        {"event": "exploit", **common, "score": 20.0, "source_score": 40.0, "old": {"ppo.lr": 1e-6}},
        {"event": "explore", **common, "old": {"ppo.lr": 1e-3}, "new": {"ppo.lr": 8e-4}},
    ]
    (path / "population.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lineage))
    return path


def test_every_population_panel_shares_the_runs_env_steps_and_each_member_runs_to_its_end(tmp_path):
    """The lineage panel's copies sit at the run's env steps, as the panels under it count them, and each
    member's row runs to the run's last env step, not its last copy."""
    from srl.cli.plot import draw_population

    fig = draw_population(_fake_population(tmp_path / "run"))
    lineage, schedule, returns = fig.axes
    (arrow,) = lineage.texts
    assert arrow.xy == (4000, 1) and arrow.xyann == (4000, 0)  # from member 0 to member 1, at the run's 4,000
    rows = [seg for c in lineage.collections for seg in c.get_segments()]
    assert len(rows) == 2 and all(seg[0][0] == 0 and seg[-1][0] == 12_000 for seg in rows)
    assert lineage.get_xlim() == schedule.get_xlim() == returns.get_xlim() == (0, 12_000)
    assert {ax.get_xlabel() for ax in fig.axes} == {"env steps (the run's)"}


def test_a_lineage_without_the_runs_env_steps_is_one_line(tmp_path):
    """A population.jsonl written before its records carried ``run_env_steps`` cannot share the x axis."""
    from srl.cli.plot import draw_population

    run = _fake_population(tmp_path / "run")
    old = {"event": "exploit", "target": 1, "source": 0, "env_steps": 2000, "copy": 2}
    (run / "population.jsonl").write_text(json.dumps(old) + "\n")
    with pytest.raises(ConfigError, match=r"population\.jsonl:1: no run_env_steps \(written by an older srl\)"):
        draw_population(run)
