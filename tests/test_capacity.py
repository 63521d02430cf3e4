"""The capacity model (``srl plan``): hand-checked predictions, bottleneck switches, the parameter service
flat vs hierarchical, layouts that fit, the costs file, and the command line."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from srl.api.config import ConfigError
from srl.capacity.model import Cluster, Costs, Layout, fan_out_candidates, param_delivery, predict, tree_depth
from srl.capacity.recommend import Limits, recommend, scale_table
from srl.cli.main import main

# Round numbers, so predictions can be checked by hand: an env step costs 100 us, an update 200 us per sample;
# the trainers' all-reduce is free here (a test of its own charges it).
COSTS = Costs(
    env_id="Fake-v0",
    envs_per_slot=8,
    segment_length=32,
    samples_per_version=512,
    max_inference_batch=64,
    env_seconds_per_step=100e-6,
    actor_seconds_per_step=0.0,
    inference_seconds_per_sample=0.0,
    inference_seconds_per_batch=0.0,
    request_seconds=0.0,
    serve_seconds_per_batch=0.0,
    serve_seconds_per_request=0.0,
    update_seconds_per_sample=200e-6,
    trainer_threads=1,
    segment_send_seconds=0.0,
    bytes_per_sample=100.0,
    param_bytes=1_000_000,
    param_hop_seconds=1e-3,
    param_bytes_per_second=1e9,
    gradient_bytes=100_000,
    reductions_per_update=16,
    allreduce_hop_seconds=0.0,
    allreduce_bytes_per_second=1e18,
)


def one_node(actors: int, pws: int = 0, trainers: int = 1) -> Layout:
    return Layout(
        actor_nodes=1,
        trainer_nodes=0,
        actors_per_node=actors,
        policy_workers_per_node=pws,
        trainers=trainers,
        envs_per_slot=8,
    )


def many_nodes(
    actor_nodes: int, trainer_nodes: int, actors: int = 60, pws: int = 4, trainers: int = 64, **kw: object
) -> Layout:
    return Layout(
        actor_nodes=actor_nodes,
        trainer_nodes=trainer_nodes,
        actors_per_node=actors,
        policy_workers_per_node=pws,
        trainers=trainers,
        envs_per_slot=8,
        **kw,
    )  # type: ignore[arg-type]


def test_one_node_prediction_by_hand():
    pred = predict(COSTS, Cluster(nodes=1, cores_per_node=2), one_node(1))
    assert pred.stages["env"] == pytest.approx(10_000)  # 1 actor / 100 us
    assert pred.stages["trainer"] == pytest.approx(5_000)  # 1 trainer / 200 us
    assert pred.stages["cores"] == pytest.approx(2 / 300e-6)  # both processes share 2 cores
    assert math.isinf(pred.stages["network"]) and math.isinf(pred.stages["params"])  # nothing leaves the node
    assert pred.bottleneck == "trainer" and pred.steps_per_second == pytest.approx(5_000)


def test_multi_agent_steps_cost_one_sample_per_agent():
    """Three agents per env: inference and the update run three samples per env step; the env is per env step."""
    costs = dataclasses.replace(COSTS, agents_per_env=3, inference_seconds_per_sample=10e-6)
    pred = predict(costs, Cluster(nodes=1, cores_per_node=2), one_node(1))
    assert pred.stages["env"] == pytest.approx(1 / (100e-6 + 3 * 10e-6))  # inline inference: 3 forwards' worth
    assert pred.stages["trainer"] == pytest.approx(1 / (3 * 200e-6))
    # a costs file written before agents_per_env existed reads as single-agent
    old = {k: v for k, v in COSTS.to_dict().items() if k != "agents_per_env"}
    assert Costs.from_dict(old).agents_per_env == 1


def test_an_inline_actor_costs_what_it_was_measured_to_cost_together():
    """The pieces timed apart add up to 100 + 10 + 40/8 = 115 us per step; the actor measured whole took 138 us
    (each piece's own loop runs in warm caches). The model takes the whole, scaled to the layout's slot size;
    with policy workers the actor runs no forward pass and the whole does not apply."""
    costs = dataclasses.replace(
        COSTS,
        inference_seconds_per_sample=10e-6,
        inference_seconds_per_batch=40e-6,
        inline_actor_seconds_per_step=138e-6,
    )
    assert predict(costs, Cluster(nodes=1, cores_per_node=2), one_node(1)).stages["env"] == pytest.approx(1 / 138e-6)
    wider = dataclasses.replace(one_node(1), envs_per_slot=16)  # the forward's fixed part over twice the envs
    scaled = 138e-6 / 115e-6 * (100e-6 + 10e-6 + 40e-6 / 16)
    assert predict(costs, Cluster(nodes=1, cores_per_node=2), wider).stages["env"] == pytest.approx(1 / scaled)
    served = predict(costs, Cluster(nodes=1, cores_per_node=4), one_node(1, pws=1)).stages["env"]
    assert served == pytest.approx(1 / 100e-6)  # request_seconds is 0 here
    # a costs file measured before the whole actor was: the pieces' sum
    old = {k: v for k, v in costs.to_dict().items() if k != "inline_actor_seconds_per_step"}
    assert predict(Costs.from_dict(old), Cluster(nodes=1, cores_per_node=2), one_node(1)).stages[
        "env"
    ] == pytest.approx(1 / 115e-6)


def test_more_env_cores_raise_throughput_until_the_trainer_binds():
    costs = dataclasses.replace(COSTS, env_seconds_per_step=1e-3)  # 1k env steps/s per actor
    cluster = Cluster(nodes=1, cores_per_node=64)
    rates, bottlenecks = [], []
    for actors in range(4, 40, 4):
        pred = predict(costs, cluster, one_node(actors, trainers=4))  # trainers: 4 / 200 us = 20k
        rates.append(pred.steps_per_second)
        bottlenecks.append(pred.bottleneck)
    assert rates[:2] == pytest.approx([4_000, 8_000]) and bottlenecks[:4] == ["env"] * 4
    assert all(b >= a for a, b in zip(rates, rates[1:]))
    assert rates[-1] == pytest.approx(20_000) and bottlenecks[-1] == "trainer"


def test_oversubscribed_node_is_bound_by_its_cores():
    pred = predict(COSTS, Cluster(nodes=1, cores_per_node=2), one_node(4, trainers=4))
    assert pred.bottleneck == "cores" and pred.steps_per_second == pytest.approx(2 / 300e-6)


def test_nodes_on_one_machine_share_its_cores():
    """Three nodes of one 2-core machine (namespaces): each node's own cores would leave the trainer the
    bottleneck; sharing the machine's, every sample's work (acting and training) comes out of the same 2 cores,
    as on one node with the same workers."""
    costs = dataclasses.replace(COSTS, env_seconds_per_step=200e-6, update_seconds_per_sample=100e-6)
    layout = many_nodes(2, 1, actors=1, pws=0, trainers=1)
    own = predict(costs, Cluster(nodes=3, cores_per_node=2), layout)
    shared = predict(costs, Cluster(nodes=3, cores_per_node=2, shared_cores=2), layout)
    one = predict(costs, Cluster(nodes=1, cores_per_node=2), one_node(2, trainers=1))
    assert own.bottleneck != "cores" and own.steps_per_second == pytest.approx(10_000)
    assert shared.bottleneck == "cores" and shared.steps_per_second == pytest.approx(2 / 300e-6)
    assert shared.stages["cores"] == pytest.approx(one.stages["cores"])
    assert shared.stages["cores"] < own.stages["cores"]
    with pytest.raises(ConfigError, match="shared_cores"):
        Cluster(nodes=3, cores_per_node=2, shared_cores=0)


@pytest.mark.parametrize(
    "change, bottleneck",
    [
        ({}, "trainer"),
        ({"env_seconds_per_step": 10e-3}, "env"),
        ({"inference_seconds_per_sample": 1e-3}, "inference"),
        ({"bytes_per_sample": 1e6}, "network"),
        ({"param_bytes": 10**9, "param_hop_seconds": 1.0}, "params"),
    ],
)
def test_bottleneck_switches(change, bottleneck):
    costs = dataclasses.replace(COSTS, **change)
    pred = predict(costs, Cluster(nodes=8, cores_per_node=64), many_nodes(6, 2, trainers=16))
    assert pred.bottleneck == bottleneck
    assert pred.steps_per_second == min(pred.stages.values())


def test_gpu_trainers_use_the_speed_up():
    cluster = Cluster(nodes=2, cores_per_node=64, gpus_per_node=8)
    layout = many_nodes(1, 1, trainers=8, trainer_device="gpu")
    with pytest.raises(ConfigError, match="gpu_update_speedup"):
        predict(COSTS, cluster, layout)
    pred = predict(dataclasses.replace(COSTS, gpu_update_speedup=10.0), cluster, layout)
    assert pred.stages["trainer"] == pytest.approx(8 * 10 / 200e-6)


def test_tree_depth_and_fan_out_candidates():
    assert [tree_depth(r, 4) for r in (1, 4, 5, 20, 21, 84, 85)] == [1, 1, 2, 2, 3, 3, 4]
    for relays in (1, 3, 8, 100, 5000):
        cands = fan_out_candidates(relays)
        depths = [tree_depth(relays, f) for f in cands]
        assert len(set(depths)) == len(depths)  # one fan-out per depth
        for f, d in zip(cands, depths):
            assert f == 2 or tree_depth(relays, f - 1) > d  # the smallest fan-out reaching that depth


def test_hierarchical_root_egress_grows_with_relays_not_readers():
    cluster = Cluster(nodes=200, cores_per_node=64)
    for actor_nodes in (2, 8, 32, 128):
        few, many = many_nodes(actor_nodes, 1, pws=1), many_nodes(actor_nodes, 1, pws=8)
        flat_few, flat_many = (param_delivery(COSTS, cluster, lay, "flat") for lay in (few, many))
        assert flat_many.root_bytes == 8 * flat_few.root_bytes == 8 * actor_nodes * COSTS.param_bytes
        hier_few, hier_many = (param_delivery(COSTS, cluster, lay, "hierarchical", 8) for lay in (few, many))
        assert hier_few.root_bytes == hier_many.root_bytes == min(actor_nodes, 8) * COSTS.param_bytes
        assert hier_many.relays == actor_nodes and hier_many.depth == tree_depth(actor_nodes, 8)
        assert hier_many.seconds < flat_many.seconds


def test_inline_actors_are_readers():
    delivery = param_delivery(COSTS, Cluster(nodes=3, cores_per_node=64), many_nodes(2, 1, actors=50, pws=0), "flat")
    assert delivery.readers == 100 and delivery.root_sends == 100


@pytest.mark.parametrize(
    "nodes, cores, gpus", [(1, 2, 0), (1, 16, 0), (1, 16, 2), (4, 64, 0), (40, 64, 8), (1563, 64, 0)]
)
def test_recommended_layouts_fit_the_cluster(nodes, cores, gpus):
    costs = dataclasses.replace(
        COSTS,
        gpu_update_speedup=10.0,
        request_seconds=20e-6,
        inference_seconds_per_batch=200e-6,
        inference_seconds_per_sample=1e-6,
    )
    cluster = Cluster(nodes=nodes, cores_per_node=cores, gpus_per_node=gpus)
    rec = recommend(costs, cluster)
    lay = rec.layout
    assert lay.actor_nodes + lay.trainer_nodes <= nodes
    assert lay.actor_nodes * lay.actors_per_node >= lay.trainers >= 1
    per_trainer = 1 if lay.trainer_device == "gpu" else costs.trainer_threads
    if lay.trainer_nodes == 0:
        assert lay.actors_per_node + lay.policy_workers_per_node + lay.trainers * per_trainer <= cores
    else:
        assert lay.actors_per_node + lay.policy_workers_per_node <= cores
        assert lay.trainers * per_trainer <= lay.trainer_nodes * (gpus if lay.trainer_device == "gpu" else cores)
    if lay.trainer_device == "gpu":
        assert lay.trainers <= gpus * max(1, lay.trainer_nodes)
    assert rec.prediction.steps_per_second > 0
    settings = rec.settings()
    assert settings["params.fan_out"] >= 1 and settings["workers.ring_size"] == 2


def test_two_cores_recommend_the_shipped_layout():
    rec = recommend(COSTS, Cluster(nodes=1, cores_per_node=2))
    assert rec.settings()["workers.actors"] == 1 and rec.settings()["workers.policy_workers"] == 0
    assert rec.layout.trainers == 1


def test_one_node_as_fast_as_several_is_recommended_alone():
    """Where the trainer binds on one node already, more nodes add power and no speed: the plan keeps one."""
    costs = dataclasses.replace(COSTS, gradient_bytes=None, reductions_per_update=None, allreduce_hop_seconds=None,
                                allreduce_bytes_per_second=None)  # fmt: skip
    one = recommend(costs, Cluster(nodes=1, cores_per_node=64))
    many = recommend(costs, Cluster(nodes=16, cores_per_node=64))
    assert one.prediction.bottleneck == "trainer" and many.layout == one.layout and many.layout.trainer_nodes == 0


def test_max_trainers_caps_and_leaves_idle_actor_nodes():
    free = recommend(COSTS, Cluster(nodes=100, cores_per_node=64))
    capped = recommend(COSTS, Cluster(nodes=100, cores_per_node=64), Limits(max_trainers=8))
    assert capped.layout.trainers == 8 and free.layout.trainers > 8
    assert capped.prediction.bottleneck == "trainer"
    assert capped.prediction.steps_per_second == pytest.approx(8 / 200e-6)
    assert capped.layout.actor_nodes + capped.layout.trainer_nodes < 100  # more actor nodes would add nothing


def test_max_trainer_nodes_caps_the_trainer_nodes_and_trainers_split_evenly_over_them():
    costs = dataclasses.replace(COSTS, gpu_update_speedup=10.0)
    # a free all-reduce; nodes of 16 cores: one alone cannot feed its 8 GPU trainers
    cluster = Cluster(nodes=40, cores_per_node=16, gpus_per_node=8, link_latency_us=0.0)
    free, one = recommend(costs, cluster), recommend(costs, cluster, Limits(max_trainer_nodes=1))
    assert free.layout.trainer_nodes > 1 and one.layout.trainer_nodes == 1
    assert (
        free.settings()["ray.trainer_nodes"] == free.layout.trainer_nodes and one.settings()["ray.trainer_nodes"] == 1
    )
    assert one.layout.trainers == 8 and one.settings()["ray.trainer_gpus"] == 1
    odd = recommend(costs, cluster, Limits(max_trainers=13))  # 2 trainer nodes: 12 trainers, 6 on each
    assert (odd.layout.trainer_nodes, odd.layout.trainers) == (2, 12)
    assert one.prediction.steps_per_second == pytest.approx(8 * 10 / 200e-6)
    with pytest.raises(ConfigError, match="max_trainer_nodes: must be >= 1"):
        Limits(max_trainer_nodes=0)


def test_the_trainers_all_reduce_is_a_ring_charged_per_minibatch():
    """By hand: 4 trainers on one node all-reduce 100 kB 16 times per update of their 512 samples; a ring takes
    2 x 3 steps of (100 us + 25 kB at 1 GB/s) = 750 us. Across trainer nodes each step waits on the link:
    its latency (500 us here) and bandwidth (1 Gbit/s). One trainer reduces nothing."""
    from srl.capacity.model import allreduce_per_step, allreduce_seconds

    costs = dataclasses.replace(COSTS, allreduce_hop_seconds=100e-6, allreduce_bytes_per_second=1e9)
    node = Cluster(nodes=1, cores_per_node=64)
    four = one_node(actors=8, trainers=4)
    assert allreduce_seconds(costs, node, four) == pytest.approx(6 * (100e-6 + 25e-6))
    per_step = 16 * 750e-6 / 512
    assert allreduce_per_step(costs, node, four) == pytest.approx(per_step)
    assert predict(costs, node, four).stages["trainer"] == pytest.approx(4 / (200e-6 + per_step))
    assert allreduce_seconds(costs, node, one_node(actors=8)) == 0.0
    far = Cluster(nodes=4, cores_per_node=64, link_gbps=1.0, link_latency_us=500.0)
    spread = many_nodes(2, 2, trainers=64)
    assert allreduce_seconds(costs, far, spread) == pytest.approx(2 * 63 * (500e-6 + 100_000 / 64 / 1.25e8))
    near = many_nodes(2, 1, trainers=64)  # one trainer node: the ring stays on its loopback
    assert allreduce_seconds(costs, far, near) == pytest.approx(2 * 63 * (100e-6 + 100_000 / 64 / 1e9))
    # a costs file measured before the all-reduce was: one trainer only, more is one line
    old = dataclasses.replace(costs, **dict.fromkeys(("gradient_bytes", "reductions_per_update",
                                                      "allreduce_hop_seconds", "allreduce_bytes_per_second")))  # fmt: skip
    assert predict(old, node, one_node(actors=8)).steps_per_second > 0
    with pytest.raises(ConfigError, match="gradient_bytes: this costs file has no all-reduce measurement"):
        predict(old, node, four)
    assert recommend(old, Cluster(nodes=100, cores_per_node=64)).layout.trainers == 1  # it plans one trainer
    with pytest.raises(ConfigError, match="reductions_per_update: missing, while gradient_bytes is given"):
        dataclasses.replace(old, gradient_bytes=1000)


def test_a_costly_all_reduce_stops_the_trainers_growing_with_the_cluster():
    """At 160 nodes of 64 cores, a free all-reduce lets the plan run 5,120 CPU trainers; at 200 us per ring step
    and 50 us across nodes, every one more makes each trainer wait longer: the plan keeps each trainer at least
    half its time on its update (128 trainers here), where filling the cluster would add 40x the trainers for
    less than 2x the throughput, each waiting 97% of its time."""
    from srl.capacity.recommend import trainer_efficiency

    free = recommend(COSTS, Cluster(nodes=160, cores_per_node=64, link_gbps=1e9, link_latency_us=0.0))
    assert free.layout.trainers == 5_120 and free.prediction.steps_per_second == pytest.approx(5_120 / 200e-6)
    cluster = Cluster(nodes=160, cores_per_node=64)
    costly = dataclasses.replace(COSTS, allreduce_hop_seconds=200e-6, allreduce_bytes_per_second=1e9)
    charged = recommend(costly, cluster)
    assert charged.layout.trainers <= 200 and charged.layout.actor_nodes + charged.layout.trainer_nodes <= 8
    assert trainer_efficiency(costly, cluster, charged.layout) >= 0.5
    filled = recommend(costly, cluster, Limits(min_trainer_efficiency=0.0))
    assert filled.layout.trainers >= 20 * charged.layout.trainers
    assert filled.prediction.steps_per_second < 2 * charged.prediction.steps_per_second
    assert trainer_efficiency(costly, cluster, filled.layout) < 0.05
    with pytest.raises(ConfigError, match="min_trainer_efficiency: must be in"):
        Limits(min_trainer_efficiency=1.0)


def test_scale_table_compares_flat_and_hierarchical():
    rows = scale_table(COSTS, Cluster(nodes=1, cores_per_node=64, link_latency_us=0.0))
    assert [r.cores for r in rows] == [1_000, 10_000, 100_000]
    assert [r.cluster.nodes for r in rows] == [16, 157, 1563]
    for r in rows:
        assert r.hierarchical.root_bytes <= r.flat.root_bytes
        assert r.hierarchical.relays == r.recommendation.layout.actor_nodes
    assert rows[-1].flat.root_bytes > 100 * rows[-1].hierarchical.root_bytes


def test_costs_json_round_trip_and_errors():
    data = json.loads(json.dumps({"bench": "costs", **COSTS.to_dict()}))
    assert Costs.from_dict(data) == COSTS
    as_ints = {**data, "env_seconds_per_step": 1, "param_bytes_per_second": 1000000000}
    assert Costs.from_dict(as_ints).env_seconds_per_step == 1.0
    for bad, message in [
        ({**data, "typo": 1}, "costs.json: typo: unknown field"),
        ({k: v for k, v in data.items() if k != "param_bytes"}, "costs.json: param_bytes: missing"),
        ({**data, "envs_per_slot": 0}, "costs.json: envs_per_slot: must be an integer >= 1"),
        ({**data, "update_seconds_per_sample": -1.0}, "update_seconds_per_sample: must be a number > 0"),
        ({**data, "request_seconds": "fast"}, "request_seconds: must be a number >= 0"),
        ([1, 2], "costs.json: expected a JSON object"),
    ]:
        with pytest.raises(ConfigError) as info:
            Costs.from_dict(bad, "costs.json")
        assert message in str(info.value)


# ---------------------------------------------------------------------------------------------- command line
@pytest.fixture
def costs_file(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(COSTS.to_dict()))
    return path


def test_plan_json_and_text(costs_file, capsys):
    assert main(["plan", "--costs", str(costs_file), "--nodes", "4", "--cores-per-node", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bottleneck"] in ("env", "inference", "trainer", "network", "params", "cores")
    assert out["layout"]["ray.actor_nodes"] + out["trainer_nodes"] <= 4
    assert [row["cores"] for row in out["scale"]] == [1_000, 10_000, 100_000]
    assert out["stages"]["params"] is not None and Costs.from_dict(out["costs"]) == COSTS
    assert (
        main(
            [
                "plan",
                "--costs",
                str(costs_file),
                "--nodes",
                "1",
                "--cores-per-node",
                "2",
                "--json",
                "--layout",
                "actors_per_node=4",
                "--layout",
                "trainers=4",
                "--layout",
                "batch_segments=4",
            ]
        )
        == 0
    )
    given = json.loads(capsys.readouterr().out)["given"]
    assert given["bottleneck"] == "cores" and given["env_steps_per_second"] == pytest.approx(2 / 300e-6, rel=1e-4)
    assert given["layout"]["batch_segments"] == 4  # an optional integer field is read as one
    assert main(["plan", "--costs", str(costs_file), "--nodes", "1", "--cores-per-node", "2"]) == 0
    text = capsys.readouterr().out
    assert "bottleneck: trainer" in text and "workers.policy_workers" in text and "hier." in text
    assert main(["plan", "--costs", str(costs_file), "--nodes", "4", "--cores-per-node", "64", "--markdown"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 5 and rows[1] == ["|---" * 11 + "|"]  # header, rule, one row per scale
    assert all(len(r) == 11 for r in rows[:1] + rows[2:])
    assert [r[0] for r in rows[2:]] == ["| 1,000", "| 10,000", "| 100,000"]
    for r, scale in zip(rows[2:], out["scale"]):  # the same numbers as the JSON
        used = scale["actor_nodes"] + scale["trainer_nodes"]
        assert r[1] == f"{used:,} ({scale['actor_nodes']:,} + {scale['trainer_nodes']:,})"
        assert r[5] == scale["bottleneck"]
        assert r[7] == f"{scale['spend']['kilojoules_per_million_steps']:,.3g}"


def test_the_plans_energy_and_money_are_the_nodes_it_uses_at_the_models_watts_and_prices(costs_file, capsys):
    """Every core of the nodes a layout uses at ``watts_per_core`` (idle nodes given back), per million env steps
    at the predicted rate; money per hour at the prices; ``--rank energy`` ranks fewer nodes by energy per step,
    and ``--target-steps`` gives hours, energy and money to the target."""
    args = ["plan", "--costs", str(costs_file), "--nodes", "16", "--cores-per-node", "64", "--json"]
    assert main([*args, "--cost", "watts_per_core=5", "--cost", "price_per_core_hour=0.05"]) == 0
    out = json.loads(capsys.readouterr().out)
    spend, used = out["spend"], out["layout"]["ray.actor_nodes"] + out["trainer_nodes"]
    assert spend["cores"] == used * 64 and spend["gpus"] == 0 and spend["watts"] == pytest.approx(used * 64 * 5)
    per_step = spend["watts"] / out["env_steps_per_second"]
    assert spend["kilojoules_per_million_steps"] == pytest.approx(per_step * 1e3, rel=1e-5)
    assert spend["money_per_hour"] == pytest.approx(used * 64 * 0.05)
    for row in out["scale"]:  # the 1k, 10k and 100k cores of the scale table, each its own energy
        nodes = row["actor_nodes"] + row["trainer_nodes"]
        assert row["spend"]["watts"] == pytest.approx(nodes * 64 * 5)
    assert main([*args, "--rank", "energy", "--target-steps", "2e6"]) == 0
    ranked = json.loads(capsys.readouterr().out)["energy_ranking"]
    assert sorted({r["nodes"] for r in ranked}) == [n for n in (1, 2, 4, 8, 16) if n in {r["nodes"] for r in ranked}]
    energies = [r["spend"]["kilojoules_per_million_steps"] for r in ranked]
    assert len(ranked) >= 3 and energies == sorted(energies)
    for r in ranked:
        target = r["spend"]["to_target"]
        assert target["hours"] == pytest.approx(2e6 / r["env_steps_per_second"] / 3600)
        assert target["kilojoules"] == pytest.approx(r["spend"]["kilojoules_per_million_steps"] * 2, rel=1e-5)
        assert target["money"] is None  # no price given
    assert main(["plan", "--costs", str(costs_file), "--nodes", "4", "--cores-per-node", "8", "--rank", "energy"]) == 0
    text = capsys.readouterr().out
    assert "kJ per 1M env steps" in text and "energy ranking" in text


def test_every_stored_costs_file_still_plans(capsys):
    """The costs files docs/ cites (measured before later fields existed: replay, reanalyze) still load."""
    files = sorted(Path("docs/data").rglob("costs*.jsonl"))
    assert len(files) >= 5
    for path in files:
        assert main(["plan", "--costs", str(path), "--nodes", "4", "--cores-per-node", "16", "--json"]) == 0, path
        assert json.loads(capsys.readouterr().out)["env_steps_per_second"] > 0


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--costs", "{missing}"], "missing.json: cannot read costs file"),
        (["--costs", "{broken}"], "broken.json: invalid JSON at line 1"),
        (["--costs", "{bad_field}"], "bad_field.json: param_bytes: must be an integer >= 1"),
        (["--costs", "{good}", "--nodes", "0"], "--nodes: must be >= 1, got 0"),
        (["--costs", "{good}", "--cores-per-node", "-2"], "--cores-per-node: must be >= 1, got -2"),
        (["--costs", "{good}", "--link-gbps", "0"], "--link-gbps: must be > 0"),
        (["--costs", "{good}", "--gpus-per-node", "8"], "--gpu-speedup: needed with --gpus-per-node > 0"),
        (["--costs", "{good}", "--max-trainers", "0"], "--max-trainers: must be >= 1"),
        (["--costs", "{good}", "--max-trainer-nodes", "0"], "--max-trainer-nodes: must be >= 1"),
        (["--costs", "{good}", "--link-latency-us", "-1"], "--link-latency-us: must be >= 0"),
        (["--costs", "{good}", "--shared-cores", "0"], "--shared-cores: must be >= 1, got 0"),
        (["--costs", "{good}", "--min-trainer-efficiency", "1.5"], "--min-trainer-efficiency: must be in [0, 1)"),
        (["--costs", "{good}", "--layout", "actors=2"], "--layout 'actors=2': expected KEY=VALUE"),
        (["--costs", "{good}", "--layout", "trainers=two"], "--layout trainers: expected an integer"),
        (["--costs", "{good}", "--layout", "batch_segments=x"], "--layout batch_segments: expected an integer"),
        (["--costs", "{good}", "--cost", "watts_per_core=-1"], "cost.watts_per_core: must be >= 0, got -1"),
        (["--costs", "{good}", "--cost", "price_per_kwh=-3"], "cost.price_per_kwh: must be >= 0 or null"),
        (["--costs", "{good}", "--target-steps", "0"], "--target-steps: must be > 0, got 0"),
        ([], "give --costs FILE or --config CONFIG"),
    ],
)
def test_plan_bad_input_is_one_line(tmp_path, costs_file, capsys, args, needle):
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "bad_field.json").write_text(json.dumps({**COSTS.to_dict(), "param_bytes": 0}))
    paths = {
        "missing": tmp_path / "missing.json",
        "broken": tmp_path / "broken.json",
        "bad_field": tmp_path / "bad_field.json",
        "good": costs_file,
    }
    args = [a.format(**paths) for a in args]
    base = {"--nodes": "2", "--cores-per-node": "8"}
    for flag, value in base.items():
        if flag not in args:
            args += [flag, value]
    assert main(["plan", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("srl: error: ") and needle in lines[0]


def test_plan_exit_code_in_a_fresh_process(tmp_path, costs_file):
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "srl.cli.main",
            "plan",
            "--costs",
            str(costs_file),
            "--nodes",
            "16",
            "--cores-per-node",
            "64",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0 and json.loads(ok.stdout)["scale"][0]["nodes"] == 16
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "srl.cli.main",
            "plan",
            "--costs",
            str(tmp_path / "nope.json"),
            "--nodes",
            "1",
            "--cores-per-node",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "nope.json" in bad.stderr


# ---------------------------------------------------------------------------------------------- cost measurement
@pytest.mark.slow
def test_cost_measurements_run_the_real_paths():
    """Each piece of ``srl bench costs`` except the parameter service (``bench_params`` is tested on its own),
    very briefly, on CartPole: positive, finite numbers that make a valid Costs."""
    from srl.api.config import load_config
    from srl.bench.costs import actor_overhead, inference_fit, inline_actor_seconds, segment_send, stream_costs
    from srl.runtime.plan import make_plan

    plan = make_plan(load_config("configs/cartpole_ppo.yaml"))
    measured = {
        "actor_seconds_per_step": actor_overhead(plan, 0.1, warmup=0.05),
        "inline_actor_seconds_per_step": inline_actor_seconds(plan, 0.1, warmup=0.05),
        **inference_fit(plan, 0.1, rounds=1),
        **stream_costs(plan, 0.1),
        **segment_send(plan, 0.05),
    }
    assert all(math.isfinite(v) and v >= 0 for v in measured.values())
    assert measured["request_seconds"] > 0 and measured["segment_send_seconds"] > 0
    assert measured["inline_actor_seconds_per_step"] > measured["actor_seconds_per_step"]  # env and policy inside
    w = plan.cfg.workers
    layout = plan.policies[0].layout
    segment_bytes = sum(math.prod(f.shape) * np.dtype(f.dtype).itemsize for f in layout.fields.values())
    assert measured["bytes_per_sample"] == pytest.approx(segment_bytes / (w.segment_length * w.envs_per_slot))
    costs = dataclasses.replace(COSTS, **measured)
    assert predict(costs, Cluster(nodes=1, cores_per_node=2), one_node(1)).steps_per_second > 0
    # the all-reduce: one real update's reductions counted, and two real trainer processes timed
    from srl.bench.allreduce import measure
    from srl.bench.allreduce import gradient_reductions

    counted = gradient_reductions(plan)
    assert counted["reductions_per_update"] == plan.cfg.ppo.epochs * plan.cfg.ppo.minibatches
    # a decentralized critic reduces nothing: the actor's weights, which the snapshot holds with its normalizer's
    assert 0.9 * plan.policies[0].param_size * 4 < counted["gradient_bytes"] <= plan.policies[0].param_size * 4
    timed = measure(2, counted["gradient_bytes"] // 4, rounds=3, warmup=1)
    assert timed["gradient_bytes"] == counted["gradient_bytes"] and 0 < timed["seconds_min"] <= timed["seconds_median"]


def test_segment_send_counts_the_bytes_the_stream_sends():
    """MuJoCo observations are float64 in the env but float32 in segments: the benchmark's segment has the
    stream's dtypes, goes through the real sender and receiver, and its bytes are those of the float32 layout."""
    from srl.api.config import load_config
    from srl.bench.costs import segment_send
    from srl.bench.throughput import random_batch
    from srl.runtime.plan import make_plan

    plan = make_plan(load_config("configs/halfcheetah_ppo.yaml"))
    [policy] = plan.policies
    assert policy.obs_space.dtype == np.float64
    w = plan.cfg.workers
    batch = random_batch(policy, np.random.default_rng(0), w.envs_per_slot)
    assert {n: a.dtype.name for n, a in batch.items()} == {n: f.dtype for n, f in policy.layout.fields.items()}
    measured = segment_send(plan, 0.05)
    assert measured["segment_send_seconds"] > 0
    float64_obs = sum(
        math.prod(f.shape) * (8 if n in ("obs", "final_obs") else np.dtype(f.dtype).itemsize)
        for n, f in policy.layout.fields.items()
    ) / (w.segment_length * w.envs_per_slot)
    assert measured["bytes_per_sample"] < 0.7 * float64_obs


# ---------------------------------------------------------------------------------------------- a config's own layout
def test_the_layout_a_config_runs_is_read_from_its_topology():
    from srl.api.config import load_config
    from srl.capacity.model import layout_of
    from srl.runtime.plan import make_plan

    local = layout_of(make_plan(load_config("configs/cartpole_ppo.yaml", ["workers.actors=3", "workers.trainers=1"])))
    assert (local.actor_nodes, local.trainer_nodes, local.actors_per_node) == (1, 0, 3)
    assert local.policy_workers_per_node == 0
    ray = layout_of(
        make_plan(
            load_config(
                "configs/cartpole_ppo.yaml",
                [
                    "runtime=ray",
                    "ray.actor_nodes=4",
                    "ray.actors_per_node=3",
                    "ray.policy_workers_per_node=1",
                    "ray.trainer_nodes=2",
                    "workers.trainers=2",
                    "params.mode=flat",
                ],
            )
        )
    )
    assert dataclasses.asdict(ray) == {
        **dataclasses.asdict(ray),
        "actor_nodes": 4,
        "trainer_nodes": 2,
        "actors_per_node": 3,
        "policy_workers_per_node": 1,
        "trainers": 2,
        "params_mode": "flat",
    }
    pred = predict(COSTS, Cluster(nodes=6, cores_per_node=8), ray)
    assert pred.steps_per_second > 0
    with pytest.raises(ConfigError, match="exceed 5 nodes"):
        predict(COSTS, Cluster(nodes=5, cores_per_node=8), ray)  # 4 actor + 2 trainer nodes do not fit
