"""The math of RL over tokens (PPO and GRPO on a language model) as pure torch functions.

A batch of completions is laid out ``[N, C]``: N completions of at most C new
tokens each, with a ``mask`` that is 1 on the tokens a completion generated
(its end-of-sequence token included) and 0 after it. One completion is one
episode; its scalar score (the reward function's or the reward model's) is
earned at its last token, and the KL leash to a frozen reference model is paid
per token, either folded into the rewards (:func:`token_rewards`) or added to
the loss (:func:`kl_penalty`).

Everything that is ordinary PPO (GAE, the clipped surrogate, the decoupled
importance weights of TD compensation) comes from :mod:`srl.algorithms.ppo_math`
applied to the valid tokens, so the two workloads share one implementation.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from srl.algorithms.ppo_math import gae

__all__ = [
    "KlEstimator",
    "group_advantages",
    "kl_penalty",
    "kl_per_token",
    "last_token",
    "lengths_mask",
    "masked_mean",
    "masked_whiten",
    "token_gae",
    "token_rewards",
]

KlEstimator = Literal["k1", "k2", "k3"]
"""Per-token estimators of KL(policy || reference) from samples of the policy (Schulman, "Approximating KL
divergence", 2020): ``k1 = log p - log q`` (unbiased, can be negative), ``k2 = (log p - log q)^2 / 2``,
``k3 = q/p - 1 - log(q/p)`` (unbiased, never negative)."""


def lengths_mask(lengths: Tensor, width: int) -> Tensor:
    """``[N, width]`` float mask with ``lengths[i]`` leading ones in row ``i``."""
    positions = torch.arange(width, device=lengths.device)
    return (positions[None, :] < lengths[:, None]).float()


def last_token(mask: Tensor) -> Tensor:
    """``[N, C]`` 0/1 with a single 1 at each row's last valid token (an all-zero row stays zero)."""
    lengths = mask.sum(dim=1).long()
    out = torch.zeros_like(mask)
    rows = torch.nonzero(lengths > 0).squeeze(1)
    out[rows, lengths[rows] - 1] = 1.0
    return out


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is 1 (over all, or along ``dim``); 0 where none is."""
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim=dim) / mask.sum(dim=dim).clamp(min=1.0)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """``x`` scaled to unit variance over the valid positions (and centred, with ``shift_mean``); 0 elsewhere.

    The variance is the population variance of the valid entries, so one batch whitened in two halves and as
    a whole agree when the halves have equal statistics."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def kl_per_token(logp: Tensor, ref_logp: Tensor, estimator: KlEstimator = "k1") -> Tensor:
    """Per-token estimate of KL(policy || reference) from the log-probs of tokens the policy sampled."""
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r} (k1, k2 or k3)")


def token_rewards(scores: Tensor, kl: Tensor, mask: Tensor, kl_coef: float) -> Tensor:
    """Per-token rewards ``[N, C]``: ``-kl_coef * kl`` on every valid token, and each completion's score added
    at its last valid token (the RLHF reward of Ziegler et al., 2019)."""
    return (-kl_coef * kl + scores[:, None] * last_token(mask)) * mask


def token_gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float,
    lam: float,
    rho: Tensor | None = None,
    c: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE over the tokens of each completion (``[N, C]`` in, ``[N, C]`` out, 0 after the end).

    A completion ends at its last valid token: nothing is bootstrapped past it. This is
    :func:`~srl.algorithms.ppo_math.gae` with time along the tokens (its optional V-trace weights too)."""
    values = values * mask
    ends = last_token(mask)
    next_values = torch.zeros_like(values)
    next_values[:, :-1] = values[:, 1:]
    ends = ends + (1.0 - mask)  # positions past the end: nothing flows across them either
    adv, ret = gae(  # time first: [C, N]
        (rewards * mask).t(),
        values.t(),
        next_values.t(),
        ends.t(),
        ends.t(),
        gamma,
        lam,
        None if rho is None else rho.t(),
        None if c is None else c.t(),
    )
    return adv.t() * mask, ret.t() * mask


def group_advantages(scores: Tensor, group_size: int, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO's advantages (Shao et al., 2024): each completion's score minus the mean score of its group of
    ``group_size`` completions of the same prompt (consecutive rows), divided by the group's standard
    deviation when ``scale`` (Dr. GRPO, Liu et al. 2025, argues for ``scale=False``).

    The standard deviation is the sample one (``N - 1``), as TRL and the paper compute it; a group whose
    completions all scored the same gets advantage 0."""
    if scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size}")
    grouped = scores.reshape(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale and group_size > 1:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(scores.shape)


def kl_penalty(logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float, estimator: KlEstimator) -> Tensor:
    """The KL leash as a loss term (GRPO's form): ``kl_coef`` times the mean per-token estimate over the valid
    tokens, differentiable through ``logp``. ``k3`` is the usual choice here: its gradient is that of the
    reverse KL's unbiased estimate."""
    return kl_coef * masked_mean(kl_per_token(logp, ref_logp, estimator), mask)
