"""QMIX and VDN: the mixers, the double-Q targets, dead agents, and the two-step game of the QMIX paper."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from srl.algorithms.dqn_math import greedy_values
from srl.algorithms.qmix_math import chosen_values, monotonic_mix, vdn_mix
from srl.api.config import ConfigError, ReplayConfig
from srl.api.schema import MEMORY, FieldSpec
from srl.nets.q import MonotonicMixer
from srl.replay.spec import ReplaySpec
from srl.replay.store import ReplayStore
from srl.system.streams import PoolLayout


def test_the_monotonic_mix_equals_a_plain_loop_and_never_falls_as_an_agent_value_rises():
    """``Q_tot = elu(q |w1| + b1) . |w2| + b2`` row by row; its gradient in every agent's value is >= 0 even where
    the hypernetworks' raw weights are negative."""
    torch.manual_seed(0)
    m, n, e = 5, 3, 4
    q = torch.randn(m, n, requires_grad=True)
    alive = torch.ones(m, n)
    w1, b1, w2, b2 = torch.randn(m, n, e), torch.randn(m, e), torch.randn(m, e), torch.randn(m)
    assert (w1 < 0).any() and (w2 < 0).any()
    got = monotonic_mix(q, alive, w1, b1, w2, b2)
    for r in range(m):
        hidden = []
        for j in range(e):
            x = sum(float(q[r, a]) * abs(float(w1[r, a, j])) for a in range(n)) + float(b1[r, j])
            hidden.append(x if x > 0 else float(torch.expm1(torch.tensor(x))))
        want = sum(h * abs(float(w2[r, j])) for j, h in enumerate(hidden)) + float(b2[r])
        assert float(got[r]) == pytest.approx(want, rel=1e-5, abs=1e-5)
    (grad,) = torch.autograd.grad(got.sum(), q)
    assert (grad >= 0).all() and (grad > 0).any()
    # through the hypernetwork module too, on random states
    mixer = MonotonicMixer(n, 6, embed=8, hyper=16)
    q2 = torch.randn(64, n, requires_grad=True)
    (grad,) = torch.autograd.grad(mixer(q2, torch.ones(64, n), torch.randn(64, 6), monotonic_mix).sum(), q2)
    assert (grad >= 0).all()


def test_vdn_is_the_sum_and_a_dead_agent_weighs_nothing_in_either_mix():
    torch.manual_seed(1)
    q = torch.randn(4, 3, requires_grad=True)
    alive = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(vdn_mix(q, alive), torch.stack([q[0].sum(), q[1, 0] + q[1, 2], q[2, 2], q[3, 0] * 0]))
    mixer = MonotonicMixer(3, 5, embed=4, hyper=8)
    state = torch.randn(4, 5)
    for mix in (lambda x: vdn_mix(x, alive), lambda x: mixer(x, alive, state, monotonic_mix)):
        (grad,) = torch.autograd.grad(mix(q).sum(), q)
        assert (grad[alive == 0] == 0).all()
        changed = q.detach().clone()
        changed[alive == 0] += 100.0
        torch.testing.assert_close(mix(changed), mix(q.detach()))


def test_double_q_values_each_agents_greedy_legal_online_action_by_the_target_network():
    torch.manual_seed(2)
    online, target = torch.randn(2, 5, 3, 4), torch.randn(2, 5, 3, 4)
    legal = torch.rand(2, 5, 3, 4) > 0.4
    legal[..., 1] |= ~legal.any(-1)  # at least one legal action each
    got = greedy_values(online, target, legal)
    for t in range(2):
        for b in range(5):
            for a in range(3):
                allowed = [k for k in range(4) if legal[t, b, a, k]]
                best = max(allowed, key=lambda k: float(online[t, b, a, k]))
                assert float(got[t, b, a]) == float(target[t, b, a, best])
    actions = torch.randint(0, 4, (2, 5, 3))
    torch.testing.assert_close(chosen_values(online, actions), online.gather(-1, actions.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(greedy_values(online, target), chosen_values(target, online.argmax(-1)))


def _two_step_game(mixing: str) -> tuple[int, float]:
    """The QMIX paper's two-step game, learned by tabular agents from every joint action alike: in the first
    state agent 1's action chooses the next game (2A pays 7 whatever both do; 2B pays 0, 1, 1 or 8), which both
    agents see. Returns agent 1's greedy first action and the team's value of the greedy joint action there."""
    torch.manual_seed(0)
    payoff = {1: torch.full((2, 2), 7.0), 2: torch.tensor([[0.0, 1.0], [1.0, 8.0]])}
    tables = torch.nn.Parameter(torch.zeros(2, 3, 2))  # [agent, state, action]
    mixer = MonotonicMixer(2, 3, embed=8, hyper=16)
    params = [tables, *mixer.parameters()] if mixing == "qmix" else [tables]
    optimizer = torch.optim.Adam(params, lr=0.05)
    rows = torch.tensor([(s, a, b) for s in range(3) for a in range(2) for b in range(2)])
    alive = torch.ones(len(rows), 2)

    def team(states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        q = chosen_values(tables[:, states].permute(1, 0, 2), actions)
        if mixing == "vdn":
            return vdn_mix(q, alive[: len(q)])
        return mixer(q, alive[: len(q)], torch.nn.functional.one_hot(states, 3).float(), monotonic_mix)

    for _ in range(2000):
        with torch.no_grad():
            after = 1 + rows[:, 1]  # agent 1's first action picks 2A or 2B
            greedy = tables[:, after].permute(1, 0, 2).argmax(-1)
            first = team(after, greedy)
            reward = torch.stack([payoff[int(s)][a, b] if s else torch.tensor(0.0) for s, a, b in rows.tolist()])
            target = torch.where(rows[:, 0] == 0, first, reward)
        loss = (team(rows[:, 0], rows[:, 1:]) - target).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        start = torch.zeros(1, dtype=torch.long)
        greedy = tables[:, start].permute(1, 0, 2).argmax(-1)
        return int(greedy[0, 0]), float(team(start, greedy)[0])


@pytest.mark.slow
def test_in_the_two_step_game_qmix_finds_the_payoff_of_8_that_vdn_cannot_represent():
    """VDN's sum fits 2B's payoffs at best as 6.5 for the joint action worth 8, below 2A's 7, so it steers to 2A;
    QMIX's monotonic mix represents 2B, values it at 8 and steers there (the QMIX paper, section 6.1)."""
    action, value = _two_step_game("vdn")
    assert action == 0 and value == pytest.approx(7.0, abs=0.1)
    action, value = _two_step_game("qmix")
    assert action == 1 and value == pytest.approx(8.0, abs=0.3)


# --------------------------------------------------------------------------- a team's items in the replay
def _team_layout(T: int, B: int, state: int, memory: bool = True) -> PoolLayout:
    fields = {
        "obs": FieldSpec((T + 1, B, 3), "float32"),
        "obs.state": FieldSpec((T + 1, B, 4), "float32"),
        "actions": FieldSpec((T, B), "int64"),
        "rewards": FieldSpec((T, B), "float32"),
        "terminated": FieldSpec((T, B), "bool"),
        "truncated": FieldSpec((T, B), "bool"),
        "alive": FieldSpec((T, B), "bool"),
        "version": FieldSpec((T, B), "int64"),
    }
    if memory:
        fields[MEMORY] = FieldSpec((T + 1, B, state), "float32")
    return PoolLayout(1, 1, fields, obs_fields=("obs", "obs.state"))


def test_a_team_item_holds_every_agent_of_one_env_over_the_same_steps():
    """With ``team`` 2, a segment of 3 envs x 2 agents (columns env-major) is 3 chunks; each sampled item carries
    both agents of one env, agent ``a`` of chunk ``c`` being column ``2 c + a``, with each agent's stored state."""
    T, B, L, stride, S, team = 8, 6, 4, 2, 5, 2
    cfg = ReplayConfig(max_size=1000, min_size=1, error_buffer=1e9, item_length=L, item_stride=stride)
    spec = ReplaySpec.of(_team_layout(T, B, S), cfg, 64, team=team)
    assert spec.columns == 3 and spec.fields["obs"].shape == (T + 1, 3, team, 3)
    rng = np.random.default_rng(0)
    layout = _team_layout(T, B, S).fields
    segment = {name: rng.normal(size=f.shape).astype(f.dtype) for name, f in layout.items() if f.dtype != "bool"}
    segment |= {name: rng.random(f.shape) < 0.5 for name, f in layout.items() if f.dtype == "bool"}
    batch = {name: np.zeros(f.shape, f.dtype) for name, f in spec.batch_fields(64).items()}
    assert batch["obs"].shape == (L + 1, 64, team, 3) and batch[MEMORY].shape == (64, team, S)
    assert batch["rewards"].shape == batch["alive"].shape == (L, 64, team) and batch["weights"].shape == (64,)
    store = ReplayStore.in_process(spec)
    store.insert(segment)
    assert store.inserted_steps == T * B  # every column's steps, as without teams
    store.sample_into(batch, np.random.default_rng(1), n=3, gamma=0.99)
    seen = set()
    for i, key in enumerate(batch["keys"]):
        chunk, item = divmod(int(key), spec.items_per_chunk)
        s = item * stride
        for agent in range(team):
            column = chunk * team + agent
            seen.add((column, s))
            np.testing.assert_array_equal(batch[MEMORY][i, agent], segment[MEMORY][s, column])
            for part in ("obs", "obs.state"):
                np.testing.assert_array_equal(batch[part][:, i, agent], segment[part][s : s + L + 1, column])
            for name in ("actions", "rewards", "terminated", "truncated", "alive"):
                np.testing.assert_array_equal(batch[name][:, i, agent], segment[name][s : s + L, column])
    assert {c for c, _ in seen} == set(range(B))
    with pytest.raises(ConfigError, match=r"^model\.core: a team's items are sequences"):
        ReplaySpec.of(_team_layout(T, B, S, memory=False), cfg, 64, team=team)


# --------------------------------------------------------------------------- the learner and its runs
TWO_STEP = {
    "algorithm": "qmix",
    "env": {"id": "srl.envs.ma_testing:two_step"},
    "workers": {"actors": 1, "envs_per_slot": 16, "segment_length": 4, "torch_threads": 1},
    "model": {"hidden": [32], "activation": "relu", "core": "gru", "core_size": 32, "normalize_obs": False},
    # every joint action alike, as the QMIX paper's game is learned: exploration never decays
    "qmix": {"lr": 0.005, "batch_size": 32, "epsilon_start": 1.0, "epsilon_end": 1.0, "target_every": 50},
    "replay": {"max_size": 20000, "min_size": 64, "item_length": 2, "item_stride": 2, "samples_per_insert": 4},
    "run": {"total_env_steps": 8000, "eval_episodes": 20, "target_return": None},
}


@pytest.mark.parametrize(
    ("mixer", "runtime", "payoff"), [("qmix", "inline", 8.0), ("qmix", "local", 8.0), ("vdn", "inline", 7.0)]
)
@pytest.mark.slow
def test_qmix_learns_the_two_step_games_payoff_of_8_where_vdn_settles_for_7(mixer, runtime, payoff, tmp_path):
    """The whole system on the QMIX paper's game: actors acting per agent, the replay's team items, the mixer.
    Greedy, a QMIX team goes to 2B for 8; a VDN team values 2B below 2A's 7 and takes 7."""
    import srl

    summary = srl.train(TWO_STEP, [f"qmix.mixer={mixer}", f"runtime={runtime}"], run_dir=tmp_path / "run")
    assert "error" not in summary, summary.get("error")
    assert summary["final_eval_return_mean"] == pytest.approx(payoff, abs=0.01)


def _learner(mixer: str = "qmix", *overrides: str):
    from srl.api.config import config_from
    from srl.replay.role import replay_spec
    from srl.runtime.plan import make_plan
    from srl.wiring import make_algorithm

    plan = make_plan(config_from(TWO_STEP, [f"qmix.mixer={mixer}", "runtime=inline", *overrides]))
    [policy] = plan.policies
    algo = make_algorithm(policy.obs_space, policy.action_space, plan.cfg, 0, state_space=policy.state_space, agents=2)
    return algo, replay_spec(plan, 0)


def _team_batch(spec: ReplaySpec, n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    batch = {name: np.zeros(f.shape, f.dtype) for name, f in spec.batch_fields(n).items()}
    for name in ("obs", "state"):
        batch[name][...] = rng.random(batch[name].shape)
    batch["actions"][...] = rng.integers(0, 2, batch["actions"].shape)
    batch["rewards"][...] = rng.normal(size=batch["rewards"].shape)
    batch["alive"][...] = True
    batch["weights"][...] = 1.0
    batch["keys"][...] = np.arange(n)
    return batch


@pytest.mark.parametrize("mixer", ["qmix", "vdn"])
def test_what_a_dead_agent_observed_did_and_was_paid_changes_nothing_in_the_team_loss(mixer):
    """Agent 1 has left in some steps: whatever its columns hold there, the team's loss is the same."""
    first, spec = _learner(mixer)
    second, _ = _learner(mixer)
    batch = _team_batch(spec, 8, 0)
    assert batch["obs"].shape[2] == 2 and batch["state"].shape[:3] == batch["obs"].shape[:3]
    batch["alive"][1:, :4, 1] = False  # agent 1 of items 0-3 leaves after step 0
    batch["terminated"][0, :4, 1] = True
    other = {k: v.copy() for k, v in batch.items()}
    rng = np.random.default_rng(1)
    dead = ~other["alive"][:, :, 1]
    other["actions"][:, :, 1] = np.where(dead, 1 - other["actions"][:, :, 1], other["actions"][:, :, 1])
    other["rewards"][:, :, 1] = np.where(dead, 100.0, other["rewards"][:, :, 1])
    other["obs"][1:, :, 1] = np.where(
        dead[:, :, None], rng.random(other["obs"][1:, :, 1].shape), other["obs"][1:, :, 1]
    )
    a, b = first.train(batch, 0.0), second.train(other, 0.0)
    assert a.stats["loss"] == pytest.approx(b.stats["loss"], rel=1e-6)
    np.testing.assert_allclose(a.priorities.values, b.priorities.values, rtol=1e-6)


def test_the_mixer_reads_states_standardized_from_the_first_batch_on():
    """The mixer folds a batch's states into its running statistics before it mixes with them: a first batch whose
    states are scaled and shifted gives the same team values, and so the same loss, as the plain one."""
    first, spec = _learner()
    second, _ = _learner()
    batch = _team_batch(spec, 8, 0)
    scaled = {k: v.copy() for k, v in batch.items()}
    scaled["state"] = batch["state"] * 1000.0 + 5.0
    a, b = first.train(batch, 0.0), second.train(scaled, 0.0)
    assert a.stats["loss"] == pytest.approx(b.stats["loss"], rel=1e-4)
    assert float(second.target_mixer.normalizer.mean.mean()) == pytest.approx(
        float(second.mixer.normalizer.mean.mean())
    )


def test_the_team_reward_and_episode_ends_equal_a_plain_loop():
    """The team is paid the sum (or mean) of its living agents' rewards; its episode ends at a step after which no agent
    goes on, truncated where any agent's was; an agent that ended while the other goes on ends nothing."""
    algo, _ = _learner()
    rng = np.random.default_rng(3)
    L, n = 6, 50
    batch = {
        "rewards": rng.normal(size=(L, n, 2)).astype(np.float32),
        "terminated": rng.random((L, n, 2)) < 0.2,
        "truncated": rng.random((L, n, 2)) < 0.1,
        "alive": rng.random((L, n, 2)) < 0.8,
    }
    for share in ("sum", "mean"):
        algo.cfg = dataclasses.replace(algo.cfg, team_reward=share)
        rewards, terminated, truncated = algo._team_steps(batch)
        for t in range(L):
            for i in range(n):
                paid = [float(batch["rewards"][t, i, a]) for a in range(2) if batch["alive"][t, i, a]]
                want = sum(paid) if share == "sum" else sum(paid) / max(len(paid), 1)
                assert rewards[t, i] == pytest.approx(want, rel=1e-5, abs=1e-6)
                ends = [bool(batch["terminated"][t, i, a] or batch["truncated"][t, i, a]) for a in range(2)]
                over = all(ends[a] or not batch["alive"][t, i, a] for a in range(2)) and any(ends)
                cut = over and bool(batch["truncated"][t, i].any())
                assert (terminated[t, i], truncated[t, i]) == (over and not cut, cut)


def test_standardized_team_rewards_use_the_statistics_of_every_step_taken_so_far_and_resume_with_them():
    """``standardize_rewards``: each batch's team rewards less the mean, over the std, of every team reward of a
    step some agent took, in this batch and those before (not of steps no agent took); a learner restored from
    the checkpoint standardizes the next batch as the one that went on."""
    algo, _ = _learner()
    rng = np.random.default_rng(4)
    seen = []
    for _ in range(3):
        rewards = (rng.random((5, 8)) < 0.1).astype(np.float32) * 0.5  # sparse, as LBF's
        steps = rng.random((5, 8)) < 0.9
        seen.append(rewards[steps])
        got = algo._standardized(rewards, steps)
        everything = np.concatenate(seen).astype(np.float64)
        want = (rewards - everything.mean()) / everything.std()  # up to the statistics' tiny prior count
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    restored, _ = _learner()
    restored.load_state_dict(algo.state_dict())
    rewards, steps = rng.random((5, 8)).astype(np.float32), np.ones((5, 8), bool)
    np.testing.assert_array_equal(restored._standardized(rewards, steps), algo._standardized(rewards, steps))
    # the team's rewards the targets are made of: the living agents' sums, standardized over the steps some took
    batch = {
        "rewards": rng.random((5, 8, 2)).astype(np.float32),
        "terminated": np.zeros((5, 8, 2), bool),
        "truncated": np.zeros((5, 8, 2), bool),
        "alive": rng.random((5, 8, 2)) < 0.7,
    }
    plain, _ = _learner()
    sums = plain._team_steps(batch)[0]
    on, _ = _learner("qmix", "qmix.standardize_rewards=true")
    taken = batch["alive"].any(axis=-1)
    np.testing.assert_allclose(on._team_steps(batch)[0], plain._standardized(sums, taken), rtol=1e-6)


def test_a_population_member_takes_new_settings_live_and_only_those_its_trainer_can():
    """``reconfigure``: Adam's step and epsilon, the clip's threshold and the targets' discount change at once: the
    next update is the one a learner built with those settings makes. Settings the actors read (exploration) are
    refused for a population in one line."""
    from srl.api.config import config_from
    from srl.runtime.plan import make_plan

    algo, spec = _learner()
    batch = _team_batch(spec, 8, 0)
    algo.reconfigure(dataclasses.replace(algo.cfg, lr=0.125, adam_eps=0.25, max_grad_norm=0.5, gamma=0.5))
    assert (algo.optimizer.lr, algo.optimizer.eps, algo.clipper.max_norm) == (0.125, 0.25, 0.5)
    built, _ = _learner("qmix", "qmix.lr=0.125", "qmix.adam_eps=0.25", "qmix.max_grad_norm=0.5", "qmix.gamma=0.5")
    got, want = algo.train(batch, 0.0), built.train(batch, 0.0)
    assert got.stats == pytest.approx(want.stats) and got.stats["target_mean"] != pytest.approx(
        _learner()[0].train(batch, 0.0).stats["target_mean"]
    )
    for a, b in zip(algo.q.parameters(), built.q.parameters()):
        torch.testing.assert_close(a, b)
    population = {"members": 2, "hyperparameters": [{"key": "qmix.epsilon_end", "min": 0.01, "max": 0.1}]}
    with pytest.raises(
        ConfigError, match=r"^population\.hyperparameters\[0\]\.key: qmix\.epsilon_end: qmix takes only "
    ):
        make_plan(config_from({**TWO_STEP, "population": population}, ["runtime=inline"]))


@pytest.mark.slow
def test_pbt_over_qmix_brings_the_member_that_cannot_learn_to_the_payoff_of_8_by_a_copy(tmp_path):
    """Two QMIX teams on the two-step game, one with a learning rate too small to learn: scored by greedy
    episodes, it copies the other (networks, mixer, Adam) and a perturbed learning rate, and plays 8 too."""
    import json

    import srl

    lr = {"key": "qmix.lr", "min": 1e-8, "max": 0.1, "log": True, "initial": [0.005, 1e-8], "resample": 0.0}
    population = {"members": 2, "interval": 3000, "score": "eval", "eval_episodes": 5, "hyperparameters": [lr]}
    run = tmp_path / "run"
    summary = srl.train(
        {**TWO_STEP, "population": population}, ["runtime=inline", "run.total_env_steps=20000"], run_dir=run
    )
    assert "error" not in summary, summary.get("error")
    lineage = [json.loads(line) for line in (run / "population.jsonl").read_text().splitlines()]
    assert any(r["event"] == "exploit" and (r["target"], r["source"]) == (1, 0) for r in lineage), lineage
    assert any(r["event"] == "explore" and r["target"] == 1 and r["new"]["qmix.lr"] > 1e-3 for r in lineage)
    returns = {name: p["final_eval_return_mean"] for name, p in summary["policies"].items()}
    assert returns == pytest.approx({"member0": 8.0, "member1": 8.0}, abs=0.01)


def test_settings_and_envs_qmix_cannot_learn_are_one_line():
    from srl.api.config import config_from
    from srl.runtime.plan import make_plan

    def plan(*overrides: str, **sections):
        return make_plan(config_from({**TWO_STEP, **sections}, ["runtime=inline", *overrides]))

    cases = [
        (
            {"env": {"id": "srl.envs.turns:game", "kwargs": {"name": "tic_tac_toe"}}},
            r"^env\.id: 'srl\.envs\.turns:game' is a game of 2 opposing players",
        ),
        (
            {"agents": [{"match": "agent_0", "policy": "a"}, {"match": "agent_1", "policy": "b"}]},
            r"^agents: qmix learns one team's value, and the agents rules map its agents to 2 policies \(a, b\)",
        ),
        (
            {"env": {"id": "mpe2.simple_spread_v3:parallel_env", "kwargs": {"N": 2, "continuous_actions": True}}},
            r"^algorithm: qmix needs a Discrete action space",
        ),
    ]
    for sections, message in cases:
        with pytest.raises(ConfigError, match=message):
            plan("qmix.critic_input=obs", **sections)
    with pytest.raises(ConfigError, match=r"^qmix\.critic_input: state: env 'CartPole-v1' has no global state"):
        plan(env={"id": "CartPole-v1"})
    with pytest.raises(ConfigError, match=r"^env\.id: 'CartPole-v1' has one agent; qmix mixes"):
        plan("qmix.critic_input=obs", env={"id": "CartPole-v1"})
    with pytest.raises(ConfigError, match=r"^model\.core: qmix learns a recurrent Q network; set model\.core"):
        plan("model.core=none")
    with pytest.raises(ConfigError, match=r"^qmix\.burn_in: 2 steps leave none of each sequence"):
        plan("qmix.burn_in=2")
    with pytest.raises(ConfigError, match=r"^qmix\.mixing_embed: must be >= 1, got 0"):
        plan("qmix.mixing_embed=0")
