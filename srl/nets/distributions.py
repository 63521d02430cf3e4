"""Action distributions by formula: sample, log-prob and entropy for each supported action space.

Why not ``torch.distributions``: distribution objects validate their
arguments on construction, which costs tens of microseconds per call, a real
share of a policy worker's budget at small batch sizes. Each head here is
two pure functions over the policy's raw output (``act`` without autograd,
``evaluate`` with it), tested against ``torch.distributions`` in
``tests/test_nets.py``. A product distribution (MultiDiscrete, MultiBinary)
sums log-probs and entropies over its independent components.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import Tensor, nn

from srl.api.spaces import ActionSpec

__all__ = ["ActionHead", "make_action_head"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class ActionHead(Protocol):
    """How one action space is sampled from the policy's raw output ``[N, out_dim]``."""

    out_dim: int

    def act(self, out: Tensor, deterministic: bool) -> tuple[Tensor, Tensor]:
        """Actions (the stream's dtype and shape) and their log-probs ``[N]``."""

    def evaluate(self, out: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Log-probs ``[N]`` and entropies ``[N]`` of given actions, with gradients."""


def categorical_act(logits: Tensor, deterministic: bool) -> tuple[Tensor, Tensor]:
    """Sample with the exponential race, a division-only form of the Gumbel-max trick.

    ``argmax(p_i / E_i)`` with ``E_i ~ Exp(1)`` picks ``i`` with probability
    ``p_i`` (it equals ``argmax(log p_i + Gumbel_i)``). Measured at batch 8-64
    with one thread it is 2-4x faster than ``torch.multinomial``.
    """
    logp_all = torch.log_softmax(logits, dim=-1)
    if deterministic:
        actions = logp_all.argmax(dim=-1)
    else:
        race = logp_all.exp()
        race.div_(torch.empty_like(race).exponential_())
        actions = race.argmax(dim=-1)
    return actions, logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)


def categorical_evaluate(logits: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
    """Categorical log-prob and entropy of ``actions`` (indices of the last logits dimension)."""
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(dim=-1)
    return logp, entropy


def mask_logits(logits: Tensor, legal: Tensor) -> Tensor:
    """``logits`` with illegal actions (``legal`` 0) at -inf, so they are never sampled and carry no probability.
    A row with no legal action at all is left as it is (nothing to choose; it cannot be made NaN)."""
    legal = legal.bool()
    legal = legal | ~legal.any(dim=-1, keepdim=True)
    return logits.masked_fill(~legal, float("-inf"))


def masked_categorical_evaluate(logits: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`categorical_evaluate` over logits that may hold -inf (masked actions): their ``p log p`` is 0, not
    NaN, and they get no gradient."""
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    finite = logp_all.clamp_min(torch.finfo(logp_all.dtype).min)
    entropy = -(logp_all.exp() * finite).sum(dim=-1)
    return logp, entropy


class Categorical:
    """Discrete(n): int64 actions ``[N]``."""

    def __init__(self, n: int) -> None:
        self.out_dim = n

    def act(self, out: Tensor, deterministic: bool) -> tuple[Tensor, Tensor]:
        return categorical_act(out, deterministic)

    def evaluate(self, out: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        return categorical_evaluate(out, actions.reshape(-1))


class MultiCategorical:
    """MultiDiscrete(nvec): independent categoricals, int64 actions ``[N, k]``.

    Components of equal size (the common case: a grid of equal choices) are
    sampled as one ``[N, k, n]`` categorical; otherwise the logits are padded
    to the largest ``n`` with -inf, which gives those categories probability 0
    and leaves the rest exact.
    """

    def __init__(self, nvec: tuple[int, ...]) -> None:
        self.nvec = nvec
        self.out_dim = sum(nvec)
        self._uniform = len(set(nvec)) == 1
        width = max(nvec)
        # Index of each padded logit in the flat output (or -1 for padding).
        index = torch.full((len(nvec), width), -1, dtype=torch.long)
        offset = 0
        for i, n in enumerate(nvec):
            index[i, :n] = torch.arange(offset, offset + n)
            offset += n
        self._index, self._pad = index.clamp(min=0), index < 0

    def _logits(self, out: Tensor) -> Tensor:
        """``[N, k, max n]`` logits, padded with -inf."""
        if self._uniform:
            return out.reshape(out.shape[0], len(self.nvec), self.nvec[0])
        index, pad = self._index.to(out.device), self._pad.to(out.device)
        return out[:, index].masked_fill(pad, float("-inf"))

    def act(self, out: Tensor, deterministic: bool) -> tuple[Tensor, Tensor]:
        actions, logp = categorical_act(self._logits(out), deterministic)
        return actions, logp.sum(dim=-1)

    def evaluate(self, out: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        logits = self._logits(out)
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, actions.long().reshape(out.shape[0], -1, 1)).squeeze(-1).sum(dim=-1)
        probs = logp_all.exp()
        if not self._uniform:  # 0 * -inf is NaN (and so is its gradient): padded categories contribute nothing
            logp_all = logp_all.masked_fill(self._pad.to(out.device), 0.0)
        return logp, -(probs * logp_all).sum(dim=(-2, -1))


class Bernoulli:
    """MultiBinary(n): independent Bernoullis with logits ``[N, n]``, int8 actions ``[N, n]``."""

    def __init__(self, n: int) -> None:
        self.out_dim = n

    def act(self, out: Tensor, deterministic: bool) -> tuple[Tensor, Tensor]:
        if deterministic:
            ones = out > 0
        else:
            ones = torch.rand_like(out) < torch.sigmoid(out)
        logp = torch.where(ones, nn.functional.logsigmoid(out), nn.functional.logsigmoid(-out)).sum(dim=-1)
        return ones.to(torch.int8), logp

    def evaluate(self, out: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        a = actions.reshape(out.shape).to(out.dtype)
        log_p1, log_p0 = nn.functional.logsigmoid(out), nn.functional.logsigmoid(-out)
        logp = (a * log_p1 + (1.0 - a) * log_p0).sum(dim=-1)
        entropy = -(log_p1.exp() * log_p1 + log_p0.exp() * log_p0).sum(dim=-1)
        return logp, entropy


class DiagGaussian(nn.Module):
    """Box(d): a diagonal Gaussian with a state-independent, learned ``log_std``; float32 actions ``[N, d]``.

    Actions are returned unclipped; clipping to the bounds is the env adapter's job, so log-probs always
    refer to the action actually sampled.
    """

    def __init__(self, dim: int, init_log_std: float) -> None:
        super().__init__()
        self.out_dim = dim
        self.log_std = nn.Parameter(torch.full((dim,), float(init_log_std)))

    def act(self, out: Tensor, deterministic: bool) -> tuple[Tensor, Tensor]:
        """Sample ``mean + std * eps``; the log-prob follows directly from ``eps``."""
        eps = torch.zeros_like(out) if deterministic else torch.randn_like(out)
        actions = out + self.log_std.exp() * eps
        logp = (-0.5 * eps.pow(2) - self.log_std - _HALF_LOG_2PI).sum(dim=-1)
        return actions, logp

    def evaluate(self, out: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        z = (actions.reshape(out.shape) - out) * torch.exp(-self.log_std)
        logp = (-0.5 * z.pow(2) - self.log_std - _HALF_LOG_2PI).sum(dim=-1)
        entropy = (0.5 + _HALF_LOG_2PI + self.log_std).sum().expand(out.shape[0])
        return logp, entropy


def make_action_head(action: ActionSpec, init_log_std: float = 0.0) -> ActionHead:
    """The distribution for an action field (see :func:`srl.api.spaces.action_spec`)."""
    if action.kind == "discrete":
        return Categorical(action.nvec[0])
    if action.kind == "multi_discrete":
        return MultiCategorical(action.nvec)
    if action.kind == "binary":
        return Bernoulli(action.size)
    return DiagGaussian(action.size, init_log_std)
