"""Recurrent policies: the core's unroll, the state on the inference path and in segments, and learning a task
that needs memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from srl.api.config import ConfigError, build, to_dict
from srl.api.config.experiment import ExperimentConfig
from srl.api.schema import MEMORY, sample_schema
from srl.base.channel import InProcChannel
from srl.base.seqlock import VersionedBuffer
from srl.nets.memory import Recurrent, Sequences, encode
from srl.nets.mlp import mlp
from srl.system.control import DirectReporter
from srl.system.params import ParamPublisher, ParamSubscriber
from srl.system.policy_worker import PolicyWorker
from srl.system.streams import InferenceClient, InferenceServer, PoolLayout, SegmentPool
from srl.system.testing import MemoryProbePolicy, memory_violations

ROOT = Path(__file__).resolve().parent.parent


class _Flat(torch.nn.Module):
    """A tiny encoder over one vector part."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = mlp(3, (width,), "tanh")
        self.out_dim = width

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.net(obs["obs"])


def _grads(core: torch.nn.Module, out: torch.Tensor) -> list[torch.Tensor]:
    """The gradients of a fixed weighting of ``out``'s features."""
    core.zero_grad()
    (out * torch.linspace(-1, 1, out.shape[1])).sum().backward()
    return [p.grad.clone() for p in core.parameters()]


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_an_unroll_equals_a_step_by_step_run_with_resets(kind: str) -> None:
    """Truncated BPTT's forward: the fused stretches between resets give the features, the states before each
    reset and the gradients that one step at a time gives, zeroing the state where an episode ended."""
    torch.manual_seed(0)
    core = Recurrent(_Flat(8), kind, 5)
    L, n = 7, 4
    obs = {"obs": torch.randn(L * n, 3)}
    start = torch.randn(n, core.state_size)
    resets = torch.zeros(L, n, dtype=torch.bool)
    resets[2, 1] = resets[5, 0] = resets[5, 3] = resets[6, 2] = True
    features, ends, last = core.unroll(obs, start, resets)
    assert sorted(ends) == [1, 4, 5]  # the steps after which some column starts a new episode

    state, steps, before = start, [], {}
    for t in range(L):
        if t > 0 and resets[t].any():
            before[t - 1] = state.clone()
            state = state * (~resets[t]).float()[:, None]
        f, state = core.step({"obs": obs["obs"][t * n : (t + 1) * n]}, state)
        steps.append(f)
    stepped = torch.cat(steps)
    assert torch.allclose(features, stepped, atol=1e-6)
    assert torch.allclose(last, state, atol=1e-6)
    for t, s in before.items():
        assert torch.allclose(ends[t], s, atol=1e-6)

    for a, b in zip(_grads(core, core.unroll(obs, start, resets)[0]), _grads(core, stepped), strict=True):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_features_of_episode_pieces_in_one_call_equal_the_unrolls(kind: str) -> None:
    """A gradient step's features (each episode's piece a padded column of its own, one call) equal the
    unroll's, gradients too: with episodes of one step, a reset in row 0 (ignored), no resets at all, and a
    column so choppy that padding would cost more than it saves (the stretches then)."""
    torch.manual_seed(3)
    core = Recurrent(_Flat(8), kind, 5)
    L, n = 9, 4
    obs = {"obs": torch.randn(L * n, 3)}
    start = torch.randn(n, core.state_size)
    some = torch.zeros(L, n, dtype=torch.bool)
    some[0, 0] = some[2, 1] = some[3, 1] = some[5, 0] = some[5, 3] = some[8, 2] = True
    choppy = torch.zeros(L, n, dtype=torch.bool)
    choppy[1:, 2:] = True  # 16 one-step episodes beside two of 9 steps: 20 pieces x 9 steps, 5x the rows
    for resets in (some, torch.zeros(L, n, dtype=torch.bool), choppy):
        features, unrolled = core.features(obs, start, resets), core.unroll(obs, start, resets)[0]
        assert torch.allclose(features, unrolled, atol=1e-6)
        for a, b in zip(_grads(core, core.features(obs, start, resets)), _grads(core, unrolled), strict=True):
            assert torch.allclose(a, b, atol=1e-5)
    assert core._pieces(core.encoder(obs).reshape(L, n, -1), start, choppy) is None
    assert core._pieces(core.encoder(obs).reshape(L, n, -1), start, some) is not None


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_an_unroll_with_idle_columns_equals_a_step_by_step_run(kind: str) -> None:
    """A turn-based game's columns sit idle in turn: the unroll gives, features and gradients alike, what one
    step at a time gives when an idle step leaves its column's state as it was (``api.env.carried``), with
    resets and burn-in as well."""
    from srl.api.env import carried

    torch.manual_seed(2)
    core = Recurrent(_Flat(8), kind, 5)
    L, n = 8, 4
    obs = {"obs": torch.randn(L * n, 3)}
    start = torch.randn(n, core.state_size)
    resets = torch.zeros(L, n, dtype=torch.bool)
    resets[3, 0] = resets[6, 2] = True
    idle = torch.zeros(L, n, dtype=torch.bool)
    idle[0::2, 0] = idle[1::2, 1] = True  # columns 0 and 1 take turns; 2 and 3 wait at a few steps only
    idle[4, 2] = idle[5, 3] = idle[6, 3] = True
    features, ends, last = core.unroll(obs, start, resets, idle)

    state, steps = start, []
    for t in range(L):
        if t > 0:
            state = state * (~resets[t]).float()[:, None]
        f, after = core.step({"obs": obs["obs"][t * n : (t + 1) * n]}, state)
        state = torch.where(idle[t][:, None], state, after)
        steps.append(f)
        if t + 1 < L and resets[t + 1].any():
            assert torch.allclose(ends[t], state, atol=1e-6)  # the state an episode ended with, kept
    stepped = torch.cat(steps)
    assert torch.allclose(features, stepped, atol=1e-6)
    assert torch.allclose(last, state, atol=1e-6)
    with torch.no_grad():  # the numpy rule the actor applies gives the same states
        before, after = start.numpy().copy(), core.step({"obs": obs["obs"][:n]}, start)[1].numpy().copy()
        carried(before, after, np.zeros(n, bool), np.zeros(n, bool), (~idle[0]).numpy())
        assert np.allclose(after[0], start[0].numpy()) and not np.allclose(after[1], start[1].numpy())

    for a, b in zip(_grads(core, core.unroll(obs, start, resets, idle)[0]), _grads(core, stepped), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    seq = Sequences(start, resets, idle=idle)
    warm, _ = encode(core, obs, seq, burn_in=3)
    assert torch.allclose(warm, stepped, atol=1e-6)


def test_burn_in_warms_the_state_without_gradient() -> None:
    torch.manual_seed(1)
    core = Recurrent(_Flat(8), "lstm", 4)
    L, n = 6, 3
    obs = {"obs": torch.randn(L * n, 3)}
    seq = Sequences(torch.randn(n, core.state_size), torch.zeros(L, n, dtype=torch.bool))
    seq.resets[3, 1] = True  # an episode ends right at the burn-in's edge: its state starts afresh
    full, _ = encode(core, obs, seq)
    warm, _ = encode(core, obs, seq, burn_in=3)
    assert torch.allclose(full, warm, atol=1e-6)  # the same numbers
    core.zero_grad()
    warm[: 3 * n].sum().backward(retain_graph=True)
    assert all(p.grad is None or not p.grad.any() for p in core.parameters())  # no gradient from the warm-up
    warm[3 * n :].sum().backward()
    assert core.rnn.weight_ih_l0.grad is not None and core.rnn.weight_ih_l0.grad.abs().sum() > 0


def _memory_pool(actors: int, T: int = 4, B: int = 3) -> SegmentPool:
    policy = MemoryProbePolicy(gym.spaces.Discrete(2))
    schema = sample_schema(gym.spaces.Box(0, np.inf, (2,)), gym.spaces.Discrete(2), policy.output_fields())
    return SegmentPool.in_process(PoolLayout.of(schema, T, B, actors, 2, slots=2))


def test_auto_batched_requests_each_keep_their_own_state() -> None:
    """Requests of three actors answered in one forward pass: each env's next state goes to its own row t + 1,
    from its own state at row t; a re-asked request recomputes the same row from the same input."""
    pool = _memory_pool(actors=3)
    requests, replies = InProcChannel(5), {a: InProcChannel(2) for a in range(3)}
    policy = MemoryProbePolicy(gym.spaces.Discrete(2))
    params = VersionedBuffer.in_process(policy.flat_size(), np.float32)
    ParamPublisher(params).publish(1, np.zeros(4, np.float32))
    worker = PolicyWorker(
        0, [policy], InferenceServer([pool], requests, replies), [ParamSubscriber(params, policy)],
        DirectReporter(lambda *r: None), max_batch=64, wait_timeout=0.0,
    )  # fmt: skip
    worker.setup()
    clients = [InferenceClient(a, [pool], requests, replies[a]) for a in range(3)]
    for a, client in enumerate(clients):
        pool.arrays["obs"][a, 1, 2] = [[10.0 * a + j, 2.0] for j in range(3)]
        pool.arrays[MEMORY][a, 1, 2] = [[10.0 * a + j, 2.0 + a] for j in range(3)]
        client.request(0, slot=a % 2, buffer=1, t=2)
    assert worker.poll() == 3 and policy.batch_sizes == [9]  # one forward pass
    want = {a: np.array([[10.0 * a + j, 3.0 + a] for j in range(3)]) for a in range(3)}
    for a in range(3):
        assert np.array_equal(pool.arrays[MEMORY][a, 1, 3], want[a])
        assert np.array_equal(pool.arrays[MEMORY][a, 1, 2][:, 1], np.full(3, 2.0 + a))  # its input is untouched
    clients[1].request(0, slot=1, buffer=1, t=2)  # asked again (the answer was late)
    worker.poll()
    assert np.array_equal(pool.arrays[MEMORY][1, 1, 3], want[1])


def _probe(
    runtime: str, tmp_path: Path, env: str = "srl.system.testing:step_counter", kwargs: dict | None = None
) -> list[dict[str, Any]]:
    from srl.runtime.train import train

    cfg = build(
        ExperimentConfig,
        {
            "name": "memory_probe",
            "runtime": runtime,
            "algorithm": "srl.system.testing:MemoryProbe",
            "env": {"id": env, "kwargs": kwargs or {}},
            "workers": {
                "actors": 2 if runtime == "local" else 1,
                "policy_workers": 1 if runtime == "local" else 0,
                "ring_size": 2,
                "envs_per_slot": 3,
                "segment_length": 5,
                "batch_segments": 2,
            },
            "run": {"total_env_steps": 600, "eval_episodes": 0, "log_interval_seconds": 0.05},
        },
    )
    train(cfg, tmp_path / "run", progress=None)
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("runtime", "env", "kwargs"),
    [
        ("inline", "srl.system.testing:step_counter", {}),
        ("local", "srl.system.testing:step_counter", {}),
        ("inline", "srl.envs.ma_testing:step_counters", {}),
        ("local", "srl.envs.ma_testing:step_counters", {}),
        ("inline", "srl.envs.ma_testing:step_counters", {"finish_early": True}),
        ("inline", "srl.envs.ma_testing:move_counters", {}),
        ("local", "srl.envs.ma_testing:move_counters", {}),
    ],
)
def test_the_state_is_carried_per_env_reset_at_episode_ends_and_across_segments(
    runtime: str, env: str, kwargs: dict, tmp_path: Path
) -> None:
    """Every row of every batch the trainer gets holds the state its step started from: zeros at an episode's
    first step, else what this env's own previous steps made, also across segment boundaries; inline and
    through a policy worker batching the requests of two actors; per agent, each agent of a multi-agent env (a
    column of its own) with a state of its own; an agent done before the others, whose idle column holds
    zeros until its next episode starts from them; and the players of a turn-based game, whose states stand
    still while they wait for their turn."""
    records = [r for r in _probe(runtime, tmp_path, env, kwargs) if "memory_rows" in r]
    assert records and sum(r["memory_rows"] for r in records) > 0
    assert sum(r["memory_violations"] for r in records) == 0


def test_the_probe_sees_a_state_carried_wrong() -> None:
    """The check above can fail: a state that missed its reset, or came from another env, is counted."""
    obs = np.array([[[5.0, 0.0], [7.0, 3.0]]], np.float32)  # [rows, envs, 2]
    good = {"obs": obs, MEMORY: np.array([[[0.0, 0.0], [7.0, 3.0]]], np.float32)}
    assert memory_violations(good) == (0, 2)
    for bad in ([[5.0, 4.0], [7.0, 3.0]], [[0.0, 0.0], [5.0, 3.0]]):
        assert memory_violations({"obs": obs, MEMORY: np.array([bad], np.float32)})[0] == 1


def _masked(**over: Any) -> ExperimentConfig:
    data = json.loads(json.dumps(_shipped()))
    for key, value in over.items():
        section, _, name = key.partition(".")
        data[section] = {**data.get(section, {}), name: value}
    return build(ExperimentConfig, data)


def _shipped() -> dict[str, Any]:
    import yaml

    return yaml.safe_load((ROOT / "configs" / "cartpole_masked_lstm.yaml").read_text())


@pytest.mark.slow
def test_masked_cartpole_needs_the_memory(tmp_path: Path) -> None:
    """CartPole with its velocities hidden: the shipped LSTM config passes a return of 150 within 200k env steps
    under the inline runtime (it solves 475 within the shipped budget: docs/benchmarks.md); the same run
    without the core, given twice the env steps the LSTM needed, does not reach 150."""
    from srl.runtime.train import train

    lstm = train(
        _inline(_masked(**{"run.target_return": 150.0, "run.total_env_steps": 200_000})),
        tmp_path / "lstm",
        progress=None,
    )
    assert lstm["stop_reason"] == "solved", lstm
    assert lstm["final_eval_return_mean"] >= 120.0, lstm  # greedy, on the eval envs
    budget = {"run.target_return": 150.0, "run.total_env_steps": 2 * lstm["solved_env_steps"]}
    plain = train(_inline(_masked(**budget, **{"model.core": "none"})), tmp_path / "plain", progress=None)
    assert plain["stop_reason"] != "solved" and plain["train_return_mean"] < 150.0, plain

    import srl
    from srl.envs.partial import keep_dims

    policy = srl.load_policy(tmp_path / "lstm")  # keeps its own state between calls; reset() per episode
    env = keep_dims("CartPole-v1", [0, 2])
    returns = []
    for seed in (0, 1, 2):
        policy.reset()
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    assert np.mean(returns) >= 100.0, returns


def _inline(cfg: ExperimentConfig) -> ExperimentConfig:
    data = to_dict(cfg)
    data["runtime"] = "inline"
    data["workers"] = {**data["workers"], "policy_workers": 0}
    return build(ExperimentConfig, data)


@pytest.mark.parametrize("memory", ["recompute", "stored"])
def test_the_trainer_sees_the_states_the_actor_acted_with(memory: str, tmp_path: Path) -> None:
    """The first batch was sampled with the weights the trainer holds: the log-probs it computes (its core
    unrolled over each segment from the stored start state, or stepped from each step's stored state) are the
    behaviour log-probs exactly, so every importance weight is 1. A state reset at the wrong step, carried from
    the wrong env or misaligned by one row would move them."""
    from srl.runtime.train import train

    over = {"ppo.td_compensation": True, "ppo.memory": memory, "run.total_env_steps": 2048, "run.target_return": None,
            "run.log_interval_seconds": 0.001, "model.shared_encoder": memory == "stored"}  # fmt: skip
    train(_inline(_masked(**over)), tmp_path / "run", progress=None)
    first = next(
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if "is_weight_max" in json.loads(line)
    )
    assert first["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert first["is_weight_max"] == pytest.approx(1.0, abs=1e-4), first


# Each budget covers the inline runtime's first update: it comes once the trainer's batch and every sample buffer
# are full (``(buffers_per_actor * actors + batch_segments)`` segments), as in a run whose trainer binds.
@pytest.mark.parametrize(
    ("config", "overrides"),
    [
        # a Nature CNN under the LSTM, single frames (2 envs x 16 steps, 2 minibatches of one segment column)
        ("pong_lstm_cpu", ["workers.envs_per_slot=2", "workers.segment_length=16", "workers.batch_segments=1",
                           "workers.ring_size=1", "ppo.minibatches=2", "run.total_env_steps=160"]),
        # three agents per env as columns of one shared policy, each with its own state
        ("mpe_simple_spread_ippo", ["model.core=lstm", "model.core_size=32", "run.total_env_steps=3000"]),
        # MAPPO: the critic on the global state has a core of its own, unrolled over each segment
        ("mpe_simple_spread_mappo", ["model.core=lstm", "model.core_size=32", "run.total_env_steps=3000"]),
        # two policies, each agent's state in its own policy's pool
        ("mpe_speaker_listener", ["model.core=gru", "model.core_size=32", "run.total_env_steps=3000"]),
        # an agent done before the others: the trainer's unroll zeroes its idle column's state where the actor did
        ("cartpole_ppo", ["env.id=srl.envs.ma_testing:step_counters", "env.kwargs.finish_early=true",
                          "model.core=lstm", "model.core_size=16", "run.total_env_steps=3000"]),
        # a turn-based game: the unroll leaves a waiting player's state where the actor did
        ("cartpole_ppo", ["env.id=srl.envs.turns:game", "env.kwargs.name=tic_tac_toe", "env.agent_id=true",
                          "model.core=lstm", "model.core_size=16", "run.total_env_steps=3000"]),
    ],
)  # fmt: skip
@pytest.mark.slow
def test_the_states_the_actors_acted_with_reach_the_trainer_with_cnns_and_agents(
    config: str, overrides: list[str], tmp_path: Path
) -> None:
    """The same check with a CNN encoder, a multi-agent env (a state per agent), MAPPO's centralized critic and
    two policies: on the first batch every importance weight of every policy is 1."""
    from srl.api.config import load_config
    from srl.runtime.train import train

    cfg = load_config(
        ROOT / "configs" / f"{config}.yaml",
        [*overrides, "ppo.td_compensation=true", "run.target_return=null", "run.log_interval_seconds=0.001",
         "run.eval_episodes=0"],
    )  # fmt: skip
    train(_inline(cfg), tmp_path / "run", progress=None)
    first = next(
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if "is_weight_max" in json.loads(line)
    )
    names = cfg.policy_names
    keys = ["is_weight_max"] if len(names) == 1 else [f"{n}/is_weight_max" for n in names]
    assert all(first[k] == pytest.approx(1.0, abs=1e-4) for k in keys), first
    assert first["is_weight_mean"] == pytest.approx(1.0, abs=1e-5), first


def test_bad_memory_settings_are_one_line() -> None:
    with pytest.raises(ConfigError, match="ppo.burn_in"):
        _masked(**{"ppo.burn_in": _masked().workers.segment_length})
    with pytest.raises(ConfigError, match="ppo.memory"):
        _masked(**{"ppo.memory": "stored", "model.shared_encoder": False})
    with pytest.raises(ConfigError, match="model.core"):
        _masked(**{"model.core": "rnn"})
    from srl.runtime.plan import make_plan

    few = _masked(**{"workers.batch_segments": 1, "workers.envs_per_slot": 2, "ppo.minibatches": 4})
    with pytest.raises(ConfigError, match="ppo.minibatches: 4 minibatches of an update of 2 segment columns"):
        make_plan(few)
