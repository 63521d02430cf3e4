"""SAC's and TD3's math as pure functions: the tanh-squashed Gaussian, bounded actions, the soft and clipped
double-Q targets, TD3's target-policy smoothing, and the losses of the actor and the entropy temperature.

Like :mod:`srl.algorithms.dqn_math`, nothing here knows a config, a network or a worker: each piece is checked
against a reference (torch's own transformed distribution for the squashed log-density, plain loops for the
targets), and the algorithms read as a composition of them. The n-step returns and discounts the targets take
come from the replay (:func:`srl.algorithms.nstep.nstep`); the target networks move by
:func:`srl.algorithms.dqn_math.polyak_`.

Why the log-density is written out instead of taken from ``TransformedDistribution(Normal, TanhTransform)``: the
correction ``log(1 - tanh(u)^2)`` is computed here as ``2 (log 2 - u - softplus(-2u))``, which stays finite where
``tanh(u)`` rounds to +-1 in float32 (|u| above about 9); the plain form gives ``-inf`` there, and a policy whose
mean drifts that far then gets infinite losses.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "actor_loss",
    "clipped_double_q_target",
    "rescale",
    "smoothed_target_actions",
    "soft_q_target",
    "squashed_gaussian",
    "squashed_log_prob",
    "target_entropy",
    "temperature_loss",
    "unscale",
]

LOG_2 = math.log(2.0)


def squashed_log_prob(pre_tanh: Tensor, mean: Tensor, log_std: Tensor) -> Tensor:
    """Log-density ``[N]`` of ``a = tanh(u)`` with ``u ~ Normal(mean, exp(log_std))`` (independent dimensions,
    ``[N, D]``): the Gaussian's log-density of ``u`` minus ``sum_d log(1 - tanh(u_d)^2)``, the change of
    variables of the squashing (Haarnoja et al. 2018, appendix C), in its stable form."""
    if not pre_tanh.shape == mean.shape == log_std.shape or pre_tanh.dim() != 2:
        raise ValueError(
            f"squashed_log_prob: pre_tanh {tuple(pre_tanh.shape)}, mean {tuple(mean.shape)} and log_std "
            f"{tuple(log_std.shape)} must be one [N, D] shape"
        )
    z = (pre_tanh - mean) * torch.exp(-log_std)
    gaussian = -0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    log_det = 2.0 * (LOG_2 - pre_tanh - F.softplus(-2.0 * pre_tanh))  # log(1 - tanh(u)^2)
    return (gaussian - log_det).sum(dim=-1)


def squashed_gaussian(
    mean: Tensor, log_std: Tensor, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """A reparameterized sample of the squashed Gaussian: ``(action [N, D], its log-density [N], its pre-tanh
    value [N, D])``. Gradients flow to ``mean`` and ``log_std`` through the sample. The action lies in
    ``[-1, 1]``: far out, float32's tanh rounds to +-1, which is why the log-density is taken from the pre-tanh
    value (and stays exact there)."""
    noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
    pre_tanh = mean + torch.exp(log_std) * noise
    return torch.tanh(pre_tanh), squashed_log_prob(pre_tanh, mean, log_std), pre_tanh


def rescale(unit: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """Actions in ``[-1, 1]`` mapped affinely onto the Box ``[low, high]`` (what the env is given)."""
    return low + (unit + 1.0) * 0.5 * (high - low)


def unscale(action: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """The inverse of :func:`rescale`: env actions (as stored in the replay) back into ``[-1, 1]``."""
    return (action - low) * 2.0 / (high - low) - 1.0


def target_entropy(action_dims: int) -> float:
    """SAC's default entropy target for automatic temperature tuning: ``-|A|``."""
    if action_dims < 1:
        raise ValueError(f"target_entropy: an action space of {action_dims} dimensions")
    return -float(action_dims)


def _check_rows(name: str, returns: Tensor, discounts: Tensor, *values: Tensor) -> None:
    for t in (discounts, *values):
        if t.shape != returns.shape or returns.dim() != 1:
            raise ValueError(
                f"{name}: returns {tuple(returns.shape)}, discounts {tuple(discounts.shape)} and values "
                f"{[tuple(v.shape) for v in values]} must all be one [N] shape"
            )


@torch.no_grad()
def soft_q_target(
    returns: Tensor, discounts: Tensor, q1_next: Tensor, q2_next: Tensor, log_prob_next: Tensor, alpha: float
) -> Tensor:
    """SAC's target ``[N]``: ``returns + discounts * (min(Q1', Q2') - alpha * log pi(a'|s'))``, with ``a'`` drawn
    from the current policy at the bootstrap observation and both Q's from the target critics (the clipped
    double-Q of Fujimoto et al. 2018, with the entropy bonus of the next step)."""
    _check_rows("soft_q_target", returns, discounts, q1_next, q2_next, log_prob_next)
    return returns + discounts * (torch.minimum(q1_next, q2_next) - alpha * log_prob_next)


@torch.no_grad()
def clipped_double_q_target(returns: Tensor, discounts: Tensor, q1_next: Tensor, q2_next: Tensor) -> Tensor:
    """TD3's target ``[N]``: ``returns + discounts * min(Q1', Q2')`` at the smoothed target action."""
    _check_rows("clipped_double_q_target", returns, discounts, q1_next, q2_next)
    return returns + discounts * torch.minimum(q1_next, q2_next)


@torch.no_grad()
def smoothed_target_actions(
    target_actions: Tensor, noise_std: float, noise_clip: float, generator: torch.Generator | None = None
) -> Tensor:
    """TD3's target-policy smoothing, in the unit box: the target actor's actions plus Gaussian noise clipped to
    ``+-noise_clip``, the sum clipped back into ``[-1, 1]``, so the target averages Q over a small neighbourhood
    of the action instead of trusting a sharp peak of it."""
    if noise_std < 0 or noise_clip < 0:
        raise ValueError(f"smoothed_target_actions: noise_std {noise_std} and noise_clip {noise_clip} must be >= 0")
    noise = torch.randn(
        target_actions.shape, generator=generator, dtype=target_actions.dtype, device=target_actions.device
    )
    noise = (noise * noise_std).clamp(-noise_clip, noise_clip)
    return (target_actions + noise).clamp(-1.0, 1.0)


def actor_loss(q1: Tensor, q2: Tensor, log_prob: Tensor, alpha: float, weights: Tensor | None = None) -> Tensor:
    """SAC's policy loss: ``mean(w * (alpha * log pi(a|s) - min(Q1, Q2)(s, a)))`` over reparameterized actions
    (TD3's deterministic actor is the case ``alpha = 0`` with ``Q1`` alone passed twice). ``weights``: importance
    weights of prioritized replay."""
    _check_rows("actor_loss", log_prob, q1, q2)
    loss = alpha * log_prob - torch.minimum(q1, q2)
    return (loss * weights).mean() if weights is not None else loss.mean()


def temperature_loss(log_alpha: Tensor, log_prob: Tensor, target: float) -> Tensor:
    """Automatic entropy tuning's loss of ``log alpha``: ``-mean(log_alpha * (log pi + target))``, with the
    log-densities held fixed. Its gradient raises alpha while the policy's entropy ``-E[log pi]`` is below
    ``target`` and lowers it above."""
    if log_alpha.numel() != 1:
        raise ValueError(f"temperature_loss: log_alpha must be one value, got {tuple(log_alpha.shape)}")
    return -(log_alpha.reshape(()) * (log_prob.detach() + target)).mean()
