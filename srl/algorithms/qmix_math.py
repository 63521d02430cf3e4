"""The math of cooperative value learning, QMIX (Rashid et al. 2018) and VDN (Sunehag et al. 2018), as pure
functions of tensors.

A team of ``N`` agents shares one reward. Each agent's Q network values its own actions from its own observations
(and its own recurrent state); the team's value ``Q_tot`` mixes the values of the actions the agents chose:

- **VDN**: ``Q_tot`` is their sum (:func:`vdn_mix`).
- **QMIX**: ``Q_tot = elu(q W1 + b1) w2 + b2`` (:func:`monotonic_mix`), its weights made from the global state by
  hypernetworks and taken in absolute value, so ``dQ_tot / dq_a >= 0`` for every agent ``a``: the agents' greedy
  actions, each on its own, are the team's greedy joint action, and decentralised acting stays consistent with the
  centralised value. A sum cannot value a joint action above what its parts add up to; a monotonic mix can, as
  long as raising one agent's value never lowers the team's.

An agent that is not alive (dead, or not yet in the env) enters every mix as 0: its value and its gradient weigh
nothing. Targets are double Q per agent (:func:`srl.algorithms.dqn_math.greedy_values`): each agent's greedy legal
action under the online network, valued by the target network, then mixed by the target mixer on the next state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["chosen_values", "monotonic_mix", "vdn_mix"]


def chosen_values(q: Tensor, actions: Tensor) -> Tensor:
    """Each agent's value of its chosen action ``[..., N]``, from its values ``[..., N, A]`` and ``actions``
    ``[..., N]``."""
    return q.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def vdn_mix(q: Tensor, alive: Tensor) -> Tensor:
    """VDN's team value ``[...]``: the sum of the living agents' values ``q`` ``[..., N]`` (``alive`` 1 or 0)."""
    return (q * alive).sum(dim=-1)


def monotonic_mix(q: Tensor, alive: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    """QMIX's team value ``[M]`` of ``M`` rows of agents' values ``q`` ``[M, N]`` (``alive`` 1 or 0): hidden
    ``elu(q |w1| + b1)`` with ``w1`` ``[M, N, E]`` and ``b1`` ``[M, E]``, then ``hidden . |w2| + b2`` with ``w2``
    ``[M, E]`` and ``b2`` ``[M]``: the hypernetworks' outputs for each row's state."""
    hidden = F.elu(torch.einsum("mn,mne->me", q * alive, w1.abs()) + b1)
    return (hidden * w2.abs()).sum(dim=-1) + b2
