"""Gradient clipping for one network: unit-wise (relative to weight norms), then by global norm.

The global threshold is either fixed or *adaptive*: the given percentile of
the last ``window`` gradient norms this clipper has seen, so it follows the
scale of the gradients as training moves instead of a constant chosen up
front. Until the window holds ``window // 2`` norms the fixed threshold (or
none) applies.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn


class GradClipper:
    """Clips the gradients of ``params`` in place; :meth:`clip` returns the norm before and the threshold."""

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        max_norm: float | None,
        adaptive: bool = False,
        percentile: float = 90.0,
        window: int = 100,
        unitwise: float | None = None,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.max_norm, self.adaptive = max_norm, adaptive
        self.percentile, self.unitwise = percentile, unitwise
        self.norms: deque[float] = deque(maxlen=window)
        # Unit-wise clipping applies to weights with an output-unit axis (linear and conv), not biases or scales.
        self._unit_params = [p for p in self.params if p.dim() >= 2]

    def threshold(self) -> float | None:
        """The global-norm threshold the next :meth:`clip` uses (None: no clipping)."""
        if self.adaptive and len(self.norms) >= max(2, (self.norms.maxlen or 2) // 2):
            return float(np.percentile(np.fromiter(self.norms, np.float64), self.percentile))
        return self.max_norm

    @torch.no_grad()
    def clip(self) -> tuple[float, float]:
        """Clip; returns ``(gradient norm before global clipping, threshold or inf)``."""
        if self.unitwise is not None:
            self._clip_unitwise(self.unitwise)
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return 0.0, float("inf")
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        threshold = self.threshold()
        if threshold is not None and norm > threshold and np.isfinite(norm):
            torch._foreach_mul_(grads, threshold / (norm + 1e-6))
        if np.isfinite(norm):
            self.norms.append(norm)
        return norm, float("inf") if threshold is None else threshold

    def _clip_unitwise(self, ratio: float) -> None:
        for p in self._unit_params:
            if p.grad is None:
                continue
            w = p.detach().reshape(p.shape[0], -1)
            g = p.grad.reshape(p.shape[0], -1)
            w_norm = torch.linalg.vector_norm(w, dim=1).clamp_(min=1e-3)
            g_norm = torch.linalg.vector_norm(g, dim=1)
            scale = (ratio * w_norm / g_norm.clamp(min=1e-6)).clamp_(max=1.0)
            p.grad.mul_(scale.view(-1, *([1] * (p.dim() - 1))))


def clip_all(clippers: Mapping[str, GradClipper]) -> dict[str, float]:
    """Clip each network's gradients; per network ``name`` the stats ``grad_norm_<name>`` (before clipping),
    ``grad_norm_<name>_applied`` (what the step uses) and ``clip_threshold_<name>``."""
    out: dict[str, float] = {}
    for name, clipper in clippers.items():
        norm, threshold = clipper.clip()
        out[f"grad_norm_{name}"] = norm
        out[f"grad_norm_{name}_applied"] = min(norm, threshold)
        out[f"clip_threshold_{name}"] = threshold
    return out
