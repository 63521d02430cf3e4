"""The SRL techniques' mechanisms: V-trace-corrected GAE, weighted surrogate, gradient clipping,
mergeable normalizer moments, data-parallel trainers over gloo (decentralized vs centralized critic),
and staleness injection."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from srl.algorithms.grad_clip import GradClipper
from srl.algorithms.ppo import ActingPolicy
from srl.algorithms.ppo_math import gae, ppo_loss
from srl.api.config import ConfigError, ExperimentConfig, ModelConfig, PPOConfig, build
from srl.base.seqlock import VersionedBuffer
from srl.nets.normalizer import RunningMeanStd
from srl.nets.policy import PolicyNet, ValueNet
from srl.system.params import ParamSubscriber
from srl.wiring import acting_policy, make_algorithm

OBS = spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = spaces.Discrete(2)


def _ppo(model: ModelConfig, ppo: PPOConfig, seed: int, **kw):
    """The built-in PPO for OBS/ACT, as the runtime builds it."""
    return make_algorithm(OBS, ACT, ExperimentConfig(model=model, ppo=ppo), seed, **kw)


# --------------------------------------------------------------------------- V-trace-corrected GAE


def _vtrace_reference(r, v, nv, term, end, gamma, lam, rho, c):
    """Targets by the explicit sum v_s = V_s + sum_t gamma^(t-s) (prod_{i<t} lam c_i) rho_t delta_t, per env."""
    T, B = r.shape
    out = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total, trace = 0.0, 1.0
            for t in range(s, T):
                delta = r[t, b] + (0.0 if term[t, b] else gamma * nv[t, b]) - v[t, b]
                total += (gamma ** (t - s)) * trace * rho[t, b] * delta
                if end[t, b]:
                    break
                trace *= lam * c[t, b]
            out[s, b] = v[s, b] + total
    return out


def test_vtrace_gae_matches_explicit_sum_and_reduces_to_gae_on_policy() -> None:
    rng = np.random.default_rng(3)
    T, B = 16, 5
    r, v = rng.normal(size=(T, B)), rng.normal(size=(T, B))
    nv = np.concatenate([v[1:], rng.normal(size=(1, B))])
    term = rng.random((T, B)) < 0.1
    end = term | (rng.random((T, B)) < 0.05)
    ratio = np.exp(rng.normal(scale=0.5, size=(T, B)))
    rho, c = np.minimum(ratio, 1.0), np.minimum(ratio, 0.9)
    as_t = lambda x: torch.as_tensor(x, dtype=torch.float64)  # noqa: E731
    adv, ret = gae(as_t(r), as_t(v), as_t(nv), as_t(term), as_t(end), 0.97, 0.9, rho=as_t(rho), c=as_t(c))
    np.testing.assert_allclose(ret.numpy(), _vtrace_reference(r, v, nv, term, end, 0.97, 0.9, rho, c), atol=1e-10)
    np.testing.assert_allclose(adv.numpy(), ret.numpy() - v, atol=1e-12)
    ones = torch.ones(T, B, dtype=torch.float64)
    plain = gae(as_t(r), as_t(v), as_t(nv), as_t(term), as_t(end), 0.97, 0.9)
    weighted = gae(as_t(r), as_t(v), as_t(nv), as_t(term), as_t(end), 0.97, 0.9, rho=ones, c=ones)
    torch.testing.assert_close(plain, weighted)


def test_surrogate_weights_scale_each_sample() -> None:
    rng = torch.Generator().manual_seed(0)
    n = 64
    new, old = torch.randn(n, generator=rng) * 0.1, torch.randn(n, generator=rng) * 0.1
    adv, v, ret = torch.randn(n, generator=rng), torch.randn(n, generator=rng), torch.randn(n, generator=rng)
    ent = torch.zeros(n)
    kw = dict(clip=0.2, value_clip=None, vf_coef=0.0, ent_coef=0.0)
    ones, _ = ppo_loss(new, old, adv, v, v, ret, ent, weights=torch.ones(n), **kw)
    none, _ = ppo_loss(new, old, adv, v, v, ret, ent, **kw)
    torch.testing.assert_close(ones, none)
    w = torch.rand(n, generator=rng)
    weighted, _ = ppo_loss(new, old, adv, v, v, ret, ent, weights=w, **kw)
    ratio = (new - old).exp()
    expected = -(w * torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)).mean()
    torch.testing.assert_close(weighted, expected)


# --------------------------------------------------------------------------- clipping, normalizers


def _params_with_grads(scale: float, seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(8, 5, generator=g)), torch.nn.Parameter(torch.randn(8, generator=g))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * scale
    return params


def _norm(params: list[torch.nn.Parameter]) -> float:
    return float(torch.sqrt(sum((p.grad**2).sum() for p in params)))


def test_fixed_clip_caps_the_global_norm() -> None:
    params = _params_with_grads(10.0)
    before = _norm(params)
    norm, threshold = GradClipper(params, max_norm=0.5).clip()
    assert norm == pytest.approx(before) and threshold == 0.5
    assert _norm(params) == pytest.approx(0.5, rel=1e-4)
    small = _params_with_grads(1e-3)
    kept = _norm(small)
    GradClipper(small, max_norm=0.5).clip()
    assert _norm(small) == pytest.approx(kept)


def test_adaptive_threshold_is_the_percentile_of_recent_norms() -> None:
    clipper = GradClipper(_params_with_grads(1.0), max_norm=None, adaptive=True, percentile=50, window=10)
    assert clipper.threshold() is None  # nothing seen yet and no fixed fallback
    seen = []
    for i in range(12):
        params = _params_with_grads(1.0 + i, seed=i)
        clipper.params = params
        seen.append(_norm(params))
        clipper.clip()
    assert clipper.threshold() == pytest.approx(float(np.percentile(seen[-10:], 50)))
    spike = _params_with_grads(1000.0, seed=99)
    clipper.params = spike
    threshold = clipper.threshold()
    clipper.clip()
    assert _norm(spike) == pytest.approx(threshold, rel=1e-4)


def test_unitwise_clip_caps_each_unit_relative_to_its_weight_norm() -> None:
    params = _params_with_grads(100.0)
    weight = params[0]
    GradClipper(params, max_norm=None, unitwise=0.1).clip()
    ratio = weight.grad.norm(dim=1) / weight.detach().norm(dim=1)
    assert float(ratio.max()) == pytest.approx(0.1, rel=1e-4)
    assert torch.all(ratio <= 0.1 + 1e-5)


def test_merged_moments_equal_one_update_on_the_union() -> None:
    rng = np.random.default_rng(0)
    a, b = torch.as_tensor(rng.normal(2.0, 3.0, (50, 3))), torch.as_tensor(rng.normal(-1.0, 0.5, (30, 3)))
    whole, split = RunningMeanStd(3), RunningMeanStd(3)
    whole.update(torch.cat([a, b]))
    (ma, va, na), (mb, vb, nb) = split.moments(a), split.moments(b)
    n = na + nb
    mean = (ma * na + mb * nb) / n
    var = ((va + ma**2) * na + (vb + mb**2) * nb) / n - mean**2
    split.update_moments(mean, var, n)
    torch.testing.assert_close(split.mean, whole.mean)
    torch.testing.assert_close(split.var, whole.var)


def test_value_normalization_keeps_values_in_return_units() -> None:
    net = ValueNet(OBS, hidden=(8,), normalize_values=True)
    obs = {"obs": torch.randn(10, 4)}
    raw = net.head_output(net.encoder(obs))
    net.return_normalizer.update(torch.randn(500, dtype=torch.float64) * 50 + 20)
    torch.testing.assert_close(net(obs), net.return_normalizer.denormalize(raw))
    torch.testing.assert_close(net.normalize(net(obs)), raw, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- critic placement and snapshots


def test_centralized_snapshot_carries_the_critic_and_decentralized_does_not() -> None:
    base = build(ExperimentConfig, {"model": {"hidden": [16]}})
    central = build(ExperimentConfig, {"model": {"hidden": [16]}, "ppo": {"critic": "centralized"}})
    actor_only = acting_policy(OBS, ACT, base)
    both = acting_policy(OBS, ACT, central)
    value = ValueNet(OBS, hidden=(16,))
    assert actor_only.flat_size() == PolicyNet(OBS, ACT, hidden=(16,)).flat_size()
    assert both.flat_size() == actor_only.flat_size() + value.flat_size()
    algo = _ppo(central.model, central.ppo, seed=0)
    snap = algo.policy_state()
    both.load_flat(snap)
    ones = {"obs": torch.ones(3, 4)}
    torch.testing.assert_close(both.critic(ones), algo.value(ones))
    with pytest.raises(ValueError, match="wrong length"):
        both.load_flat(snap[:-1])


def test_shared_encoder_critic_owns_only_its_head() -> None:
    model = ModelConfig(hidden=(16,), shared_encoder=True)
    algo = _ppo(model, PPOConfig(), seed=0)
    assert algo.value.encoder is algo.policy.encoder
    assert {n for n, _ in algo.value.named_parameters()} == {"head.weight", "head.bias"}
    assert len(algo.optimizer.params) == len(list(algo.policy.parameters())) + 2


# --------------------------------------------------------------------------- data-parallel trainers


def _random_batch(seed: int, T: int = 8, N: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(T + 1, N, 4)).astype(np.float32),
        "actions": rng.integers(0, 2, (T, N)),
        "logp": np.full((T, N), np.log(0.5), np.float32),
        "rewards": rng.normal(size=(T, N)).astype(np.float32),
        "terminated": rng.random((T, N)) < 0.1,
        "truncated": np.zeros((T, N), bool),
        "version": np.zeros((T, N), np.int64),
        "final_obs": np.zeros((T, N, 4), np.float32),
    }


def _replica(rank: int, store: str, out: str, critic: str) -> None:
    """One data-parallel trainer: checks the collective's primitives, then trains on its own data."""
    from srl.system.collective import TorchCollective

    torch.set_num_threads(1)
    coll = TorchCollective(rank, 2, f"file://{store}", timeout=30.0)
    coll.connect()
    try:
        x = [torch.full((3,), float(rank + 1)), torch.full((2, 2), 10.0 * (rank + 1))]
        coll.mean_(x)
        b = [torch.full((4,), float(rank + 7))]
        coll.broadcast_(b)
        data = torch.arange(5.0, dtype=torch.float64) * (rank + 1) + 10 * rank
        mean, var, n = coll.merge_moments(data.mean().reshape(1), data.var(unbiased=False).reshape(1), 5)
        flags = [*coll.maximum([0, 5 - rank]), *coll.maximum([int(rank == 1), -1])]
        cfg = PPOConfig(critic=critic, epochs=2, minibatches=2, normalize_values=True)
        algo = _ppo(ModelConfig(hidden=(16,)), cfg, seed=10 + rank, collective=coll)  # different inits
        algo.synchronize()
        before = coll.bytes_reduced
        for i in range(2):
            algo.train(_random_batch(100 * rank + i), 0.0)
        np.savez(
            f"{out}/rank{rank}.npz",
            mean_=torch.cat([t.reshape(-1) for t in x]).numpy(),
            bcast=b[0].numpy(),
            moments=np.array([float(mean), float(var), n]),
            flags=np.array(flags),
            actor=algo.policy.flat_state(),
            critic=algo.value.flat_state(),
            reduced=np.array(coll.bytes_reduced - before),
            seconds=np.array(coll.seconds_reduced),
        )
    finally:
        coll.close()


@pytest.mark.slow
@pytest.mark.parametrize("critic", ["decentralized", "centralized"])
def test_data_parallel_replicas_stay_identical_where_synchronized(tmp_path: Path, critic: str) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_replica, args=(r, str(tmp_path / "store"), str(tmp_path), critic)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    r0, r1 = (np.load(tmp_path / f"rank{r}.npz", allow_pickle=False) for r in (0, 1))
    np.testing.assert_allclose(r0["mean_"], [1.5] * 3 + [15.0] * 4)
    np.testing.assert_array_equal(r1["bcast"], np.full(4, 7.0))
    union = np.concatenate([np.arange(5.0), np.arange(5.0) * 2 + 10])
    np.testing.assert_allclose(r0["moments"], [union.mean(), union.var(), 10])
    assert r0["flags"].tolist() == [0, 5, 1, -1] == r1["flags"].tolist()  # element-wise maxima, on both
    np.testing.assert_array_equal(r0["actor"], r1["actor"])  # identical reduced gradients, identical Adam
    actor_params = sum(p.numel() for p in PolicyNet(OBS, ACT, hidden=(16,)).parameters())
    critic_params = sum(p.numel() for p in ValueNet(OBS, hidden=(16,)).parameters())
    steps = 2 * 2 * 2  # updates x epochs x minibatches
    if critic == "decentralized":
        assert not np.array_equal(r0["critic"], r1["critic"])  # each trains its own on its own shard
        assert int(r0["reduced"]) == 4 * actor_params * steps
    else:
        np.testing.assert_array_equal(r0["critic"], r1["critic"])
        assert int(r0["reduced"]) == 4 * (actor_params + critic_params) * steps
    assert float(r0["seconds"]) > 0 and float(r1["seconds"]) > 0  # the time in reductions is kept too
    # what srl bench costs counts from one trainer's update is what the two reduced
    from srl.bench.allreduce import CountingCollective

    counter = CountingCollective()
    alone = _ppo(ModelConfig(hidden=(16,)), PPOConfig(critic=critic, epochs=2, minibatches=2, normalize_values=True),
                 seed=10, collective=counter)  # fmt: skip
    for i in range(2):
        alone.train(_random_batch(i), 0.0)
    assert counter.bytes_reduced == int(r0["reduced"]) and counter.reductions == steps


def test_several_trainers_need_the_local_runtime_and_enough_actors() -> None:
    with pytest.raises(ConfigError, match="workers.trainers: the inline runtime"):
        build(ExperimentConfig, {"runtime": "inline", "workers": {"trainers": 2, "actors": 2}})
    with pytest.raises(ConfigError, match="trainers"):
        build(ExperimentConfig, {"workers": {"trainers": 3, "actors": 2}})


# --------------------------------------------------------------------------- staleness injection


def test_version_stride_holds_snapshots_until_far_enough_ahead() -> None:
    net = PolicyNet(OBS, ACT, hidden=(8,))
    policy = ActingPolicy(net)
    buffer = VersionedBuffer.in_process(policy.flat_size(), np.float32)
    sub = ParamSubscriber(buffer, policy, stride=4)
    flat = net.flat_state()
    loaded = []
    for version in range(10):
        buffer.write(version, flat)
        sub.refresh()
        loaded.append(sub.current)
    assert loaded == [0, 0, 0, 0, 4, 4, 4, 4, 8, 8]


def test_td_compensation_changes_nothing_on_fresh_data_and_weights_stale_data() -> None:
    batch = _random_batch(5)
    model = ModelConfig(hidden=(16,))

    def trained(td: bool, behaviour_shift: float, vtrace: bool = False) -> tuple[np.ndarray, dict[str, float]]:
        algo = _ppo(model, PPOConfig(td_compensation=td, vtrace_targets=vtrace, epochs=2, minibatches=2), seed=0)
        with torch.no_grad():  # behaviour log-probs of the very policy being trained: on-policy data
            logp, _ = algo.policy.evaluate(
                {"obs": torch.from_numpy(batch["obs"][:-1].reshape(-1, 4))},
                torch.from_numpy(batch["actions"]).reshape(-1),
            )
        data = dict(batch, logp=(logp.numpy() + behaviour_shift).reshape(batch["logp"].shape).astype(np.float32))
        stats = algo.train(data, 0.0).stats
        return algo.policy.flat_state(), stats

    fresh_plain, _ = trained(False, 0.0)
    fresh_td, stats = trained(True, 0.0)
    np.testing.assert_allclose(fresh_td, fresh_plain, atol=1e-6)
    np.testing.assert_allclose(trained(True, 0.0, vtrace=True)[0], fresh_plain, atol=1e-6)
    assert stats["is_weight_mean"] == pytest.approx(1.0, abs=1e-5) and stats["is_weight_truncated"] == 0.0
    # Behaviour log-probs 0.5 higher than the current policy's: every weight is exp(-0.5), none truncated.
    _, stale = trained(True, 0.5)
    assert stale["is_weight_mean"] == pytest.approx(np.exp(-0.5), rel=1e-4)
    assert stale["approx_kl"] == pytest.approx(0.0, abs=0.05)  # the ratio is against the proximal policy


def test_trainer_device_trains_there_or_refuses_clearly() -> None:
    if torch.cuda.is_available():
        algo = _ppo(ModelConfig(hidden=(16,)), PPOConfig(epochs=1), seed=0, device="cuda")
        algo.train(_random_batch(1), 0.0)
        assert next(algo.policy.parameters()).is_cuda and algo.policy_state().dtype == np.float32
    else:
        with pytest.raises(ValueError, match="no CUDA device"):
            _ppo(ModelConfig(hidden=(16,)), PPOConfig(), seed=0, device="cuda")
    with pytest.raises(ConfigError, match="trainer_device"):
        build(ExperimentConfig, {"workers": {"trainer_device": "gpu0"}})
