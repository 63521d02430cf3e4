"""The math of RL over tokens against references: naive loops, exact expectations, hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from srl.algorithms.ppo_math import ppo_loss
from srl.algorithms.token_math import (
    group_advantages,
    kl_penalty,
    kl_per_token,
    last_token,
    lengths_mask,
    masked_mean,
    masked_whiten,
    token_gae,
    token_rewards,
)


def test_lengths_mask_and_last_token() -> None:
    mask = lengths_mask(torch.tensor([3, 0, 5, 1]), 5)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert last_token(mask).tolist() == [[0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [1, 0, 0, 0, 0]]


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_estimators_are_unbiased_exactly(estimator: str) -> None:
    """E_{x~p}[k(x)] = KL(p || q) exactly for k1 and k3: summed over a categorical's support, not sampled."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(7, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(7, generator=g, dtype=torch.float64), 0)
    exact = float((p * (p.log() - q.log())).sum())
    estimate = float((p * kl_per_token(p.log(), q.log(), estimator)).sum())  # type: ignore[arg-type]
    assert estimate == pytest.approx(exact, rel=1e-12)


def test_kl_estimator_values() -> None:
    logp, ref = torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-1.5, -1.0, -0.5])
    d = logp - ref
    assert torch.allclose(kl_per_token(logp, ref, "k1"), d)
    assert torch.allclose(kl_per_token(logp, ref, "k2"), 0.5 * d**2)
    assert torch.allclose(kl_per_token(logp, ref, "k3"), torch.exp(-d) - 1 + d)
    assert bool((kl_per_token(logp, ref, "k3") >= 0).all())
    with pytest.raises(ValueError, match="k4"):
        kl_per_token(logp, ref, "k4")  # type: ignore[arg-type]


def test_token_rewards_by_hand() -> None:
    mask = lengths_mask(torch.tensor([2, 3]), 4)
    kl = torch.tensor([[0.1, 0.2, 9.0, 9.0], [0.3, -0.1, 0.4, 9.0]])
    r = token_rewards(torch.tensor([1.0, -2.0]), kl, mask, 0.5)
    expected = [[-0.05, 1.0 - 0.1, 0.0, 0.0], [-0.15, 0.05, -2.0 - 0.2, 0.0]]
    assert torch.allclose(r, torch.tensor(expected))


def _gae_reference(rewards: np.ndarray, values: np.ndarray, lengths: np.ndarray, gamma: float, lam: float):
    """Per completion, backwards over its valid tokens; nothing bootstraps past the last one."""
    adv = np.zeros_like(rewards)
    for i, n in enumerate(lengths):
        running = 0.0
        for t in range(n - 1, -1, -1):
            next_v = values[i, t + 1] if t + 1 < n else 0.0
            delta = rewards[i, t] + gamma * next_v - values[i, t]
            running = delta + gamma * lam * running
            adv[i, t] = running
    ret = adv + values * (np.arange(rewards.shape[1])[None] < lengths[:, None])
    return adv, ret


def test_token_gae_matches_a_loop() -> None:
    rng = np.random.default_rng(1)
    lengths = np.array([5, 1, 3, 0, 4])
    rewards, values = rng.normal(size=(5, 5)), rng.normal(size=(5, 5))
    mask = lengths_mask(torch.from_numpy(lengths), 5).double()
    adv, ret = token_gae(torch.from_numpy(rewards) * mask, torch.from_numpy(values), mask, 0.97, 0.9)
    ref_adv, ref_ret = _gae_reference(rewards * mask.numpy(), values, lengths, 0.97, 0.9)
    assert np.allclose(adv.numpy(), ref_adv) and np.allclose(ret.numpy(), ref_ret)
    assert bool((adv[mask == 0] == 0).all()) and bool((ret[mask == 0] == 0).all())


def test_token_gae_with_unit_weights_is_plain_gae() -> None:
    rng = np.random.default_rng(2)
    rewards, values = torch.from_numpy(rng.normal(size=(3, 6))), torch.from_numpy(rng.normal(size=(3, 6)))
    mask = lengths_mask(torch.tensor([6, 2, 4]), 6).double()
    plain = token_gae(rewards, values, mask, 1.0, 0.95)
    ones = torch.ones_like(rewards)
    weighted = token_gae(rewards, values, mask, 1.0, 0.95, ones, ones)
    assert all(torch.allclose(a, b) for a, b in zip(plain, weighted))


def test_group_advantages_match_numpy() -> None:
    rng = np.random.default_rng(3)
    scores = rng.normal(size=12)
    scores[8:12] = 0.5  # a group whose completions all scored alike learns nothing from it
    adv = group_advantages(torch.from_numpy(scores), 4).numpy()
    g = scores.reshape(3, 4)
    expected = (g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-6)
    assert np.allclose(adv, expected.reshape(-1))
    assert np.allclose(adv[8:], 0.0)
    unscaled = group_advantages(torch.from_numpy(scores), 4, scale=False).numpy()
    assert np.allclose(unscaled, (g - g.mean(1, keepdims=True)).reshape(-1))
    with pytest.raises(ValueError, match="groups of 5"):
        group_advantages(torch.from_numpy(scores), 5)


def test_masked_whiten_and_mean() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(3.0, 2.0, size=(4, 6))
    lengths = np.array([6, 3, 0, 2])
    mask = lengths_mask(torch.from_numpy(lengths), 6).double()
    valid = x[mask.numpy() == 1]
    assert float(masked_mean(torch.from_numpy(x), mask)) == pytest.approx(valid.mean())
    w = masked_whiten(torch.from_numpy(x), mask).numpy()
    assert np.allclose(w[mask.numpy() == 1], (valid - valid.mean()) / np.sqrt(valid.var() + 1e-8))
    assert np.all(w[mask.numpy() == 0] == 0)
    per_row = masked_mean(torch.from_numpy(x), mask, dim=1).numpy()
    assert per_row[0] == pytest.approx(x[0].mean()) and per_row[2] == 0.0


def test_kl_penalty_value_and_gradient() -> None:
    logp = torch.tensor([[-1.0, -0.5, -3.0], [-0.2, -4.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.2, -0.4, 0.0], [-0.3, 0.0, 0.0]])
    mask = lengths_mask(torch.tensor([2, 1]), 3)
    loss = kl_penalty(logp, ref, mask, 0.1, "k3")
    d = (logp - ref).detach()
    k3 = torch.exp(-d) - 1 + d
    assert float(loss.detach()) == pytest.approx(0.1 * float((k3 * mask).sum() / 3), rel=1e-5)
    loss.backward()
    # d/dlogp of k3 = 1 - exp(ref - logp), on the valid tokens only, averaged over the 3 of them
    expected = 0.1 * (1 - torch.exp(-d)) * mask / 3
    assert logp.grad is not None and torch.allclose(logp.grad, expected)


def test_ppo_loss_without_a_critic_has_no_value_loss() -> None:
    logp = torch.tensor([-1.0, -2.0, -0.5])
    total, stats = ppo_loss(
        logp, logp, torch.tensor([1.0, -1.0, 2.0]), None, None, None, torch.zeros(3),
        clip=0.2, value_clip=None, vf_coef=0.5, ent_coef=0.0,
    )  # fmt: skip
    assert float(stats["value_loss"]) == 0.0
    assert float(total) == pytest.approx(-float(torch.tensor([1.0, -1.0, 2.0]).mean()))
