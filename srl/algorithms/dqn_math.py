"""DQN's math as pure functions: the dueling head, (double) Q targets, the TD loss, target-net averaging,
and the exploration schedules.

Like :mod:`srl.algorithms.ppo_math`, nothing here knows a config, a network or a worker, so each piece is
checked against a plain-loop reference and the trainer reads as a composition of them. The n-step
returns and discounts the targets take come from :func:`srl.algorithms.nstep.nstep`, which the replay worker
runs at sampling time.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from srl.nets.distributions import mask_logits

__all__ = [
    "double_q_target",
    "dueling",
    "epsilon_ladder",
    "greedy_values",
    "linear_epsilon",
    "polyak_",
    "q_target",
    "td_loss",
]


def dueling(value: Tensor, advantages: Tensor) -> Tensor:
    """Q ``[N, A]`` from a state value ``[N, 1]`` and advantages ``[N, A]`` (Wang et al. 2016).

    The advantages are mean-subtracted: value and advantage are otherwise identifiable only up to a
    constant. The mean rather than the max is Wang et al.'s choice for stability: the advantages then
    need only change as fast as their mean, not as fast as the best action's.
    """
    if value.dim() != 2 or value.shape[1] != 1 or value.shape[0] != advantages.shape[0]:
        raise ValueError(
            f"dueling: value must be [N, 1] beside advantages {tuple(advantages.shape)}, got {tuple(value.shape)}"
        )
    return value + advantages - advantages.mean(dim=-1, keepdim=True)


@torch.no_grad()
def q_target(q_next_target: Tensor, returns: Tensor, discounts: Tensor, legal: Tensor | None = None) -> Tensor:
    """The DQN target ``returns + discounts * max_a Q_target(s', a)`` over the legal actions, ``[N]``.

    ``returns`` and ``discounts`` are the n-step sums and ``gamma^m`` (0 after a terminal step) of
    :func:`srl.algorithms.nstep.nstep`; ``q_next_target`` is the target net at the bootstrap observation.
    """
    _check_rows(q_next_target, returns, discounts)
    best = _masked(q_next_target, legal, discounts).argmax(dim=-1)
    return _bootstrap(q_next_target, best, returns, discounts)


@torch.no_grad()
def double_q_target(
    q_next_online: Tensor, q_next_target: Tensor, returns: Tensor, discounts: Tensor, legal: Tensor | None = None
) -> Tensor:
    """The double-DQN target ``[N]`` (van Hasselt et al. 2016): the online net picks the next action, the
    target net values it, which removes the max operator's overestimation of noisy Q values.
    """
    if q_next_online.shape != q_next_target.shape:
        raise ValueError(
            f"double_q_target: online {tuple(q_next_online.shape)} and target {tuple(q_next_target.shape)} "
            "Q values must have one shape"
        )
    _check_rows(q_next_target, returns, discounts)
    best = _masked(q_next_online, legal, discounts).argmax(dim=-1)
    return _bootstrap(q_next_target, best, returns, discounts)


def greedy_values(pick: Tensor, values: Tensor, legal: Tensor | None = None) -> Tensor:
    """``values`` ``[..., A]`` at the action ``pick`` ``[..., A]`` prefers among the ``legal`` ones (``[..., A]``;
    None: all), ``[...]``: with ``pick`` the online network's values and ``values`` the target's, double Q's
    bootstrap value (a row with no legal action takes action 0)."""
    if legal is not None:
        pick = mask_logits(pick, legal)
    return values.gather(-1, pick.argmax(dim=-1, keepdim=True)).squeeze(-1)


def _check_rows(q: Tensor, returns: Tensor, discounts: Tensor) -> None:
    """Returns and discounts one per Q row, so nothing broadcasts ``[N]`` against ``[N, 1]`` into ``[N, N]``."""
    rows = tuple(q.shape[:-1])
    if q.dim() != 2 or tuple(returns.shape) != rows or tuple(discounts.shape) != rows:
        raise ValueError(
            f"Q values must be [N, A] with returns and discounts [N], got {tuple(q.shape)}, "
            f"{tuple(returns.shape)} and {tuple(discounts.shape)}"
        )


def _masked(q: Tensor, legal: Tensor | None, discounts: Tensor) -> Tensor:
    """``q`` with illegal actions at -inf, so no argmax picks one.

    A row with no legal action is an error only where the target bootstraps from it (``discounts`` > 0):
    a terminal observation may legally offer no move, and its value is never read.
    """
    if legal is None:
        return q
    if legal.shape != q.shape:
        raise ValueError(f"legal action mask {tuple(legal.shape)} must have the Q values' shape {tuple(q.shape)}")
    legal = legal.bool()
    empty = ~legal.any(dim=-1) & (discounts != 0)
    if bool(empty.any()):
        rows = torch.nonzero(empty).flatten().tolist()
        raise ValueError(f"legal action mask: rows {rows[:8]} bootstrap from an observation with no legal action")
    return q.masked_fill(~legal, float("-inf"))


def _bootstrap(q_next: Tensor, best: Tensor, returns: Tensor, discounts: Tensor) -> Tensor:
    """``returns + discounts * q_next[best]``, reading no Q value where the discount is 0 (it may be -inf/NaN
    for a terminal observation's row, and 0 * inf is NaN)."""
    value = q_next.gather(-1, best.unsqueeze(-1)).squeeze(-1)
    value = torch.where(discounts != 0, value, torch.zeros_like(value))
    return returns + discounts * value


def td_loss(
    q_taken: Tensor, target: Tensor, weights: Tensor | None = None, kind: str = "huber", huber_delta: float = 1.0
) -> tuple[Tensor, Tensor]:
    """The importance-weighted mean TD loss and the detached TD errors ``target - q_taken`` (both ``[N]``).

    The TD errors are what the replay's new priorities are made of. ``weights`` are prioritized replay's
    importance weights (no gradient flows into them); ``kind`` is ``"huber"`` (quadratic within
    ``huber_delta``, linear beyond, so one large error cannot dominate a step) or ``"mse"``.
    """
    if q_taken.shape != target.shape:
        raise ValueError(
            f"td_loss: q_taken {tuple(q_taken.shape)} and target {tuple(target.shape)} must have one shape"
        )
    target = target.detach()
    if kind == "huber":
        if not huber_delta > 0:
            raise ValueError(f"td_loss: huber_delta={huber_delta} must be > 0")
        per_item = F.huber_loss(q_taken, target, reduction="none", delta=huber_delta)
    elif kind == "mse":
        per_item = F.mse_loss(q_taken, target, reduction="none")
    else:
        raise ValueError(f"td_loss: kind={kind!r} must be 'huber' or 'mse'")
    if weights is not None:
        if weights.shape != q_taken.shape:
            raise ValueError(
                f"td_loss: weights {tuple(weights.shape)} must have q_taken's shape {tuple(q_taken.shape)}"
            )
        per_item = weights.detach() * per_item
    return per_item.mean(), (target - q_taken).detach()


@torch.no_grad()
def polyak_(target_params: Iterable[Tensor], online_params: Iterable[Tensor], tau: float) -> None:
    """Move each target tensor a fraction ``tau`` towards its online tensor, in place.

    ``tau = 1`` is the hard copy of the original DQN (an exact copy, not ``t + (o - t)``, which can round);
    a small ``tau`` every step is Polyak averaging.
    """
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"polyak_: tau={tau} must be in (0, 1]")
    targets, onlines = list(target_params), list(online_params)
    if len(targets) != len(onlines):
        raise ValueError(f"polyak_: {len(targets)} target tensors for {len(onlines)} online tensors")
    for i, (t, o) in enumerate(zip(targets, onlines)):
        if t.shape != o.shape:
            raise ValueError(f"polyak_: tensor {i} has target shape {tuple(t.shape)}, online {tuple(o.shape)}")
        if tau == 1.0:
            t.copy_(o)
        else:
            t.lerp_(o, tau)


def epsilon_ladder(num_envs_total: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Ape-X's exploration rates ``base^(1 + alpha * i / (N - 1))`` for env ``i`` of ``N`` (Horgan et al. 2018).

    ``N`` counts every env of every actor, so the ladder spans the same range however the envs are split
    over processes; one env gets ``base``. Float64 ``[N]``, from ``base`` down to ``base^(1 + alpha)``.
    """
    if isinstance(num_envs_total, bool) or not isinstance(num_envs_total, (int, np.integer)) or num_envs_total < 1:
        raise ValueError(f"epsilon_ladder: num_envs_total={num_envs_total} must be an integer >= 1")
    if not 0.0 <= base <= 1.0:
        raise ValueError(f"epsilon_ladder: base={base} must be in [0, 1]")
    if not alpha >= 0.0:
        raise ValueError(f"epsilon_ladder: alpha={alpha} must be >= 0")
    if num_envs_total == 1:
        return np.array([base], np.float64)
    i = np.arange(num_envs_total, dtype=np.float64)
    return np.power(base, 1.0 + alpha * i / (num_envs_total - 1))


def linear_epsilon(step: int, start: float, end: float, decay_steps: int) -> float:
    """Plain DQN's exploration rate: ``start`` at step 0, linearly to ``end`` at ``decay_steps``, then ``end``.

    ``decay_steps = 0`` means ``end`` from the first step.
    """
    if not (0.0 <= start <= 1.0 and 0.0 <= end <= 1.0):
        raise ValueError(f"linear_epsilon: start={start} and end={end} must be in [0, 1]")
    if step < 0 or decay_steps < 0:
        raise ValueError(f"linear_epsilon: step={step} and decay_steps={decay_steps} must be >= 0")
    if step >= decay_steps:
        return float(end)
    return float(start + (end - start) * step / decay_steps)
