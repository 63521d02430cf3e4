"""Device-agnostic code on the CPU: staging buffers, the policy worker's staged forward pass and its measured
batch cap, the trainer's prefetching batch source, bfloat16 updates, and the device settings. tests/test_gpu.py
runs the same paths on CUDA."""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import pytest
import torch

from srl.algorithms.ppo import ActingPolicy
from srl.api.config import ConfigError, ExperimentConfig, ModelConfig, build
from srl.api.device import DeviceBatch, field
from srl.api.schema import sample_schema
from srl.api.worker import TrainResult
from srl.base.channel import InProcChannel
from srl.base.seqlock import VersionedBuffer
from srl.system.batches import Trained
from srl.system.control import DirectReporter
from srl.system.device import ALIGN, Staging
from srl.system.params import ParamPublisher, ParamSubscriber
from srl.system.policy_worker import PolicyWorker, batch_cap, cap_sizes, measure_curve
from srl.system.prefetch import DeviceBatches
from srl.system.streams import InferenceClient, InferenceServer, PoolLayout, SegmentPool
from srl.wiring import acting_policy, make_algorithm

CPU = torch.device("cpu")
OBS, ACT = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(4)


# --------------------------------------------------------------------------- the batch cap from a cost curve
def test_the_cap_is_the_fewest_slots_within_five_percent_of_the_best_throughput() -> None:
    fixed_then_linear = {n: 1e-3 + 1e-4 * n for n in (1, 2, 4, 8, 16, 32, 64)}  # throughput keeps rising
    assert batch_cap(fixed_then_linear) == 64
    saturating = {1: 1.0, 2: 1.0, 4: 1.2, 8: 2.0, 16: 4.0, 32: 8.2}  # 4 slots/s from 8 on
    assert batch_cap(saturating) == 8
    assert batch_cap(saturating, share=0.8) == 4
    assert batch_cap({1: 0.0, 2: 0.0}) == 1  # too fast to time: the smallest
    with pytest.raises(ValueError, match="empty"):
        batch_cap({})
    assert cap_sizes(64) == [1, 2, 4, 8, 16, 32, 64] and cap_sizes(6) == [1, 2, 4, 6] and cap_sizes(1) == [1]


def test_the_cost_curve_takes_the_fastest_pass_and_stops_past_the_budget() -> None:
    now = [0.0]
    calls: list[int] = []

    def forward(n: int) -> None:  # a pass of n slots takes 0.1 s per slot, the first (warm-up) of each size more
        calls.append(n)
        now[0] += 0.1 * n + (1.0 if calls.count(n) == 1 else 0.0)

    curve = measure_curve(forward, [1, 2, 4, 8], repeats=2, clock=lambda: now[0])
    assert curve == pytest.approx({1: 0.1, 2: 0.2, 4: 0.4})  # 4 slots took 0.4 s > 0.25 s: 8 is not measured
    assert calls == [1, 1, 1, 2, 2, 2, 4, 4, 4]


# --------------------------------------------------------------------------- staging buffers
def test_staging_lays_out_n_rows_of_every_field_as_one_aligned_prefix() -> None:
    fields = {"img": ((2, 3), np.dtype(np.uint8)), "x": ((), np.dtype(np.float32)), "ok": ((1,), np.dtype(bool))}
    st = Staging(fields, rows=8, device=CPU)
    assert st.on_device is st.host  # the CPU: one buffer, nothing copied
    assert st.nbytes(5) == 2 * ALIGN + 5  # img 30 bytes, x 20 bytes, each block aligned; ok 5 bytes
    host = st.host_views(5)
    host["img"][:] = np.arange(30, dtype=np.uint8).reshape(5, 2, 3)
    host["x"][:] = np.arange(5) * 0.5
    host["ok"][:] = [[True], [False], [True], [False], [True]]
    dev = st.to_device(5)
    assert dev["img"].dtype == torch.uint8 and dev["img"].shape == (5, 2, 3)
    assert torch.equal(dev["img"], torch.arange(30, dtype=torch.uint8).reshape(5, 2, 3))
    assert torch.equal(dev["x"], torch.arange(5) * 0.5) and dev["ok"].dtype == torch.bool
    dev["x"].add_(1.0)  # an answer written on the device comes back in the host views
    assert np.array_equal(st.to_host(5)["x"], np.arange(5) * 0.5 + 1.0)
    with pytest.raises(ValueError, match="up to 8 rows"):
        st.host_views(9)


# --------------------------------------------------------------------------- the policy worker's staged pass
def _worker(
    policy: ActingPolicy, actors: int, measure: bool, device: str = "cpu", obs: gym.spaces.Space = OBS
) -> tuple[PolicyWorker, SegmentPool, list, dict]:
    schema = sample_schema(obs, ACT, policy.output_fields())
    pool = SegmentPool.in_process(PoolLayout.of(schema, 4, 3, actors, 2, slots=2))
    requests, replies = InProcChannel(5), {a: InProcChannel(2) for a in range(actors)}
    params = VersionedBuffer.in_process(policy.flat_size(), np.float32)
    ParamPublisher(params).publish(1, policy.flat_state())
    reports: list = []
    worker = PolicyWorker(
        0, [policy], InferenceServer([pool], requests, replies), [ParamSubscriber(params, policy)],
        DirectReporter(lambda *r: reports.append(r)), max_batch=4, wait_timeout=0.0, measure_cap=measure,
        device=device,
    )  # fmt: skip
    worker.setup()
    return worker, pool, reports, {"requests": requests, "replies": replies}


def test_the_policy_worker_answers_through_staging_as_the_policy_acts() -> None:
    """A device policy on the CPU runs the staged path: observations gathered into the staging buffer, the same
    answers (same seed) as the policy's own ``act`` on the same observations, written in place."""
    policy = acting_policy(OBS, ACT, ExperimentConfig(model=ModelConfig(hidden=(8,))))
    assert isinstance(policy, ActingPolicy)
    worker, pool, _, ch = _worker(policy, actors=2, measure=False)
    assert worker.staged[0] is not None
    rng = np.random.default_rng(0)
    pool.arrays["obs"][:] = rng.uniform(-1, 1, pool.arrays["obs"].shape)
    InferenceClient(0, [pool], ch["requests"], ch["replies"][0]).request(0, slot=0, buffer=1, t=2)
    InferenceClient(1, [pool], ch["requests"], ch["replies"][1]).request(0, slot=1, buffer=0, t=3)
    torch.manual_seed(5)
    assert worker.poll() == 2
    torch.manual_seed(5)
    want = policy.act({"obs": np.concatenate([pool.arrays["obs"][0, 1, 2], pool.arrays["obs"][1, 0, 3]])})
    assert np.array_equal(pool.arrays["actions"][0, 1, 2], want["actions"][:3])
    assert np.array_equal(pool.arrays["actions"][1, 0, 3], want["actions"][3:])
    assert np.allclose(pool.arrays["logp"][1, 0, 3], want["logp"][3:])
    assert (pool.arrays["version"][0, 1, 2] == 1).all()


def test_the_policy_worker_caps_its_batches_from_the_curve_it_measures() -> None:
    policy = acting_policy(OBS, ACT, ExperimentConfig(model=ModelConfig(hidden=(8,))))
    assert isinstance(policy, ActingPolicy)
    worker, _, reports, _ = _worker(policy, actors=2, measure=True)
    assert sorted(worker.curve) == cap_sizes(4)[: len(worker.curve)] and worker.curve
    assert worker.max_batch == batch_cap(worker.curve)
    worker.teardown()
    assert reports[-1][1]["batch_cap"] == worker.max_batch


def test_observations_of_several_parts_are_staged_and_timed() -> None:
    """A Dict observation (a vector and an action mask) lies in the staging as two blocks; the cost curve is timed
    on the staging's zeros (a mask of zeros leaves every action legal)."""
    obs = gym.spaces.Dict({"x": OBS, "action_mask": gym.spaces.MultiBinary(4)})
    policy = acting_policy(obs, ACT, ExperimentConfig(model=ModelConfig(hidden=(8,))))
    assert isinstance(policy, ActingPolicy)
    worker, pool, _, ch = _worker(policy, actors=1, measure=True, obs=obs)
    assert worker.curve and 1 <= worker.max_batch <= 4
    pool.arrays["obs.action_mask"][0, 0, 1] = [[0, 0, 1, 0]] * 3  # one legal action
    InferenceClient(0, [pool], ch["requests"], ch["replies"][0]).request(0, slot=0, buffer=0, t=1)
    assert worker.poll() == 1 and (pool.arrays["actions"][0, 0, 1] == 2).all()


# --------------------------------------------------------------------------- the trainer's prefetching source
class _Segments:
    """A batch source of ``segments`` per batch, each segment's ``x`` the order it came in, every segment of a
    batch waiting when it is asked; ``answers_upstream`` as the kind of source it stands for."""

    def __init__(self, answers_upstream: bool, segments: int = 2) -> None:
        self.answers_upstream, self.batch_segments = answers_upstream, segments
        self.fields: Mapping = {}
        self.dropped = self.rejected = 0
        self.t_copy = 0.0
        self.came = 0
        self.filled = 0
        self.x = np.zeros((2, segments), np.float32)
        self.versions: list[int] = []
        self.results: list[TrainResult] = []

    def setup(self) -> None:
        pass

    def fill(self, version: int, timeout: float) -> int:
        self.versions.append(version)
        came = self.batch_segments - self.filled
        for _ in range(came):
            self.x[:, self.filled] = self.came
            self.came += 1
            self.filled += 1
        return came

    def full(self) -> bool:
        return self.filled == self.batch_segments

    def batch(self) -> Mapping[str, np.ndarray]:
        return {"x": self.x}

    def done(self, result: TrainResult) -> Trained:
        self.results.append(result)
        self.filled = 0
        return Trained(int(self.x[0, 0]), 2)  # which batch it was, by its first segment

    def discard_older(self, version: int) -> None:
        self.dropped += self.filled
        self.filled = 0


def test_on_the_cpu_the_batches_pass_through_as_views_of_the_same_memory() -> None:
    source = _Segments(answers_upstream=False)
    batches = DeviceBatches(source, CPU)  # type: ignore[arg-type]
    batches.setup()
    while not batches.full():
        batches.fill(0, 0.0)
    batch = batches.batch()
    assert isinstance(batch, DeviceBatch) and batch["x"] is source.x
    assert np.shares_memory(field(batch, "x", CPU).numpy(), source.x)
    assert batches.done(TrainResult({})).samples == 0 and source.results


def test_ahead_the_next_batch_is_taken_as_an_update_starts_at_the_next_version() -> None:
    """Segments (nothing sent back): the source lets each batch go once it is copied, the next batch is taken when
    the update starts (at the version it will be trained at), batches come out in order, and a discard counts
    the copied one."""
    source = _Segments(answers_upstream=False)
    batches = DeviceBatches(source, CPU, ahead=True)  # type: ignore[arg-type]
    batches.setup()
    batches.fill(3, 0.0)
    assert batches.full() and source.filled == 0  # copied, the source already free
    first = batches.batch()  # takes the next batch's segments, at version 4
    assert source.versions == [3, 4] and batches.prefetched == 1
    assert first["x"].tolist() == [[0, 1], [0, 1]] and first["x"] is not source.x
    assert batches.done(TrainResult({})).samples == 0
    assert batches.full() and batches.batch()["x"].tolist() == [[2, 3], [2, 3]]
    assert batches.done(TrainResult({})).samples == 2 and batches.prefetched == 2
    batches.discard_older(6)  # a population member took another's weights: the batch copied ahead goes
    assert not batches.full() and batches.dropped == 2
    assert len(source.results) == 3 and not any(r.stats for r in source.results)  # let go before each update


def test_a_source_that_sends_results_back_is_never_read_ahead() -> None:
    """A replay's priorities go back to the batch they were computed on: its batch is kept until the update ends."""
    source = _Segments(answers_upstream=True)
    batches = DeviceBatches(source, CPU, ahead=True)  # type: ignore[arg-type]
    batches.setup()
    while not batches.full():
        batches.fill(0, 0.0)
    assert not batches.ahead and batches.batch()["x"].tolist() == [[0, 1], [0, 1]] and source.versions == [0]
    result = TrainResult({"loss": 1.0})
    batches.done(result)
    assert source.results == [result]


# --------------------------------------------------------------------------- bfloat16 updates, device settings
def _batch(seed: int, T: int = 8, N: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(T + 1, N, 3)).astype(np.float32),
        "actions": rng.integers(0, 4, (T, N)),
        "logp": np.full((T, N), np.log(0.25), np.float32),
        "rewards": rng.normal(size=(T, N)).astype(np.float32),
        "terminated": rng.random((T, N)) < 0.1,
        "truncated": rng.random((T, N)) < 0.1,
        "version": np.zeros((T, N), np.int64),
        "final_obs": rng.normal(size=(T, N, 3)).astype(np.float32),
    }


def test_a_ppo_update_under_bfloat16_autocast_trains_in_float32_weights() -> None:
    cfg = build(ExperimentConfig, {"workers": {"trainer_dtype": "bfloat16"}, "model": {"hidden": [16]}})
    algo = make_algorithm(OBS, ACT, cfg, seed=0)
    before = algo.policy_state().copy()
    stats = algo.train(_batch(0), 0.0).stats
    after = algo.policy_state()
    assert after.dtype == np.float32 and not np.array_equal(before, after)
    assert all(np.isfinite(v) for v in stats.values())
    assert all(p.dtype == torch.float32 for p in algo.policy.parameters())


def test_device_settings_are_checked_with_one_line_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="policy_device: must be cpu, cuda or cuda:N"):
        build(ExperimentConfig, {"workers": {"policy_device": "gpu"}})
    with pytest.raises(ConfigError, match="policy_device: cuda needs policy workers"):
        build(ExperimentConfig, {"workers": {"policy_device": "cuda", "policy_workers": 0}})
    with pytest.raises(ConfigError, match="trainer_dtype"):
        build(ExperimentConfig, {"workers": {"trainer_dtype": "float16"}})


def test_bfloat16_is_refused_for_an_algorithm_that_does_not_declare_it() -> None:
    from srl.runtime.plan import make_plan

    cfg = build(ExperimentConfig, {"algorithm": "dqn", "workers": {"trainer_dtype": "bfloat16"}})
    with pytest.raises(ConfigError, match="workers.trainer_dtype: bfloat16: algorithm dqn computes its update in"):
        make_plan(cfg)


# --------------------------------------------------------------------------- costs measured on a device
def test_bench_compute_measures_on_the_device_it_is_given_with_the_cap_it_would_take() -> None:
    from srl.api.config import load_config
    from srl.bench.throughput import bench_compute

    cfg = load_config("configs/cartpole_ppo.yaml", ["workers.max_inference_batch=4"])
    result = bench_compute(cfg, 0.1, "cpu")
    assert result["device"] == "cpu" and result["update_samples_per_second"] > 0
    curve = {int(n): t for n, t in result["inference_curve_seconds"].items()}
    assert sorted(curve) == [1, 2, 4] and result["inference_batch_cap"] == batch_cap(curve)


def test_costs_measured_on_a_device_price_gpu_trainers_before_any_speed_up(tmp_path, capsys) -> None:
    """``srl bench costs --device`` adds the update and inference measured there; ``srl plan`` charges trainers on
    GPUs that update, needs no ``--gpu-speedup`` then, and ignores one given."""
    import dataclasses
    import json

    from test_capacity import COSTS

    from srl.api.config import load_config
    from srl.bench.costs import device_costs
    from srl.bench.throughput import segment_batch
    from srl.capacity.model import Cluster, Costs, Layout, predict
    from srl.cli.main import main
    from srl.runtime.plan import make_plan

    plan = make_plan(load_config("configs/cartpole_ppo.yaml"))
    batch = segment_batch(plan.policies[0], plan.cfg, np.random.default_rng(0))
    measured = device_costs(plan, batch, int(batch["rewards"].size), 0.05, "cpu")
    assert measured["device"] == "cpu" and measured["device_update_seconds_per_sample"] > 0
    assert measured["device_inference_seconds_per_sample"] >= 0 and measured["device_inference_seconds_per_batch"] >= 0
    costs = dataclasses.replace(COSTS, **{**measured, "device_update_seconds_per_sample": 20e-6})
    layout = Layout(
        actor_nodes=1, trainer_nodes=1, actors_per_node=4, policy_workers_per_node=1, trainers=1,
        trainer_device="gpu", envs_per_slot=8,
    )  # fmt: skip
    cluster = Cluster(nodes=2, cores_per_node=16, gpus_per_node=1)
    slow = dataclasses.replace(costs, gpu_update_speedup=1e-3)  # measured beats the speed-up
    assert predict(slow, cluster, layout).stages["trainer"] == pytest.approx(1 / 20e-6)
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"bench": "costs", **costs.to_dict()}))
    args = ["plan", "--costs", str(path), "--nodes", "2", "--cores-per-node", "16", "--gpus-per-node", "1"]
    assert main([*args, "--gpu-speedup", "5"]) == 0
    out, err = capsys.readouterr()
    assert "GPU update 20 us/sample measured on cpu" in out and "--gpu-speedup not used" in err
    partial = {k: v for k, v in costs.to_dict().items() if k != "device_inference_seconds_per_batch"}
    with pytest.raises(ConfigError, match="device_inference_seconds_per_batch: missing, while device is given"):
        Costs.from_dict(partial)
