"""A custom network: a residual MLP encoder that both actor and critic use, named by ``model.encoder``.

Train it with ``srl train examples/custom_network.yaml`` (from the repository root). The encoder is built as
``ResidualMLP(obs_space, model)`` for each network; it maps the observation parts (here the single part
``obs`` of a Box space) to features ``[N, out_dim]``, and the algorithm puts its heads on top. Running
normalizer statistics are optional: an encoder that lists them in ``normalizer_inputs`` gets them updated by
the trainer (and shipped with the weights, since they are buffers).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from srl.api.config import ModelConfig
from srl.nets.normalizer import RunningMeanStd


class ResidualMLP(nn.Module):
    """``x -> Linear -> [x + MLP(LayerNorm(x))] * blocks``, with a running normalizer on the input."""

    def __init__(self, obs_space: spaces.Space, model: ModelConfig) -> None:
        super().__init__()
        if not isinstance(obs_space, spaces.Box) or len(obs_space.shape) != 1:
            raise ValueError(f"ResidualMLP takes a 1-D Box observation, got {obs_space}")
        width = model.hidden[0]
        self.out_dim = width
        self.normalizer = RunningMeanStd(obs_space.shape)
        self.inp = nn.Linear(obs_space.shape[0], width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
            for _ in model.hidden
        )
        for block in self.blocks:  # each block starts as the identity: a deep stack trains like a shallow one
            nn.init.zeros_(block[-1].weight)
            nn.init.zeros_(block[-1].bias)
        nn.init.orthogonal_(self.inp.weight, gain=float(np.sqrt(2)))

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        x = torch.tanh(self.inp(self.normalizer.normalize(obs["obs"].float())))
        for block in self.blocks:
            x = x + block(x)
        return x

    def normalizer_inputs(self, obs: Mapping[str, torch.Tensor]) -> list[tuple[RunningMeanStd, torch.Tensor]]:
        return [(self.normalizer, obs["obs"])]
