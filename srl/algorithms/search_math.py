"""The math of learning from search (AlphaZero, MuZero), as pure functions of tensors.

- Values and rewards of unbounded scale are learned in a categorical form (MuZero, appendix F): a value ``x`` is
  squashed by ``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x``, whose inverse is closed-form, then spread over the two
  neighbouring integer points of a support ``[-S, S]`` (a two-hot vector); a predicted distribution over the
  support maps back by its expectation and ``h``'s inverse.
- The policy is fitted to the search's policy target over the legal actions only.
- A board game whose rules are the same mirrored left to right (Connect Four, tic-tac-toe) trains on positions
  mirrored at random (:func:`mirror_planes`, :func:`mirror_actions`): a mirrored position's policy is the
  mirrored policy and its value the same, so every game played teaches its mirror image as well.
- AlphaZero's value target may mix the n-step return with the search's own value of the position
  (:func:`value_target`): the outcome of one game is a noisy sample, the search's value a biased but steadier one.
- A model unrolled along a stored item (MuZero) meets the item's episode end: past a termination its positions are
  absorbing (reward and value 0, no policy), past a time limit they are unknown (no target at all)
  (:func:`unroll_targets`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

EPS = 1e-3
"""The linear term of the value transform (MuZero's)."""


def scale(x: Tensor, eps: float = EPS) -> Tensor:
    """``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x``: squashes large values, nearly linear near 0."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x


def unscale(y: Tensor, eps: float = EPS) -> Tensor:
    """The inverse of :func:`scale`."""
    root = (torch.sqrt(1 + 4 * eps * (y.abs() + 1 + eps)) - 1) / (2 * eps)
    return torch.sign(y) * (root.square() - 1)


def two_hot(y: Tensor, support: int) -> Tensor:
    """Each (already scaled) value of ``y`` ``[...]`` as a distribution over the integers ``-support..support``
    ``[..., 2 * support + 1]``: its weight split between the two integers around it (all on one when it is one),
    clipped to the support's ends."""
    y = y.clamp(-support, support)
    low = torch.floor(y)
    upper = y - low  # the weight of low + 1
    out = torch.zeros((*y.shape, 2 * support + 1), dtype=y.dtype, device=y.device)
    index = (low + support).long()
    out.scatter_(-1, index.unsqueeze(-1), (1 - upper).unsqueeze(-1))
    out.scatter_add_(-1, (index + 1).clamp(max=2 * support).unsqueeze(-1), upper.unsqueeze(-1))
    return out


def from_categorical(logits: Tensor, support: int, eps: float = EPS) -> Tensor:
    """The value a categorical prediction ``[..., 2 * support + 1]`` stands for: its expected point, unscaled."""
    points = torch.arange(-support, support + 1, dtype=logits.dtype, device=logits.device)
    return unscale((torch.softmax(logits, dim=-1) * points).sum(-1), eps)


def categorical_loss(logits: Tensor, targets: Tensor, support: int, eps: float = EPS) -> Tensor:
    """Cross-entropy of each prediction ``[N, 2 * support + 1]`` against the two-hot form of each target value
    ``[N]`` (in the values' own units), per row ``[N]``."""
    return -(two_hot(scale(targets, eps), support) * torch.log_softmax(logits, dim=-1)).sum(-1)


def policy_loss(logits: Tensor, target: Tensor, legal: Tensor | None) -> Tensor:
    """Cross-entropy of the policy ``logits`` ``[N, A]`` against the search's policy ``target`` ``[N, A]`` over the
    ``legal`` actions (``[N, A]`` bool; None: all), per row ``[N]``. An illegal action's target is 0 and its logit
    takes no part."""
    if legal is not None:
        logits = logits.masked_fill(~legal, float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    return -(target * torch.where(target > 0, logp, torch.zeros_like(logp))).sum(-1)


def mirror_planes(planes: Tensor, flip: Tensor) -> Tensor:
    """Board planes ``[N, C, H, W]`` with the rows where ``flip`` ``[N]`` (bool) is set mirrored left to right."""
    return torch.where(flip.view(-1, 1, 1, 1), planes.flip(-1), planes)


def mirror_actions(x: Tensor, flip: Tensor, width: int) -> Tensor:
    """Per-action values ``[N, A]`` (a policy, a legal-move mask) of a board ``width`` columns wide, mirrored
    where ``flip`` ``[N]`` is set: an action names a column (``A == width``: Connect Four) or a cell, row-major
    (``A`` a multiple of ``width``: tic-tac-toe), and its mirror is the same row's other end."""
    grid = x.reshape(x.shape[0], -1, width)
    return torch.where(flip.view(-1, 1, 1), grid.flip(-1), grid).reshape(x.shape)


def value_target(returns: Tensor, search_value: Tensor, searched: Tensor, weight: float) -> Tensor:
    """The value target of each position ``[N]``: ``(1 - weight)`` times its n-step return (bootstrapped) plus
    ``weight`` times the search's root value, where the position was searched (``searched`` 1); the return alone
    where it was not (a seat waiting for the opponent has no search of its own)."""
    return torch.where(searched > 0, (1.0 - weight) * returns + weight * search_value, returns)


@dataclass
class Unrolled:
    """The targets of a model unrolled ``K`` steps along items (:func:`unroll_targets`): at each position
    ``k = 0..K`` a value and whether it counts, whether a policy target counts; for each step ``k = 0..K-1`` the
    reward of its action and whether it counts."""

    values: Tensor
    value_mask: Tensor
    policy_mask: Tensor
    rewards: Tensor
    reward_mask: Tensor


def unroll_targets(values: Tensor, rewards: Tensor, terminated: Tensor, truncated: Tensor) -> Unrolled:
    """Targets for unrolling a model along items of ``K + 1`` stored steps (``[K + 1, N]`` each): ``values`` the
    value target each step has as stored (an n-step return, bootstrapped), ``rewards`` and the episode-end flags of
    each step. Position 0 is the item's first step. A position after the item's first episode end is past it:
    after a termination it is absorbing (value 0, the reward of acting there 0, both counted; no policy), after a
    time limit unknown (nothing counted). Masks are float (1 counts, 0 does not)."""
    ends = terminated | truncated
    seen = torch.cumsum(ends.long(), dim=0)
    past = (seen - ends.long()) > 0  # [K + 1, N]: an episode end lies before this position
    first_terminated = (terminated & (seen == 1)).any(dim=0)  # [N]: the first end is a termination
    absorbing = past & first_terminated
    known = (~past | absorbing).float()
    zero = torch.zeros_like(values)
    return Unrolled(
        values=torch.where(absorbing, zero, values),
        value_mask=known,
        policy_mask=(~past).float(),
        rewards=torch.where(absorbing, zero, rewards.to(values.dtype))[:-1],
        reward_mask=known[:-1],
    )
