"""Adam, written out: ``torch.optim`` imports ``torch._dynamo`` on first use (~1.5 s of start-up on
this kind of machine), which is a sixth of our CartPole time-to-solve budget.

Same update as Kingma & Ba with bias correction, applied with multi-tensor
(``_foreach``) kernels so a small network costs a handful of kernel calls per step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch


def scheduled_lr(lr: float, schedule: str, progress: float) -> float:
    """The learning rate at ``progress`` (in [0, 1]) of a run: ``lr`` throughout (``constant``), or annealed
    linearly towards 0 (``linear``), never below 1e-8."""
    return max(lr * (1.0 - progress), 1e-8) if schedule == "linear" else lr


class Adam:
    """Adam over a fixed list of parameters; ``lr`` may be changed between steps."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        """``weight_decay``: an L2 penalty's gradient, ``weight_decay * p``, added to each gradient (coupled, as
        MuZero's)."""
        self.weight_decay = weight_decay
        self.params = [p for p in params if p.requires_grad]
        self.lr = lr
        self.betas = betas
        self.eps = eps
        self.steps = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update with the gradients currently in ``p.grad`` (a missing gradient counts as zero)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if self.weight_decay:
            grads = list(torch._foreach_add(grads, list[torch.Tensor](self.params), alpha=self.weight_decay))
        beta1, beta2 = self.betas
        self.steps += 1
        torch._foreach_lerp_(self.exp_avg, grads, 1.0 - beta1)
        torch._foreach_mul_(self.exp_avg_sq, beta2)
        torch._foreach_addcmul_(self.exp_avg_sq, grads, grads, value=1.0 - beta2)
        bias1 = 1.0 - beta1**self.steps
        bias2 = 1.0 - beta2**self.steps
        denom = torch._foreach_sqrt(self.exp_avg_sq)
        torch._foreach_div_(denom, math.sqrt(bias2))
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(list[torch.Tensor](self.params), self.exp_avg, denom, value=-self.lr / bias1)

    def state_dict(self) -> dict[str, Any]:
        """Tensors and numbers only, so checkpoints load with ``weights_only=True``."""
        return {
            "steps": self.steps,
            "lr": self.lr,
            "betas": list(self.betas),
            "eps": self.eps,
            "exp_avg": [t.clone() for t in self.exp_avg],
            "exp_avg_sq": [t.clone() for t in self.exp_avg_sq],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if len(state["exp_avg"]) != len(self.params) or len(state["exp_avg_sq"]) != len(self.params):
            raise ValueError(f"optimizer state has {len(state['exp_avg'])} tensors, expected {len(self.params)}")
        for mine, theirs in zip(self.exp_avg + self.exp_avg_sq, list(state["exp_avg"]) + list(state["exp_avg_sq"])):
            if mine.shape != theirs.shape:
                raise ValueError(f"optimizer state shape {tuple(theirs.shape)} != parameter shape {tuple(mine.shape)}")
            mine.copy_(theirs)
        self.steps = int(state["steps"])
        self.lr = float(state["lr"])
        self.betas = (float(state["betas"][0]), float(state["betas"][1]))
        self.eps = float(state["eps"])
