"""PPO math checked against naive elementwise / double-loop references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from srl.algorithms.ppo_math import explained_variance, gae, normalize_advantages, ppo_loss


def _gae_reference(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    episode_end: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Textbook GAE: one env at a time, one step at a time, plain floats."""
    t_len, b_len = rewards.shape
    adv = np.zeros((t_len, b_len))
    for b in range(b_len):
        running = 0.0
        for t in reversed(range(t_len)):
            bootstrap = 0.0 if terminated[t, b] else gamma * next_values[t, b]
            delta = rewards[t, b] + bootstrap - values[t, b]
            if episode_end[t, b]:
                running = 0.0
            running = delta + gamma * lam * running
            adv[t, b] = running
    return adv, adv + values


def _random_segment(rng: np.random.Generator, t_len: int = 24, b_len: int = 7) -> dict[str, np.ndarray]:
    """Random segment with terminations and truncations (next value != values[t+1])."""
    rewards = rng.normal(size=(t_len, b_len))
    values = rng.normal(size=(t_len, b_len))
    next_values = np.concatenate([values[1:], rng.normal(size=(1, b_len))], axis=0)
    terminated = rng.random((t_len, b_len)) < 0.1
    truncated = (rng.random((t_len, b_len)) < 0.1) & ~terminated
    # After a truncation the caller bootstraps from V(final_obs), not the reset obs.
    next_values = np.where(truncated, rng.normal(size=(t_len, b_len)), next_values)
    return {
        "rewards": rewards,
        "values": values,
        "next_values": next_values,
        "terminated": terminated,
        "episode_end": terminated | truncated,
    }


def _run_gae(seg: dict[str, np.ndarray], gamma: float, lam: float, as_bool: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Call the torch gae on a numpy segment, with masks as bool or float."""
    tensors = {k: torch.as_tensor(v) for k, v in seg.items()}
    for key in ("rewards", "values", "next_values"):
        tensors[key] = tensors[key].float()
    if not as_bool:
        tensors["terminated"] = tensors["terminated"].float()
        tensors["episode_end"] = tensors["episode_end"].float()
    return gae(**tensors, gamma=gamma, lam=lam)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("as_bool", [True, False])
def test_gae_matches_reference(seed: int, as_bool: bool) -> None:
    rng = np.random.default_rng(seed)
    seg = _random_segment(rng)
    assert seg["terminated"].any() and (seg["episode_end"] & ~seg["terminated"]).any()
    adv, ret = _run_gae(seg, 0.99, 0.95, as_bool)
    ref_adv, ref_ret = _gae_reference(**seg, gamma=0.99, lam=0.95)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=1e-5, atol=1e-5)


def test_gae_lambda_zero_is_one_step_td() -> None:
    seg = _random_segment(np.random.default_rng(3))
    adv, _ = _run_gae(seg, 0.9, 0.0, True)
    delta = seg["rewards"] + 0.9 * seg["next_values"] * (1.0 - seg["terminated"]) - seg["values"]
    np.testing.assert_allclose(adv.numpy(), delta, rtol=1e-5, atol=1e-5)


def test_gae_lambda_one_is_bootstrapped_discounted_return() -> None:
    """With lam=1 the returns are Monte-Carlo returns bootstrapped at segment/episode ends."""
    seg = _random_segment(np.random.default_rng(4))
    _, ret = _run_gae(seg, 0.97, 1.0, True)
    t_len, b_len = seg["rewards"].shape
    expected = np.zeros((t_len, b_len))
    for b in range(b_len):
        g = 0.0
        for t in reversed(range(t_len)):
            if seg["terminated"][t, b]:
                g = seg["rewards"][t, b]
            elif seg["episode_end"][t, b] or t == t_len - 1:
                g = seg["rewards"][t, b] + 0.97 * seg["next_values"][t, b]
            else:
                g = seg["rewards"][t, b] + 0.97 * g
            expected[t, b] = g
    np.testing.assert_allclose(ret.numpy(), expected, rtol=1e-4, atol=1e-4)


def _loss_reference(
    d: dict[str, np.ndarray], clip: float, value_clip: float | None, vf: float, ent: float
) -> dict[str, float]:
    """Elementwise PPO loss in plain Python floats."""
    pg, vl, kl, cf = [], [], [], []
    for i in range(len(d["adv"])):
        r = float(np.exp(d["new_logp"][i] - d["old_logp"][i]))
        a = d["adv"][i]
        pg.append(-min(r * a, min(max(r, 1 - clip), 1 + clip) * a))
        v, ov, ret = d["new_v"][i], d["old_v"][i], d["ret"][i]
        unclipped = (v - ret) ** 2
        if value_clip is None:
            vl.append(0.5 * unclipped)
        else:
            vc = ov + min(max(v - ov, -value_clip), value_clip)
            vl.append(0.5 * max(unclipped, (vc - ret) ** 2))
        kl.append((r - 1) - np.log(r))
        cf.append(float(abs(r - 1) > clip))
    out = {
        "policy_loss": float(np.mean(pg)),
        "value_loss": float(np.mean(vl)),
        "entropy": float(np.mean(d["entropy"])),
        "approx_kl": float(np.mean(kl)),
        "clip_fraction": float(np.mean(cf)),
    }
    out["total"] = out["policy_loss"] + vf * out["value_loss"] - ent * out["entropy"]
    return out


def _loss_inputs(n: int = 64, seed: int = 0) -> dict[str, np.ndarray]:
    """Random minibatch with ratios spread well past the clip range."""
    rng = np.random.default_rng(seed)
    old_v = rng.normal(size=n)
    return {
        "new_logp": rng.normal(-1.0, 0.3, size=n),
        "old_logp": rng.normal(-1.0, 0.3, size=n),
        "adv": rng.normal(size=n),
        "new_v": old_v + rng.normal(0, 0.5, size=n),
        "old_v": old_v,
        "ret": rng.normal(size=n),
        "entropy": rng.uniform(0.1, 1.0, size=n),
    }


@pytest.mark.parametrize("value_clip", [None, 0.2])
def test_ppo_loss_matches_reference(value_clip: float | None) -> None:
    d = _loss_inputs()
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in d.items()}
    total, stats = ppo_loss(
        t["new_logp"],
        t["old_logp"],
        t["adv"],
        t["new_v"],
        t["old_v"],
        t["ret"],
        t["entropy"],
        clip=0.2,
        value_clip=value_clip,
        vf_coef=0.5,
        ent_coef=0.01,
    )
    ref = _loss_reference(d, 0.2, value_clip, 0.5, 0.01)
    assert total.item() == pytest.approx(ref["total"], rel=1e-9)
    assert set(stats) == {"policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"}
    for key, value in stats.items():
        assert not value.requires_grad and value.dim() == 0
        assert value.item() == pytest.approx(ref[key], rel=1e-9, abs=1e-12), key
    assert 0.0 < stats["clip_fraction"].item() < 1.0
    total.backward()
    for key in ("new_logp", "new_v", "entropy"):
        grad = t[key].grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, key


def test_value_clip_changes_value_loss() -> None:
    d = _loss_inputs(seed=1)
    t = {k: torch.tensor(v) for k, v in d.items()}
    args = (t["new_logp"], t["old_logp"], t["adv"], t["new_v"], t["old_v"], t["ret"], t["entropy"])
    _, s_none = ppo_loss(*args, clip=0.2, value_clip=None, vf_coef=0.5, ent_coef=0.0)
    _, s_clip = ppo_loss(*args, clip=0.2, value_clip=0.05, vf_coef=0.5, ent_coef=0.0)
    assert s_clip["value_loss"] >= s_none["value_loss"]  # max() can only add loss
    assert s_clip["value_loss"] != s_none["value_loss"]


def test_normalize_advantages() -> None:
    adv = torch.randn(1000) * 5 + 3
    out = normalize_advantages(adv)
    assert out.mean().abs() < 1e-5
    assert out.std().item() == pytest.approx(1.0, abs=1e-4)
    assert torch.isfinite(normalize_advantages(torch.ones(10))).all()
    assert torch.isfinite(normalize_advantages(torch.ones(1))).all()


def test_explained_variance() -> None:
    target = torch.randn(500)
    assert explained_variance(target, target) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(500) + target.mean(), target) == pytest.approx(0.0, abs=1e-6)
    noisy = target + 0.5 * torch.randn(500)
    ref = 1 - np.var((target - noisy).numpy()) / np.var(target.numpy())
    assert explained_variance(noisy, target) == pytest.approx(ref, rel=1e-4)
    assert np.isnan(explained_variance(torch.zeros(5), torch.ones(5)))
