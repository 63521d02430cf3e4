"""Agents mapped to several policies: the rules, the grouped slots, and runs whose policies each have their own
trainers, parameter stream and checkpoints (needs the multiagent extra: PettingZoo)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import srl
from srl.api.config import ConfigError, ExperimentConfig, build
from srl.api.config.policies import AgentRule, map_agents
from srl.envs.slots import make_grouped, probe_groups
from srl.loaded import LoadedPolicies
from srl.runtime.plan import make_plan
from srl.system.checkpoint import checkpoints, load_checkpoint

KINDS = "srl.envs.ma_testing:two_kinds"
RULES = [{"match": "red_.*", "policy": "red"}, {"match": "blue_.*", "policy": "blue"}]


def _cfg(**over) -> dict:
    """Two policies on :class:`~srl.envs.ma_testing.TwoKinds`: reds (4 targets) and blues (3 targets, another
    observation size); blue learns at its own learning rate."""
    cfg = {
        "name": "two_kinds",
        "runtime": "inline",
        "env": {"id": KINDS},
        "agents": RULES,
        "policies": [{"name": "blue", "ppo": {"lr": 0.002}}],
        "workers": {"actors": 1, "envs_per_slot": 8, "segment_length": 16, "batch_segments": 2, "policy_workers": 0},
        "ppo": {"epochs": 4, "minibatches": 2, "lr": 0.001},
        "run": {"total_env_steps": 20_000, "log_interval_seconds": 1, "eval_episodes": 20},
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            cfg[section] = {**cfg.get(section, {}), field: value}
        else:
            cfg[key] = value
    return cfg


def test_rules_map_agents_first_match_wins_in_env_order():
    rules = [AgentRule(match="adversary_0", policy="boss"), AgentRule(match="adversary_.*", policy="adv")]
    agents = ["adversary_0", "agent_0", "adversary_1", "adversary_2"]
    mapped = map_agents([*rules, AgentRule(match="agent_.*", policy="good")], agents, "tag")
    assert mapped == {"boss": ("adversary_0",), "adv": ("adversary_1", "adversary_2"), "good": ("agent_0",)}
    assert map_agents([], agents, "tag") == {"default": tuple(agents)}


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([{"match": "red_.*", "policy": "red"}], "agents: agent 'blue_0' of env"),
        ([*RULES, {"match": "green_.*", "policy": "green"}], "agents[2].match: 'green_.*' matches no agent"),
        ([{"match": ".*", "policy": "all"}, *RULES], "agents: policy 'red' plays no agent"),
    ],
)
def test_rules_that_leave_an_agent_unmapped_or_match_nothing_are_one_line(rules, message):
    with pytest.raises(ConfigError) as err:
        make_plan(build(ExperimentConfig, _cfg(agents=rules, policies=[])))
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"policies": [{"name": "red"}, {"name": "red"}]}, "policies[1].name: policy 'red' is named twice"),
        ({"policies": [{"name": "green"}]}, "policies[0].name: no agents rule plays policy 'green'"),
        ({"policies": [{"name": "red", "ppo": {"lr": -1}}]}, "policies[0].ppo.lr: must be > 0"),
        ({"policies": [{"name": "red", "model": {"hiden": [8]}}]}, "policies[0].model.hiden: unknown field"),
        ({"agents": [{"match": "(", "policy": "red"}]}, "agents[0].match: '(' is not a regular expression"),
        ({"agents": [{"match": "x", "policy": "a b"}]}, "agents[0].policy: 'a b' is not a name"),
    ],
)
def test_bad_agents_and_policies_sections_are_one_line_naming_the_field(over, message):
    with pytest.raises(ConfigError) as err:
        build(ExperimentConfig, _cfg(**over))
    assert str(err.value).startswith(message)


def test_one_line_from_the_cli_for_rules_on_a_single_agent_env(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(_cfg(env={"id": "CartPole-v1"}, policies=[])))
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "train", str(config), "--quiet", "--run-dir", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "agents: env 'CartPole-v1' is a single-agent env" in lines[0], proc.stderr


def test_a_grouped_slot_gives_each_policy_its_own_columns_and_spaces():
    rules = [AgentRule(**r) for r in RULES]
    slot = make_grouped(build(ExperimentConfig, _cfg()).env, 3, rules)
    try:
        red, blue = slot.groups
        assert (red.policy, red.agents, blue.policy, blue.agents) == ("red", ("red_0", "red_1"), "blue", ("blue_0",))
        assert red.observation_space.shape == (4,) and blue.observation_space.shape == (5,)
        assert int(red.action_space.n) == 4 and int(blue.action_space.n) == 3
        obs = slot.reset_groups(seed=1)
        assert obs[0]["obs"].shape == (3 * 2, 4) and obs[1]["obs"].shape == (3, 5)
        targets = [o["obs"][:, :4].argmax(1) if k == 0 else o["obs"][:, :3].argmax(1) for k, o in enumerate(obs)]
        steps = slot.step_groups(targets)  # every agent hits its target
        assert [s.reward.tolist() for s in steps] == [[1.0] * 6, [1.0] * 3]
        wrong = slot.step_groups([(targets[0] + 1) % 4, steps[1].obs["obs"][:, :3].argmax(1)])
        assert wrong[0].reward.sum() < 6 and wrong[1].reward.tolist() == [1.0] * 3  # blue's columns are blue's
    finally:
        slot.close()


def test_a_plan_sizes_one_pool_and_one_snapshot_per_policy():
    plan = make_plan(
        build(
            ExperimentConfig, _cfg(runtime="local", workers__actors=2, workers__trainers=2, workers__policy_workers=1)
        )
    )
    red, blue = plan.policies
    assert (red.name, red.agents_per_env, blue.name, blue.agents_per_env) == ("red", 2, "blue", 1)
    assert red.layout.fields["obs"].shape[1:] == (8 * 2, 4) and blue.layout.fields["obs"].shape[1:] == (8, 5)
    assert red.param_size != blue.param_size and blue.cfg.ppo.lr == 0.002 and red.cfg.ppo.lr == 0.001
    trainers = [w for w in plan.topology.workers if w.role.name == "trainer"]
    assert [(w.index, w.policy) for w in trainers] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert plan.topology.peers(trainers[2]) == (trainers[2], trainers[3])  # data-parallel within one policy
    [policy_worker] = [w for w in plan.topology.workers if w.role.name == "policy"]
    assert {e.policy for e in policy_worker.connects} == {0, 1}  # one policy worker serves both


def _assert_both_learned(summary: dict, run: Path) -> None:
    """Random play scores 2 (red) and 2.7 (blue) of 8; each policy's own evaluation must be near perfect."""
    assert summary["stop_reason"] == "env_steps", summary.get("error")
    policies = summary["policies"]
    assert set(policies) == {"red", "blue"}
    for name in ("red", "blue"):
        assert policies[name]["final_eval_return_mean"] >= 7.0, policies
        assert policies[name]["policy_version"] > 0
        found = checkpoints(run / "checkpoints" / name)
        assert found, f"no checkpoint of {name}"
        state = load_checkpoint(found[-1])
        assert state["policy"] == name
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert "red/return_mean" in record and "blue/policy_loss" in record


@pytest.mark.slow
def test_two_policies_learn_with_their_own_trainers_inline(tmp_path):
    summary = srl.train(_cfg(), run_dir=tmp_path / "run")
    _assert_both_learned(summary, tmp_path / "run")
    loaded = srl.load_policy(tmp_path / "run")
    assert isinstance(loaded, LoadedPolicies) and set(loaded.by_policy) == {"red", "blue"}
    obs = {"red_1": np.eye(4, dtype=np.float32)[2], "blue_0": np.array([0, 1, 0, 0.5, 0.5], np.float32)}
    assert loaded.act(obs) == {"red_1": 2, "blue_0": 1}
    with pytest.raises(ValueError, match="dict of agent id"):
        loaded.act({"green_0": obs["red_1"]})


@pytest.mark.slow
def test_two_policies_learn_under_the_local_runtime_with_a_shared_policy_worker_and_relays(tmp_path):
    """Processes, one policy worker serving both policies, two data-parallel trainers per policy, a relay
    per group of readers; then ``srl eval`` plays the run directory with both policies."""
    cfg = _cfg(
        runtime="local",
        workers__actors=2,
        workers__policy_workers=1,
        workers__trainers=2,
        workers__torch_threads=1,
        params={"groups": 2},
    )
    summary = srl.train(cfg, run_dir=tmp_path / "run")
    _assert_both_learned(summary, tmp_path / "run")
    proc = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "eval", str(tmp_path / "run"), "--episodes", "8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result["checkpoints"]) == {"red", "blue"}
    assert result["policies"]["red"]["return_mean"] >= 7.0 and result["policies"]["blue"]["return_mean"] >= 7.0


def test_probe_groups_refuses_several_policies_of_one_space_that_differs_within_a_group():
    """One rule that takes reds and blues together: agents sharing a policy need one space (one line)."""
    with pytest.raises(ConfigError, match="agents sharing a policy need one"):
        probe_groups(build(ExperimentConfig, _cfg()).env, [AgentRule(match=".*", policy="all")])


def test_a_turn_based_game_splits_its_seats_between_two_policies(tmp_path):
    """Tic-tac-toe, one policy per seat: each group is one column per game, the seat to move is alive in its
    own group, and both policies train (their own versions, their own checkpoints)."""
    env = {"id": "srl.envs.turns:game", "kwargs": {"name": "tic_tac_toe"}}
    seats = [{"match": "player_0", "policy": "crosses"}, {"match": "player_1", "policy": "noughts"}]
    cfg = build(ExperimentConfig, {"env": env, "agents": seats})
    slot = make_grouped(cfg.env, 2, cfg.agents)
    try:
        crosses, noughts = slot.groups
        assert (crosses.agents, noughts.agents) == (("player_0",), ("player_1",))
        obs = slot.reset_groups(seed=3)
        moves = [o["obs.action_mask"].argmax(1) for o in obs]  # a legal move for each column
        steps = slot.step_groups(moves)
        assert steps[0].alive.tolist() == [True, True] and steps[1].alive.tolist() == [False, False]
        after = [s.obs["obs.action_mask"] for s in steps]
        assert (after[1].sum(1) == 8).all()  # noughts to move: one square taken
    finally:
        slot.close()
    run = {"total_env_steps": 3_000, "eval_episodes": 4, "log_interval_seconds": 1}
    summary = srl.train({"env": env, "agents": seats, "runtime": "inline", "run": run}, run_dir=tmp_path / "run")
    assert summary["stop_reason"] == "env_steps", summary.get("error")
    assert all(summary["policies"][p]["policy_version"] > 0 for p in ("crosses", "noughts")), summary["policies"]
    assert checkpoints(tmp_path / "run" / "checkpoints" / "noughts")


def test_a_run_of_two_policies_resumes_each_from_its_own_checkpoint(tmp_path):
    from srl.runtime.train import resume_config, train

    run = tmp_path / "run"
    first = srl.train(_cfg(run={"total_env_steps": 4_000, "eval_episodes": 0}), run_dir=run)
    cfg, resume = resume_config(run, ["run.total_env_steps=8000"])
    assert [p.parent.name for p in resume.checkpoints] == ["red", "blue"]
    second = train(cfg, run, progress=None, resume=resume)
    assert second["env_steps"] >= 8000 and second["resumed_from"] == [str(p) for p in resume.checkpoints]
    for name in ("red", "blue"):
        assert second["policies"][name]["policy_version"] > first["policies"][name]["policy_version"]
    (run / "checkpoints" / "blue").rename(tmp_path / "gone")
    with pytest.raises(ConfigError, match="no checkpoint of policy 'blue' to resume from"):
        resume_config(run, [])


def test_a_vmas_env_splits_its_worlds_columns_between_policies():
    """VMAS agents share a space; with two policies each takes its agents' columns of every world (one gather),
    and each group's actions reach its own agents."""
    from srl.api.config import EnvConfig

    env = EnvConfig(
        id="vmas:make_env",
        kwargs={"scenario": "balance", "n_agents": 3, "max_steps": 6, "continuous_actions": True, "device": "cpu"},
    )
    rules = [AgentRule(match="agent_0", policy="lead"), AgentRule(match="agent_.*", policy="rest")]
    slot = make_grouped(env, 4, rules)
    try:
        lead, rest = slot.groups
        assert (lead.agents, rest.agents) == (("agent_0",), ("agent_1", "agent_2"))
        obs = slot.reset_groups(seed=2)
        assert obs[0]["obs"].shape[0] == 4 and obs[1]["obs"].shape[0] == 8
        whole = slot.slot.reset(seed=2)["obs"]  # the same worlds, all columns world-major
        np.testing.assert_array_equal(obs[0]["obs"], whole[0::3])
        np.testing.assert_array_equal(obs[1]["obs"], np.stack([whole[1::3], whole[2::3]], 1).reshape(8, -1))
        shape = lead.action_space.shape
        steps = slot.step_groups([np.zeros((4, *shape), np.float32), np.ones((8, *shape), np.float32)])
        assert steps[0].reward.shape == (4,) and steps[1].reward.shape == (8,)
        assert (
            (slot._actions[0::3] == 0).all() and (slot._actions[1::3] == 1).all() and (slot._actions[2::3] == 1).all()
        )
    finally:
        slot.close()


def test_a_killed_trainer_of_one_policy_restarts_from_that_policy_s_checkpoint(tmp_path):
    """kill -9 of blue's trainer once it has a checkpoint: it alone restarts, from checkpoints/blue, publishing
    above what blue's readers hold, and both policies still learn. The run has no step budget: a watcher kills
    the trainer, then stops the run once the restarted trainer has published and both policies play well, so
    nothing races the machine's speed."""
    import os
    import signal
    import threading
    import time

    from conftest import last_record, worker_pids

    from srl.runtime.train import train

    run = tmp_path / "run"
    endless = {**_cfg()["run"], "total_env_steps": 10**9, "checkpoint_interval_seconds": 0.1}
    cfg = build(ExperimentConfig, _cfg(runtime="local", workers__policy_workers=1, run=endless))
    stop, done, seen = threading.Event(), threading.Event(), {}

    def until(cond) -> bool:
        deadline = time.monotonic() + 300  # a safety net for a broken run, not the stop
        while not done.is_set() and time.monotonic() < deadline and not cond():
            time.sleep(0.05)
        return cond()

    def watch() -> None:
        try:
            if until(lambda: checkpoints(run / "checkpoints" / "blue") and "trainer1" in worker_pids(run)):
                seen["killed"] = worker_pids(run)["trainer1"]
                seen["version"] = int(last_record(run).get("blue/version", 0))
                os.kill(seen["killed"], signal.SIGKILL)
                until(
                    lambda: (
                        worker_pids(run).get("trainer1") not in (None, seen["killed"])
                        and last_record(run).get("blue/version", 0) > seen["version"]
                        and last_record(run).get("red/return_mean", 0) >= 7.0
                        and last_record(run).get("blue/return_mean", 0) >= 7.0
                    )
                )
        finally:
            stop.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        summary = train(cfg, run, progress=None, stop=stop)
    finally:
        done.set()
        watcher.join()
    assert summary["stop_reason"] == "requested" and "killed" in seen, summary.get("error")
    assert summary["restarts"] == {"trainer1": 1}
    assert all(summary["policies"][p]["final_eval_return_mean"] >= 7.0 for p in ("red", "blue")), summary["policies"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    blue = [r["blue/version"] for r in records if "blue/version" in r]
    assert blue == sorted(blue)  # the restarted trainer published above every version before it
