"""SAC's and TD3's math against references: torch's own tanh-transformed Gaussian, the density integrating to
one, closed forms where float32 saturates, and plain loops for the targets and losses."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from srl.algorithms.sac_math import (
    actor_loss,
    clipped_double_q_target,
    rescale,
    smoothed_target_actions,
    soft_q_target,
    squashed_gaussian,
    squashed_log_prob,
    target_entropy,
    temperature_loss,
    unscale,
)


def test_squashed_log_prob_matches_torch_transformed_distribution() -> None:
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(64, 3, generator=g, dtype=torch.float64)
    log_std = torch.randn(64, 3, generator=g, dtype=torch.float64) * 0.5
    pre_tanh = mean + torch.exp(log_std) * torch.randn(64, 3, generator=g, dtype=torch.float64)
    reference = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform()])
    want = reference.log_prob(torch.tanh(pre_tanh)).sum(-1)
    torch.testing.assert_close(squashed_log_prob(pre_tanh, mean, log_std), want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("u", [9.0, 15.0, 40.0, -40.0])
def test_squashed_log_prob_stays_finite_where_tanh_rounds_to_one(u: float) -> None:
    """Far out, float32's tanh(u) is exactly +-1 and the plain ``log(1 - tanh^2)`` is -inf; the stable form gives
    the closed form ``-2 log cosh u = -2 (|u| + log(1 + e^(-2|u|)) - log 2)``."""
    pre = torch.tensor([[u]], dtype=torch.float32)
    mean, log_std = torch.zeros(1, 1), torch.zeros(1, 1)
    got = squashed_log_prob(pre, mean, log_std)
    a = abs(u)
    log_det = -2.0 * (a + math.log1p(math.exp(-2 * a)) - math.log(2.0))
    want = -0.5 * u * u - 0.5 * math.log(2 * math.pi) - log_det
    assert torch.isfinite(got).all()
    assert got.item() == pytest.approx(want, rel=1e-5)
    if a >= 15:
        assert torch.log(1 - torch.tanh(pre) ** 2).isinf().all()  # why the stable form is needed


def test_the_squashed_density_integrates_to_one_over_the_open_interval() -> None:
    mean, log_std = torch.tensor([[0.7]], dtype=torch.float64), torch.tensor([[-0.3]], dtype=torch.float64)
    a = torch.linspace(-1 + 1e-9, 1 - 1e-9, 200_001, dtype=torch.float64)
    u = torch.atanh(a)[:, None]
    density = torch.exp(squashed_log_prob(u, mean.expand_as(u), log_std.expand_as(u)))
    assert torch.trapezoid(density, a).item() == pytest.approx(1.0, abs=1e-4)


def test_a_squashed_sample_is_bounded_reparameterized_and_reproducible() -> None:
    mean = torch.zeros(512, 2, requires_grad=True)
    log_std = torch.full((512, 2), 1.5, requires_grad=True)
    action, log_prob, pre = squashed_gaussian(mean, log_std, torch.Generator().manual_seed(3))
    assert action.shape == (512, 2) and log_prob.shape == (512,)
    assert (action.abs() <= 1).all()
    assert (action.abs() == 1).any() and torch.isfinite(log_prob).all()  # std 4.5 saturates float32's tanh
    torch.testing.assert_close(action, torch.tanh(pre))
    torch.testing.assert_close(log_prob, squashed_log_prob(pre, mean, log_std))
    action.sum().backward()
    assert mean.grad is not None and mean.grad.abs().sum() > 0 and log_std.grad is not None
    again, _, _ = squashed_gaussian(mean, log_std, torch.Generator().manual_seed(3))
    torch.testing.assert_close(again, action)


def test_rescale_maps_the_unit_box_onto_any_bounds_and_back() -> None:
    low, high = torch.tensor([-2.0, 0.0, 10.0]), torch.tensor([2.0, 1.0, 30.0])
    unit = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0], [0.0, 0.5, -0.5]])
    env = rescale(unit, low, high)
    torch.testing.assert_close(env[0], low)
    torch.testing.assert_close(env[1], high)
    torch.testing.assert_close(env[2], torch.tensor([0.0, 0.75, 15.0]))
    torch.testing.assert_close(unscale(env, low, high), unit)


def test_targets_match_plain_loops() -> None:
    rng = np.random.default_rng(0)
    n, gamma, alpha = 16, 0.99, 0.2
    returns, q1, q2, logp = (torch.tensor(rng.normal(size=n), dtype=torch.float32) for _ in range(4))
    discounts = torch.tensor(gamma ** rng.integers(1, 4, n) * (rng.random(n) > 0.2), dtype=torch.float32)
    soft, clipped = (
        soft_q_target(returns, discounts, q1, q2, logp, alpha),
        clipped_double_q_target(returns, discounts, q1, q2),
    )
    for i in range(n):
        low = min(float(q1[i]), float(q2[i]))
        assert soft[i].item() == pytest.approx(float(returns[i]) + float(discounts[i]) * (low - alpha * float(logp[i])))
        assert clipped[i].item() == pytest.approx(float(returns[i]) + float(discounts[i]) * low)
    with pytest.raises(ValueError, match="one \\[N\\] shape"):
        soft_q_target(returns, discounts, q1[:3], q2, logp, alpha)


def test_target_smoothing_clips_the_noise_and_the_action() -> None:
    target = torch.tensor([[0.95, -0.2, 0.0]]).repeat(1000, 1)
    smoothed = smoothed_target_actions(
        target, noise_std=10.0, noise_clip=0.5, generator=torch.Generator().manual_seed(1)
    )
    assert (smoothed - target).abs().max() <= 0.5 + 1e-6
    assert smoothed.max() <= 1.0 and smoothed.min() >= -1.0
    assert (smoothed[:, 0] == 1.0).any()  # 0.95 plus noise past 1 is clipped to the bound
    torch.testing.assert_close(smoothed_target_actions(target, 0.0, 0.5), target)
    with pytest.raises(ValueError, match="must be >= 0"):
        smoothed_target_actions(target, -1.0, 0.5)


def test_actor_loss_by_hand_and_its_gradient_raises_the_smaller_q() -> None:
    q1 = torch.tensor([1.0, 3.0], requires_grad=True)
    q2 = torch.tensor([2.0, 0.0], requires_grad=True)
    logp = torch.tensor([-1.0, 0.5])
    loss = actor_loss(q1, q2, logp, alpha=0.1)
    assert loss.item() == pytest.approx(((0.1 * -1.0 - 1.0) + (0.1 * 0.5 - 0.0)) / 2)
    loss.backward()
    assert q1.grad is not None and q2.grad is not None
    assert q1.grad.tolist() == [-0.5, 0.0] and q2.grad.tolist() == [0.0, -0.5]
    weighted = actor_loss(q1, q2, logp, alpha=0.1, weights=torch.tensor([2.0, 0.0]))
    assert weighted.item() == pytest.approx((0.1 * -1.0 - 1.0) * 2 / 2)


@pytest.mark.parametrize(("log_prob", "rises"), [(5.0, True), (-5.0, False)])
def test_the_temperature_rises_while_the_entropy_is_below_its_target(log_prob: float, rises: bool) -> None:
    """Target entropy -1 (one action dimension): log pi = 5 is an entropy of -5, below it, so descent raises
    log alpha; log pi = -5 (entropy 5) lowers it."""
    log_alpha = torch.zeros(1, requires_grad=True)
    temperature_loss(log_alpha, torch.full((8,), log_prob), target_entropy(1)).backward()
    assert log_alpha.grad is not None
    assert (log_alpha.grad.item() < 0) == rises  # a step against the gradient moves log alpha up iff it is < 0
    with pytest.raises(ValueError, match="one value"):
        temperature_loss(torch.zeros(2), torch.zeros(8), -1.0)
    with pytest.raises(ValueError, match="0 dimensions"):
        target_entropy(0)
