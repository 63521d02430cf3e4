"""Turn-based games as slots (OpenSpiel, PettingZoo AEC): seats as columns, who moves, rewards that reach the one
who waits, masks that keep every sampled move legal, and the league's slot where pool members play the other seat."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from srl.api.config import ConfigError, EnvConfig, ExperimentConfig, LeagueConfig, build, to_dict
from srl.api.schema import MEMORY
from srl.api.spaces import ACTION_MASK
from srl.envs.slots import make_slot, probe_spaces
from srl.envs.turns import TurnSlot
from srl.league import slot as league_slot
from srl.league.pool import Member, PoolIndex, write_index, write_snapshot
from srl.nets.memory import Remembering
from srl.wiring import acting_policy

TTT = EnvConfig(id="srl.envs.turns:game", kwargs={"name": "tic_tac_toe"}, agent_id=True)
AEC_TTT = EnvConfig(id="pettingzoo.classic.tictactoe_v3:env")
C4 = EnvConfig(id="srl.envs.turns:game", kwargs={"name": "connect_four"}, agent_id=True)

# x takes the top row (0, 1, 2) while o plays 3 and 4: x wins on the fifth move
X_WINS = [0, 3, 1, 4, 2]


def _play_line(slot: TurnSlot, moves: list[int]):
    """Play ``moves`` in game 0 (other games copy them); every step's result."""
    steps = []
    for move in moves:
        steps.append(slot.step(np.full(slot.num_envs, move)))
    return steps


@pytest.mark.parametrize("cfg", [TTT, AEC_TTT], ids=["openspiel", "pettingzoo_aec"])
def test_seats_are_columns_one_moves_and_the_one_who_waits_gets_its_reward(cfg):
    slot = make_slot(cfg, 2)
    try:
        assert (slot.num_envs, slot.agents_per_env) == (4, 2)
        obs = slot.reset(seed=0)
        mask = obs[ACTION_MASK]
        assert mask.tolist() == [[1] * 9] * 4  # the first mover's legal moves; the waiting seat may pick any
        steps = _play_line(slot, X_WINS)
        # seats alternate: x (column 0 of each game) moves first
        assert [s.alive.tolist() for s in steps] == [[True, False] * 2, [False, True] * 2] * 2 + [[True, False] * 2]
        assert not any(s.episode_end.any() for s in steps[:-1])
        last = steps[-1]
        # the winning move pays x +1 and o, who did not move, -1 in the same step; both episodes end
        assert last.reward.tolist() == [1.0, -1.0] * 2
        assert last.terminated.all() and last.episode_end.all() and not last.truncated.any()
        # the game restarted within the step: an empty board, x to move
        assert (last.obs[ACTION_MASK] == 1).all()
        mid = steps[2].obs[ACTION_MASK]  # after x 0, o 3, x 1: o to move, 6 free cells
        assert mid[1].tolist() == [0, 0, 1, 0, 1, 1, 1, 1, 1] and mid[0].tolist() == [1] * 9
    finally:
        slot.close()


def test_agent_id_tells_each_column_its_seat():
    probed = probe_spaces(TTT)
    assert (probed.agents, probed.alive, probed.turn_based) == (2, True, True)
    slot = make_slot(TTT, 3)
    try:
        assert slot.reset(seed=1)["obs.agent"].tolist() == [0, 1] * 3
    finally:
        slot.close()
    with pytest.raises(ConfigError, match="env.agent_id: 'CartPole-v1' is not a multi-agent env"):
        make_slot(EnvConfig(id="CartPole-v1", agent_id=True), 1)


def test_a_simultaneous_game_has_every_seat_move_each_step():
    slot = make_slot(EnvConfig(id="srl.envs.turns:game", kwargs={"name": "markov_soccer"}), 2)
    try:
        assert not probe_spaces(EnvConfig(id="srl.envs.turns:game", kwargs={"name": "markov_soccer"})).turn_based
        obs = slot.reset(seed=0)
        rng = np.random.default_rng(0)
        for _ in range(20):
            actions = np.array([rng.choice(np.flatnonzero(m)) for m in obs[ACTION_MASK]])
            step = slot.step(actions)
            assert step.alive.all()
            obs = step.obs
    finally:
        slot.close()


def test_a_masked_policy_never_samples_an_illegal_move():
    """OpenSpiel raises on an illegal move: a fresh policy plays 3,000 connect-four moves, sampling."""
    cfg = ExperimentConfig(env=C4)
    probed = probe_spaces(C4)
    policy = acting_policy(probed.obs, probed.action, cfg)
    slot = make_slot(C4, 16)
    try:
        obs = slot.reset(seed=3)
        ends = 0
        with torch.inference_mode():
            for _ in range(200):
                actions = np.asarray(policy.act(obs)["actions"])
                # the mover's mask is its legal moves, the waiting seat's allows all: every pick fits its mask
                assert (obs[ACTION_MASK][np.arange(len(actions)), actions] == 1).all()
                step = slot.step(actions)
                ends += int(step.episode_end.sum())
                obs = step.obs
        assert ends > 0  # games were finished (and restarted) on the way
    finally:
        slot.close()


def test_unknown_openspiel_game_is_one_line():
    with pytest.raises(ConfigError, match="env.kwargs.name: 'no_such_game'"):
        make_slot(EnvConfig(id="srl.envs.turns:game", kwargs={"name": "no_such_game"}), 1)


def _league_slot(tmp_path, monkeypatch, core: str = "none", **league):
    monkeypatch.setattr(league_slot, "REFRESH_SECONDS", 0.0)
    turns = make_slot(TTT, 8)
    assert isinstance(turns, TurnSlot)
    probed = probe_spaces(TTT)
    cfg = build(ExperimentConfig, {"env": to_dict(TTT), "model": {"core": core, "core_size": 8}})
    make = lambda: acting_policy(probed.obs, probed.action, cfg)  # noqa: E731
    return league_slot.LeagueSlot(turns, tmp_path, LeagueConfig(opponent="pfsp", **league), make, seed=0), make


def test_league_slot_is_the_learners_seat_and_opponents_reply_within_the_step(tmp_path, monkeypatch):
    slot, _ = _league_slot(tmp_path, monkeypatch)
    try:
        assert (slot.num_envs, slot.agents_per_env) == (8, 1)
        obs = slot.reset(seed=4)
        rng = np.random.default_rng(0)
        outcomes = []
        for _ in range(300):
            # every game waits for the learner's seat: its column is the one that moves
            for e, g in enumerate(slot.games):
                assert g.to_move() == [int(slot.seat[e])]
            assert (obs["obs.agent"] == slot.seat).all()
            actions = np.array([rng.choice(np.flatnonzero(m)) for m in obs[ACTION_MASK]])
            step = slot.step(actions)
            assert step.alive is None
            outcomes += step.reward[step.episode_end].tolist()
            assert (step.reward[~step.episode_end] == 0).all()  # tic-tac-toe pays only at the end
            obs = step.obs
        # random against random: both seats win, and the losses reach the learner on the opponent's move
        assert set(outcomes) <= {-1.0, 0.0, 1.0} and {-1.0, 1.0} <= set(outcomes)
        assert set(slot.seat.tolist()) == {0, 1} and (slot.opponent == league_slot.RANDOM).all()
    finally:
        slot.close()


def test_league_slot_loads_pool_members_and_plays_them(tmp_path, monkeypatch):
    slot, make = _league_slot(tmp_path, monkeypatch, random_opponent=0.0)
    try:
        member = make()
        write_snapshot(tmp_path, 7, member.flat_state())
        write_index(tmp_path, PoolIndex(members=[Member(7, 100.0, 0.3)]))
        obs = slot.reset(seed=0)
        assert set(slot._policies) == {7} and (slot.opponent == 7).all()
        for _ in range(20):
            obs = slot.step(np.array([np.flatnonzero(m)[0] for m in obs[ACTION_MASK]])).obs
        # the member leaves the pool: games drawn after that play random moves
        write_index(tmp_path, PoolIndex())
        slot._index_mtime = -1.0
        slot._refresh()
        assert slot._policies == {}
    finally:
        slot.close()


def test_a_pool_member_with_memory_keeps_a_state_per_game_stepped_on_its_own_moves(tmp_path, monkeypatch):
    """A member with an LSTM plays the other seat of several games at once: each of its forwards starts every
    game's row from the state its own last move there left (zeros in a game new to it), never another game's."""
    slot, make = _league_slot(tmp_path, monkeypatch, core="lstm", random_opponent=0.0)
    try:
        write_snapshot(tmp_path, 7, make().flat_state())
        write_index(tmp_path, PoolIndex(members=[Member(7, 100.0, 0.3)]))
        obs = slot.reset(seed=0)  # loads the member
        member = slot._policies[7]
        assert isinstance(member, Remembering)
        events: list[tuple] = []  # ("new", game) and ("act", keys, states in, states out), in order
        draw, keyed_act, forward = slot._draw, member.act, member.policy.act
        calls: list[tuple] = []

        def new_game(e):
            events.append(("new", e))
            draw(e)

        def act(batch, deterministic=False, keys=None):
            out = keyed_act(batch, deterministic, keys)
            ((given, got),) = calls
            calls.clear()
            events.append(("act", keys, given, got))
            return out

        def policy_act(batch, deterministic=False):
            out = forward(batch, deterministic=deterministic)
            calls.append((batch[MEMORY].copy(), out[MEMORY].copy()))
            return out

        monkeypatch.setattr(slot, "_draw", new_game)
        monkeypatch.setattr(member, "act", act)
        monkeypatch.setattr(member.policy, "act", policy_act)
        obs = slot.reset(seed=1)  # every game drawn again: the member starts afresh in each
        for _ in range(60):
            obs = slot.step(np.array([np.flatnonzero(m)[0] for m in obs[ACTION_MASK]])).obs
        last: dict[int, np.ndarray] = {}
        moves = 0
        for event in events:
            if event[0] == "new":
                for seat in (0, 1):
                    last.pop(2 * event[1] + seat, None)
                continue
            _, keys, given, got = event
            assert len({k // 2 for k in keys}) == len(keys)  # one seat of each game: the learner has the other
            for key, before, after in zip(keys, given, got, strict=True):
                assert np.array_equal(before, last.get(key, np.zeros_like(before)))
                last[key] = after
                moves += 1
        assert moves >= 100 and any(np.abs(v).sum() > 0 for v in last.values())
    finally:
        slot.close()


# ---------------------------------------------------------------------------------------------- self-play, end to end
def test_league_slot_plays_bots_their_share_of_games_and_their_moves_are_the_bots(tmp_path, monkeypatch):
    """Half the games go to MCTS: the learner that always takes the first free square never beats it (the
    solver blocks every line), while it beats random moves often; the same seed plays the same games."""
    from srl.api.config import Bot

    def outcomes(seed: int) -> tuple[dict[int, list[float]], list[int]]:
        slot, _ = _league_slot(tmp_path, monkeypatch, random_opponent=0.5, bots=(Bot(opponent="mcts:50", share=0.5),))
        try:
            by_opponent: dict[int, list[float]] = {league_slot.RANDOM: [], league_slot.RANDOM - 1: []}
            drawn = []
            obs = slot.reset(seed=seed)
            for _ in range(150):
                before = slot.opponent.copy()
                step = slot.step(np.array([np.flatnonzero(m)[0] for m in obs[ACTION_MASK]]))
                for e in np.flatnonzero(step.episode_end).tolist():
                    by_opponent[int(before[e])].append(float(step.reward[e]))
                    drawn.append(int(before[e]))
                obs = step.obs
            return by_opponent, drawn
        finally:
            slot.close()

    games, drawn = outcomes(seed=3)
    vs_bot, vs_random = games[league_slot.RANDOM - 1], games[league_slot.RANDOM]
    assert len(vs_bot) >= 40 and len(vs_random) >= 40  # the pool is empty: the rest of the games go to random
    assert 0.35 < len(vs_bot) / (len(vs_bot) + len(vs_random)) < 0.65
    assert max(vs_bot) <= 0.0 and min(vs_bot) == -1.0
    assert np.mean(np.array(vs_random) > 0) > 0.3
    again, drawn_again = outcomes(seed=3)
    assert drawn_again == drawn and again == games


@pytest.mark.slow
def test_a_league_learns_tic_tac_toe_and_srl_eval_plays_it_against_opponents(tmp_path):
    """Self-play against a PFSP league; random against random scores about 0.5 with seats alternating."""
    import json
    import subprocess
    import sys

    import srl

    run = tmp_path / "run"
    summary = srl.train(
        {
            "runtime": "inline",
            "env": {"id": TTT.id, "kwargs": dict(TTT.kwargs), "agent_id": True},
            "workers": {"envs_per_slot": 16, "segment_length": 16},
            "model": {"hidden": [128, 128]},
            "league": {"opponent": "pfsp", "check_every_versions": 10, "match_games": 32},
            "run": {"total_env_steps": 100_000},
        },
        run_dir=run,
    )
    assert "error" not in summary, summary["error"]
    assert summary["final_eval_vs_random_games"] == 100 and summary["final_eval_vs_random_score"] >= 0.6, summary
    league = summary["league"]
    assert league["rounds"] >= 5 and league["pool_size"] >= 2 and league["learner_elo"] > 100, league
    record = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert record["league_pool_size"] == league["pool_size"] and "league_learner_elo" in record

    # srl.load_policy answers a dict of player -> observation, filling in the seat itself
    import pyspiel

    state = pyspiel.load_game("tic_tac_toe").new_initial_state()
    for move in (4, 0):
        state.apply_action(move)
    player = {
        "observation": np.asarray(state.observation_tensor(0), np.float32).reshape(3, 3, 3),
        "action_mask": np.asarray(state.legal_actions_mask(0), np.int8),
    }
    loaded = srl.load_policy(run)
    assert loaded.agents == ["player_0", "player_1"]
    move = loaded.act({"player_0": player})["player_0"]
    assert move in state.legal_actions()

    def srl_eval(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "srl.cli.main", "eval", str(run), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    vs_random = srl_eval("--opponent", "random", "--episodes", "200")
    assert vs_random.returncode == 0, vs_random.stderr
    result = json.loads(vs_random.stdout)
    assert result["games"] == 200 and result["score"] >= 0.7, result

    # the run as a league bot: it takes its share of a slot's games and plays them with the run's own policy
    from srl.api.config import Bot
    from srl.loaded import load_policy
    from srl.league.match import PolicyOpponent

    turns = make_slot(TTT, 16)
    assert isinstance(turns, TurnSlot)
    league = LeagueConfig(opponent="pfsp", bots=(Bot(opponent=str(run), share=0.5),))
    probed = probe_spaces(TTT)
    make = lambda: acting_policy(probed.obs, probed.action, ExperimentConfig(env=TTT))  # noqa: E731
    slot = league_slot.LeagueSlot(turns, tmp_path / "no_pool", league, make, seed=0)
    try:
        bot = slot._bots[league_slot.RANDOM - 1]
        assert isinstance(bot, PolicyOpponent) and not bot.deterministic
        assert np.array_equal(bot.policy.flat_state(), load_policy(run)[1].flat_state())
        ended = {league_slot.RANDOM: 0, league_slot.RANDOM - 1: 0}
        obs = slot.reset(seed=1)
        for _ in range(200):
            before = slot.opponent.copy()
            step = slot.step(np.array([np.flatnonzero(m)[0] for m in obs[ACTION_MASK]]))
            for e in np.flatnonzero(step.episode_end).tolist():
                ended[int(before[e])] += 1
            obs = step.obs
    finally:
        slot.close()
    assert 0.35 < ended[league_slot.RANDOM - 1] / sum(ended.values()) < 0.65, ended
    assert result["win_rate"] + result["draw_rate"] + result["loss_rate"] == pytest.approx(1.0)
    mcts = json.loads(srl_eval("--opponent", "mcts:10", "--episodes", "4").stdout)
    assert mcts["games"] == 4
    itself = json.loads(srl_eval("--opponent", str(run), "--episodes", "4").stdout)
    assert itself["games"] == 4
    other = tmp_path / "c4"  # a policy for another game cannot be the opponent
    c4_env = {"id": C4.id, "kwargs": dict(C4.kwargs), "agent_id": True}
    srl.train({"runtime": "inline", "env": c4_env, "run": {"total_env_steps": 2_000}}, run_dir=other)
    for bad, line in [
        (str(other), "plays 'srl.envs.turns:game' with other spaces"),
        ("mcts:0", "expected mcts:N with N >= 1"),
        ("nobody", "'nobody' is not random, mcts:N or a run directory"),
    ]:
        proc = srl_eval("--opponent", bad)
        assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and line in proc.stderr, proc.stderr


def _train_until(cfg, run, ready, resume=None) -> dict:
    """Train with no step budget until ``ready(pool index)`` holds, then stop the run (however fast the machine
    is: the league worker's rounds, not a budget racing them, end it). The run keeps the main thread (the local
    runtime installs signal handlers); a watcher thread stops it."""
    import threading
    import time

    from srl.league.pool import read_index
    from srl.runtime.train import train

    stop, done = threading.Event(), threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 300  # a safety net for a broken run, not the stop
        while not done.is_set() and time.monotonic() < deadline and not ready(read_index(run / "league")):
            time.sleep(0.2)
        stop.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        out = train(cfg, run, progress=None, resume=resume, stop=stop)
    finally:
        done.set()
        watcher.join()
    assert out.get("stop_reason") == "requested" and ready(read_index(run / "league")), out
    return out


@pytest.mark.slow
def test_a_league_runs_under_the_local_runtime_and_resumes_with_its_pool(tmp_path):
    """Actors in their own processes read the pool the league worker (a process too) writes; a resumed run
    goes on with the same pool and rounds."""
    from srl.api.config import load_config
    from srl.league.pool import read_index
    from srl.runtime.train import resume_config

    run = tmp_path / "run"
    endless = "run.total_env_steps=1000000000"
    sets = ["runtime=local", "workers.actors=2", endless, "league.check_every_versions=2", "league.match_games=8"]
    first = _train_until(load_config("configs/connect_four_selfplay.yaml", sets), run, lambda i: i.rounds >= 2)
    assert "error" not in first, first["error"]
    index = read_index(run / "league")
    assert index.rounds >= 2 and index.frozen and first["league"]["rounds"] <= index.rounds
    cfg2, resume = resume_config(run, [endless])
    second = _train_until(cfg2, run, lambda i: i.rounds > index.rounds, resume=resume)
    assert "error" not in second, second["error"]
    after = read_index(run / "league")
    assert after.rounds > index.rounds  # counted on from the pool index it found
    assert after.frozen[: len(index.frozen)] == index.frozen


def test_a_league_needs_a_turn_based_game():
    import srl

    with pytest.raises(ConfigError, match="league.opponent: pfsp: env 'CartPole-v1' is not a turn-based game"):
        srl.train({"env": {"id": "CartPole-v1"}, "league": {"opponent": "pfsp"}})


def test_plain_self_play_shows_its_win_draw_and_loss_rates_against_random_while_it_trains(tmp_path):
    """One policy in both seats of tic-tac-toe: its returns average 0 whatever it plays, so an eval worker, on
    without settings in such a game, plays it against a uniform random player; the rates reach the progress
    line, metrics.jsonl and TensorBoard."""
    import io
    import json
    import re

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from srl.runtime.train import train

    run, progress = tmp_path / "run", io.StringIO()
    cfg = build(ExperimentConfig, {"runtime": "inline", "env": {"id": AEC_TTT.id}, "run": {"total_env_steps": 12_000}})
    summary = train(cfg, run, progress=progress)
    assert summary["stop_reason"] == "env_steps" and summary["policy_version"] >= 10, summary
    assert summary["evaluations"] >= 2  # the untrained policy at version 0, and every 10 versions from there
    # best.pt is the best against random: a trained version's score beat the untrained one's
    assert summary["best_eval_version"] >= 10 and summary["best_eval_vs_random_score"] > 0.5, summary
    record = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    rates = [record[f"eval_vs_random_{k}_rate"] for k in ("win", "draw", "loss")]
    assert all(0.0 <= r <= 1.0 for r in rates) and sum(rates) == pytest.approx(1.0), record
    assert record["eval_version"] >= 10 and record["return_mean"] == 0.0  # zero-sum: both seats are the policy
    shown = re.findall(r"win (\d\.\d\d) draw (\d\.\d\d) loss (\d\.\d\d) vs random", progress.getvalue())
    assert shown and [float(r) for r in shown[-1]] == pytest.approx(rates, abs=0.005)
    tb = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    tb.Reload()
    assert {f"eval_vs_random_{k}_rate" for k in ("win", "draw", "loss")} <= set(tb.Tags()["scalars"])


def test_an_eval_worker_runs_without_settings_where_one_policy_plays_a_two_player_turn_based_game():
    """Self-play (plain or against a league) gets one every 10 versions; other envs, a game split between two
    policies, ``eval_episodes: 0`` and ``eval_every_versions: 0`` get none; a cadence that is set is kept."""
    from srl.runtime.plan import make_plan

    def eval_workers(env: dict, **settings) -> list[tuple[str, int]]:
        plan = make_plan(build(ExperimentConfig, {"env": env, **settings}))
        return [(w.name, plan.eval_every) for w in plan.topology.workers if w.name.startswith("eval")]

    ttt, league = {"id": AEC_TTT.id}, {"opponent": "pfsp"}
    assert eval_workers(ttt) == eval_workers(ttt, league=league) == [("eval0", 10)]
    assert eval_workers(ttt, run={"eval_every_versions": 3}) == [("eval0", 3)]
    assert eval_workers(ttt, run={"eval_every_versions": 0}) == eval_workers(ttt, run={"eval_episodes": 0}) == []
    seats = [{"match": "player_1", "policy": "crosses"}, {"match": "player_2", "policy": "noughts"}]
    assert eval_workers(ttt, agents=seats) == eval_workers({"id": "CartPole-v1"}) == []
