"""Population-based training: the exploit and explore math against hand-computed cases, the population state and
its resume, the config's one-line errors, and members sharing every slot's environments."""

from __future__ import annotations

import json
import time
import types

import numpy as np
import pytest

from srl.api.config import ConfigError, ExperimentConfig, build
from srl.api.config.population import Hyperparameter, PopulationConfig
from srl.population.rules import Truncation, explore, group_size, ranked
from srl.population.state import PopulationState
from srl.system import streams


def _pop(**kw) -> PopulationConfig:
    return PopulationConfig(**{"members": 4, "interval": 100, "min_episodes": 2, **kw})


# ---------------------------------------------------------------------------------------------- the exploit rule
@pytest.mark.parametrize(
    "members, quantile, k",
    [(4, 0.25, 1), (5, 0.3, 2), (8, 0.25, 2), (10, 0.25, 3), (3, 0.5, 1), (2, 0.5, 1), (2, 0.1, 1), (7, 0.5, 3)],
)
def test_groups_are_the_quantile_rounded_up_and_never_overlap(members, quantile, k):
    assert group_size(members, quantile) == k


def test_the_bottom_member_copies_the_top_one_and_the_others_copy_nobody():
    scores = {0: 10.0, 1: 50.0, 2: 30.0, 3: 500.0}
    rule, rng = Truncation(_pop(quantile=0.25)), np.random.default_rng(0)
    assert ranked(scores) == [0, 2, 1, 3]
    assert rule.source(0, scores, rng) == 3  # bottom 1 of 4 copies the top 1
    assert [rule.source(m, scores, rng) for m in (1, 2, 3)] == [None, None, None]
    assert rule.source(4, scores, rng) is None  # not scored: nothing to decide


def test_a_bottom_member_draws_its_source_from_the_whole_top_group():
    scores = {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0, 4: 5.0}  # 5 members at 0.3: bottom {0, 1}, top {3, 4}
    rule, rng = Truncation(_pop(members=5, quantile=0.3)), np.random.default_rng(1)
    drawn = {rule.source(1, scores, rng) for _ in range(200)}
    assert drawn == {3, 4}
    assert rule.source(2, scores, rng) is None


def test_the_gap_guard_and_ties_copy_nobody():
    rng = np.random.default_rng(0)
    scores = {0: 100.0, 1: 110.0, 2: 120.0, 3: 130.0}
    assert Truncation(_pop(min_gap=30.0)).source(0, scores, rng) == 3  # 130 - 100 = 30: enough
    assert Truncation(_pop(min_gap=30.5)).source(0, scores, rng) is None  # not enough
    level = {m: 7.0 for m in range(4)}  # all tied: the worst by index is no worse than the best
    assert Truncation(_pop()).source(0, level, rng) is None


def test_a_barred_member_is_ranked_but_never_copied():
    """8 members at 0.25: bottom {0, 1}, top {6, 7}. With 7 in the middle of a copy, member 1 is still in the
    bottom group (7 counts in the ranking) and copies 6; with both top members barred it copies nobody."""
    scores = {m: float(10 * m) for m in range(8)}
    rule, rng = Truncation(_pop(members=8)), np.random.default_rng(0)
    assert {rule.source(1, scores, rng, barred={7}) for _ in range(50)} == {6}
    assert rule.source(1, scores, rng, barred={6, 7}) is None
    assert rule.source(2, scores, rng, barred={0, 1}) is None  # the barred bottom ones still rank below it


# ---------------------------------------------------------------------------------------------- explore
def test_perturbations_multiply_then_clamp():
    rng = np.random.default_rng(0)
    halve = Hyperparameter(key="ppo.lr", min=1e-4, max=1.0, perturb=(0.5,), resample=0.0)
    grow = Hyperparameter(key="ppo.clip", min=0.1, max=0.3, perturb=(1.5,), resample=0.0)
    out = explore({"ppo.lr": 0.01, "ppo.clip": 0.25}, [halve, grow], rng)
    assert out == {"ppo.lr": 0.005, "ppo.clip": 0.3}  # 0.375 clamped to max
    assert explore({"ppo.lr": 1.5e-4, "ppo.clip": 0.1}, [halve, grow], rng)["ppo.lr"] == 1e-4  # clamped to min


def test_resampling_happens_with_its_probability_and_draws_log_uniformly():
    h = Hyperparameter(key="ppo.lr", min=1e-6, max=1e-2, log=True, perturb=(1.0,), resample=0.3)
    rng = np.random.default_rng(2)
    draws = np.array([explore({"ppo.lr": 5e-3}, [h], rng)["ppo.lr"] for _ in range(20_000)])
    resampled = draws[draws != 5e-3]  # a factor of 1 keeps the value: every other one was drawn afresh
    assert abs(len(resampled) / len(draws) - 0.3) < 0.015
    assert resampled.min() >= 1e-6 and resampled.max() <= 1e-2
    # log-uniform: the median is the range's geometric middle (1e-4), not its arithmetic one (5e-3)
    assert 5e-5 < np.median(resampled) < 2e-4


# ---------------------------------------------------------------------------------------------- state
def _state(**kw) -> PopulationState:
    lr = Hyperparameter(
        key="ppo.lr", min=1e-6, max=1e-2, initial=(1e-3, 1e-6, 1e-6, 1e-6), perturb=(0.5, 2.0), resample=0.0
    )
    return PopulationState.start(_pop(hyperparameters=(lr,), **kw), seed=3)


def _feed(state: PopulationState, member: int, steps: int, returns: list[float]) -> None:
    state.add_steps(member, steps)
    state.add_episodes(member, returns)


def test_a_member_is_ready_after_its_interval_with_enough_episodes():
    s = _state()
    _feed(s, 0, 99, [1.0, 2.0])
    assert not s.ready(0)  # 99 of 100 steps
    _feed(s, 0, 1, [])
    assert s.ready(0)
    _feed(s, 1, 500, [3.0])
    assert not s.ready(1)  # one episode of the two it needs
    assert s.score(1) is None and s.score(0) == 1.5


def test_a_check_copies_explores_and_records_the_lineage():
    s = _state()
    for m, ret in enumerate([400.0, 10.0, 20.0, 30.0]):
        _feed(s, m, 100, [ret, ret])
    top = s.check(0, Truncation(s.cfg))  # the best copies nobody, and keeps its score for the others' checks
    assert top.source is None and top.records() == [] and s.members[0].last_score == 400.0
    assert s.members[0].window_count == 0 and s.members[0].checked_at == 100
    low = s.check(1, Truncation(s.cfg))  # the worst of 4 copies the best, then perturbs its lr by 0.5 or 2
    assert low.source == 0 and low.copied == {"ppo.lr": 1e-3}
    assert low.new["ppo.lr"] in (5e-4, 2e-3) and s.members[1].values == low.new
    assert s.members[1].env_steps == 100  # its step count is kept
    assert s.members[1].last_score == 10.0  # the score it copied with, until its next window is scored
    exploit, explore_ = s.lineage
    assert exploit == {
        "event": "exploit",
        "target": 1,
        "run_env_steps": 400,  # the 4 members' steps: the run's, as metrics.jsonl counts them
        "member_env_steps": 100,
        "decision": 2,  # the second check (the first copied nobody): one of summary.population.decisions
        "source": 0,
        "score": 10.0,
        "source_score": 400.0,
        "old": {"ppo.lr": 1e-6},
    }
    assert explore_["event"] == "explore" and explore_["old"] == {"ppo.lr": 1e-3} and explore_["new"] == low.new


def test_one_round_replaces_only_the_bottom_group():
    """4 members at 0.25, all ready at the same env steps (as members sharing a slot are): the worst copies the
    best, and the second worst, checked after it in the same round, still ranks above the member that copied
    (whose score stays the one it copied with), so it keeps its own weights. Even with the copy under way (its
    source and target barred), the ranking is the round's: one copy per round."""
    for busy in (False, True):
        s = _state()
        for m, ret in enumerate([400.0, 10.0, 20.0, 30.0]):
            _feed(s, m, 100, [ret, ret])
        decisions = []
        for m in (1, 2, 3, 0):
            decisions.append(s.check(m, Truncation(s.cfg), barred={1, 0} if busy and m != 1 else ()))
        assert [d.source for d in decisions] == [0, None, None, None]
        assert s.scores() == {0: 400.0, 1: 10.0, 2: 20.0, 3: 30.0}
        # the next round: member 1 now plays member 0's policy (scored 390): member 2 is the worst and copies
        for m, ret in enumerate([400.0, 390.0, 20.0, 30.0]):
            _feed(s, m, 100, [ret, ret])
        assert [s.check(m, Truncation(s.cfg)).source for m in (1, 2, 3, 0)] == [None, 0, None, None]


def test_within_its_warmup_a_check_only_scores_a_member():
    """warmup 200: the worst member's check at 100 env steps copies nobody (its score is kept for the others),
    its check at 200 copies the best."""
    s = _state(warmup=200)
    for m, ret in enumerate([400.0, 10.0, 20.0, 30.0]):
        _feed(s, m, 100, [ret, ret])
    early = s.check(1, Truncation(s.cfg))
    assert early.source is None and early.records() == [] and s.members[1].last_score == 10.0
    assert s.members[1].values == {"ppo.lr": 1e-6}
    _feed(s, 1, 100, [10.0, 10.0])
    assert s.check(1, Truncation(s.cfg)).source == 0 and s.members[1].env_steps == 200


def test_a_restored_state_decides_what_the_first_would_have():
    """Resume: the state written after some decisions and read back goes on with the same draws and lineage."""
    a = _state()
    for m in range(4):
        _feed(a, m, 100, [float(m), float(m)])
    a.check(0, Truncation(a.cfg))
    b = PopulationState.from_json(a.cfg, json.loads(json.dumps(a.to_json())), "state.json")
    for s in (a, b):
        for m in range(4):
            _feed(s, m, 150, [float(10 - m), float(10 - m)])
        for m in range(4):
            if s.ready(m):
                s.check(m, Truncation(s.cfg))
    assert a.to_json() == b.to_json() and len(a.lineage) > 2


def test_a_state_that_does_not_fit_the_config_is_one_error():
    s = _state()
    data = s.to_json()
    with pytest.raises(ValueError, match=r"state\.json: holds 4 members, the config 2"):
        PopulationState.from_json(PopulationConfig(members=2), data, "state.json")
    with pytest.raises(ValueError, match="not a population state"):
        PopulationState.from_json(s.cfg, {"format": "x"}, "state.json")


def test_initial_values_are_listed_or_drawn_from_the_seed():
    listed = _state().cfg.initial_values(0)
    assert [v["ppo.lr"] for v in listed] == [1e-3, 1e-6, 1e-6, 1e-6]
    drawn = _pop(hyperparameters=(Hyperparameter(key="ppo.lr", min=1e-5, max=1e-3, log=True),))
    assert drawn.initial_values(1) == drawn.initial_values(1) != drawn.initial_values(2)
    assert all(1e-5 <= v["ppo.lr"] <= 1e-3 for v in drawn.initial_values(1))


# ---------------------------------------------------------------------------------------------- config
def _config(population: dict, **more) -> ExperimentConfig:
    return build(ExperimentConfig, {"env": {"id": "CartPole-v1"}, "population": population, **more})


def test_members_are_policies_with_their_own_values():
    cfg = _config(
        {
            "members": 4,
            "hyperparameters": [
                {"key": "ppo.lr", "min": 1e-6, "max": 1e-3, "initial": [3e-4, 1e-6, 1e-6, 1e-6]},
                {"key": "ppo.epochs", "min": 1, "max": 8, "initial": [1, 2.6, 4, 8]},
            ],
        }
    )
    assert cfg.policy_names == ("member0", "member1", "member2", "member3")
    assert [cfg.for_policy(n).ppo.lr for n in cfg.policy_names] == [3e-4, 1e-6, 1e-6, 1e-6]
    assert [cfg.for_policy(n).ppo.epochs for n in cfg.policy_names] == [1, 3, 4, 8]  # an integer field: rounded


@pytest.mark.parametrize(
    "population, needle",
    [
        ({"members": 1}, "population.members: a population needs at least 2, got 1"),
        ({"members": 4, "quantile": 0.6}, "population.quantile: must be in (0, 0.5], got 0.6"),
        ({"members": 4, "quantile": 0}, "population.quantile: must be in (0, 0.5], got 0"),
        ({"members": 4, "warmup": -1}, "population.warmup: must be >= 0, got -1"),
        (
            {"members": 4, "hyperparameters": [{"key": "ppo.lrr", "min": 1, "max": 2}]},
            "population.hyperparameters[0].key: 'lrr' is not a field of ppo; did you mean 'lr'?",
        ),
        (
            {"members": 4, "hyperparameters": [{"key": "ppo.lr", "min": 2, "max": 1}]},
            "population.hyperparameters[0].min: 2 is above max 1",
        ),
        (
            {"members": 4, "hyperparameters": [{"key": "ppo.lr_schedule", "min": 1, "max": 2}]},
            "population.hyperparameters[0].key: ppo.lr_schedule is not a number",
        ),
        (
            {"members": 4, "hyperparameters": [{"key": "model.hidden", "min": 1, "max": 2}]},
            "population.hyperparameters[0].key: 'model' is no algorithm section",
        ),
        (
            {"members": 2, "hyperparameters": [{"key": "ppo.lr", "min": 0, "max": 1, "initial": [0.5]}]},
            "population.hyperparameters[0].initial: 1 values for 2 members",
        ),
        ({"members": 3}, "population.members: 3 members do not split workers.envs_per_slot=8 evenly"),
    ],
)
def test_bad_population_settings_are_one_line(population, needle):
    with pytest.raises(ConfigError) as err:
        _config(population)
    assert str(err.value).startswith(needle) and "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------- live copies
def _population_plan(members: int = 2, **more):
    from srl.runtime.plan import make_plan

    lr = {"key": "ppo.lr", "min": 1e-6, "max": 1e-2, "log": True, "initial": [1e-3] + [1e-6] * (members - 1)}
    population = {"members": members, "interval": 2000, "hyperparameters": [lr]}
    return make_plan(_config(population, runtime="inline", **more))


def test_a_copy_takes_the_source_state_bit_for_bit_and_its_values_live(tmp_path):
    """Member 1's trainer takes member 0's weights, Adam state and normalizers (buffers of the networks) exactly
    as member 0 exported them, and the new learning rate; its version goes up; a trainer restarted from the
    checkpoint it writes takes the copied values again. The source goes on as it was."""
    import torch

    from srl.bench.throughput import segment_batch
    from srl.runtime.build import build_worker
    from srl.runtime.fabric import InlineFabric
    from srl.runtime.topology import TRAINER, Endpoint, Stream
    from srl.population.role import INBOX
    from srl.population.worker import EXPORT, IMPORT, STATE, TAKEN, MemberLink
    from srl.system.checkpoint import checkpoints, load_checkpoint

    plan = _population_plan()
    (tmp_path / "checkpoints").mkdir()  # the run directory's, as the runtime makes it
    fabric = InlineFabric(plan, lambda *report: None)
    source, target = (build_worker(plan, fabric, plan.topology.get(TRAINER, k), tmp_path, 0.0, 0.0) for k in (0, 1))
    for trainer in (source, target):
        trainer.setup()
    rng = np.random.default_rng(0)
    for _ in range(3):  # Adam moments, normalizer statistics and weights of its own
        source.algorithm.train(segment_batch(plan.policies[0], plan.cfg, rng), 0.0)
    before = {k: v for k, v in source.algorithm.state_dict().items() if k != "rng"}
    inbox = fabric.mailbox(Endpoint(INBOX, 0), read=True)
    fabric.mailbox(Endpoint(Stream.COMMANDS, 0), read=False).send({"op": EXPORT, "seq": 7})
    assert source.poll() == 1
    ((meta, payload),) = inbox.recv()
    assert meta == {"op": STATE, "seq": 7, "member": 0} and payload[:4] == b"PK\x03\x04"  # checkpoint bytes
    version = target.version
    values = {"ppo.lr": 2e-3}
    fabric.mailbox(Endpoint(Stream.COMMANDS, 1), read=False).send(
        {"op": IMPORT, "seq": 7, "source": 0, "values": values}, payload
    )
    assert target.poll() == 1
    assert inbox.recv() == [({"op": TAKEN, "seq": 7, "member": 1}, b"")]  # said once its checkpoint holds it

    def same(a, b) -> bool:
        if isinstance(a, torch.Tensor):
            return torch.equal(a, b)
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b

    after = target.algorithm.state_dict()
    assert same({k: after[k] for k in before}, before)
    assert any(n.endswith("rms.mean") or "moments" in n for n in before["policy"])  # normalizers are in it
    assert same({k: v for k, v in source.algorithm.state_dict().items() if k != "rng"}, before)  # untouched
    assert target.version == version + 1 and target.adopted == 1
    assert target.algorithm.cfg.lr == 2e-3 and source.algorithm.cfg.lr == 1e-3
    # a data-parallel peer of the target (no command mailbox of its own) takes the same copy from its lead over
    # their collective at their lockstep: the same state bit for bit, and it says nothing to the population
    peer = build_worker(plan, fabric, plan.topology.get(TRAINER, 1), tmp_path, 0.0, 0.0)
    peer.leader = False  # rank 1: the lead publishes
    handed = iter([json.dumps(values).encode(), payload])  # what the lead broadcasts, in order
    peer.collective = types.SimpleNamespace(broadcast_bytes=lambda data: next(handed))
    link = MemberLink(None, lambda: inbox, 1, peer.port.settings)
    assert link.serve(peer) == 0 and link.asked == -1  # nothing asked of it: it waits for the lockstep
    link.take(peer, 7)
    assert same({k: v for k, v in peer.algorithm.state_dict().items() if k in before}, before)
    assert link.taken == 7 and peer.algorithm.cfg.lr == 2e-3 and inbox.recv() == []
    saved = load_checkpoint(checkpoints(tmp_path / "checkpoints" / "member1")[-1])
    assert saved["version"] == target.version and saved["hyperparameters"] == {"ppo.lr": 2e-3}
    again = build_worker(plan, fabric, plan.topology.get(TRAINER, 1), tmp_path, 0.0, 0.0)
    again.restore(saved)
    assert again.algorithm.cfg.lr == 2e-3 and same(again.algorithm.state_dict()["policy"], after["policy"])


@pytest.mark.parametrize(
    "more, needle",
    [
        ({"population": {"interval": 100}}, "population.interval: 100 env steps is less than one update of a member"),
        (
            {"algorithm": "dqn", "population": {"hyperparameters": [{"key": "ppo.lr", "min": 1e-4, "max": 1e-3}]}},
            "population.hyperparameters[0].key: ppo.lr: dqn reads the dqn section",
        ),
    ],
)
def test_population_settings_the_plan_refuses_are_one_line(more, needle):
    from srl.runtime.plan import make_plan

    population = {"members": 2, "interval": 5000, **more.pop("population", {})}
    with pytest.raises(ConfigError) as err:
        make_plan(_config(population, **more))
    assert str(err.value).startswith(needle) and "\n" not in str(err.value)


@pytest.mark.slow
def test_a_resumed_run_continues_the_lineage_and_its_members_are_evaluated_and_loaded(tmp_path, capsys):
    """``srl train --resume``: the population worker reads its state back (counters, values, decisions), the
    members' trainers their values from their checkpoints, and the lineage goes on in the same files. Then
    ``srl eval RUN_DIR`` plays each member and names the best; a member's checkpoint file plays alone;
    ``srl.load_policy(RUN_DIR)`` is the best member, as the final evaluation named it."""
    import srl
    from srl.api.config import load_config
    from srl.cli.main import main
    from srl.runtime.train import resume_config, train

    lr = "{key: ppo.lr, min: 1.0e-6, max: 1.0e-2, log: true, initial: [1.0e-3, 1.0e-6], resample: 0.0}"
    settings = ["runtime=inline", "population.members=2", "population.interval=2000"]
    settings += [f"population.hyperparameters=[{lr}]", "run.target_return=null", "run.eval_episodes=0"]
    run = tmp_path / "run"
    done = train(load_config("configs/cartpole_ppo.yaml", [*settings, "run.total_env_steps=16000"]), run, progress=None)
    first = json.loads((run / "population" / "state.json").read_text())
    lines = (run / "population.jsonl").read_text().splitlines()
    assert first["lineage"] and len(lines) == len(first["lineage"])  # at least one copy, in both places
    cfg, resume = resume_config(run, ["run.total_env_steps=32000", "run.eval_episodes=4"])
    assert resume.env_steps == done["env_steps"]  # the run's steps, not one member's share of them
    second = train(cfg, run, progress=None, resume=resume)
    assert "error" not in second
    steps = [json.loads(line)["env_steps"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and 32000 <= second["env_steps"] < 32000 + 2048  # counted on, budget kept
    after = json.loads((run / "population" / "state.json").read_text())
    assert after["decisions"] > first["decisions"] and after["lineage"][: len(first["lineage"])] == first["lineage"]
    assert all(a["env_steps"] > b["env_steps"] for a, b in zip(after["members"], first["members"]))
    assert (run / "population.jsonl").read_text().splitlines()[: len(lines)] == lines
    from srl.system.checkpoint import checkpoints, load_checkpoint

    newest = load_checkpoint(checkpoints(run / "checkpoints" / "member1")[-1])
    explored = [r["new"] for r in after["lineage"] if r["event"] == "explore" and r["target"] == 1]
    assert newest["hyperparameters"] in explored  # values it copied, not its first (1e-6)
    assert second["population"]["best"] in ("member0", "member1")
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    played = json.loads(capsys.readouterr().out)
    assert set(played["policies"]) == {"member0", "member1"} and played["best"] in played["policies"]
    assert played["return_mean"] == played["policies"][played["best"]]["return_mean"]
    ckpt = sorted((run / "checkpoints" / "member1").glob("ckpt_*.pt"))[-1]
    assert main(["eval", str(ckpt), "--episodes", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["return_mean"] == played["policies"]["member1"]["return_mean"]
    loaded = srl.load_policy(run)
    best = second["population"]["best"]
    assert f"/{best}/" in loaded.checkpoint and loaded.version >= second["policies"][best]["policy_version"]


def test_the_worker_sends_again_what_was_not_answered_and_a_copy_is_under_way_until_taken(tmp_path, monkeypatch):
    """The population worker against in-process mailboxes: an export the source never answered is asked again;
    the state it sends goes to the target, and again while the target does not say it took it; a copy stays under
    way (its members barred from others) until then; an answer to a closed copy is skipped. A trainer asked again
    for a copy it took already only says so again."""
    from srl.base.channel import InProcChannel
    from srl.population import worker as pw
    from srl.system.remote_records import InProcMail

    clock = [0.0]
    monkeypatch.setattr(pw, "time", types.SimpleNamespace(monotonic=lambda: clock[0], perf_counter=time.perf_counter,
                                                          process_time=time.process_time))  # fmt: skip
    reports: list[tuple] = []
    episodes, inbox = InProcChannel(streams.EPISODE_WIDTH), InProcMail()
    members = [InProcMail() for _ in range(2)]
    lr = Hyperparameter(key="ppo.lr", min=1e-6, max=1e-2, initial=(1e-3, 1e-6), resample=0.0)
    state = PopulationState.start(PopulationConfig(members=2, interval=100, min_episodes=1, hyperparameters=(lr,)), 0)
    worker = pw.PopulationWorker(
        state,
        Truncation(state.cfg),
        episodes,
        inbox,
        members,
        tmp_path,
        type("R", (), {"report": lambda *a: reports.append(a)})(),
        state.cfg.names(),
    )
    worker.setup()
    episodes.send(streams.episode_records([100, 100], [500.0, 10.0], [1, 1]))
    worker.poll()  # member 1 copies member 0: an export is asked of member 0
    (seq,) = worker.pending
    assert members[0].recv() == [({"op": pw.EXPORT, "seq": seq}, b"")]
    worker.poll()
    assert members[0].recv() == []  # not yet due again
    clock[0] += pw.ASK_AGAIN_SECONDS + 1
    worker.poll()  # not answered in time: asked again
    assert members[0].recv() == [({"op": pw.EXPORT, "seq": seq}, b"")]
    inbox.send({"op": pw.STATE, "seq": seq, "member": 0}, b"the state")
    worker.poll()
    ((meta, payload),) = members[1].recv()
    assert meta["op"] == pw.IMPORT and meta["seq"] == seq and payload == b"the state" and seq in worker.pending
    episodes.send(streams.episode_records([100, 100], [500.0, 10.0], [1, 1]))
    clock[0] += pw.ASK_AGAIN_SECONDS + 1
    worker.poll()  # not taken in time: sent again, and both members stay barred from new decisions
    assert [m["op"] for m, _ in members[1].recv()] == [pw.IMPORT] and list(worker.pending) == [seq]
    inbox.send({"op": pw.TAKEN, "seq": seq, "member": 1})
    worker.poll()  # closed: the members are free, and the check they were barred from decides a new copy
    (seq2,) = worker.pending
    assert seq2 > seq and not members[1].recv() and members[0].recv() == [({"op": pw.EXPORT, "seq": seq2}, b"")]
    inbox.send({"op": pw.TAKEN, "seq": seq, "member": 1})  # said twice: nothing to close
    worker.poll()
    assert list(worker.pending) == [seq2] and reports
    link = pw.MemberLink(members[1], lambda: inbox, 1, lambda values: values)
    link.taken = seq
    members[1].send({"op": pw.IMPORT, "seq": seq, "source": 0, "values": {"ppo.lr": 1e-3}}, b"the state")
    alone = types.SimpleNamespace(collective=None)  # a member of one trainer (it has no adopt: none is called)
    assert link.serve(alone) == 1 and link.taken == seq
    assert inbox.recv() == [({"op": pw.TAKEN, "seq": seq, "member": 1}, b"")]
    assert len(_lineage_lines(tmp_path)) == 4  # two copies, an exploit and an explore line each


def test_the_reported_copies_are_the_lineages_and_a_restarted_worker_counts_them_too(tmp_path):
    """``summary.population.copies`` counts the copies decided, one exploit line of population.jsonl each, with
    ``copies_under_way`` those their target had not taken yet; each line's ``decision`` is the number
    of the check that decided it, of ``decisions`` checks in all. A restarted worker reads its count back."""
    from srl.base.channel import InProcChannel
    from srl.population import worker as pw
    from srl.system.remote_records import InProcMail

    lr = Hyperparameter(key="ppo.lr", min=1e-6, max=1e-2, initial=(1e-3, 1e-6), resample=0.0)
    cfg = PopulationConfig(members=2, interval=100, min_episodes=1, hyperparameters=(lr,))

    def worker(reports: list[dict]) -> pw.PopulationWorker:
        episodes = InProcChannel(streams.EPISODE_WIDTH)
        members = [InProcMail() for _ in range(2)]
        reporter = type("R", (), {"report": lambda _self, kind, meta: reports.append(meta)})()
        built = pw.PopulationWorker(PopulationState.start(cfg, 0), Truncation(cfg), episodes, InProcMail(), members,
                                    tmp_path, reporter, cfg.names())  # fmt: skip
        built.setup()
        return built

    reports: list[dict] = []
    first = worker(reports)
    first.episodes.send(streams.episode_records([100, 100], [500.0, 10.0], [1, 1]))
    first.poll()  # member 1 copies member 0; no export yet
    (seq,) = first.pending
    first.inbox.send({"op": pw.TAKEN, "seq": seq, "member": 1})  # taken (the state's trip is the test above's)
    first.poll()
    first.episodes.send(streams.episode_records([100, 100], [500.0, 10.0], [1, 1]))
    first.poll()  # a second copy, under way
    lines = _lineage_lines_json(tmp_path)
    exploits = [r for r in lines if r["event"] == "exploit"]
    assert reports[-1]["copies"] == len(exploits) == 2 and reports[-1]["copies_under_way"] == 1
    assert [r["decision"] for r in exploits] == sorted({seq, *first.pending})
    assert all(1 <= r["decision"] <= reports[-1]["decisions"] for r in lines)
    assert [r["run_env_steps"] for r in exploits] == [200, 400] and [r["member_env_steps"] for r in exploits] == [
        100,
        200,
    ]
    first.teardown()
    again: list[dict] = []
    worker(again)  # a restart reads the state back
    assert again[-1]["copies"] == 2 and again[-1]["copies_under_way"] == 1


def test_on_a_full_disk_the_worker_decides_nothing_until_its_state_is_written_again(tmp_path, monkeypatch):
    """A decision whose lineage lines or state a full disk refused: one warning, no further decision while the
    state cannot be written, and once it can, the lineage written whole from the state (its record)."""
    import errno

    from srl.base.channel import InProcChannel
    from srl.population import worker as pw
    from srl.system.remote_records import InProcMail

    lr = Hyperparameter(key="ppo.lr", min=1e-6, max=1e-2, initial=(1e-3, 1e-6), resample=0.0)
    cfg = PopulationConfig(members=2, interval=100, min_episodes=1, hyperparameters=(lr,))
    reports: list[dict] = []
    reporter = type("R", (), {"report": lambda _self, kind, meta: reports.append({"kind": kind, **meta})})()
    episodes, inbox = InProcChannel(streams.EPISODE_WIDTH), InProcMail()
    worker = pw.PopulationWorker(PopulationState.start(cfg, 0), Truncation(cfg), episodes, inbox,
                                 [InProcMail() for _ in range(2)], tmp_path, reporter, cfg.names())  # fmt: skip
    worker.setup()
    real_write, real_atomic, full = pw.write_all, pw.atomic_write_text, {"now": True}

    def no_room(*args):
        if full["now"]:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pw, "write_all", lambda f, data: no_room() or real_write(f, data))
    monkeypatch.setattr(pw, "atomic_write_text", lambda path, text: no_room() or real_atomic(path, text))
    episodes.send(streams.episode_records([100, 100], [500.0, 10.0], [1, 1]))
    worker.poll()  # member 1 copies member 0; neither its lines nor the state reach the disk
    (seq,) = worker.pending
    decisions = worker.state.decisions
    assert _lineage_lines(tmp_path) == [] and decisions >= 1
    warned = [r["message"] for r in reports if r["kind"] == "info"]
    assert warned == ["state not saved (No space left on device): no exploit decisions until it is"]
    inbox.send({"op": pw.TAKEN, "seq": seq, "member": 1})
    episodes.send(streams.episode_records([100, 100], [500.0, 10.0], [1, 1]))
    worker.poll()  # the copy closes, but no new decision while the disk is full
    assert not worker.pending and worker.state.decisions == decisions
    full["now"] = False
    episodes.send(streams.episode_records([100, 100], [500.0, 10.0], [1, 1]))
    worker.poll()  # written again: the first decision's lines from the state, then a new decision's
    assert worker.state.decisions > decisions and len(worker.pending) == 1
    assert [r["message"] for r in reports if r["kind"] == "info"][-1] == "state saved again: decisions go on"
    lines = _lineage_lines_json(tmp_path)
    exploits = [r["decision"] for r in lines if r["event"] == "exploit"]
    assert len(exploits) == 2 and exploits[0] <= decisions < exploits[1] and lines == worker.state.lineage
    assert json.loads((tmp_path / "population" / "state.json").read_text())["decisions"] == worker.state.decisions


def _lineage_lines(run) -> list[str]:
    return (run / "population.jsonl").read_text().splitlines()


def test_scored_by_evaluation_a_member_is_judged_by_its_deterministic_episodes_not_its_training_ones(tmp_path):
    """``score: eval``: training returns say member 1 is the better, evaluations say member 0 is: member 1 copies
    member 0. A short inline run wires the evaluations to the members' snapshots."""
    from srl.api.config import load_config
    from srl.base.channel import InProcChannel
    from srl.population import worker as pw
    from srl.runtime.train import train
    from srl.system.remote_records import InProcMail

    cfg = PopulationConfig(members=2, interval=100, min_episodes=2, score="eval", eval_episodes=3)
    evaluations = {0: [300.0, 310.0, 320.0], 1: [20.0, 30.0, 40.0]}
    episodes = InProcChannel(streams.EPISODE_WIDTH)
    members = [InProcMail() for _ in range(2)]
    worker = pw.PopulationWorker(
        PopulationState.start(cfg, 0),
        Truncation(cfg),
        episodes,
        InProcMail(),
        members,
        tmp_path,
        type("R", (), {"report": lambda *a: None})(),
        cfg.names(),
        evaluate=lambda m: evaluations[m],
    )
    worker.setup()
    episodes.send(streams.episode_records([100, 100], [50.0, 900.0], [5, 5]))  # training says the opposite
    worker.poll()
    assert worker.state.members[0].last_score == 310.0
    assert [r["source"] for r in _lineage_lines_json(tmp_path) if r["event"] == "exploit"] == [0]
    with pytest.raises(ConfigError, match="eval_episodes: 1 episodes score no member: min_episodes is 5"):
        PopulationConfig(members=2, score="eval", eval_episodes=1)
    lr = "{key: ppo.lr, min: 1.0e-6, max: 1.0e-2, log: true, initial: [1.0e-3, 1.0e-6]}"
    settings = ["runtime=inline", "population.members=2", "population.interval=3000", "population.score=eval"]
    settings += [f"population.hyperparameters=[{lr}]", "run.total_env_steps=12000", "run.target_return=null"]
    run = tmp_path / "run"
    summary = train(load_config("configs/cartpole_ppo.yaml", [*settings, "run.eval_episodes=0"]), run, progress=None)
    assert "error" not in summary and summary["population"]["decisions"] >= 2
    scores = [m["last_score"] for m in json.loads((run / "population" / "state.json").read_text())["members"]]
    assert any(x is not None for x in scores) and all(x is None or x >= 8 for x in scores)  # CartPole returns


def _lineage_lines_json(run) -> list[dict]:
    return [json.loads(line) for line in _lineage_lines(run)]


# ---------------------------------------------------------------------------------------------- a multi-agent env
KINDS = {
    "env": {"id": "srl.envs.ma_testing:two_kinds"},
    "agents": [{"match": "red_.*", "policy": "red"}, {"match": "blue_.*", "policy": "blue"}],
    "policies": [{"name": "blue", "model": {"hidden": [32, 32]}, "ppo": {"clip": 0.1}}],
}
"""Reds and blues of :class:`~srl.envs.ma_testing.TwoKinds`, two policies of other spaces, blue with overrides."""


def _teams(**population) -> ExperimentConfig:
    lr = {"key": "ppo.lr", "min": 1e-6, "max": 1e-2, "log": True, "initial": [2e-3, 1e-6]}
    return build(ExperimentConfig, {**KINDS, "population": {"members": 2, "hyperparameters": [lr], **population}})


def test_each_policy_of_a_multi_agent_env_has_its_own_members_with_its_overrides_and_their_values():
    cfg = _teams()
    assert cfg.base_policies == ("red", "blue")
    assert cfg.policy_names == ("red-member0", "blue-member0", "red-member1", "blue-member1")
    assert [cfg.member_of(n) for n in cfg.policy_names] == [("red", 0), ("blue", 0), ("red", 1), ("blue", 1)]
    assert [cfg.for_policy(n).ppo.lr for n in cfg.policy_names] == [2e-3, 2e-3, 1e-6, 1e-6]
    blue = cfg.for_policy("blue-member1")  # its policy's overrides, then its member's values
    assert blue.model.hidden == (32, 32) and blue.ppo.clip == 0.1 and blue.ppo.lr == 1e-6
    assert cfg.for_policy("red-member1").model.hidden != (32, 32) and cfg.for_policy("red-member1").ppo.clip == 0.2
    drawn = _teams(hyperparameters=[{"key": "ppo.lr", "min": 1e-5, "max": 1e-3, "log": True}])
    values = [drawn.for_policy(n).ppo.lr for n in drawn.policy_names]
    assert len(set(values)) == 4  # every member of every policy draws its own


def test_a_policy_named_like_a_member_and_a_turn_based_game_are_one_line():
    from srl.runtime.plan import make_plan

    one = {**KINDS, "agents": [{"match": ".*", "policy": "member1"}], "policies": [], "population": {"members": 2}}
    with pytest.raises(ConfigError, match=r"^agents: policy 'member1' is named like a population member$"):
        build(ExperimentConfig, one)
    game = {"env": {"id": "srl.envs.turns:game", "kwargs": {"name": "tic_tac_toe"}}, "population": {"members": 2}}
    with pytest.raises(ConfigError) as err:
        make_plan(build(ExperimentConfig, game))
    assert str(err.value).startswith("population: env 'srl.envs.turns:game' is a turn-based game") and "\n" not in str(
        err.value
    )


def test_member_k_of_every_policy_plays_the_kth_share_of_the_envs_with_its_own_columns():
    """4 envs, 2 members: red-member0 and blue-member0 play envs 0-1, the member-1 policies envs 2-3. Member 0's
    policies pick every target, member 1's always miss: each member's rewards say it got its own columns."""
    from srl.api.config.policies import AgentRule
    from srl.envs.slots import make_grouped

    cfg = _teams()
    slot = make_grouped(cfg.env, 4, [AgentRule(**r) for r in KINDS["agents"]], members=cfg.policy_names)
    try:
        assert [(g.policy, g.agents, g.envs) for g in slot.groups] == [
            ("red-member0", ("red_0", "red_1"), 2),
            ("blue-member0", ("blue_0",), 2),
            ("red-member1", ("red_0", "red_1"), 2),
            ("blue-member1", ("blue_0",), 2),
        ]
        assert [g.columns(slot.env_count) for g in slot.groups] == [4, 2, 4, 2]
        obs = slot.reset_groups(seed=0)
        assert [o["obs"].shape for o in obs] == [(4, 4), (2, 5), (4, 4), (2, 5)]
        for _ in range(3):
            targets = [o["obs"][:, : 4 if i % 2 == 0 else 3].argmax(axis=1) for i, o in enumerate(obs)]
            n = [4, 3, 4, 3]
            actions = [t if i < 2 else (t + 1) % n[i] for i, t in enumerate(targets)]  # member 1 misses
            steps = slot.step_groups(actions)
            assert [s.reward.tolist() for s in steps] == [[1.0] * 4, [1.0] * 2, [0.0] * 4, [0.0] * 2]
            obs = [s.obs for s in steps]
    finally:
        slot.close()


def test_a_member_copies_only_members_of_its_own_policy():
    """Blue member 0 scores best of all, but red member 1 (the worse red) copies red member 0; blue member 1
    copies blue member 0. A state of 2 policies does not fit a config of 1."""
    s = PopulationState.start(_pop(members=2, quantile=0.5), seed=0, bases=2)
    for m, ret in enumerate([5.0, 100.0, 1.0, 50.0]):  # red-member0, blue-member0, red-member1, blue-member1
        _feed(s, m, 100, [ret, ret])
    assert s.scores(0) == {0: 5.0, 2: 1.0} and s.scores(1) == {1: 100.0, 3: 50.0}
    assert s.check(2, Truncation(s.cfg)).source == 0
    assert s.lineage[-1]["run_env_steps"] == 200 and s.lineage[-1]["member_env_steps"] == 100  # teams of 2
    assert s.check(3, Truncation(s.cfg)).source == 1
    assert s.check(0, Truncation(s.cfg)).source is None  # the better red, whatever blue scores
    data = json.loads(json.dumps(s.to_json()))
    assert PopulationState.from_json(s.cfg, data, "state.json", bases=2).lineage == s.lineage
    with pytest.raises(ValueError, match=r"^state\.json: holds populations of 2 policies, the config 1$"):
        PopulationState.from_json(s.cfg, data, "state.json")
