"""The device paths on CUDA: staging buffers, a policy worker on the GPU, the trainer's prefetching on a side
stream, bfloat16 updates, and lm_ppo generating and training on the GPU. Skipped without CUDA; tests/test_devices.py
runs the same code on the CPU. ``scripts/gpu_check.sh`` runs this file on a lent GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_devices import _batch, _Segments, _worker

from srl.algorithms.ppo import ActingPolicy
from srl.api.config import ExperimentConfig, build
from srl.api.device import field
from srl.api.worker import TrainResult
from srl.system.device import Staging
from srl.system.policy_worker import batch_cap
from srl.system.prefetch import DeviceBatches
from srl.system.streams import InferenceClient
from srl.wiring import acting_policy, make_algorithm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = torch.device("cuda")
OBS, ACT = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(4)


def test_staging_moves_a_batch_in_one_copy_each_way_through_pinned_memory() -> None:
    st = Staging({"x": ((2,), np.dtype(np.float32)), "k": ((), np.dtype(np.int64))}, rows=16, device=CUDA)
    assert st.host.is_pinned() and st.on_device.is_cuda and st.on_device is not st.host
    st.host_views(3)["x"][:] = np.arange(6, dtype=np.float32).reshape(3, 2)
    dev = st.to_device(3)
    assert dev["x"].is_cuda and torch.equal(dev["x"].cpu(), torch.arange(6.0).reshape(3, 2))
    dev["k"].copy_(torch.tensor([4, 5, 6], device=CUDA))
    assert st.to_host(3)["k"].tolist() == [4, 5, 6]


def test_a_policy_worker_on_the_gpu_answers_as_its_policy_would_on_the_cpu() -> None:
    """The worker's net is on the GPU; the actions it writes have, under a CPU copy of the same weights, the
    log-probs it wrote; it measures its batch cap there too."""
    cfg = build(ExperimentConfig, {"model": {"hidden": [8]}, "workers": {"policy_device": "cuda"}})
    policy = acting_policy(OBS, ACT, cfg)
    cpu_copy = acting_policy(OBS, ACT, cfg)
    cpu_copy.load_flat(policy.flat_state())
    assert isinstance(policy, ActingPolicy) and isinstance(cpu_copy, ActingPolicy)
    worker, pool, _, ch = _worker(policy, actors=2, measure=True, device="cuda")
    assert next(policy.net.parameters()).is_cuda and worker.max_batch == batch_cap(worker.curve)
    pool.arrays["obs"][:] = np.random.default_rng(0).uniform(-1, 1, pool.arrays["obs"].shape)
    InferenceClient(0, [pool], ch["requests"], ch["replies"][0]).request(0, slot=0, buffer=1, t=2)
    assert worker.poll() == 1
    obs = torch.from_numpy(pool.arrays["obs"][0, 1, 2])
    actions = torch.from_numpy(pool.arrays["actions"][0, 1, 2])
    logp, _ = cpu_copy.net.evaluate({"obs": obs}, actions)
    assert np.allclose(pool.arrays["logp"][0, 1, 2], logp.detach().numpy(), atol=1e-5)


def test_the_next_batch_is_copied_on_a_side_stream_while_the_update_runs() -> None:
    source = _Segments(answers_upstream=False)
    batches = DeviceBatches(source, CUDA)  # type: ignore[arg-type]
    batches.setup()
    assert batches.ahead
    batches.fill(0, 0.0)
    first = batches.batch()
    assert batches.prefetched == 1 and field(first, "x", CUDA).is_cuda
    assert field(first, "x", CUDA).cpu().tolist() == [[0, 1], [0, 1]]
    batches.done(TrainResult({}))
    second = batches.batch()
    assert field(second, "x", CUDA).cpu().tolist() == [[2, 3], [2, 3]]


def test_a_ppo_update_on_the_gpu_reads_its_prefetched_batch_in_bfloat16() -> None:
    cfg = build(ExperimentConfig, {"model": {"hidden": [16]}, "workers": {"trainer_dtype": "bfloat16"}})
    algo = make_algorithm(OBS, ACT, cfg, seed=0, device="cuda")
    before = algo.policy_state().copy()

    class Batches(_Segments):
        def batch(self) -> dict[str, np.ndarray]:
            return _batch(0)

        def fill(self, version: int, timeout: float) -> int:
            self.filled = self.batch_segments
            return 1

    batches = DeviceBatches(Batches(answers_upstream=False), CUDA)  # type: ignore[arg-type]
    batches.setup()
    batches.fill(0, 0.0)
    stats = algo.train(batches.batch(), 0.0).stats
    assert all(np.isfinite(v) for v in stats.values()) and not np.array_equal(before, algo.policy_state())
    assert all(p.is_cuda and p.dtype == torch.float32 for p in algo.policy.parameters())


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained one-layer Llama and a byte tokenizer: enough to generate and train on."""
    from srl.api.config.text import LMSpec
    from srl.text.hf import build_lm, save_lm, train_tokenizer

    folder = tmp_path_factory.mktemp("models") / "tiny"
    tokenizer = train_tokenizer(["0123456789"])
    torch.manual_seed(0)
    save_lm(build_lm(LMSpec(arch="llama", layers=1, width=32, heads=2, context=32), tokenizer), tokenizer, folder)
    return folder


def _lm_config(model: Path, **workers: Any) -> ExperimentConfig:
    return build(
        ExperimentConfig,
        {
            "algorithm": "lm_ppo",
            "env": {"id": "srl.text.task:TextTask", "kwargs": {
                "tokenizer": str(model), "prompts": "srl.text.testing:digit_prompts",
                "reward": "srl.text.testing:sevens", "max_prompt_tokens": 4, "max_new_tokens": 4, "group_size": 4,
            }},
            "workers": {"envs_per_slot": 16, "segment_length": 1, "batch_segments": 1, **workers},
            "text": {"model": str(model), "advantage": "gae", "kl_coef": 0.05, "kl_in": "reward"},
            "ppo": {"gamma": 1.0, "epochs": 1, "minibatches": 2},
        },
    )  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lm_ppo_generates_and_trains_on_the_gpu(tiny_lm: Path, dtype: str) -> None:
    from srl.text.algorithm import LMPPO
    from srl.text.task import TextTask
    from srl.wiring import context

    cfg = _lm_config(tiny_lm, trainer_dtype=dtype)
    task = TextTask(**cfg.env.kwargs, num_envs=16)
    ctx = context(task.single_observation_space, task.single_action_space, cfg, device="cuda")
    policy = LMPPO.acting_policy(ctx)
    policy.to_device(CUDA)
    obs = task.reset(0)
    out = policy.act(obs)  # generated on the GPU, answered as arrays
    assert out["actions"].shape == (16, 4) and next(policy.model.parameters()).is_cuda
    batch = {k: v[None] for k, v in out.items()}
    batch.update({"obs": obs["obs"][None], "rewards": task.step(out["actions"]).reward[None].astype(np.float32)})
    algo = LMPPO(ctx)
    before = algo.policy_state().copy()
    stats = algo.train(batch, 0.0).stats
    assert next(algo.policy.parameters()).is_cuda and all(np.isfinite(v) for v in stats.values())
    assert not np.array_equal(before, algo.policy_state())
