"""SAC and TD3: acting within the Box's bounds, the update on hand-built replay batches, checkpoints, the checks
that need the env, and both learning Pendulum from a replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from srl.algorithms.sac import SAC, TD3, BoxPolicy
from srl.api.config import ConfigError, ExperimentConfig, build, load_config
from srl.api.explore import make_explorer
from srl.envs.factory import make_env
from srl.runtime.plan import make_plan
from srl.runtime.train import train
from srl.wiring import NetModels, algorithm_class, context, make_algorithm

OBS = spaces.Box(-np.inf, np.inf, shape=(3,), dtype=np.float32)
ACT = spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32))


def _cfg(algorithm: str, **settings: Any) -> ExperimentConfig:
    model = {"hidden": [16], "activation": "relu", "normalize_obs": False}
    return build(ExperimentConfig, {"algorithm": algorithm, "model": model, algorithm: settings})


def _algo(algorithm: str, seed: int = 0, **settings: Any) -> Any:
    return make_algorithm(OBS, ACT, _cfg(algorithm, **settings), seed=seed)


def _batch(seed: int = 0, n: int = 32) -> dict[str, np.ndarray]:
    """A replay batch as the replay hands it: env actions within the bounds, terminal discounts among them."""
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(1, n, 3)).astype(np.float32),
        "boot_obs": rng.normal(size=(1, n, 3)).astype(np.float32),
        "actions": rng.uniform(ACT.low, ACT.high, (1, n, 2)).astype(np.float32),
        "returns": rng.normal(size=(1, n)).astype(np.float32),
        "discounts": np.where(rng.random((1, n)) < 0.25, 0.0, 0.99).astype(np.float32),
        "weights": np.ones(n, np.float32),
        "keys": np.arange(n, dtype=np.int64),
    }


@pytest.mark.parametrize("algorithm", ["sac", "td3"])
def test_acting_stays_within_any_bounds_and_deterministic_acting_is_repeatable(algorithm: str) -> None:
    cfg = _cfg(algorithm, **({"exploration_noise": 0.5} if algorithm == "td3" else {}))
    policy = (SAC if algorithm == "sac" else TD3).acting_policy(context(OBS, ACT, cfg))
    assert isinstance(policy, BoxPolicy)
    obs = {"obs": np.random.default_rng(0).normal(size=(256, 3)).astype(np.float32) * 5}
    sampled = policy.act(obs)["actions"]
    assert sampled.shape == (256, 2) and sampled.dtype == np.float32
    assert (sampled >= ACT.low).all() and (sampled <= ACT.high).all()
    first, again = policy.act(obs, deterministic=True)["actions"], policy.act(obs, deterministic=True)["actions"]
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(sampled, first)  # acting for the actors explores, evaluation does not


@pytest.mark.parametrize("algorithm", ["sac", "td3"])
def test_training_on_a_fixed_batch_lowers_the_critic_loss(algorithm: str) -> None:
    """Terminal items only: the targets are the returns themselves, which both critics must come to fit."""
    algo = _algo(algorithm, batch_size=32, critic_lr=0.01)
    batch = _batch()
    batch["discounts"][...] = 0.0
    losses = [algo.train(batch, 0.0).stats["critic_loss"] for _ in range(150)]
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])


def test_priorities_are_the_larger_td_error_of_the_two_critics() -> None:
    algo = _algo("sac")
    batch = _batch(3)
    with torch.no_grad():  # what train() computes before its step, from the same networks and the same draw
        obs = {"obs": torch.from_numpy(batch["obs"][0])}
        actions = torch.from_numpy((batch["actions"][0] - ACT.low) * 2 / (ACT.high - ACT.low) - 1)
        q1, q2 = algo.critic(obs, actions)
    torch.manual_seed(7)
    target = algo._target(
        {"obs": torch.from_numpy(batch["boot_obs"][0])},
        torch.from_numpy(batch["returns"][0]),
        torch.from_numpy(batch["discounts"][0]),
    )
    torch.manual_seed(7)
    result = algo.train(batch, 0.0)
    assert result.priorities is not None
    want = torch.maximum((q1 - target).abs(), (q2 - target).abs()).numpy()
    np.testing.assert_allclose(result.priorities.values, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(result.priorities.keys, batch["keys"])


@pytest.mark.parametrize("algorithm", ["sac", "td3"])
def test_each_network_s_gradients_are_clipped_to_its_norm(algorithm: str) -> None:
    algo = _algo(algorithm, max_grad_norm=0.5, actor_delay=1)
    stats = algo.train(_batch(), 0.0).stats
    for net in ("critic", "actor"):
        assert stats[f"clip_threshold_{net}"] == 0.5 and stats[f"grad_norm_{net}_applied"] <= 0.5


def test_steps_an_agent_did_not_take_weigh_nothing() -> None:
    algo = _algo("sac")
    batch = _batch(5)
    batch["alive"] = np.ones((1, 32), bool)
    batch["alive"][0, 20:] = False
    result = algo.train(batch, 0.0)
    assert result.priorities is not None
    assert (result.priorities.values[20:] == 0).all() and (result.priorities.values[:20] > 0).all()


def test_the_temperature_is_tuned_and_a_fixed_one_stays() -> None:
    tuned, fixed = _algo("sac"), _algo("sac", autotune=False, alpha=0.3)
    for _ in range(20):
        tuned.train(_batch(), 0.0)
        fixed.train(_batch(), 0.0)
    assert tuned.alpha != pytest.approx(0.2) and fixed.alpha == pytest.approx(0.3)


@pytest.mark.parametrize(("target", "rises"), [(10.0, True), (-10.0, False)])
def test_the_temperature_moves_toward_its_target_entropy(target: float, rises: bool) -> None:
    """An entropy target above what the policy has raises the temperature (more entropy is paid for); one below
    lowers it."""
    algo = _algo("sac", target_entropy=target, alpha_lr=0.01)
    for step in range(30):
        algo.train(_batch(step), 0.0)
    assert (algo.alpha > 0.2) == rises, algo.alpha


@pytest.mark.parametrize("algorithm", ["sac", "td3"])
def test_the_first_random_steps_act_uniformly_within_the_box(algorithm: str) -> None:
    ctx = context(OBS, ACT, _cfg(algorithm, random_steps=1000), seed=0)
    explorer = make_explorer(algorithm_class(ctx.cfg), ctx, 0, 4, 8, actors=2)
    assert explorer is not None
    rng = np.random.default_rng(0)
    drawn = []
    for _ in range(200):
        actions = np.full((4, 2), 7.0, np.float32)
        explorer.explore(actions, {"obs": np.zeros((4, 3), np.float32)}, slice(0, 4), 499, rng)  # 998 run steps
        drawn.append(actions)
    a = np.concatenate(drawn)
    assert (a >= ACT.low).all() and (a <= ACT.high).all() and explorer.stats() == {"random_actions": 1.0}
    assert abs(a[:, 1].mean() - 5.0) < 0.3 and abs(a[:, 0].mean()) < 0.15  # uniform: the middle of each bound
    policy_actions = np.full((4, 2), 7.0, np.float32)
    explorer.explore(policy_actions, {"obs": np.zeros((4, 3), np.float32)}, slice(0, 4), 500, rng)  # 1000 run steps
    assert (policy_actions == 7.0).all() and explorer.stats() == {"random_actions": 0.0}
    no_warmup = context(OBS, ACT, _cfg(algorithm), seed=0)
    assert make_explorer(algorithm_class(no_warmup.cfg), no_warmup, 0, 4, 8, actors=2) is None


def test_td3_moves_its_actor_and_targets_only_every_actor_delay_steps() -> None:
    algo = _algo("td3", actor_delay=3)
    before = [p.detach().clone() for p in (*algo.actor.parameters(), *algo.critic_target.parameters())]
    for step in range(1, 4):
        algo.train(_batch(step), 0.0)
        now = [p.detach() for p in (*algo.actor.parameters(), *algo.critic_target.parameters())]
        moved = any(not torch.equal(a, b) for a, b in zip(before, now))
        assert moved == (step == 3), step


@pytest.mark.parametrize("algorithm", ["sac", "td3"])
def test_a_checkpoint_restores_every_network_optimizer_and_the_step_count(algorithm: str) -> None:
    algo = _algo(algorithm)
    for step in range(5):
        algo.train(_batch(step), 0.0)
    fresh = _algo(algorithm, seed=9)
    fresh.load_state_dict(algo.state_dict())
    assert fresh.learner_steps == 5
    for a, b in zip(algo.state_dict().values(), fresh.state_dict().values()):
        if isinstance(a, dict) and "state" not in a:
            for key in a:
                torch.testing.assert_close(a[key], b[key])
    np.testing.assert_array_equal(fresh.policy_state(), algo.policy_state())


def test_the_env_shows_its_bounds_and_clips_what_it_is_given() -> None:
    from srl.api.config import EnvConfig

    env = make_env(EnvConfig(id="Pendulum-v1"))
    try:
        assert env.action_space == spaces.Box(-2.0, 2.0, (1,), np.float32)
        assert env.action(np.array([5.0], np.float32)).tolist() == [2.0]  # type: ignore[attr-defined]
    finally:
        env.close()


@pytest.mark.parametrize("algorithm", ["sac", "td3"])
def test_a_discrete_action_space_is_one_line_naming_it_and_what_fits(algorithm: str) -> None:
    cfg = build(ExperimentConfig, {"algorithm": algorithm, "env": {"id": "CartPole-v1"}})
    with pytest.raises(ConfigError, match=rf"^algorithm: {algorithm} needs a Box action space; env 'CartPole-v1'"):
        make_plan(cfg)


def test_an_unbounded_box_is_one_line() -> None:
    unbounded = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    cfg = _cfg("sac")
    with pytest.raises(ConfigError, match=r"^algorithm: sac maps its actions onto the Box's bounds; .* unbounded"):
        SAC.acting_policy(context(OBS, unbounded, cfg))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sac": {"nstep": 5}, "workers": {"segment_length": 4}}, "sac.nstep: 5-step returns are longer"),
        ({"model": {"core": "lstm"}}, "model.core: sac has no recurrent networks"),
        ({"sac": {"batch_size": 512}, "replay": {"max_size": 100, "min_size": 10}}, "sac.batch_size: a batch of 512"),
    ],
)
def test_what_the_items_cannot_hold_is_refused(overrides: dict[str, Any], message: str) -> None:
    cfg = build(ExperimentConfig, {"algorithm": "sac", "env": {"id": "Pendulum-v1"}, **overrides})
    with pytest.raises(ConfigError, match=message):
        make_plan(cfg)


@pytest.mark.parametrize(
    ("field", "value"), [("tau", 0.0), ("actor_delay", 0), ("alpha", -1.0), ("gamma", 1.5), ("random_steps", -1)]
)
def test_bad_sac_settings_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"sac.{field}"):
        build(ExperimentConfig, {"algorithm": "sac", "sac": {field: value}})


def test_the_critics_join_the_action_to_the_observation_s_features() -> None:
    models = NetModels(OBS, ACT, _cfg("sac"))
    twin = models.twin_q()
    obs = {"obs": torch.zeros(4, 3)}
    q_a, _ = twin(obs, torch.zeros(4, 2))
    q_b, _ = twin(obs, torch.ones(4, 2))
    assert q_a.shape == (4,) and not torch.equal(q_a, q_b)  # the action changes Q
    assert twin.q1.torso[0].in_features == 3 + 2  # features of the observation (no torso of their own) + action


@pytest.mark.slow
@pytest.mark.parametrize(("algorithm", "runtime"), [("sac", "inline"), ("sac", "local"), ("td3", "local")])
def test_pendulum_is_learned_from_a_replay(tmp_path: Path, algorithm: str, runtime: str) -> None:
    """The shipped Pendulum config: the mean of the last 20 episodes reaches -250 within 30k env steps (a random
    policy scores about -1200), and the greedy policy plays at least -400."""
    overrides = [f"runtime={runtime}", f"algorithm={algorithm}", f"{algorithm}.batch_size=128"]
    overrides += [f"{algorithm}.actor_lr=0.001", f"{algorithm}.tau=0.01"]
    summary = train(load_config("configs/pendulum_sac.yaml", overrides), tmp_path / "run", progress=None)
    assert summary["solved"] and summary["solved_env_steps"] <= 30_000, summary
    assert summary["final_eval_return_mean"] >= -400
    assert abs(summary["replays"]["replay0"]["samples_per_insert"] / 128 - 1) < 0.05
