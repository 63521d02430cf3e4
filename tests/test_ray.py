"""The Ray runtime on a simulated cluster: a head (trainers) and two worker nodes (actors), all on this machine."""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# Before Ray is imported: keep every Ray address on loopback (otherwise Ray resolves 127.0.0.1 to the machine's
# external interface) and give Ray a private temp folder, apart from any other Ray user on the machine.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
if "RAY_TMPDIR" not in os.environ:  # ours: removed when the test process ends (after the cluster has shut down)
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="srlray-")
    atexit.register(shutil.rmtree, os.environ["RAY_TMPDIR"], True)
os.environ.setdefault("RAY_worker_niceness", "0")

import pytest  # noqa: E402
import ray  # noqa: E402
from conftest import children_of, start_endless_training  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from srl.api.config import load_config  # noqa: E402
from srl.base.shm import list_segments  # noqa: E402
from srl.runtime.plan import make_plan  # noqa: E402
from srl.replay.role import replay_spec  # noqa: E402
from srl.runtime.train import train  # noqa: E402
from srl.replay.worker import MAX_PENDING  # noqa: E402
from srl.testing.netcluster import ray_settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# under pytest-xdist (.ci/run) the module is one unit of work: one worker holds its cluster, the other runs the rest
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.slow]


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        kids = children_of(todo.pop())
        out |= kids
        todo.extend(kids)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.fixture(autouse=True)
def no_leaks():
    """Replaces the suite's check: the cluster's processes live for the module (checked when it ends), and Ray's
    workers, not this process, create the segments: none made by a process of ours may outlive a test."""
    before = set(list_segments())
    yield
    mine = _descendants(os.getpid())
    left = [
        s
        for s in set(list_segments()) - before
        if s.split("_")[1].isdigit() and (int(s.split("_")[1]) in mine or not _alive(int(s.split("_")[1])))
    ]
    assert not left, f"leaked shared memory: {sorted(left)}"


@pytest.fixture(scope="module")
def cluster():
    before = children_of(os.getpid())
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"srl_trainer": 1}, "node_ip_address": "127.0.0.1"},
    )
    nodes = [c.add_node(num_cpus=2, resources={"srl_actor": 1}, node_ip_address="127.0.0.1") for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="WARNING")
    yield c, nodes
    ray.shutdown()
    c.shutdown()
    deadline = time.monotonic() + 30.0
    while children_of(os.getpid()) - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not children_of(os.getpid()) - before, "Ray processes outlived the cluster"


def _on_cluster(c: Cluster) -> list[str]:
    """The settings that place a run on the module's cluster: trainers on the head, one actor per worker node."""
    return ray_settings(c.address, actor_nodes=2)


def _cfg(c: Cluster, *overrides: str, config: str = "configs/cartpole_ppo.yaml"):
    return load_config(ROOT / config, [*_on_cluster(c), *overrides])


SAFETY_NET = 300.0
"""Seconds a wait below gives a broken run before failing; conditions, never this clock, decide how runs stop."""


def _wait_for(path: Path, ready: Any, timeout: float = SAFETY_NET) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            data = json.loads(path.read_text())
            if ready(data):
                return data
        time.sleep(0.2)
    raise AssertionError(f"{path} not ready in {timeout} s")


def _wait_for_record(run_dir: Path, ready: Any, timeout: float = SAFETY_NET) -> dict[str, Any]:
    """Until the run's newest metrics record satisfies ``ready``; returns that record."""
    path, deadline = run_dir / "metrics.jsonl", time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = path.read_text().split("\n")[:-1] if path.exists() else []  # complete lines only
        if lines and ready(record := json.loads(lines[-1])):
            return record
        time.sleep(0.2)
    raise AssertionError(f"{path}: no record ready in {timeout} s")


def _wait_for_steps(run_dir: Path, steps: int, timeout: float = SAFETY_NET) -> None:
    """Until the run's metrics show ``steps`` env steps (the run is training, not starting)."""
    _wait_for_record(run_dir, lambda r: r.get("env_steps", 0) >= steps, timeout)


def _node_ids(c: Cluster, nodes: list) -> tuple[str, set[str]]:
    return c.head_node.node_id, {n.node_id for n in nodes}


def test_places_by_node_and_solves_cartpole(cluster, tmp_path):
    """Two actor nodes and two trainer nodes (a third worker node joins as the second trainer node): each group
    whole on its own node, the data-parallel trainers meeting over TCP across nodes."""
    c, nodes = cluster
    second = c.add_node(num_cpus=2, resources={"srl_trainer": 1}, node_ip_address="127.0.0.1")
    try:
        c.wait_for_nodes()
        summary = train(
            _cfg(c, "ray.policy_workers_per_node=1", "workers.trainers=2", "ray.trainer_nodes=2"),
            run_dir=tmp_path / "run",
            progress=None,
        )
    finally:
        c.remove_node(second)
    assert summary["solved"], summary
    assert summary["solved_return_mean"] >= 475  # at the moment it was met (episodes that end later may lower it)
    workers = json.loads((tmp_path / "run" / "workers.json").read_text())
    head, actor_nodes = _node_ids(c, nodes)
    # one trainer on each trainer node; the root server with the lead trainer
    assert {workers["trainer0"]["node_id"], workers["trainer1"]["node_id"]} == {head, second.node_id}
    assert workers["param_root0"]["node_id"] == workers["trainer0"]["node_id"]
    group = [{workers[f"{r}{g}"]["node_id"] for r in ("actor", "policy", "relay")} for g in range(2)]
    assert all(len(g) == 1 for g in group) and set().union(*group) == actor_nodes
    # the root sent each version to the two relays only (hierarchical service across nodes)
    assert summary["rejected_segment_messages"] == 0
    root = summary["param_service"]["param_root"]
    assert root["rejected"] == 0 and root["sends"] <= 2 * (summary["policy_version"] + 1)
    # each Ray worker process reported what it spent, by role
    spent = summary["cost"]["core_seconds"]
    assert {"actor", "policy", "trainer", "relay", "driver"} <= set(spent) and min(spent.values()) > 0, spent


def test_a_stage_on_each_actor_node_filters_before_the_network(cluster, tmp_path):
    """The custom dataflow of examples/fresh_segments.yaml under Ray: one stage per actor node, placed with the
    actors it serves, sends what it keeps to the trainer's node over TCP; CartPole solves."""
    c, nodes = cluster
    cfg = _cfg(
        c,
        "ray.policy_workers_per_node=1",
        "ray.cpus_per_policy_worker=0.5",
        config="examples/fresh_segments.yaml",
    )
    summary = train(cfg, run_dir=tmp_path / "run", progress=None)
    assert summary["solved"], summary
    workers = json.loads((tmp_path / "run" / "workers.json").read_text())
    head, actor_nodes = _node_ids(c, nodes)
    assert {workers[f"stage{g}"]["node_id"] for g in range(2)} == actor_nodes
    assert all(workers[f"stage{g}"]["node_id"] == workers[f"actor{g}"]["node_id"] for g in range(2))
    assert all(summary["stages"][f"stage{g}"]["kept"] > 0 for g in range(2)), summary["stages"]
    assert summary["rejected_segment_messages"] == 0


@pytest.mark.parametrize("config", ["configs/cartpole_dqn.yaml", "configs/cartpole_masked_r2d2.yaml"])
def test_actors_on_two_nodes_fill_a_replay_on_the_trainers_node(cluster, tmp_path, config):
    """DQN's transitions and R2D2's sequences (with the state each starts from) across nodes: each actor node's
    segments go over TCP to the replay beside the trainer, which its rate limiter holds at the configured samples
    per insert (the actors wait for it across the network, as on one node); none is refused, and all but the few
    still queued at the stop reach the store."""
    c, nodes = cluster
    cfg = _cfg(
        c,
        "run.total_env_steps=16000",
        "run.target_return=null",
        "replay.samples_per_insert=8",
        config=config,
    )
    summary = train(cfg, run_dir=tmp_path / "run", progress=None)
    workers = json.loads((tmp_path / "run" / "workers.json").read_text())
    head, actor_nodes = _node_ids(c, nodes)
    assert workers["replay0"]["node_id"] == workers["trainer0"]["node_id"] == head
    assert {workers[f"actor{g}"]["node_id"] for g in range(2)} == actor_nodes
    replay = summary["replays"]["replay0"]
    assert summary["rejected_segment_messages"] == 0 and replay["rejected_segments"] == 0
    # the limiter's bound: samples stay within its error buffer of spi x the items inserted past min_size
    earned = cfg.replay.samples_per_insert * (replay["inserted"] - cfg.replay.min_size)
    assert abs(replay["sampled"] - earned) <= replay_spec(make_plan(cfg), 0).error_buffer, replay
    assert summary["env_steps"] >= 16000 and summary["policy_version"] > 0
    # held back: the replay takes at most MAX_PENDING segments ahead of its limiter, the rest wait in the senders'
    # and the sockets' buffers (a few dozen segments at most, where the run's whole output would pile up unheld)
    assert replay["pending_segments"] <= MAX_PENDING
    queued = summary["env_steps"] - replay["inserted_steps"]
    segment = cfg.workers.segment_length * cfg.workers.envs_per_slot
    assert 0 <= queued <= 32 * segment, replay


def test_a_reanalyze_worker_sits_beside_its_replay_and_refreshes_its_steps_across_nodes(cluster, tmp_path):
    """MuZero with a reanalyze worker: placed on the replay's node, it attaches to the replay's store there and
    mails refreshed search policies back; the replay writes them, refusing none."""
    c, nodes = cluster
    small = ("model.hidden=[32]", "muzero.latent=16", "muzero.hidden=32", "muzero.batch_size=32")
    cfg = _cfg(
        c,
        *small,
        "muzero.search.simulations=4",
        "replay.min_size=200",
        "run.total_env_steps=1000000000",  # the first refreshed steps end the run, however fast the machine
        "run.target_return=null",
        "run.eval_episodes=0",
        "run.log_interval_seconds=0.2",
        "reanalyze.workers=1",
        config="configs/cartpole_muzero.yaml",
    )
    run_dir, stop = tmp_path / "run", threading.Event()
    thread, summary = _train_in_thread(cfg, run_dir, stop)
    try:
        _wait_for_record(run_dir, lambda r: r.get("replay0_refreshed_steps", 0) > 0)
    finally:
        stop.set()
        thread.join(300)
    assert not thread.is_alive() and "error" not in summary, summary.get("error")
    workers = json.loads((run_dir / "workers.json").read_text())
    assert workers["reanalyze0"]["node_id"] == workers["replay0"]["node_id"] == c.head_node.node_id
    replay = summary["replays"]["replay0"]
    assert replay["refreshed_steps"] > 0 and replay["refused_refreshes"] == 0, replay
    assert summary["reanalyze"]["reanalyzed_steps"] >= replay["refreshed_steps"] and summary["restarts"] == {}


def test_a_policys_memory_is_carried_per_env_across_nodes(cluster, tmp_path):
    """The memory probe (tests/test_memory.py) under Ray: on each actor node a policy worker batches the requests
    of two actors, the states travel in the segments to the trainer's node over TCP, and every row of every
    batch holds the state its step started from."""
    c, _ = cluster
    cfg = _cfg(
        c,
        "algorithm=srl.system.testing:MemoryProbe",
        "env.id=srl.system.testing:step_counter",
        "ray.actors_per_node=2",
        "ray.policy_workers_per_node=1",
        "ray.cpus_per_actor=0.5",
        "ray.cpus_per_policy_worker=0.5",
        "workers.ring_size=2",
        "workers.envs_per_slot=3",
        "workers.segment_length=5",
        "workers.batch_segments=2",
        "run.total_env_steps=600",
        "run.target_return=null",
        "run.eval_episodes=0",
        "run.log_interval_seconds=0.05",
    )
    summary = train(cfg, run_dir=tmp_path / "run", progress=None)
    assert summary["stop_reason"] == "env_steps", summary
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    probed = [r for r in records if "memory_rows" in r]
    assert probed and sum(r["memory_rows"] for r in probed) > 0
    assert sum(r["memory_violations"] for r in probed) == 0
    assert summary["rejected_segment_messages"] == 0


def test_a_multi_agent_env_trains_across_nodes(cluster, tmp_path):
    """PettingZoo agents as columns and MAPPO's global state, under Ray: the state crosses to the trainers' node
    with each segment, and the two-agent cooperative task is learned."""
    c, _ = cluster
    cfg = _cfg(
        c,
        "env.id=srl.envs.ma_testing:coop_targets",
        "ppo.critic_input=state",
        "run.target_return=6.5",
        "run.return_window=100",
    )
    summary = train(cfg, run_dir=tmp_path / "run", progress=None)
    assert summary["solved"], summary
    assert summary["rejected_segment_messages"] == 0 and summary["final_eval_agents_per_episode"] == 2


def test_two_policies_train_across_nodes_each_with_its_own_parameter_stream(cluster, tmp_path):
    """Agents mapped to two policies of other spaces: each policy's pool on every actor node, its own root and
    relays, its own two data-parallel trainers (one on each trainer node, meeting at that policy's TCP store)
    and its own checkpoints; both learn their part of the task."""
    c, _ = cluster
    second = c.add_node(num_cpus=2, resources={"srl_trainer": 1}, node_ip_address="127.0.0.1")
    try:
        c.wait_for_nodes()
        cfg = _cfg(
            c,
            "env.id=srl.envs.ma_testing:two_kinds",
            'agents=[{match: "red_.*", policy: red}, {match: "blue_.*", policy: blue}]',
            "workers.trainers=2",
            "ray.trainer_nodes=2",
            "run.target_return=null",
            "run.total_env_steps=30000",
            "run.eval_episodes=20",
        )
        summary = train(cfg, run_dir=tmp_path / "run", progress=None)
    finally:
        c.remove_node(second)
    assert summary["stop_reason"] == "env_steps", summary.get("error")
    for name in ("red", "blue"):  # random play scores 2 (red) and 2.7 (blue) of 8
        assert summary["policies"][name]["final_eval_return_mean"] >= 7.0, summary["policies"]
        assert (tmp_path / "run" / "checkpoints" / name).is_dir()
    assert {"relay0", "relay1", "relay2", "relay3"} <= set(summary["param_service"])
    workers = json.loads((tmp_path / "run" / "workers.json").read_text())
    for lead, other in ((0, 1), (2, 3)):  # each policy's two trainers on the two trainer nodes
        assert workers[f"trainer{lead}"]["node_id"] != workers[f"trainer{other}"]["node_id"]


def test_a_population_spread_over_two_trainer_nodes_copies_across_them(cluster, tmp_path):
    """Population-based training under Ray (configs/cartpole_pbt.yaml with 2 members, the second with a learning
    rate of 1e-6): each member trains whole on its own trainer node, its envs on both actor nodes. The actors'
    episode records reach the population worker on the first trainer node over a record channel; it tells
    member 1's trainer on the second node to copy member 0 (commands and the state by message across nodes);
    member 1 then plays like a learner, and its versions never went back. kill -9 of the population
    worker after that copy: it restarts at its address, reads its state back and goes on deciding."""
    c, _ = cluster
    second = c.add_node(num_cpus=2, resources={"srl_trainer": 1}, node_ip_address="127.0.0.1")
    lr = "key: ppo.lr, min: 1.0e-6, max: 1.0e-2, log: true, initial: [1.0e-3, 1.0e-6], resample: 0.0"
    run = tmp_path / "run"
    try:
        c.wait_for_nodes()
        sets = ["ray.trainer_nodes=2", "population.members=2", f"population.hyperparameters=[{{{lr}}}]"]
        # a gap of 3 keeps a copy from going the wrong way on the noise of two untrained members' first windows
        # no budget ends the run: it stops once the restarted worker has decided again and 60k env steps are
        # done, so a fast machine cannot finish before the kill
        sets += ["population.interval=3000", "population.min_gap=3", "run.total_env_steps=1000000000"]
        sets += ["run.eval_episodes=10"]
        cfg = load_config(ROOT / "configs" / "cartpole_pbt.yaml", [*_on_cluster(c), *sets])
        stop = threading.Event()
        thread, summary = _train_in_thread(cfg, run, stop)
        try:
            state = run / "population" / "state.json"
            copied = _wait_for(state, lambda d: any(r["target"] == 1 for r in d["lineage"]))
            workers = json.loads((run / "workers.json").read_text())
            os.kill(workers["population0"]["pid"], signal.SIGKILL)
            old = workers["population0"]["pid"]
            _wait_for(run / "workers.json", lambda d: d.get("population0", {}).get("pid", old) != old)
            _wait_for(state, lambda d: d["decisions"] > copied["decisions"])
            _wait_for_steps(run, 60000)
        finally:
            stop.set()
            thread.join(SAFETY_NET)
    finally:
        c.remove_node(second)
    assert not thread.is_alive() and summary["stop_reason"] == "requested", summary.get("error")
    assert summary["restarts"] == {"population0": 1}, summary["restarts"]
    workers = json.loads((run / "workers.json").read_text())
    trainer_nodes = {c.head_node.node_id, second.node_id}  # either trainer group may land on either node
    assert {workers["trainer0"]["node_id"], workers["trainer1"]["node_id"]} == trainer_nodes, workers
    assert workers["param_root1"]["node_id"] == workers["trainer1"]["node_id"]
    assert workers["population0"]["node_id"] == workers["trainer0"]["node_id"]
    after = json.loads((run / "population" / "state.json").read_text())
    assert after["lineage"][: len(copied["lineage"])] == copied["lineage"]  # it went on, not from scratch
    assert after["decisions"] > copied["decisions"]
    lineage = [json.loads(line) for line in (run / "population.jsonl").read_text().splitlines()]
    assert lineage == after["lineage"] and summary["population"]["copies"] >= 1
    assert any(r["event"] == "exploit" and (r["target"], r["source"]) == (1, 0) for r in lineage), lineage
    # random play scores about 22, and a learning rate of 1e-6 keeps it there
    assert summary["policies"]["member1"]["final_eval_return_mean"] >= 150, summary["policies"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    versions = [r["member1/version"] for r in records if "member1/version" in r]
    assert versions and versions == sorted(versions)


def test_self_play_against_a_league_runs_across_nodes(cluster, tmp_path):
    """Tic-tac-toe against a league under Ray: the league worker plays its rounds from the parameter service on
    the trainers' node and freezes members; the actors on the other nodes play them."""
    c, _ = cluster
    cfg = _cfg(
        c,
        "env.id=srl.envs.turns:game",
        "env.kwargs={name: tic_tac_toe}",
        "env.agent_id=true",
        "league.opponent=pfsp",
        "league.check_every_versions=2",
        "league.match_games=8",
        "league.random_opponent=0.0",
        "league.freeze_score=0.05",  # freezing is what is tested, not learning: any win or draw in 8 games will do
        "run.total_env_steps=1000000000",  # the league's rounds end the run, not a budget racing them
    )
    run_dir, stop = tmp_path / "run", threading.Event()
    thread, summary = _train_in_thread(cfg, run_dir, stop)
    try:
        pool = _wait_for(run_dir / "league" / "pool.json", lambda d: d["rounds"] >= 3 and len(d["members"]) >= 2)
    finally:
        stop.set()
        thread.join(300)
    assert not thread.is_alive() and "error" not in summary, summary.get("error")
    assert summary["stop_reason"] == "requested" and summary["league"]["rounds"] >= 1, summary
    members = json.loads((run_dir / "league" / "pool.json").read_text())["members"]
    assert len(members) >= len(pool["members"]) >= 2
    assert sorted(p.name for p in (run_dir / "league").glob("v*.npy")) == [f"v{m['version']:08d}.npy" for m in members]


def _train_in_thread(
    cfg, run_dir: Path, stop: threading.Event | None = None
) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(train(cfg, run_dir=run_dir, progress=None, stop=stop)))
    thread.start()
    return thread, out


def test_a_role_added_by_config_is_placed_reports_and_restarts_alone(cluster, tmp_path):
    """examples/policy_churn.yaml under Ray: the role's worker is placed with the lead trainer, its reports reach
    the records and the summary, and after kill -9 it is restarted alone, counted, and reports again."""
    c, _ = cluster
    run_dir, stop = tmp_path / "run", threading.Event()
    cfg = _cfg(c, "run.total_env_steps=100000000", "run.target_return=null", config="examples/policy_churn.yaml")
    thread, summary = _train_in_thread(cfg, run_dir, stop)
    try:
        _wait_for_record(run_dir, lambda r: "churn" in r)
        workers = json.loads((run_dir / "workers.json").read_text())
        assert workers["churn0"]["node_id"] == workers["trainer0"]["node_id"] == c.head_node.node_id
        os.kill(workers["churn0"]["pid"], signal.SIGKILL)
        old = workers["churn0"]["pid"]
        _wait_for(run_dir / "workers.json", lambda d: d.get("churn0", {}).get("pid", old) != old)
        measured = _wait_for_record(run_dir, lambda r: "churn_version" in r)["churn_version"]
        _wait_for_record(run_dir, lambda r: r.get("churn_version", -1) > measured + 1)
    finally:
        stop.set()
        thread.join(300)
    assert not thread.is_alive() and "error" not in summary, summary.get("error")
    assert summary["restarts"] == {"churn0": 1}, summary
    assert summary["churn"]["versions"] >= 3 and 0.0 <= summary["churn"]["mean"] <= 1.0, summary["churn"]


def test_killed_actor_policy_worker_and_trainer_processes_are_restarted(cluster, tmp_path):
    """kill -9 of an actor, of a policy worker, then of the lead of two data-parallel trainers: the actor and the
    policy worker restart alone, both trainers restart together from the newest checkpoint, and the run solves.
    The lead trainer is frozen (SIGSTOP) from its first checkpoint until it is killed, so the run cannot solve
    before every kill is done, however fast the machine."""
    c, _ = cluster
    run_dir = tmp_path / "run"
    cfg = _cfg(c, "run.checkpoint_interval_seconds=0.2", "workers.trainers=2", "ray.policy_workers_per_node=1")
    thread, summary = _train_in_thread(cfg, run_dir)
    workers = _wait_for(run_dir / "workers.json", lambda d: "actor1" in d)
    deadline = time.monotonic() + SAFETY_NET
    while not list((run_dir / "checkpoints").glob("ckpt_*.pt")):
        assert time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.05)
    os.kill(workers["trainer0"]["pid"], signal.SIGSTOP)
    for name in ("actor1", "policy0", "trainer0"):
        os.kill(workers[name]["pid"], signal.SIGKILL)
        old = workers[name]["pid"]
        _wait_for(run_dir / "workers.json", lambda d, name=name, old=old: d.get(name, {}).get("pid", old) != old)
    thread.join(300)
    assert not thread.is_alive()
    restarts = summary["restarts"]
    assert restarts == {"actor1": 1, "policy0": 1, "trainer0": 1, "trainer1": 1}, summary
    assert summary["solved"], summary
    # the peer that was not found dead first restarted because the other failed
    assert any("restarted (1) after: trainer" in w and " failed (" in w for w in summary["warnings"]), summary
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["restarts"] == 4
    versions = [r["policy_version"] for r in records]
    assert versions == sorted(versions)  # the restarted trainers published above every version before them
    after = json.loads((run_dir / "workers.json").read_text())
    assert all(after[t]["pid"] != workers[t]["pid"] for t in ("trainer0", "trainer1"))


def test_lost_node_leaves_training_going_and_group_returns(cluster, tmp_path):
    """Group 0's node dies. Its relay also serves relay 1 (fan-out 1), so when the group lands on a new node and
    the relay binds there, relay 1 (on the surviving node) must follow it to its new address.

    No budget ends the run: the test stops it once it has seen the group back, relay 1 following, and training
    go on for ``more_steps`` env steps and ``more_versions`` policy versions after that, however fast the machine.
    """
    more_steps, more_versions = 3000, 5
    c, nodes = cluster
    run_dir, stop = tmp_path / "run", threading.Event()
    endless = ["run.target_return=null", "run.total_env_steps=1000000000", "run.max_wall_seconds=null"]
    thread, summary = _train_in_thread(_cfg(c, *endless, "params.fan_out=1"), run_dir, stop)
    try:
        workers = _wait_for(run_dir / "workers.json", lambda d: "actor1" in d)
        victim = next(n for n in nodes if n.node_id == workers["actor0"]["node_id"])
        _wait_for_steps(run_dir, 2000)
        c.remove_node(victim)  # the node's raylet and every worker on it die
        nodes.remove(victim)
        _wait_for_record(run_dir, lambda r: r.get("restarts", 0) >= 1)  # the run saw its workers go
        nodes.append(c.add_node(num_cpus=2, resources={"srl_actor": 1}, node_ip_address="127.0.0.1"))
        back = _wait_for(
            run_dir / "workers.json",
            lambda d: (
                d.get("actor0", {}).get("node_id") == nodes[-1].node_id
                and d.get("relay1", {}).get("pid") not in (None, workers["relay1"]["pid"])
            ),  # relay 1 followed
        )
        then = _wait_for_record(run_dir, lambda r: True)
        _wait_for_record(
            run_dir,
            lambda r: (
                r["env_steps"] >= then["env_steps"] + more_steps
                and r["policy_version"] >= then["policy_version"] + more_versions
            ),
        )
    finally:
        stop.set()
        thread.join(300)
    assert not thread.is_alive()
    assert summary["stop_reason"] == "requested", summary
    assert back["relay0"]["node_id"] == nodes[-1].node_id
    assert back["relay1"]["node_id"] == workers["relay1"]["node_id"] != nodes[-1].node_id
    restarts = summary["restarts"]
    assert restarts.get("actor0", 0) >= 1 and restarts.get("relay0", 0) >= 1, summary
    assert restarts.get("relay1", 0) >= 1 and restarts.get("actor1", 0) == 0, summary  # only the relay followed
    assert summary["param_service"]["relay1"]["version"] >= summary["policy_version"] - 3  # and it is fed again
    assert summary["env_steps"] >= then["env_steps"] + more_steps
    steps = [json.loads(line)["env_steps"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] > steps[len(steps) // 2] > 0  # training kept going through the loss


def test_a_signal_stops_a_ray_run_cleanly_and_gives_its_resources_back(cluster, tmp_path):
    """SIGTERM to ``srl train`` on a cluster it joined: the run stops as interrupted, checkpoints, exits 130, and
    its placement groups and actors are gone (the cluster's CPUs are all free again); the cluster lives on."""
    c, _ = cluster
    run = tmp_path / "run"
    proc = start_endless_training(run, *_on_cluster(c))
    try:
        _wait_for_record(run, lambda r: r.get("policy_version", 0) >= 2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=SAFETY_NET)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and "error" not in summary
    assert list((run / "checkpoints").glob("ckpt_*.pt"))
    deadline = time.monotonic() + SAFETY_NET
    while ray.available_resources().get("CPU") != ray.cluster_resources().get("CPU"):
        assert time.monotonic() < deadline, "the run's placement groups outlived it"
        time.sleep(0.2)


def _listening(pids: set[int]) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses the TCP sockets of these processes listen on (their socket inodes, found in /proc/net)."""
    inodes = set()
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:  # gone meanwhile
            continue
        inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                raw = bytes.fromhex(fields[1].split(":")[0])  # 32-bit words in host (little-endian) order
                found.append(ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))))
    return found


def _loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def test_a_private_instance_listens_on_loopback_and_a_signal_to_the_group_stops_it_cleanly(tmp_path, monkeypatch):
    """``runtime: ray`` without ``ray.address``, started the way a shell starts a job (its own process group).
    Ray's servers, our ZeroMQ servers and ``workers.json`` are on loopback only. SIGTERM to the whole group stops
    the run as interrupted (exit 130, a final checkpoint: Ray is not in the group, so the workers stop as under any
    runtime) and nothing of it is left: no process, no shared memory (the autouse check), no pipe folder."""
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")  # this module's switch: the run must find its own
    run, tmp = tmp_path / "run", tmp_path / "tmp"
    tmp.mkdir()
    proc = start_endless_training(run, "runtime=ray", tmp=tmp, new_session=True)
    try:
        _wait_for_record(run, lambda r: r.get("policy_version", 0) >= 2)
        tree = {proc.pid} | _descendants(proc.pid)
        listening = _listening(tree)
        hosts = {w["host"] for w in json.loads((run / "workers.json").read_text()).values()}
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=SAFETY_NET)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and "error" not in summary, summary
    assert list((run / "checkpoints").glob("ckpt_*.pt"))
    deadline = time.monotonic() + SAFETY_NET
    while left := [pid for pid in tree if _alive(pid) and pid not in children_of(os.getpid())]:
        assert time.monotonic() < deadline, f"processes of the run outlived it: {left}"
        time.sleep(0.2)
    assert not list(tmp.iterdir()), "pipe folders outlived the run"
    assert len(tree) > 5 and listening, (tree, listening)  # Ray's processes and the workers were seen
    assert all(_loopback(a) for a in listening), sorted(map(str, listening))
    assert hosts == {"127.0.0.1"}, hosts


def test_a_stop_while_ray_places_the_run_ends_it_at_once(cluster, tmp_path):
    """A node group whose resource no node offers waits for its placement; a stop request meanwhile ends the run
    there (stopped, not failed), long before ``ray.start_timeout_seconds``, and gives the cluster its CPUs back."""
    c, _ = cluster
    cfg = _cfg(c, "ray.node_resource=absent", "ray.start_timeout_seconds=3600")
    stop = threading.Event()
    thread, summary = _train_in_thread(cfg, tmp_path / "run", stop)
    try:
        deadline = time.monotonic() + SAFETY_NET
        while not any(pg["state"] == "PENDING" for pg in ray.util.placement_group_table().values()):
            assert time.monotonic() < deadline and thread.is_alive(), "the run never waited for its placement"
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(SAFETY_NET)
    assert not thread.is_alive(), "the stop did not end the wait for the placement"
    assert summary["stop_reason"] == "requested" and "error" not in summary, summary
    while ray.available_resources().get("CPU") != ray.cluster_resources().get("CPU"):
        assert time.monotonic() < deadline, "the run's placement groups outlived it"
        time.sleep(0.2)


def test_bad_ray_settings_get_one_line_and_a_non_zero_exit(tmp_path):
    cases = [
        (["ray.address=127.0.0.1:1"], "ray.address: cannot reach '127.0.0.1:1'"),
        (["ray.actor_nodes=2", "workers.actors=3"], "workers.actors: 3 actors do not split evenly"),
        (["ray.actors_per_node=0"], "ray.actors_per_node: must be >= 1"),
        (
            ["ray.trainer_nodes=2", "workers.trainers=3", "workers.actors=3"],
            "workers.trainers: 3 trainers do not split evenly over ray.trainer_nodes=2",
        ),
    ]
    for i, (overrides, message) in enumerate(cases):
        cmd = [
            sys.executable,
            "-m",
            "srl.cli.main",
            "train",
            str(ROOT / "configs" / "cartpole_ppo.yaml"),
            "--run-dir",
            str(tmp_path / str(i)),
            "--set",
            "runtime=ray",
            *[a for o in overrides for a in ("--set", o)],
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], proc.stderr
