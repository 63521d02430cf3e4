"""The replay under the runtimes: its rate limiter holds a run's samples per insert, whatever the actors; a replay
worker, an actor and a trainer killed with SIGKILL are survived, and the replay loses no item."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import last_record, train_killing

from srl.api.config import ConfigError, load_config
from srl.runtime.plan import make_plan
from srl.runtime.train import resume_config, train

DQN = "configs/cartpole_dqn.yaml"
QMIX = "configs/mpe_simple_spread_qmix.yaml"


def _short(*overrides: str) -> list[str]:
    """A short DQN run: no target to stop at, a fast exploration schedule, small batches."""
    return [
        "run.target_return=null",
        "run.eval_episodes=2",
        "dqn.epsilon_decay_env_steps=2000",
        "replay.min_size=500",
        *overrides,
    ]


@pytest.mark.slow
@pytest.mark.parametrize("actors", [1, 2])
def test_the_rate_limiter_holds_the_samples_per_insert_of_a_local_run(tmp_path: Path, actors: int) -> None:
    """Measured samples per insert (past ``min_size``) within 5% of the setting, with one actor and with two."""
    cfg = load_config(
        DQN, _short(f"workers.actors={actors}", "replay.samples_per_insert=8", "run.total_env_steps=12000")
    )
    summary = train(cfg, tmp_path / "run", progress=None)
    replay = summary["replays"]["replay0"]
    assert replay["inserted"] >= 8_000
    assert abs(replay["samples_per_insert"] / 8 - 1) < 0.05, replay


def test_a_replay_per_node_group_feeds_each_of_its_trainers() -> None:
    """``replay.placement=node``: one replay per trainer node group, serving the batches of each trainer of the
    group, filled by the actors whose trainers are there (a Ray plan of 2 trainer nodes, built without a cluster)."""
    cfg = load_config(
        DQN,
        ["runtime=ray", "ray.trainer_nodes=2", "workers.trainers=4", "workers.actors=4", "replay.placement=node"],
    )
    topology = make_plan(cfg).topology
    replays = [w for w in topology.workers if w.role.name == "replay"]
    assert [(w.name, w.group, [e.name for e in w.serves]) for w in replays] == [
        ("replay0", -1, ["replay0", "batches0", "batches1", "refresh0"]),  # refresh: reanalyzed targets come back
        ("replay1", -2, ["replay1", "batches2", "batches3", "refresh1"]),
    ]
    trainers = [w for w in topology.workers if w.role.name == "trainer"]
    assert [([e.name for e in w.connects], w.group) for w in trainers] == [
        (["batches0"], -1),
        (["batches1"], -1),
        (["batches2"], -2),
        (["batches3"], -2),
    ]
    actors = [w for w in topology.workers if w.role.name == "actor"]
    assert [w.connects[0].name for w in actors] == ["replay0", "replay0", "replay1", "replay1"]


@pytest.mark.slow
def test_two_trainers_sharing_one_replay_take_its_batches_in_turn(tmp_path: Path) -> None:
    """Both data-parallel trainers of a one-machine run sample the one replay both actors fill; the rate limiter
    holds their samples together at the setting."""
    overrides = ["workers.trainers=2", "workers.actors=2", "replay.placement=node", "replay.samples_per_insert=8"]
    cfg = load_config(DQN, _short(*overrides, "run.total_env_steps=12000"))
    summary = train(cfg, tmp_path / "run", progress=None)
    assert list(summary["replays"]) == ["replay0"]
    replay = summary["replays"]["replay0"]
    assert replay["inserted"] >= 8_000
    assert abs(replay["samples_per_insert"] / 8 - 1) < 0.05, replay
    assert summary["time_fractions"]["trainer0/train"] > 0 and summary["time_fractions"]["trainer1/train"] > 0


@pytest.mark.slow
def test_kill_9_of_the_replay_worker_an_actor_and_the_trainer_is_survived_and_no_item_is_lost(tmp_path: Path) -> None:
    """The replay worker restarts alone and attaches to its store in shared memory: the replay's size never goes
    back, and every item inserted is still there at the end. The actor restarts alone, the trainer from its
    checkpoint. The trainer is frozen from the first kill until its own, which holds the actors back, so the run
    cannot end before every kill however fast the machine."""
    run = tmp_path / "run"
    settings = _short("run.total_env_steps=16000", "run.checkpoint_interval_seconds=0.1")
    full = lambda: last_record(run).get("replay0_size", 0) >= 2_000  # noqa: E731
    summary = train_killing(run, DQN, settings, full, ["replay0", "actor0", "trainer0"], freeze="trainer0")
    assert summary["restarts"] == {"actor0": 1, "replay0": 1, "trainer0": 1}
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    sizes = [r.get("replay0_size", 0) for r in records]
    assert sizes == sorted(sizes) and sizes[-1] > 2_000  # never emptied: the restarted worker found every item
    # the restarted actor explores on at the rate the run reached (epsilon ends at 2,000 env steps), not afresh
    late = [r["explore_epsilon"] for r in records if "explore_epsilon" in r and r["env_steps"] >= 2_100]
    assert late and max(late) <= 0.05, late
    replay = summary["replays"]["replay0"]
    assert replay["size"] == replay["inserted"] == replay["inserted_steps"]  # below max_size: nothing evicted


@pytest.mark.slow
def test_kill_9_of_qmix_s_replay_worker_and_trainer_keeps_every_team_item(tmp_path: Path) -> None:
    """QMIX's team items (three agents' sequences each, with their stored states) survive the replay worker's
    SIGKILL as single items do: every item inserted is still there, and what the kill lost is at most the segments
    handed to the replay and not yet inserted. The trainer restarts from its checkpoint, with its mixer; it is
    frozen from the first kill until its own, so the run cannot end first however fast the machine."""
    run = tmp_path / "run"
    settings = ["run.total_env_steps=12000", "run.checkpoint_interval_seconds=0.1", "run.eval_episodes=1"]
    trained = lambda: last_record(run).get("updates", 0) >= 5  # noqa: E731
    summary = train_killing(run, QMIX, settings, trained, ["replay0", "trainer0"], freeze="trainer0")
    assert summary["restarts"] == {"replay0": 1, "trainer0": 1}
    sizes = [json.loads(line).get("replay0_size", 0) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sizes == sorted(sizes)
    replay = summary["replays"]["replay0"]
    # one team item per env episode (25 steps), of three agents' steps each; what the kill can lose is bounded:
    # the segments handed to the replay and not yet inserted (8 envs' items each), at most the actor's buffers
    assert replay["size"] == replay["inserted"] == replay["inserted_steps"] / (3 * 25)
    buffers = load_config(QMIX).workers.buffers_per_actor
    assert 0 <= summary["env_steps"] // 25 - replay["inserted"] <= 8 * buffers


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["env.id=Pendulum-v1"], "algorithm: dqn needs a Discrete action space"),
        (["replay.min_size=200000"], "replay.min_size"),
        (["dqn.batch_size=300000", "replay.max_size=200000"], "dqn.batch_size"),
        (["replay.samples_per_insert=0"], "replay.samples_per_insert"),
        (["dqn.nstep=64"], "dqn.nstep"),
        (["replay.alpha=1.5"], "replay.alpha"),
        (["workers.path=[]"], "workers.path: dqn learns from a replay: end the path with replay"),
    ],
)
def test_bad_replay_settings_are_one_line_each(overrides: list[str], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        make_plan(load_config(DQN, overrides))


@pytest.mark.slow
@pytest.mark.parametrize("save", [True, False])
def test_a_resumed_run_reloads_its_saved_replay_or_says_it_refills(tmp_path: Path, save: bool) -> None:
    """``replay.save``: the replay is written beside the checkpoints and a resumed run starts with every item;
    without it the resumed run starts empty and says so (a warning in the log and in ``summary.json``)."""
    run = tmp_path / "run"
    cfg = load_config(DQN, _short("runtime=inline", "run.total_env_steps=3000", f"replay.save={str(save).lower()}"))
    first = train(cfg, run, progress=None)
    stored = first["replays"]["replay0"]["size"]
    assert stored >= 2_000 and (run / "checkpoints" / "replay0.npz").exists() == save
    cfg2, resume = resume_config(run, ["run.total_env_steps=5000"])  # 3,072 taken: the new steps reach the replay
    second = train(cfg2, run, progress=None, resume=resume)
    refilled = [w for w in second["warnings"] if "refills 1 replay(s) from empty" in w]
    size = second["replays"]["replay0"]["size"]
    if save:
        assert not refilled and size >= stored + 500  # every saved item, and the new ones
    else:
        assert refilled and size < stored  # only what the resumed run inserted


def test_a_saved_replay_that_does_not_fit_the_resumed_run_is_one_line(tmp_path: Path) -> None:
    """Resuming with segments of another length (or a broken file) would leave the replay worker unable to load
    its file, and the run going on empty: it is refused before anything starts."""
    run = tmp_path / "run"
    cfg = load_config(DQN, _short("runtime=inline", "run.total_env_steps=1500", "replay.save=true"))
    train(cfg, run, progress=None)
    cfg2, resume = resume_config(run, ["workers.segment_length=16", "run.total_env_steps=2000"])
    with pytest.raises(ConfigError, match=r"^replay.save: .*replay0.npz does not fit this run: its field"):
        train(cfg2, run, progress=None, resume=resume)
    (run / "checkpoints" / "replay0.npz").write_bytes(b"not a zip")
    cfg3, resume = resume_config(run, ["run.total_env_steps=2000"])
    with pytest.raises(ConfigError, match=r"^replay.save: replay file .*: not a saved replay"):
        train(cfg3, run, progress=None, resume=resume)


def test_messages_a_replay_refused_stay_counted_across_its_restarts() -> None:
    """Its store's counters live in shared memory, but its count of refused messages is its process's."""
    import time

    from srl.system.controller import Controller

    from conftest import reporting

    controller = reporting(Controller(load_config(DQN), None, time.time(), progress=None))
    controller.handle("replay", {"worker": "replay0", "size": 5.0, "rejected_segments": 3}, {})
    controller.note_restart("replay0", "killed", 0)
    controller.handle("replay", {"worker": "replay0", "size": 6.0, "rejected_segments": 1}, {})
    assert controller.record()["replay0_rejected_segments"] == 4
    assert controller.summary(None)["rejected_segment_messages"] == 4


def test_a_restarted_actor_reports_the_rate_its_schedule_reached_even_before_its_first_step() -> None:
    """The kill -9 test's actor, in this process: restarted while every buffer of its row waits at a replay that
    takes none (its trainer frozen), it cannot step, yet it reports. Its explorer starts at ``epsilon_start`` and
    reaches the rate of the steps it is launched with (``Launch.env_steps``) only at its first step, so those
    reports must not carry a rate; its first step explores at the rate its earlier start reached."""
    import time

    from conftest import reporting

    from srl.replay.role import REPLAY
    from srl.runtime.build import build_worker
    from srl.runtime.fabric import InlineFabric
    from srl.runtime.topology import ACTOR
    from srl.system.controller import Controller
    from srl.system.params import ParamPublisher

    cfg = load_config(DQN, _short("runtime=inline", "dqn.epsilon_decay_env_steps=500"))
    plan, end = make_plan(cfg), cfg.dqn.epsilon_end
    controller = reporting(Controller(cfg, None, time.time(), progress=None))
    fabric = InlineFabric(plan, controller.handle)
    ParamPublisher(fabric.params()).publish(0, plan.policies[0].acting_policy().flat_state())
    spec = plan.topology.get(ACTOR, 0)

    def start(incarnation: int, env_steps: int) -> Any:
        actor = build_worker(plan, fabric, spec, None, 0.0, 0.0, incarnation=incarnation, env_steps=env_steps)
        actor.setup()
        return actor

    first = start(0, 0)
    while len(first.parked) < first.ring_size:  # every buffer of its row queued at the replay, which takes none
        first.poll()
    assert controller.env_steps > 500 and controller.record()["explore_epsilon"] == pytest.approx(end)
    # SIGKILL (no teardown); the supervisor launches it with the steps it took, then counts the restart
    launched_with = controller.worker_env_steps(spec.name)
    dropped = fabric.free_buffers(spec)
    again = start(1, launched_with)
    controller.note_restart(spec.name, "killed", dropped)
    for _ in range(3):
        assert again.poll() == 0  # parked: no buffer to write to
        assert controller.record().get("explore_epsilon", end) == pytest.approx(end)
    replay = fabric.segment_source(plan.topology.get(REPLAY, 0))
    replay.release(*(int(x) for x in replay.receive(8, 0.0)[0]))  # the replay takes one segment
    replay.ring()
    while again.env_steps == 0:
        again.poll()
    assert controller.record()["explore_epsilon"] == pytest.approx(end)  # not 1.0: it counts on from its steps
    again.teardown()


@pytest.mark.parametrize(("placement", "refilled"), [("node", []), ("trainer", ["refills 1 replay(s)"])])
def test_a_resumed_run_counts_the_replays_it_refills_by_their_placement(
    tmp_path: Path, placement: str, refilled: list[str]
) -> None:
    """Two trainers and one saved replay file: one replay shared by both finds it; one replay each refills one."""
    from srl.replay.role import refilled as said

    overrides = ["workers.trainers=2", "workers.actors=2", f"replay.placement={placement}", "replay.save=true"]
    plan = make_plan(load_config(DQN, overrides))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "replay0.npz").write_bytes(b"")
    warnings = said(plan, tmp_path)
    assert [w for w in warnings if any(r in w for r in refilled)] == warnings and len(warnings) == len(refilled)


@pytest.mark.slow
def test_a_resumed_run_explores_at_the_rate_its_env_steps_reached(tmp_path: Path) -> None:
    """The actors' linear epsilon decays over the run's env steps: a resumed run goes on from where they were,
    not from ``epsilon_start``."""
    run = tmp_path / "run"
    decay = ["dqn.epsilon_decay_env_steps=8000", "dqn.epsilon_start=1.0", "dqn.epsilon_end=0.0"]
    train(load_config(DQN, _short("runtime=inline", "run.total_env_steps=4000", *decay)), run, progress=None)
    before = len((run / "metrics.jsonl").read_text().splitlines())
    cfg, resume = resume_config(run, ["run.total_env_steps=4600"])
    train(cfg, run, progress=None, resume=resume)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()[before:]]
    resumed = [(r["env_steps"], r["explore_epsilon"]) for r in records if "explore_epsilon" in r]
    # the resumed run counts on from its checkpoint's env steps, and so does its epsilon
    assert resumed and all(eps == pytest.approx(1 - steps / 8000, abs=0.05) for steps, eps in resumed), resumed


@pytest.mark.slow
def test_one_dqn_shared_by_a_multi_agent_env_s_agents_trains_through_their_columns(tmp_path: Path) -> None:
    """MPE2's simple_spread (3 agents, discrete actions): every agent is a column of the one DQN's replay."""
    overrides = _short(
        "runtime=inline",
        "env.id=mpe2.simple_spread_v3:parallel_env",
        "env.kwargs={N: 3, max_cycles: 25, continuous_actions: false}",
        "run.total_env_steps=2000",
    )
    cfg = load_config(DQN, overrides)
    plan = make_plan(cfg)
    assert plan.agents_per_env == 3
    summary = train(cfg, tmp_path / "run", progress=None)
    replay = summary["replays"]["replay0"]
    assert summary["policy_version"] > 0
    segment = 3 * cfg.workers.envs_per_slot * cfg.workers.segment_length  # a transition per agent per env step
    assert replay["inserted"] == replay["inserted_steps"] > 0 and replay["inserted"] % segment == 0


@pytest.mark.parametrize(
    ("config", "min_size"), [("configs/cartpole_masked_r2d2.yaml", 48), ("configs/pendulum_sac.yaml", 500), (QMIX, 32)]
)
@pytest.mark.slow
def test_r2d2_sac_and_qmix_resume_with_the_replay_they_saved(tmp_path: Path, config: str, min_size: int) -> None:
    """R2D2's sequences (with their stored states), SAC's transitions and QMIX's team items come back on resume:
    the resumed run starts from every saved item, refills nothing and trains on."""
    run = tmp_path / "run"
    settings = ["runtime=inline", "run.target_return=null", "run.eval_episodes=1", "replay.save=true"]
    cfg = load_config(config, [*settings, f"replay.min_size={min_size}", "run.total_env_steps=3000"])
    first = train(cfg, run, progress=None)
    stored = first["replays"]["replay0"]["size"]
    cfg2, resume = resume_config(run, ["run.total_env_steps=5000"])
    second = train(cfg2, run, progress=None, resume=resume)
    assert not [w for w in second["warnings"] if "refills" in w], second["warnings"]
    assert second["replays"]["replay0"]["size"] > stored >= min_size
    assert second["policy_version"] > first["policy_version"] > 0
