"""``srl tune``: the grid it searches, the model's ranking of it, and a real search with a tiny budget."""

from __future__ import annotations

import json

import pytest

from srl.api.config import load_config
from srl.api.config.load import overlay_overrides
from srl.bench import throughput
from srl.cli.main import main
from srl.tune import grid, own_layout, rank_key

CARTPOLE = "configs/cartpole_ppo.yaml"


def test_the_grid_keeps_every_trainers_batch_and_holds_the_configs_own_layout():
    cfg = load_config(CARTPOLE)
    w = cfg.workers
    layouts = grid(cfg)
    assert own_layout(cfg) in layouts and len(layouts) == len({json.dumps(s, sort_keys=True) for s in layouts})
    for s in layouts:  # the PPO batch (segments x slot) is the config's in every layout
        assert s["workers.batch_segments"] * s["workers.envs_per_slot"] == w.batch_segments * w.envs_per_slot
    assert {s["workers.envs_per_slot"] for s in layouts} == {4, 8, 16}  # 32 would need half a segment
    # ties (within 2%) go to fewer processes, then larger slots
    one = {"workers.actors": 1, "workers.policy_workers": 0, "workers.envs_per_slot": 8, "workers.ring_size": 2}
    more = {**one, "workers.actors": 2}
    bigger = {**one, "workers.envs_per_slot": 16}
    assert sorted([more, one, bigger], key=lambda s: rank_key(1000.0, s)) == [bigger, one, more]
    assert rank_key(1100.0, more) < rank_key(1000.0, one)  # a clear gain wins over fewer processes


@pytest.mark.slow
def test_a_tiny_search_gives_keys_srl_train_accepts(tmp_path, capsys, monkeypatch):
    """One model-ranked layout beside the config's own, each trained in a fresh process, ranked by the energy
    each spent per sample trained: the winner's --set keys build the config, and the overlay it writes applies the
    same keys.

    Each try here stops at 20k env steps instead of the search's seconds (a loaded machine can be slow enough to
    train little in a second): the actors cannot run more than their sample buffers ahead of the trainer, so by
    then it has trained, however fast the machine is."""
    real = throughput.bench_train
    by_steps = ["run.max_train_seconds=null", "run.total_env_steps=20000"]
    monkeypatch.setattr(throughput, "bench_train", lambda config, s, sets: real(config, s, [*sets, *by_steps]))
    out = tmp_path / "tuned.yaml"
    args = ["tune", CARTPOLE, "--seconds", "1", "--tries", "1", "--rank", "energy", "--out", str(out), "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["tried"]) == 2 and result["tried"][0]["own"] and not result["tried"][1]["own"]
    for t in result["tried"]:
        assert t["predicted_steps_per_second"] > 0 and 0 < t["trained_samples_per_second"] <= t["train_fps"]
        assert 0 < t["core_seconds_per_trained_sample"] < 0.01  # a CartPole sample is microseconds of CPU
        if result["energy_method"]["cpu"] == "estimate":  # the model: 10 W per core
            assert t["joules_per_trained_sample"] == pytest.approx(10 * t["core_seconds_per_trained_sample"])
    assert result["best"] in [t["set"] for t in result["tried"]] and result["rank"] == "energy"
    assert result["best_joules_per_trained_sample"] == min(t["joules_per_trained_sample"] for t in result["tried"])
    tuned = load_config(CARTPOLE, result["best"])
    assert load_config(CARTPOLE, overlay_overrides(out)) == tuned


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tries", "0"], "--tries: must be >= 1"),
        (["--seconds", "0"], "--seconds: must be > 0"),
        (["--set", "runtime=ray"], "srl tune: tunes the local runtime's layout"),
        (["--set", "cost.watts_per_core=-2"], "cost.watts_per_core: must be >= 0"),
    ],
)
def test_bad_tune_input_is_one_line(args, needle, capsys):
    assert main(["tune", CARTPOLE, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and err.count("\n") == 0, err


def test_a_bad_overlay_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    assert main(["train", CARTPOLE, "--overlay", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "bad.yaml: an overlay is a mapping of sections" in err and err.count("\n") == 0, err
    assert main(["train", CARTPOLE, "--overlay", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: cannot read overlay" in capsys.readouterr().err
