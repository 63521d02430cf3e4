"""R2D2: the value rescaling and its inverse, in-sequence n-step targets against a plain loop, sequence
priorities, burn-in without gradient, the replay's sequence items (the actor's stored state reaching the batch
bit-exact, overlapping by the stride), the learner step, the checks, and masked CartPole learned with memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from srl.algorithms.r2d2 import R2D2
from srl.algorithms.r2d2_math import inverse_value_rescale, sequence_priority, sequence_targets, value_rescale
from srl.api.config import ConfigError, ExperimentConfig, ReplayConfig, build, load_config
from srl.api.schema import MEMORY, FieldSpec
from srl.nets.memory import Sequences
from srl.runtime.plan import make_plan
from srl.runtime.train import train
from srl.replay.spec import ReplaySpec
from srl.replay.store import ReplayStore
from srl.system.streams import PoolLayout
from srl.wiring import NetModels, make_algorithm

OBS = spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
ACT = spaces.Discrete(3)


# --------------------------------------------------------------------------- the math


def test_value_rescaling_matches_its_formula_and_inverts() -> None:
    x = torch.tensor([-1000.0, -3.0, -0.5, 0.0, 0.25, 8.0, 500.0], dtype=torch.float64)
    for eps in (0.0, 1e-3, 0.1):
        expected = torch.tensor([np.sign(v) * (np.sqrt(abs(v) + 1) - 1) + eps * v for v in x.tolist()], dtype=x.dtype)
        assert torch.allclose(value_rescale(x, eps), expected, rtol=0, atol=1e-12)
        assert torch.allclose(inverse_value_rescale(value_rescale(x, eps), eps), x, rtol=1e-9, atol=1e-9)
    assert value_rescale(torch.tensor(3.0), 0.0) == 1.0  # sqrt(4) - 1


def _loop_targets(
    rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, values: np.ndarray, gamma: float, n: int
) -> np.ndarray:
    """The in-sequence n-step targets, step by step: sum up to n rewards, stopping at an episode's end or the
    sequence's; bootstrap from the row after the last step, nothing after a terminal, and at a time limit from
    the truncated step's own row with that step's reward dropped (its own row and r + gamma V there for m = 1)."""
    L, N = rewards.shape
    out = np.zeros((L, N))
    for j in range(N):
        for t in range(L):
            g, m = 0.0, 0
            while True:
                g += gamma**m * rewards[t + m, j]
                m += 1
                if terminated[t + m - 1, j]:
                    out[t, j] = g
                    break
                if truncated[t + m - 1, j]:
                    if m == 1:
                        out[t, j] = g + gamma * values[t, j]
                    else:
                        g -= gamma ** (m - 1) * rewards[t + m - 1, j]
                        out[t, j] = g + gamma ** (m - 1) * values[t + m - 1, j]
                    break
                if m == n or t + m == L:
                    out[t, j] = g + gamma**m * values[t + m, j]
                    break
    return out


@pytest.mark.parametrize("n", [1, 3, 5, 9])
def test_sequence_targets_match_a_plain_loop(n: int) -> None:
    rng = np.random.default_rng(n)
    L, N, gamma = 7, 40, 0.9
    rewards = rng.normal(size=(L, N)).astype(np.float32)
    ends = rng.random((L, N))
    terminated, truncated = ends < 0.1, (ends >= 0.1) & (ends < 0.2)
    values = rng.normal(size=(L + 1, N))
    got = sequence_targets(rewards, terminated, truncated, torch.tensor(values, dtype=torch.float32), gamma, n)
    np.testing.assert_allclose(got.numpy(), _loop_targets(rewards, terminated, truncated, values, gamma, n), atol=1e-5)
    h = sequence_targets(rewards, terminated, truncated, value_rescale(torch.tensor(values), 1e-3), gamma, n, 1e-3)
    raw = _loop_targets(rewards, terminated, truncated, values, gamma, n)
    np.testing.assert_allclose(h.numpy(), value_rescale(torch.tensor(raw), 1e-3).numpy(), atol=1e-5)


def test_sequence_priority_mixes_the_max_and_the_mean_of_the_counted_steps() -> None:
    td = torch.tensor([[1.0, 4.0, 2.0], [3.0, 0.0, 9.0], [2.0, 2.0, 5.0]])  # [T=3, N=3]
    weight = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    got = sequence_priority(td, weight, 0.9)
    # column 0: max 3, mean 2; column 1: max 4, mean 2 (its third step not counted); column 2: no step counted
    assert torch.allclose(got, torch.tensor([0.9 * 3 + 0.1 * 2, 0.9 * 4 + 0.1 * 2, 0.0]))
    assert torch.allclose(sequence_priority(td, torch.ones_like(td), 0.0), td.mean(dim=0))


# --------------------------------------------------------------------------- the network


def _cfg(**settings: Any) -> ExperimentConfig:
    replay = {"item_length": settings.pop("item_length", 6), "item_stride": settings.pop("item_stride", 1)}
    return build(
        ExperimentConfig,
        {
            "algorithm": "r2d2",
            "model": {"hidden": [16], "activation": "relu", "core": "lstm", "core_size": 8, "normalize_obs": False},
            "r2d2": {"burn_in": 2, **settings},
            "replay": replay,
        },
    )


def test_burn_in_leaves_no_gradient_on_its_steps() -> None:
    q = NetModels(OBS, ACT, _cfg()).q(dueling=True)
    L, n, burn_in = 6, 4, 2
    x = torch.randn((L * n, 2), requires_grad=True)
    seq = Sequences(torch.randn(n, q.memory_size), torch.zeros(L, n, dtype=torch.bool))
    q.unroll({"obs": x}, seq, burn_in).sum().backward()
    assert x.grad is not None
    grad = x.grad.reshape(L, n, 2)
    assert torch.count_nonzero(grad[:burn_in]) == 0  # the burn-in only rebuilds the state
    assert bool((grad[burn_in:].abs().sum(dim=-1) > 0).all())
    params = list(q.encoder.parameters())
    q.zero_grad()
    q.unroll({"obs": x.detach()}, seq, burn_in)[: burn_in * n].sum().backward()  # Q of burn-in rows alone
    assert all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in params)


def test_acting_carries_the_state_and_the_unroll_reproduces_it() -> None:
    """The acting policy's states, step by step, are what an unroll from the first one computes: the state a
    sequence stores is the one the learner resumes from."""
    algo = make_algorithm(OBS, ACT, _cfg(), seed=0)
    policy = R2D2.acting_policy(_context())
    policy.load_flat(algo.policy_state())
    (field,) = policy.output_fields()
    assert field.name == MEMORY and field.shape == (16,)  # an LSTM's h and c
    rng = np.random.default_rng(0)
    state = np.zeros((3, 16), np.float32)
    obs = rng.normal(size=(5, 3, 2)).astype(np.float32)
    actions = []
    for t in range(5):
        out = policy.act({"obs": obs[t], MEMORY: state})
        actions.append(out["actions"])
        state = out[MEMORY]
    seq = Sequences(torch.zeros(3, 16), torch.zeros(5, 3, dtype=torch.bool))
    with torch.no_grad():
        q = algo.q.unroll({"obs": torch.from_numpy(obs.reshape(15, 2))}, seq).reshape(5, 3, -1)
    np.testing.assert_array_equal(q.argmax(dim=-1).numpy(), np.stack(actions))


def _context() -> Any:
    from srl.wiring import context

    return context(OBS, ACT, _cfg(), seed=0)


# --------------------------------------------------------------------------- the replay's sequences


def _layout(T: int, B: int, state: int) -> PoolLayout:
    fields = {
        "obs": FieldSpec((T + 1, B, 2), "float32"),
        "actions": FieldSpec((T, B), "int64"),
        "rewards": FieldSpec((T, B), "float32"),
        "terminated": FieldSpec((T, B), "bool"),
        "truncated": FieldSpec((T, B), "bool"),
        "final_obs": FieldSpec((T, B, 2), "float32"),
        MEMORY: FieldSpec((T + 1, B, state), "float32"),
        "version": FieldSpec((T, B), "int64"),
    }
    return PoolLayout(1, 1, fields, obs_fields=("obs",))


def test_a_sequence_carries_the_actor_s_stored_state_bit_exact() -> None:
    T, B, L, stride, S = 12, 3, 6, 3, 5
    cfg = ReplayConfig(max_size=1000, min_size=1, error_buffer=1e9, item_length=L, item_stride=stride)
    spec = ReplaySpec.of(_layout(T, B, S), cfg, 64)
    assert spec.sequences and spec.items_per_chunk == 3  # starts 0, 3, 6
    rng = np.random.default_rng(0)
    segment = {name: rng.normal(size=f.shape).astype(f.dtype) for name, f in spec.fields.items() if f.dtype != "bool"}
    segment |= {name: rng.random(f.shape) < 0.1 for name, f in spec.fields.items() if f.dtype == "bool"}
    segment[MEMORY][...] = rng.normal(size=segment[MEMORY].shape) * 1e6 + 1e-7  # any float32 comes through as is
    batch = {name: np.zeros(f.shape, f.dtype) for name, f in spec.batch_fields(64).items()}
    assert batch["obs"].shape == (L + 1, 64, 2) and batch[MEMORY].shape == (64, S)
    store = ReplayStore.in_process(spec)
    store.insert(segment)
    store.sample_into(batch, np.random.default_rng(1), n=5, gamma=0.99)
    starts = set()
    for i, key in enumerate(batch["keys"]):
        column, item = divmod(int(key), spec.items_per_chunk)
        s = item * stride
        starts.add(s)
        assert batch[MEMORY][i].tobytes() == segment[MEMORY][s, column].tobytes()
        np.testing.assert_array_equal(batch["obs"][:, i], segment["obs"][s : s + L + 1, column])
        for name in ("actions", "rewards", "terminated", "truncated"):
            np.testing.assert_array_equal(batch[name][:, i], segment[name][s : s + L, column])
    assert starts == {0, 3, 6}


def test_a_stride_that_leaves_steps_unsampled_is_one_line() -> None:
    cfg = ReplayConfig(max_size=1000, item_length=6, item_stride=4)
    with pytest.raises(ConfigError, match=r"^replay\.item_stride: items of 6 steps every 4 steps leave the last 2"):
        ReplaySpec.of(_layout(12, 3, 5), cfg, 64)
    with pytest.raises(ConfigError, match=r"^replay\.item_stride: must be in \[1, item_length=6\]"):
        build(ExperimentConfig, {"replay": {"item_length": 6, "item_stride": 7}})


# --------------------------------------------------------------------------- the learner step


def _batch(seed: int = 0, n: int = 8, length: int = 6, state: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ends = rng.random((length, n))
    return {
        "obs": rng.normal(size=(length + 1, n, 2)).astype(np.float32),
        "actions": rng.integers(0, 3, (length, n)),
        "rewards": rng.normal(size=(length, n)).astype(np.float32),
        "terminated": ends < 0.1,
        "truncated": (ends >= 0.1) & (ends < 0.15),
        MEMORY: rng.normal(size=(n, state)).astype(np.float32) * 0.1,
        "weights": np.ones(n, np.float32),
        "keys": np.arange(n, dtype=np.int64),
    }


def test_training_on_a_fixed_batch_lowers_the_loss_and_hands_back_sequence_priorities() -> None:
    algo = make_algorithm(OBS, ACT, _cfg(lr=0.01), seed=0)
    batch = _batch()
    first = algo.train(batch, 0.0)
    for _ in range(60):
        last = algo.train(batch, 0.0)
    assert last.stats["loss"] < 0.2 * first.stats["loss"]
    assert first.priorities is not None and first.priorities.values.shape == (8,)
    assert (first.priorities.values > 0).all()


def test_the_stored_state_is_what_the_unroll_starts_from_unless_zero_state_is_asked() -> None:
    batch = _batch()
    stored = make_algorithm(OBS, ACT, _cfg(), seed=0).train(batch, 0.0).stats["loss"]
    zero = make_algorithm(OBS, ACT, _cfg(stored_state=False), seed=0).train(batch, 0.0).stats["loss"]
    blank = make_algorithm(OBS, ACT, _cfg(), seed=0).train({**batch, MEMORY: 0 * batch[MEMORY]}, 0.0).stats["loss"]
    assert zero == blank and stored != zero


def test_a_column_that_sat_idle_keeps_its_state_and_weighs_nothing() -> None:
    """A turn-based env's batch: where a column's agent did not act, the unroll keeps its state (as the actor
    carried it) and the step's TD error is not trained on, nor part of the priority."""
    algo = make_algorithm(OBS, ACT, _cfg(), seed=0)
    batch = _batch()
    batch["alive"] = np.ones((6, 8), bool)
    batch["alive"][3:, 0] = False  # column 0 waits from step 3 on
    seq = algo._sequences(batch)
    assert seq.idle is not None and seq.idle[:, 0].tolist() == [False] * 3 + [True] * 3 + [False]
    assert not bool(seq.idle[:, 1:].any())
    result = algo.train(batch, 0.0)
    everyone = make_algorithm(OBS, ACT, _cfg(), seed=0).train({**batch, "alive": np.ones((6, 8), bool)}, 0.0)
    assert result.priorities is not None and everyone.priorities is not None
    assert result.priorities.values[0] != everyone.priorities.values[0]


# --------------------------------------------------------------------------- checks


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model": {"core": "none"}}, r"^model\.core: r2d2 learns a recurrent Q network; set model\.core to lstm"),
        ({"r2d2": {"burn_in": 6}}, r"^r2d2\.burn_in: 6 steps leave none of each sequence \(replay\.item_length=6\)"),
    ],
)
def test_what_r2d2_cannot_learn_from_is_one_line(overrides: dict[str, Any], message: str) -> None:
    base = {
        "algorithm": "r2d2",
        "model": {"core": "lstm"},
        "r2d2": {"burn_in": 2},
        "replay": {"item_length": 6},
        "workers": {"segment_length": 12},
    }
    merged = {k: {**v, **overrides.get(k, {})} if isinstance(v, dict) else v for k, v in base.items()}
    cfg = build(ExperimentConfig, merged)
    with pytest.raises(ConfigError, match=message):
        make_plan(cfg)
    make_plan(build(ExperimentConfig, base))  # the base passes


def test_r2d2_on_box_actions_is_one_line() -> None:
    cfg = build(ExperimentConfig, {"algorithm": "r2d2", "env": {"id": "Pendulum-v1"}, "model": {"core": "gru"}})
    with pytest.raises(ConfigError, match=r"^algorithm: r2d2 needs a Discrete action space; env 'Pendulum-v1' has Box"):
        make_plan(cfg)


# --------------------------------------------------------------------------- learning


@pytest.mark.slow
def test_masked_cartpole_is_learned_with_memory(tmp_path: Path) -> None:
    """The shipped config under the inline runtime: with its velocities hidden, CartPole needs memory (a
    feed-forward Q network stays near 50); R2D2 reaches a mean of 200 over 20 episodes within 120k env steps."""
    overrides = ["runtime=inline", "run.target_return=200", "run.total_env_steps=120000"]
    summary = train(load_config("configs/cartpole_masked_r2d2.yaml", overrides), tmp_path / "run", progress=None)
    assert summary["solved"], summary
