"""DQN: the update on hand-built replay batches (targets, priorities, weights, target network), greedy acting,
the actors' epsilon-greedy exploration, and the checks that need the env."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from srl.algorithms.dqn import DQN, EpsilonGreedy, QPolicy, require_discrete
from srl.algorithms.dqn_math import epsilon_ladder, linear_epsilon
from srl.api.config import ConfigError, ExperimentConfig, build
from srl.api.explore import make_explorer
from srl.runtime.plan import make_plan
from srl.wiring import context, make_algorithm

OBS = spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float32)
ACT = spaces.Discrete(3)
MASKED = spaces.Dict({"action_mask": spaces.MultiBinary(3), "x": spaces.Box(-1.0, 1.0, (4,), np.float32)})


def _cfg(**dqn: Any) -> ExperimentConfig:
    return build(
        ExperimentConfig,
        {"algorithm": "dqn", "model": {"hidden": [16], "activation": "relu", "normalize_obs": False}, "dqn": dqn},
    )


def _dqn(obs_space: spaces.Space = OBS, seed: int = 0, collective: Any = None, **dqn: Any) -> DQN:
    algo = make_algorithm(obs_space, ACT, _cfg(**dqn), seed=seed, collective=collective)
    assert isinstance(algo, DQN)
    return algo


def _batch(seed: int = 0, n: int = 16, length: int = 1) -> dict[str, np.ndarray]:
    """A replay batch as the replay hands it: items of ``length`` steps, terminal discounts among them."""
    rng = np.random.default_rng(seed)
    discounts = np.where(rng.random((length, n)) < 0.25, 0.0, 0.99**3).astype(np.float32)
    return {
        "obs": rng.normal(size=(length, n, 4)).astype(np.float32),
        "boot_obs": rng.normal(size=(length, n, 4)).astype(np.float32),
        "actions": rng.integers(0, 3, (length, n)),
        "returns": rng.normal(size=(length, n)).astype(np.float32),
        "discounts": discounts,
        "weights": np.ones(n, np.float32),
        "keys": rng.permutation(1000)[:n].astype(np.int64),
    }


def _q(net: Any, x: np.ndarray) -> torch.Tensor:
    with torch.no_grad():
        return net({"obs": torch.from_numpy(x)})


def _params(net: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


# --------------------------------------------------------------------------- the update


def test_training_on_a_fixed_batch_lowers_the_td_loss() -> None:
    algo = _dqn(target_every=10_000, lr=1e-2)  # the target stays put: a regression on fixed targets
    batch = _batch()
    losses = [algo.train(batch, 0.0).stats["loss"] for _ in range(200)]
    assert losses[-1] < 0.05 * losses[0]


@pytest.mark.parametrize("double_q", [True, False])
def test_priorities_are_the_td_errors_of_the_hand_computed_target(double_q: bool) -> None:
    """Double Q: the online net picks the bootstrap action and the target net values it; plain DQN: the target
    net does both. Priorities are ``|td|`` before the step, keyed by the batch's keys in their order."""
    algo = _dqn(double_q=double_q, target_every=10_000)
    with torch.no_grad():  # a target net unlike the online one, so the two argmaxes differ on some rows
        for p in algo.target.parameters():
            p.add_(torch.randn_like(p))
    batch = _batch(seed=3, n=64)
    obs, boot = batch["obs"][0], batch["boot_obs"][0]
    online_next, target_next = _q(algo.q, boot), _q(algo.target, boot)
    assert (online_next.argmax(1) != target_next.argmax(1)).any()
    best = (online_next if double_q else target_next).argmax(1)
    target = torch.from_numpy(batch["returns"][0]) + torch.from_numpy(batch["discounts"][0]) * target_next.gather(
        1, best[:, None]
    ).squeeze(1)
    taken = _q(algo.q, obs).gather(1, torch.from_numpy(batch["actions"][0])[:, None]).squeeze(1)
    result = algo.train(batch, 0.0)
    assert result.priorities is not None
    np.testing.assert_array_equal(result.priorities.keys, batch["keys"])
    np.testing.assert_allclose(result.priorities.values, (target - taken).abs().numpy(), rtol=1e-5, atol=1e-6)


def test_an_item_of_several_steps_gets_its_largest_td_error() -> None:
    algo = _dqn(target_every=10_000)
    batch = _batch(seed=4, n=8, length=3)
    rows = {k: v.reshape(24, *v.shape[2:]) for k, v in batch.items() if k not in ("weights", "keys")}
    one = _dqn(target_every=10_000)  # the same weights (seed), handed the 24 steps as items of one step
    flat = {**{k: v[None] for k, v in rows.items()}, "weights": np.ones(24, np.float32), "keys": np.arange(24)}
    per_step = one.train(flat, 0.0).priorities
    result = algo.train(batch, 0.0).priorities
    assert per_step is not None and result is not None
    np.testing.assert_allclose(result.values, per_step.values.reshape(3, 8).max(axis=0), rtol=1e-6)


def test_importance_weights_scale_each_item_s_loss() -> None:
    batch = _batch(seed=5)
    plain = _dqn().train(batch, 0.0)
    weights = np.linspace(0.0, 2.0, 16, dtype=np.float32)
    weighted = _dqn().train({**batch, "weights": weights}, 0.0)
    assert plain.priorities is not None and weighted.priorities is not None
    td = plain.priorities.values.astype(np.float64)  # identical nets: identical TD errors
    huber = np.where(td < 1.0, 0.5 * td**2, td - 0.5)
    assert plain.stats["loss"] == pytest.approx(huber.mean(), rel=1e-5)
    assert weighted.stats["loss"] == pytest.approx((weights * huber).mean(), rel=1e-5)


def test_the_hard_copy_comes_exactly_every_target_every_learner_steps() -> None:
    algo = _dqn(target_update="hard", target_every=3)
    first = _params(algo.target)
    copies = []
    for step in range(1, 8):
        before = _params(algo.target)
        algo.train(_batch(seed=step), 0.0)
        copied = _same(_params(algo.target), _params(algo.q))
        copies.append(copied)
        if not copied:
            assert _same(_params(algo.target), before)
    assert copies == [False, False, True, False, False, True, False]
    assert not _same(_params(algo.target), first)


def test_polyak_moves_the_target_a_fraction_tau_towards_the_online_net() -> None:
    algo = _dqn(target_update="polyak", tau=0.25)
    for step in range(3):
        target = _params(algo.target)
        algo.train(_batch(seed=step), 0.0)
        for t_old, o_new, t_new in zip(target, _params(algo.q), _params(algo.target)):
            torch.testing.assert_close(t_new, t_old + 0.25 * (o_new - t_old))


def test_a_checkpoint_restores_the_nets_the_optimizer_and_the_step_count() -> None:
    algo = _dqn(target_every=2)
    for step in range(3):
        algo.train(_batch(seed=step), 0.0)
    again = _dqn(seed=9, target_every=2)
    again.load_state_dict(algo.state_dict())
    assert again.learner_steps == 3
    a, b = algo.train(_batch(seed=7), 0.0), again.train(_batch(seed=7), 0.0)
    assert a.stats == b.stats  # the fourth step copies the target in both
    np.testing.assert_array_equal(algo.policy_state(), again.policy_state())
    assert _same(_params(again.target), _params(again.q))


def test_observation_statistics_move_after_the_step_and_the_target_copies_them() -> None:
    """The target copies the statistics its weights were trained with: those from before the step."""
    cfg = build(ExperimentConfig, {"algorithm": "dqn", "model": {"hidden": [8]}, "dqn": {"target_every": 1}})
    algo = make_algorithm(OBS, ACT, cfg, seed=0)
    assert isinstance(algo, DQN)
    for step in range(2):
        batch = _batch(seed=step)
        batch["obs"] = batch["obs"] * 3.0 + 5.0
        before = [b.clone() for b in algo.q.buffers()]
        algo.train(batch, 0.0)
        rms = algo.q.encoder.obs_normalizer
        assert rms is not None and float(rms.mean.mean()) > 1.0  # folded in: about 5 after one batch
        assert _same(list(algo.target.buffers()), before)
        assert not _same(list(algo.q.buffers()), before)


def _replica(rank: int, store: str, out: str) -> None:
    """One of two data-parallel DQN trainers: different initial weights and data, one reduced gradient."""
    from srl.system.collective import TorchCollective

    torch.set_num_threads(1)
    coll = TorchCollective(rank, 2, f"file://{store}", timeout=30.0)
    coll.connect()
    try:
        algo = _dqn(seed=10 + rank, collective=coll, target_every=2)
        algo.synchronize()
        for i in range(3):
            algo.train(_batch(seed=100 * rank + i), 0.0)
        np.savez(f"{out}/rank{rank}.npz", q=algo.policy_state(), target=algo.target.flat_state())
    finally:
        coll.close()


@pytest.mark.slow
def test_data_parallel_replicas_stay_identical(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_replica, args=(r, str(tmp_path / "store"), str(tmp_path))) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    r0, r1 = (np.load(tmp_path / f"rank{r}.npz", allow_pickle=False) for r in (0, 1))
    np.testing.assert_array_equal(r0["q"], r1["q"])  # rank 0's start, then identical reduced gradients
    np.testing.assert_array_equal(r0["target"], r1["target"])
    assert not np.array_equal(r0["q"], _dqn(seed=10).policy_state())  # and they did learn


# --------------------------------------------------------------------------- acting


def _policy(obs_space: spaces.Space = OBS) -> QPolicy:
    return DQN.acting_policy(context(obs_space, ACT, _cfg()))


def test_acting_is_greedy_and_never_explores() -> None:
    """What eval workers and ``srl.load_policy`` run: the argmax, sampled or not, every time."""
    policy = _policy()
    policy.load_flat(_dqn(seed=2).policy_state())
    x = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    best = _q(policy.net, x).argmax(1).numpy()
    for deterministic in (False, True, False):
        np.testing.assert_array_equal(policy.act({"obs": x}, deterministic)["actions"], best)
    assert policy.output_fields() == ()
    np.testing.assert_array_equal(policy.flat_state(), _dqn(seed=2).policy_state())


def test_greedy_acting_respects_an_action_mask() -> None:
    policy = _policy(MASKED)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(512, 4)).astype(np.float32)
    with torch.no_grad():
        q = policy.net({"obs.x": torch.from_numpy(x), "obs.action_mask": torch.ones(512, 3, dtype=torch.int8)})
    mask = np.ones((512, 3), np.int8)
    mask[np.arange(512), q.argmax(1).numpy()] = 0  # the unmasked favourite is illegal everywhere
    mask[:8] = 0  # rows with no legal action at all pick among every action
    actions = policy.act({"obs.x": x, "obs.action_mask": mask})["actions"]
    assert mask[np.arange(8, 512), actions[8:]].all()
    second = np.where(mask.astype(bool), q.numpy(), -np.inf).argmax(1)
    np.testing.assert_array_equal(actions[8:], second[8:])
    np.testing.assert_array_equal(actions[:8], q.argmax(1).numpy()[:8])


def test_steps_an_agent_did_not_take_weigh_nothing_and_bootstrap_from_nothing() -> None:
    """A multi-agent env's agent that left early has idle columns (``alive`` False): zero observations whose
    action mask is all zero. They must not raise (no legal bootstrap action), move the loss, or earn priority."""
    algo = make_algorithm(MASKED, ACT, _cfg(target_every=10_000), seed=0)
    batch = _batch(seed=4)
    alive = np.ones((1, 16), bool)
    alive[0, 10:] = False
    boot_mask = np.ones((1, 16, 3), np.int8)
    boot_mask[0, 10:] = 0  # a dead agent's observation: no legal action, and a discount the env never zeroed
    masked = {
        "obs.x": batch.pop("obs"),
        "boot_obs.x": batch.pop("boot_obs"),
        "obs.action_mask": np.ones((1, 16, 3), np.int8),
        "boot_obs.action_mask": boot_mask,
        "alive": alive,
        **batch,
    }
    masked["discounts"][...] = 0.99
    twin = make_algorithm(MASKED, ACT, _cfg(target_every=10_000), seed=0)
    result = algo.train(masked, 0.0)
    assert result.priorities is not None
    assert (result.priorities.values[10:] == 0).all() and (result.priorities.values[:10] > 0).all()
    living = {k: (v[:, :10] if v.ndim >= 2 else v[:10]) for k, v in masked.items() if k != "alive"}
    living["discounts"] = living["discounts"].copy()
    expected = twin.train(living, 0.0)  # the same update from the living rows alone, at their share of the mean
    assert result.stats["loss"] == pytest.approx(expected.stats["loss"] * 10 / 16, rel=1e-5)


def test_the_target_ignores_illegal_bootstrap_actions() -> None:
    algo = make_algorithm(MASKED, ACT, _cfg(double_q=True, target_every=10_000), seed=0)
    assert isinstance(algo, DQN)
    batch = _batch(seed=6)
    mask = np.zeros((1, 16, 3), np.int8)
    mask[0, :, 1] = 1  # only action 1 is legal at every bootstrap observation
    masked = {
        "obs.x": batch.pop("obs"),
        "boot_obs.x": batch.pop("boot_obs"),
        "obs.action_mask": np.ones((1, 16, 3), np.int8),
        "boot_obs.action_mask": mask,
        **batch,
    }
    boot = {"obs.x": torch.from_numpy(masked["boot_obs.x"][0]), "obs.action_mask": torch.from_numpy(mask[0])}
    obs = {"obs.x": torch.from_numpy(masked["obs.x"][0]), "obs.action_mask": torch.ones(16, 3, dtype=torch.int8)}
    with torch.no_grad():
        target = (
            torch.from_numpy(batch["returns"][0]) + torch.from_numpy(batch["discounts"][0]) * algo.target(boot)[:, 1]
        )
        taken = algo.q(obs).gather(1, torch.from_numpy(batch["actions"][0])[:, None]).squeeze(1)
    result = algo.train(masked, 0.0)
    assert result.priorities is not None
    np.testing.assert_allclose(result.priorities.values, (target - taken).abs().numpy(), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- exploration


def _explorer(
    first: int, count: int, total: int, actors: int = 1, obs_space: spaces.Space = OBS, **dqn: Any
) -> EpsilonGreedy:
    explorer = make_explorer(DQN, context(obs_space, ACT, _cfg(**dqn)), first, count, total, actors)
    assert isinstance(explorer, EpsilonGreedy)
    return explorer


def _explored(explorer: EpsilonGreedy, rounds: int, count: int, env_steps: int = 0, mask: Any = None) -> np.ndarray:
    """Which of ``count`` columns took a random action, over ``rounds`` steps (the policy answers -1)."""
    rng = np.random.default_rng(0)
    out = np.zeros((rounds, count), bool)
    obs = {} if mask is None else {"obs.action_mask": mask}
    for r in range(rounds):
        actions = np.full(count, -1, np.int64)
        explorer.explore(actions, obs, slice(0, count), env_steps, rng)
        out[r] = actions >= 0
    return out


def test_the_ladder_gives_each_run_global_column_its_ape_x_rate() -> None:
    """Actor 1 of 4 owns columns 4..7 of 16: their rates are the ladder's 4..7, fixed, whatever the steps."""
    explorer = _explorer(4, 4, 16, actors=4, epsilon="ladder", ladder_base=0.4, ladder_alpha=7.0)
    expected = epsilon_ladder(16, 0.4, 7.0)[4:8]
    for steps in (0, 10**6):
        np.testing.assert_allclose(explorer.rates(slice(0, 4), steps), expected)
    np.testing.assert_allclose(explorer.rates(slice(2, 4), 0), expected[2:])
    assert explorer.stats()["epsilon"] == pytest.approx(expected.mean())
    freq = _explored(explorer, 40_000, 4).mean(axis=0)
    # four standard deviations of a binomial frequency over 40k draws
    assert (np.abs(freq - expected) <= 4 * np.sqrt(expected * (1 - expected) / 40_000)).all(), (freq, expected)


def test_the_linear_rate_decays_over_the_run_s_env_steps() -> None:
    """Two actors: this actor's 1000 steps stand for 2000 of the run."""
    explorer = _explorer(0, 8, 16, actors=2, epsilon_start=1.0, epsilon_end=0.1, epsilon_decay_env_steps=4000)
    for steps in (0, 1000, 1500, 2000, 5000):
        assert explorer.rates(slice(0, 8), steps) == pytest.approx(linear_epsilon(2 * steps, 1.0, 0.1, 4000))
        assert explorer.stats()["epsilon"] == pytest.approx(linear_epsilon(2 * steps, 1.0, 0.1, 4000))
    assert explorer.rates(slice(0, 8), 1000) == pytest.approx(0.55)
    freq = _explored(explorer, 20_000, 8, env_steps=1000).mean()
    assert freq == pytest.approx(0.55, abs=4 * np.sqrt(0.55 * 0.45 / 160_000))


def test_random_actions_are_uniform_over_the_legal_ones_only() -> None:
    explorer = _explorer(0, 6, 6, obs_space=MASKED, epsilon_start=1.0, epsilon_end=1.0)
    mask = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 1], [0, 0, 1], [0, 0, 0], [1, 1, 0]], np.int8)
    rng = np.random.default_rng(0)
    counts = np.zeros((6, 3))
    for _ in range(6000):
        actions = np.full(6, 7, np.int64)
        explorer.explore(actions, {"obs.action_mask": mask, "obs.x": np.zeros((6, 4))}, slice(0, 6), 0, rng)
        assert actions[4] == 7  # no legal action: the policy's answer stands
        legal = np.delete(np.arange(6), 4)
        assert mask[legal, actions[legal]].all()
        counts[legal, actions[legal]] += 1
    share = counts / counts.sum(axis=1, keepdims=True).clip(min=1)
    uniform = mask / mask.sum(axis=1, keepdims=True).clip(min=1)
    np.testing.assert_allclose(share[legal], uniform[legal], atol=0.03)


def test_a_rate_of_zero_changes_no_action() -> None:
    explorer = _explorer(0, 8, 8, epsilon_start=0.0, epsilon_end=0.0)
    assert not _explored(explorer, 100, 8).any()


def test_explore_refuses_columns_that_do_not_fit() -> None:
    explorer = _explorer(0, 4, 8)
    with pytest.raises(ValueError, match="columns"):
        explorer.explore(np.zeros(4, np.int64), {}, slice(2, 6), 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="3 actions"):
        explorer.explore(np.zeros(3, np.int64), {}, slice(0, 4), 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="columns"):
        make_explorer(DQN, context(OBS, ACT, _cfg()), 6, 4, 8, 1)


def test_an_algorithm_without_an_explorer_gets_none() -> None:
    from srl.algorithms.ppo import PPO

    assert make_explorer(PPO, context(OBS, ACT, build(ExperimentConfig, {})), 0, 8, 8, 1) is None


# --------------------------------------------------------------------------- checks


def test_a_box_action_space_is_one_line_naming_it_and_the_algorithms_that_fit() -> None:
    cfg = build(ExperimentConfig, {"algorithm": "dqn", "env": {"id": "Pendulum-v1"}})
    with pytest.raises(ConfigError, match=r"^algorithm: dqn needs a Discrete action space; env 'Pendulum-v1' has Box"):
        make_plan(cfg)
    plan = make_plan(build(ExperimentConfig, {"algorithm": "ppo", "env": {"id": "Pendulum-v1"}}))
    with pytest.raises(ConfigError, match=r"Box\(.*\): use ppo, sac or td3$"):
        DQN.check(plan)


def test_an_action_space_neither_discrete_nor_box_names_ppo_alone() -> None:
    """sac and td3 act on a Box only, so naming them for a MultiDiscrete would send the user to a second error."""
    with pytest.raises(ConfigError, match=r"has MultiDiscrete\(\[2 3\]\): use ppo$"):
        require_discrete(spaces.MultiDiscrete([2, 3]), _cfg())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dqn": {"nstep": 5}, "workers": {"segment_length": 4}}, "dqn.nstep: 5-step returns are longer"),
        ({"model": {"core": "lstm"}}, "model.core: dqn has no recurrent Q network"),
    ],
)
def test_what_the_items_cannot_hold_is_refused(overrides: dict[str, Any], message: str) -> None:
    cfg = build(ExperimentConfig, {"algorithm": "dqn", **overrides})
    with pytest.raises(ConfigError, match=message):
        DQN.check(make_plan(cfg))
    DQN.check(make_plan(build(ExperimentConfig, {"algorithm": "dqn"})))  # the defaults pass


@pytest.mark.parametrize(
    ("field", "value"),
    [("lr", 0.0), ("gamma", 1.5), ("nstep", 0), ("tau", 0.0), ("epsilon_end", -0.1), ("loss", "l1")],
)
def test_bad_dqn_settings_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=rf"^dqn\.{field}"):
        build(ExperimentConfig, {"dqn": {field: value}})
