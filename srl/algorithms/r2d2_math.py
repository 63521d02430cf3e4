"""The math of R2D2 (Kapturowski et al. 2019) as pure functions: the value rescaling, the targets of a stored
sequence, and a sequence's priority.

- **Value rescaling** ``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`` (Pohlen et al. 2018) squashes the scale of
  returns, so one network and learning rate fit rewards of any size without clipping them; its inverse has a
  closed form. The n-step target becomes ``h(G + D h^-1(Q_target))``.
- **Targets of a sequence** of ``L`` steps unrolled over its ``L + 1`` observations: step ``t`` takes up to ``n``
  steps, cut at the sequence's end and at its episode's end (:func:`srl.algorithms.nstep.chunk_targets`, whose
  stand-in at a time limit is used: a sequence keeps no final observations), and bootstraps from a row of the
  same unroll, so each bootstrap value is computed with the state the sequence carried there.
- **Priority** of a sequence: ``eta max_t |td_t| + (1 - eta) mean_t |td_t|`` over its trained steps: the max
  alone over-samples one noisy step, the mean alone washes a large error out of a long sequence.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from srl.algorithms.nstep import chunk_targets

__all__ = ["inverse_value_rescale", "sequence_priority", "sequence_targets", "value_rescale"]


def value_rescale(x: Tensor, eps: float) -> Tensor:
    """``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x``."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_value_rescale(y: Tensor, eps: float) -> Tensor:
    """``h^-1(y)``: the root of ``h(x) = y``, ``sign(y) (((sqrt(1 + 4 eps (|y| + 1 + eps)) - 1) / (2 eps))^2 - 1)``;
    with ``eps = 0``, ``sign(y) ((|y| + 1)^2 - 1)``."""
    if eps == 0.0:
        return torch.sign(y) * ((y.abs() + 1.0) ** 2 - 1.0)
    root = (torch.sqrt(1.0 + 4.0 * eps * (y.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return torch.sign(y) * (root**2 - 1.0)


def sequence_targets(
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    values: Tensor,
    gamma: float,
    n: int,
    rescale_eps: float | None = None,
) -> Tensor:
    """The n-step targets ``[L, N]`` of the ``L`` steps of ``N`` sequences (``rewards``, ``terminated``,
    ``truncated`` ``[L, N]``, time-major), from ``values`` ``[L + 1, N]``: the bootstrap value of each of the
    sequences' observation rows (row ``L`` follows the last step). With ``rescale_eps``, the values are in
    rescaled units (``h``) and so is the target: ``h(G + D h^-1(v))``."""
    L, N = rewards.shape
    if values.shape != (L + 1, N):
        raise ValueError(f"sequence_targets: values must be [L + 1, N] = [{L + 1}, {N}], got {list(values.shape)}")
    returns, discounts, boot, _ = chunk_targets(
        np.ascontiguousarray(rewards.T, np.float32), terminated.T, truncated.T, gamma, min(n, L), stand_in=True
    )
    index = torch.as_tensor(boot.T, device=values.device)  # [L, N] rows of values
    v = values.gather(0, index)
    if rescale_eps is not None:
        v = inverse_value_rescale(v, rescale_eps)
    target = torch.as_tensor(returns.T, device=values.device) + torch.as_tensor(discounts.T, device=values.device) * v
    return target if rescale_eps is None else value_rescale(target, rescale_eps)


def sequence_priority(td_abs: Tensor, weight: Tensor, eta: float) -> Tensor:
    """Each sequence's priority ``[N]`` from its steps' ``|td|`` ``[T, N]``: ``eta`` times their max plus ``1 - eta``
    times their mean, over the steps where ``weight`` (``[T, N]``, 1 or 0) is set; 0 for a sequence with none."""
    counted = weight > 0
    top = torch.where(counted, td_abs, torch.zeros_like(td_abs)).amax(dim=0)
    mean = (td_abs * weight).sum(dim=0) / weight.sum(dim=0).clamp(min=1.0)
    return eta * top + (1.0 - eta) * mean
