"""Running observation statistics as a torch module.

The statistics live in registered buffers so they travel with the network:
``state_dict`` checkpoints them and ``PolicyNet.flat_state`` ships them to
policy workers together with the weights, so actors and trainer normalize
identically.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["RunningMeanStd"]


class RunningMeanStd(nn.Module):
    """Per-feature running mean and variance, merged batch by batch.

    Uses the parallel-moments merge of Chan et al., which is exact for any
    batch sizes (no exponential decay), so the result equals the mean/var of
    everything seen so far up to the tiny initial ``count`` prior.
    """

    mean: Tensor
    var: Tensor
    count: Tensor

    def __init__(self, shape: Sequence[int] | int, initial_count: float = 1e-4) -> None:
        super().__init__()
        shape_t = (shape,) if isinstance(shape, int) else tuple(shape)
        self.shape: tuple[int, ...] = shape_t
        self.register_buffer("mean", torch.zeros(shape_t, dtype=torch.float32))
        self.register_buffer("var", torch.ones(shape_t, dtype=torch.float32))
        self.register_buffer("count", torch.tensor(initial_count, dtype=torch.float64))

    def _batch_view(self, x: Tensor) -> Tensor:
        """Flatten any leading dims into one batch dim, as float64 for a stable merge."""
        if tuple(x.shape[x.dim() - len(self.shape) :]) != self.shape:
            raise ValueError(f"expected trailing shape {self.shape}, got {tuple(x.shape)}")
        return x.reshape(-1, *self.shape).to(torch.float64)

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Fold a batch ``[..., *shape]`` into the running statistics."""
        self.update_moments(*self.moments(x))

    @torch.no_grad()
    def moments(self, x: Tensor) -> tuple[Tensor, Tensor, int]:
        """Mean and (biased) variance of a batch ``[..., *shape]`` in float64, and its size.

        Split from :meth:`update` so data-parallel trainers can merge their batches' moments
        before every one of them folds in the same result.
        """
        batch = self._batch_view(x)
        n = batch.shape[0]
        if n == 0:
            zeros = torch.zeros(self.shape, dtype=torch.float64, device=x.device)
            return zeros, zeros.clone(), 0
        return batch.mean(dim=0), batch.var(dim=0, unbiased=False), n

    @torch.no_grad()
    def update_moments(self, b_mean: Tensor, b_var: Tensor, n: int) -> None:
        """Fold a batch given by its moments into the running statistics."""
        if n == 0:
            return
        mean = self.mean.to(torch.float64)
        var = self.var.to(torch.float64)
        total = self.count + n
        delta = b_mean - mean
        new_mean = mean + delta * (n / total)
        m2 = var * self.count + b_var * n + delta.pow(2) * (self.count * n / total)
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def denormalize(self, x: Tensor) -> Tensor:
        """Inverse of :meth:`normalize` (without its clamp): ``x * std + mean``."""
        return x * torch.sqrt(self.var + 1e-8) + self.mean

    def normalize(self, x: Tensor, clip: float = 10.0) -> Tensor:
        """Standardize ``x`` and clamp to ``[-clip, clip]`` to bound outliers early on."""
        # In-place ops on the fresh ``x - mean`` tensor: this sits on every
        # inference call, where allocation and op count dominate at small batch.
        centered = x.to(torch.float32) - self.mean
        return centered.mul_(torch.rsqrt(self.var + 1e-8)).clamp_(-clip, clip)

    def forward(self, x: Tensor) -> Tensor:
        """Alias of :meth:`normalize` so the module composes in ``nn.Sequential``."""
        return self.normalize(x)
