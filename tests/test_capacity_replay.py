"""The capacity model with a replay on the sample path: hand-checked predictions (the trainer's update per sampled
item, the replay worker's stage and cores), the replay terms of the costs file, and ``srl bench costs`` and
``srl plan`` on a DQN config."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from test_capacity import COSTS

from srl.api.config import ConfigError, load_config
from srl.capacity.model import Cluster, Costs, Layout, allreduce_per_step, predict
from srl.capacity.recommend import envs_per_slot_candidates, recommend
from srl.cli.main import main

# test_capacity.py's round numbers (an env step costs 100 us, an update 200 us per sample, here per sampled item),
# with a replay: each env step's item is sampled 4 times, so a batch of 64 items stands for 16 env steps; the
# replay worker spends 10 us inserting an env step and 20 us sampling an item. One reduction per update, a ring
# step of 100 us + bytes at 1 GB/s.
REPLAY = dataclasses.replace(
    COSTS,
    samples_per_version=16.0,
    reductions_per_update=1,
    allreduce_hop_seconds=100e-6,
    allreduce_bytes_per_second=1e9,
    samples_per_insert=4.0,
    replay_insert_seconds_per_step=10e-6,
    replay_sample_seconds_per_item=20e-6,
)


def one_node(actors: int = 1, trainers: int = 1, envs_per_slot: int = 8) -> Layout:
    return Layout(
        actor_nodes=1,
        trainer_nodes=0,
        actors_per_node=actors,
        policy_workers_per_node=0,
        trainers=trainers,
        envs_per_slot=envs_per_slot,
    )


def test_one_node_prediction_by_hand():
    pred = predict(REPLAY, Cluster(nodes=1, cores_per_node=2), one_node())
    assert pred.stages["env"] == pytest.approx(1 / 100e-6)
    assert pred.stages["trainer"] == pytest.approx(1 / (4 * 200e-6))  # each env step's item trained on 4 times
    assert pred.stages["replay"] == pytest.approx(1 / (10e-6 + 4 * 20e-6))  # insert it, sample it 4 times
    assert pred.stages["cores"] == pytest.approx(2 / (100e-6 + 800e-6 + 90e-6))  # actor, trainer and replay
    assert pred.bottleneck == "trainer" and pred.steps_per_second == pytest.approx(1_250)


def test_the_trainer_stage_scales_with_one_over_samples_per_insert():
    rates = [
        predict(dataclasses.replace(REPLAY, samples_per_insert=spi), Cluster(nodes=1, cores_per_node=2), one_node())
        for spi in (1.0, 2.0, 8.0)
    ]
    assert [p.stages["trainer"] for p in rates] == pytest.approx([5_000, 2_500, 625])


def test_the_replay_stage_can_be_the_bottleneck():
    """At 500 us per sampled item the replay worker needs 10 + 4 x 500 us per env step: it binds before the
    trainer (800 us) and before the two cores (100 + 800 + 2010 us per env step on 2 cores)."""
    costly = dataclasses.replace(REPLAY, replay_sample_seconds_per_item=500e-6)
    pred = predict(costly, Cluster(nodes=1, cores_per_node=2), one_node())
    assert pred.bottleneck == "replay"
    assert pred.steps_per_second == pytest.approx(1 / 2010e-6)
    assert pred.stages["cores"] == pytest.approx(2 / 2910e-6)
    # one replay worker per trainer: two trainers have two; one per node group (replay.placement: node): one
    two = predict(costly, Cluster(nodes=1, cores_per_node=64), one_node(actors=8, trainers=2))
    assert two.stages["replay"] == pytest.approx(2 / 2010e-6)
    shared = dataclasses.replace(one_node(actors=8, trainers=2), replay_placement="node")
    assert predict(costly, Cluster(nodes=1, cores_per_node=64), shared).stages["replay"] == pytest.approx(1 / 2010e-6)


def test_the_cores_term_charges_the_replay_on_the_node_it_shares():
    """Four actors and four trainers, each with its replay, on 2 cores: every env step costs all three."""
    pred = predict(REPLAY, Cluster(nodes=1, cores_per_node=2), one_node(actors=4, trainers=4))
    assert pred.bottleneck == "cores" and pred.steps_per_second == pytest.approx(2 / 990e-6)
    without = predict(dataclasses.replace(REPLAY, samples_per_insert=0.0, replay_insert_seconds_per_step=0.0,
                                          replay_sample_seconds_per_item=0.0),
                      Cluster(nodes=1, cores_per_node=2), one_node(actors=4, trainers=4))  # fmt: skip
    assert math.isinf(without.stages["replay"])
    assert without.stages["cores"] == pytest.approx(2 / 300e-6)  # on-policy: each env step trained on once


def test_across_nodes_the_replay_receives_the_segments_and_its_cpu_is_on_the_trainer_nodes():
    """A segment of 32 x 8 env steps costs 2.56 ms to send: 5 us per env step at each end. The replay worker
    receives it (the trainer does not, as it does on-policy); trainer nodes host trainers and replays."""
    costs = dataclasses.replace(REPLAY, segment_send_seconds=2.56e-3)
    cluster = Cluster(nodes=3, cores_per_node=4, link_latency_us=0.0)
    layout = Layout(
        actor_nodes=2, trainer_nodes=1, actors_per_node=4, policy_workers_per_node=0, trainers=4, envs_per_slot=8
    )
    pred = predict(costs, cluster, layout)
    assert pred.stages["env"] == pytest.approx(8 / 105e-6)
    reduce = allreduce_per_step(costs, cluster, layout)
    assert reduce == pytest.approx(2 * 3 * (100e-6 + 25e-6) / 16)  # one reduction per update of 16 env steps
    assert pred.stages["trainer"] == pytest.approx(4 / (800e-6 + reduce))
    assert pred.stages["replay"] == pytest.approx(4 / 95e-6)
    assert pred.stages["cores"] == pytest.approx(min(2 * 4 / 105e-6, 1 * 4 / (800e-6 + 95e-6)))
    assert pred.stages["network"] == pytest.approx(1 * 1.25e9 / 100)  # segments cross once, into the replay


def test_a_version_per_update_of_the_batch_whatever_the_slot_size():
    """Versions come every 16 env steps per trainer (64 items at 4 samples per insert), at any ``envs_per_slot``:
    the params stage is versions' env steps over the delivery time."""
    cluster = Cluster(nodes=3, cores_per_node=8)
    for envs_per_slot in (8, 32):
        layout = Layout(actor_nodes=2, trainer_nodes=1, actors_per_node=8, policy_workers_per_node=0, trainers=2,
                        envs_per_slot=envs_per_slot, params_mode="flat")  # fmt: skip
        pred = predict(REPLAY, cluster, layout)
        delivery = 1e-3 + 16 * 1_000_000 / 1e9  # the hop, then 16 readers (inline actors) one copy each
        assert pred.params.seconds == pytest.approx(delivery)
        assert pred.stages["params"] == pytest.approx(2 * 16 / delivery)


def test_items_longer_than_a_step_and_several_agents():
    """Items of 5 steps in chunks of 32: 28 items per agent's chunk; 2 agents: 1.75 items per env step, each
    sampled 4 times."""
    costs = dataclasses.replace(REPLAY, item_length=5, agents_per_env=2)
    pred = predict(costs, Cluster(nodes=1, cores_per_node=2), one_node())
    assert pred.stages["trainer"] == pytest.approx(1 / (4 * 1.75 * 200e-6))
    assert pred.stages["replay"] == pytest.approx(1 / (10e-6 + 4 * 1.75 * 20e-6))


def test_a_replay_recommendation_keeps_its_batch_of_items():
    """A replay's batch is items, whatever the slot: every slot size up to 64 is a candidate, and no
    ``workers.batch_segments`` is set (an on-policy config of 16 env steps per version could not grow its slot)."""
    assert envs_per_slot_candidates(REPLAY) == [8, 16, 32, 64]
    on_policy = dataclasses.replace(
        REPLAY, samples_per_insert=0.0, replay_insert_seconds_per_step=0.0, replay_sample_seconds_per_item=0.0
    )
    assert envs_per_slot_candidates(on_policy) == [8]
    rec = recommend(REPLAY, Cluster(nodes=1, cores_per_node=4))
    assert "workers.batch_segments" not in rec.settings() and rec.layout.batch_segments is None
    assert rec.prediction.steps_per_second > 0 and math.isfinite(rec.prediction.stages["replay"])


def test_costs_replay_terms_round_trip_and_errors():
    data = json.loads(json.dumps({"bench": "costs", **REPLAY.to_dict()}))
    assert Costs.from_dict(data) == REPLAY
    old = {k: v for k, v in data.items() if k not in ("samples_per_insert", "item_length",
                                                      "replay_insert_seconds_per_step",
                                                      "replay_sample_seconds_per_item")}  # fmt: skip
    assert Costs.from_dict(old).samples_per_insert == 0.0  # a file without the replay terms: no replay
    for bad, message in [
        ({**data, "samples_per_insert": -1}, "costs.json: samples_per_insert: must be a number >= 0"),
        ({**data, "samples_per_insert": "many"}, "costs.json: samples_per_insert: must be a number >= 0"),
        ({**data, "item_length": 0}, "costs.json: item_length: must be an integer >= 1"),
        ({**data, "item_length": 40}, "costs.json: item_length: 40 steps do not fit in segments of 32"),
        (
            {**data, "replay_insert_seconds_per_step": 0},
            "costs.json: replay_insert_seconds_per_step: must be > 0 with a replay (samples_per_insert 4)",
        ),
        (
            {**old, "replay_sample_seconds_per_item": 2e-5},
            "costs.json: replay_sample_seconds_per_item: given (2e-05) without a replay: samples_per_insert is 0",
        ),
        ({**data, "samples_per_version": 0}, "costs.json: samples_per_version: must be a number > 0"),
    ]:
        with pytest.raises(ConfigError) as info:
            Costs.from_dict(bad, "costs.json")
        assert message in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------- measured on DQN
@pytest.mark.slow
def test_bench_costs_measures_the_replay_of_a_dqn_config_and_srl_plan_reads_it(tmp_path, capsys):
    """``srl bench costs`` on CartPole's DQN, very briefly (only the costs that matter on one node; the cross-node
    ones are the on-policy code paths, tested in test_capacity.py): the replay terms measured from the real store,
    the update from the algorithm's own batch of sampled items; then ``srl plan`` on that file."""
    from srl.bench.costs import measure_costs

    cfg = load_config("configs/cartpole_dqn.yaml")
    costs = measure_costs(cfg, 0.05, one_node=True)
    assert costs.samples_per_insert == 32 and costs.item_length == 1
    assert costs.replay_insert_seconds_per_step > 0 and costs.replay_sample_seconds_per_item > 0
    assert costs.update_seconds_per_sample > 0 and costs.actor_seconds_per_step >= 0
    assert costs.samples_per_version == pytest.approx(64 / 32)  # dqn.batch_size items at 32 samples per insert
    path = tmp_path / "dqn_costs.json"
    path.write_text(json.dumps({"bench": "costs", **costs.to_dict()}))
    assert main(["plan", "--costs", str(path), "--nodes", "4", "--cores-per-node", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stages"]["replay"] is not None and out["stages"]["replay"] > 0
    assert Costs.from_dict(out["costs"]) == costs and "workers.batch_segments" not in out["layout"]
    assert main(["plan", "--costs", str(path), "--nodes", "1", "--cores-per-node", "2"]) == 0
    text = capsys.readouterr().out
    assert "replay insert" in text and "x 32 per insert" in text and "| replay " in text


def test_a_dqn_update_is_counted_on_its_sampled_batch():
    """The all-reduce of a DQN update is counted on a batch drawn from the replay's store: one reduction of the
    Q network's gradients per ``train`` call."""
    import numpy as np

    from srl.bench.allreduce import gradient_reductions
    from srl.bench.costs import replay_costs
    from srl.runtime.plan import make_plan

    plan = make_plan(load_config("configs/cartpole_dqn.yaml"))
    terms, batch = replay_costs(plan, np.random.default_rng(0))
    assert len(batch["keys"]) == 64 and set(terms) >= {"replay_insert_seconds_per_step", "samples_per_version"}
    counted = gradient_reductions(plan, batch)
    assert counted["reductions_per_update"] == 1
    assert 0.9 * plan.policies[0].param_size * 4 < counted["gradient_bytes"] <= plan.policies[0].param_size * 4


def test_bench_compute_refuses_a_replay_config_in_one_line():
    from srl.bench.throughput import bench_compute

    with pytest.raises(ConfigError, match=r"learns from a replay.*srl bench costs"):
        bench_compute(load_config("configs/cartpole_dqn.yaml"), 0.1)


def test_reanalysis_is_charged_to_the_cores_beside_the_replay():
    """A search costs what the acting policy's forward pass costs (here 50 us per step, 400 us per call over a batch
    of 64): re-searching half the steps trained on (4 items of one step per env step) is 2 steps per env step, so
    2 x (50 + 400 / 64) us more on the node's cores, and nothing on any other stage."""
    base = dataclasses.replace(REPLAY, inference_seconds_per_sample=50e-6, inference_seconds_per_batch=400e-6)
    cluster = Cluster(nodes=1, cores_per_node=2)
    plain = predict(base, cluster, one_node(actors=4, trainers=4))
    charged = predict(dataclasses.replace(base, reanalyze_share=0.5), cluster, one_node(actors=4, trainers=4))
    extra = 2 * (50e-6 + 400e-6 / 64)
    assert 1 / charged.stages["cores"] == pytest.approx(1 / plain.stages["cores"] + extra / 2)
    assert {k: v for k, v in charged.stages.items() if k != "cores"} == {
        k: v for k, v in plain.stages.items() if k != "cores"
    }
