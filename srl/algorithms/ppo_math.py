"""PPO's math as pure torch functions.

Everything here is a plain function of tensors: no configs, no networks, no
workers. That keeps the algorithm readable on one screen and lets the tests
check it against a naive loop reference. Trainers compose these functions.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["explained_variance", "gae", "normalize_advantages", "ppo_loss"]


def _as_float(x: Tensor, like: Tensor) -> Tensor:
    """Cast a bool/float mask to ``like``'s float dtype so it can scale values."""
    return x.to(dtype=like.dtype)


@torch.no_grad()
def gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    episode_end: Tensor,
    gamma: float,
    lam: float,
    rho: Tensor | None = None,
    c: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over a ``[T, B]`` segment, optionally V-trace-corrected.

    ``next_values[t]`` is V of the state reached after step ``t``. Passing it
    explicitly (instead of reading ``values[t + 1]``) is what makes truncation
    correct: for a truncated step the caller supplies V(final_obs), which
    bootstraps, while ``episode_end`` still stops the advantage recursion from
    leaking into the next episode. ``terminated`` only zeroes the bootstrap.

    Returns ``(advantages, returns)`` with ``returns = advantages + values``,
    the regression target for the critic. Both are targets, never things to
    differentiate through, so this runs under ``no_grad`` (outputs detached).

    Off-policy correction (``rho``, ``c``: truncated importance weights
    ``min(rho_bar, pi/mu)``, ``min(c_bar, pi/mu)`` per step): each TD error is
    weighted by ``rho`` and each trace by ``lam * c``, which makes
    ``returns`` the V-trace targets of Espeholt et al. (2018) with a lambda
    and ``advantages = returns - values``. With every weight 1 this is GAE.
    """
    not_term = 1.0 - _as_float(terminated, values)
    not_end = 1.0 - _as_float(episode_end, values)
    deltas = rewards + gamma * next_values * not_term - values
    decay = (gamma * lam) * not_end
    if rho is not None:
        deltas = rho * deltas
    if c is not None:
        decay = decay * c
    advantages = torch.empty_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = deltas[t] + decay[t] * running
        advantages[t] = running
    return advantages, advantages + values


def value_loss(new_values: Tensor, old_values: Tensor, returns: Tensor, value_clip: float | None) -> Tensor:
    """Critic loss; the clipped form keeps the critic near its rollout-time values."""
    unclipped = (new_values - returns).pow(2)
    if value_clip is None:
        return 0.5 * unclipped.mean()
    clipped_v = old_values + (new_values - old_values).clamp(-value_clip, value_clip)
    clipped = (clipped_v - returns).pow(2)
    return 0.5 * torch.maximum(unclipped, clipped).mean()


def ppo_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    new_values: Tensor | None,
    old_values: Tensor | None,
    returns: Tensor | None,
    entropy: Tensor,
    *,
    clip: float,
    value_clip: float | None,
    vf_coef: float,
    ent_coef: float,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Total PPO loss (clipped surrogate + value + entropy bonus) and stats.

    All inputs are flat tensors of a minibatch: the policy's terms (log-probs, advantages, entropies, weights)
    over the rows acted in, the critic's over all its rows. The stats are detached
    scalars so the caller can log them without holding the graph alive.
    ``approx_kl`` uses the low-variance ``(r - 1) - log r`` estimator.
    ``weights`` (per sample, no gradient) scale the clipped surrogate: the
    truncated behaviour importance weights of decoupled PPO, where
    ``old_logp`` is then the proximal (current) policy's. Without a critic (GRPO) the value terms are None
    and the value loss is 0.
    """
    log_ratio = new_logp - old_logp
    ratio = log_ratio.exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1.0 - clip, 1.0 + clip) * advantages
    surrogate = torch.minimum(surr1, surr2)
    if weights is not None:
        surrogate = weights * surrogate
    policy_loss = -_mean(surrogate)
    if new_values is None or old_values is None or returns is None:
        v_loss = torch.zeros((), dtype=new_logp.dtype, device=new_logp.device)
    else:
        v_loss = value_loss(new_values, old_values, returns, value_clip)
    entropy_mean = _mean(entropy)
    total = policy_loss + vf_coef * v_loss - ent_coef * entropy_mean
    with torch.no_grad():
        stats = {
            "policy_loss": policy_loss.detach(),
            "value_loss": v_loss.detach(),
            "entropy": entropy_mean.detach(),
            "approx_kl": _mean((ratio - 1.0) - log_ratio),
            "clip_fraction": _mean(((ratio - 1.0).abs() > clip).float()),
        }
    return total, stats


def _mean(x: Tensor) -> Tensor:
    """The mean, and 0 for no elements (a minibatch in which no agent acted has no policy terms)."""
    return x.mean() if x.numel() else x.sum()


def normalize_advantages(adv: Tensor, eps: float = 1e-8) -> Tensor:
    """Zero-mean, unit-std advantages so the step size does not track reward scale."""
    if adv.numel() < 2:
        return adv - adv.mean()
    return (adv - adv.mean()) / (adv.std() + eps)


def explained_variance(pred: Tensor, target: Tensor) -> float:
    """1 - Var[target - pred] / Var[target]: how much of the returns the critic explains.

    Returns NaN when the target has no variance (the ratio is undefined), so a
    constant-return batch is visible in the logs rather than reported as 0 or 1.
    """
    pred = pred.detach().flatten().double()
    target = target.detach().flatten().double()
    var_t = target.var(unbiased=False)
    if var_t.item() == 0.0:
        return float("nan")
    return float(1.0 - (target - pred).var(unbiased=False) / var_t)
