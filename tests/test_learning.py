"""Learning thresholds: the shipped CartPole config solves under both runtimes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from srl.api.config import load_config
from srl.runtime.train import train


@pytest.mark.slow
def test_cartpole_config_solves_alike_under_the_inline_and_the_local_runtime(tmp_path):
    """The shipped config solves under both runtimes for seeds 1-3, and the inline runtime needs no more env steps
    than the local one: it polls its workers in the order the local runtime runs them when the trainer binds, so
    both train each batch on the policy two versions back. Inline runs are deterministic: each solves within
    40k env steps (22.7-24.2k here; it took 36-102k when the trainer updated as soon as a batch was full). Local
    runs depend on the machine's load, which moves their policy lag (23-25k on a quiet machine, up to 43k beside
    another test process), so they are held to a looser bound. Every run stops on solving (or its step budget),
    never on the clock."""
    solved_at: dict[str, list[int]] = {"inline": [], "local": []}
    for runtime, steps in solved_at.items():
        greedy = []
        for seed in (1, 2, 3):
            cfg = load_config("configs/cartpole_ppo.yaml", [f"runtime={runtime}", f"seed={seed}"])
            summary = train(cfg, tmp_path / f"{runtime}{seed}", progress=None)
            assert summary["solved"], summary
            assert summary["solved_return_mean"] >= 475  # mean of the last 20 episodes when the target was reached
            steps.append(summary["solved_env_steps"])
            greedy.append(summary["final_eval_return_mean"])
        # the greedy policy at the moment of solving: 500 as a rule, now and then one short episode in ten
        assert np.median(greedy) >= 475, (runtime, greedy)
    assert max(solved_at["inline"]) <= 40_000, solved_at
    inline, local = (float(np.median(v)) for v in solved_at.values())
    assert inline <= 1.5 * local and local <= 2.5 * inline, solved_at


@pytest.mark.slow
def test_bench_sampling_reports_both_paths_and_their_ratio():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "srl.cli.main",
            "bench",
            "sampling",
            "--env",
            "CartPole-v1",
            "--seconds",
            "0.5",  # what is checked is the report, not the rates (benchmarks measure those)
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["full_path_steps_per_second"] > 0 and result["plain_loop_steps_per_second"] > 0
    assert result["ratio"] == pytest.approx(
        result["full_path_steps_per_second"] / result["plain_loop_steps_per_second"], rel=1e-2
    )
    vector = result["vector_loop_steps_per_second"]
    assert set(vector) == {"8", "32", "64"} and min(vector.values()) > 0
    assert vector[str(result["vector_loop_best_envs"])] == max(vector.values())
    assert result["vector_ratio"] == pytest.approx(
        result["full_path_steps_per_second"] / max(vector.values()), rel=1e-2
    )
    assert result["mean_inference_batch"] >= 16  # at least one slot of 16 envs per forward pass


def test_the_sampling_window_opens_once_every_actor_has_reported():
    """Slow env construction (64 Pong envs on a busy machine) must not eat the warm-up or the window: they are
    counted from the last actor's first report, and a window with fewer than two reports is an error, not 0.
    Time is moved by shifting the controller's clock marks, so no step depends on how fast this runs."""
    import time

    from conftest import reporting

    from srl.api.config import load_config
    from srl.bench.throughput import _RateController

    cfg = load_config("configs/cartpole_ppo.yaml", ["workers.actors=2"])
    c = _RateController(cfg, warmup=0.0, seconds=100.0)
    c.start_time -= 100.0  # the process started long ago: no actor has stepped yet
    assert c.should_stop() is None
    reporting(c)
    c.handle("actor", {"worker": "actor0", "env_steps": 0}, {})
    assert c.started is None and c.should_stop() is None  # one of two actors
    c.handle("actor", {"worker": "actor1", "env_steps": 0}, {})
    assert c.started is not None and c.should_stop() is None
    with pytest.raises(RuntimeError, match="fewer than two actor reports"):
        c.rate()
    time.sleep(0.01)  # a later report has a later time stamp
    c.handle("actor", {"worker": "actor0", "env_steps": 1000}, {})
    assert c.rate() > 0
    c.started -= 100.0  # the window has passed
    assert c.should_stop() == "bench_done"

    silent = _RateController(cfg, warmup=0.0, seconds=100.0)
    silent.start_time -= silent.GIVE_UP  # no actor ever reported
    assert silent.should_stop() == "bench_done"
    with pytest.raises(RuntimeError, match="did not all report"):
        silent.rate()


@pytest.mark.slow
def test_bench_train_reports_throughput_lag_and_time_shares():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "srl.cli.main",
            "bench",
            "train",
            "--config",
            "configs/cartpole_ppo.yaml",
            "--seconds",
            "6",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == "train" and result["env_steps"] > 0 and result["train_fps"] > 0
    assert result["policy_version"] >= 1
    assert 0 <= result["lag_mean"] <= 16  # workers.max_policy_lag: older segments are dropped, not trained
    assert 0 < result["time_fractions"]["trainer0/train"] <= 1


@pytest.mark.slow
def test_continuous_actions_learn_pendulum(tmp_path):
    cfg = load_config("configs/pendulum_ppo.yaml", ["runtime=inline"])
    summary = train(cfg, tmp_path / "run", progress=None)
    assert summary["solved"], summary  # mean of the last 20 episodes >= -250 (a random policy scores ~ -1200)
    assert summary["final_eval_return_mean"] >= -400


@pytest.mark.slow
def test_two_data_parallel_trainers_solve_cartpole(tmp_path):
    # Two actors, each feeding its own trainer one segment per update: the same global batch as the shipped
    # config, reduced across the trainers (gloo) every minibatch.
    cfg = load_config(
        "configs/cartpole_ppo.yaml",
        ["workers.trainers=2", "workers.actors=2", "workers.batch_segments=1"],
    )
    summary = train(cfg, tmp_path / "run", progress=None)
    assert summary["solved"], summary
    assert summary["final_eval_return_mean"] >= 475
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["bytes_reduced"] > 0  # gradients really went through the collective
    assert summary["reduce_seconds_per_update"] > 0 and summary["bytes_reduced_per_update"] > 0
    assert set(summary["time_fractions"]) >= {"trainer0/train", "trainer1/train"}


def test_bench_solve_refuses_a_seed_override_it_would_report_under_another_seed():
    from srl.api.config import ConfigError
    from srl.bench.throughput import bench_solve

    with pytest.raises(ConfigError, match="--set seed: srl bench solve runs seeds 1 to --runs itself"):
        bench_solve("configs/cartpole_ppo.yaml", 1, ["ppo.lr=0.001", "seed=2"])


@pytest.mark.slow
@pytest.mark.parametrize(("runtime", "budget"), [("inline", 100_000)])
def test_dqn_solves_cartpole_from_its_replay_within_100k_env_steps(tmp_path, runtime, budget):
    """The shipped DQN config: the mean of the last 20 training episodes (with the actors' exploration) reaches
    475 within 100k env steps inline, the greedy policy plays 500, and the replay held its 32 samples per insert.
    Inline only: under the local runtime the actor and the trainer run apart, so which items each update samples
    differs from run to run and with the machine's load (on 2026-12-04 it missed 100k env steps in 2 of 4 runs,
    and a 150k budget took 65 s of CI); DQN's processes under the local runtime, killed and resumed, are
    tests/test_replay_runtime.py's, and across Ray nodes tests/test_ray.py's."""
    cfg = load_config("configs/cartpole_dqn.yaml", [f"runtime={runtime}", f"run.total_env_steps={budget}"])
    summary = train(cfg, tmp_path / runtime, progress=None)
    assert summary["solved"] and summary["solved_env_steps"] <= budget, {
        k: summary.get(k) for k in ("solved", "env_steps", "train_return_mean")
    }
    assert summary["final_eval_return_mean"] >= 475
    assert abs(summary["replays"]["replay0"]["samples_per_insert"] / 32 - 1) < 0.05


def test_bench_solve_reports_the_mean_policy_lag_of_the_samples_trained_on():
    from srl.bench.throughput import _mean_lag

    assert _mean_lag([1, 1, 2]) == 1.25 and _mean_lag([]) is None and _mean_lag([0, 0]) is None


def test_bench_solve_takes_each_runs_cost_to_target_and_their_medians(monkeypatch):
    """Each seed's core-seconds and energy to its target come from its summary's ``cost.to_target``; a run that
    did not solve counts as never (its median then none, when most did not)."""
    from srl.bench import throughput

    def summary(seed: int) -> dict:
        cost = {"core_seconds": {"total": 9.0 * seed}, "energy_method": {"cpu": "estimate"}}
        if seed < 3:  # seed 3 does not reach the target
            cost["to_target"] = {"core_seconds": 2.0 * seed, "energy_joules": 20.0 * seed, "money": None}
        solved = {"solved_wall_seconds": 1.5 * seed, "solved_env_steps": 1000 * seed} if seed < 3 else {}
        return {"solved": seed < 3, "wall_seconds": 5.0, "lag_histogram": [1], "cost": cost, **solved}

    monkeypatch.setattr(throughput, "train_in_fresh_process", lambda c, o: (summary(int(o[0][5:])), []))
    out = throughput.bench_solve("configs/cartpole_ppo.yaml", 3, [])
    assert [r["solved_core_seconds"] for r in out["per_run"]] == [2.0, 4.0, None]
    assert [r["solved_energy_joules"] for r in out["per_run"]] == [20.0, 40.0, None]
    assert out["median_solved_core_seconds"] == 4.0 and out["median_solved_energy_joules"] == 40.0
    assert out["median_solved_wall_seconds"] == 3.0 and out["solved"] == 2
    monkeypatch.setattr(throughput, "train_in_fresh_process", lambda c, o: (summary(3), []))
    assert throughput.bench_solve("configs/cartpole_ppo.yaml", 2, [])["median_solved_core_seconds"] is None
