"""Multi-layer perceptron torso and weight initialization helpers."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

__all__ = ["ACTIVATIONS", "init_linear", "mlp"]

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
}


def init_linear(layer: nn.Linear, gain: float) -> nn.Linear:
    """Orthogonal weights, zero bias.

    Orthogonal init keeps activations' scale stable through depth; a small
    gain on output heads (0.01) starts the policy near uniform / zero-mean,
    which is what makes PPO's early updates well behaved.
    """
    nn.init.orthogonal_(layer.weight, gain=gain)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


def _activation(name: str) -> nn.Module:
    """Build the named activation, failing loudly on an unknown name."""
    try:
        return ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}") from None


def mlp(in_dim: int, hidden: Sequence[int], activation: str = "tanh", layer_norm: bool = False) -> nn.Sequential:
    """Hidden layers ``Linear [+ LayerNorm] + act``; the caller adds the head.

    LayerNorm (before the activation) is SRL's layer-wise normalization switch
    for variance reduction. Linear layers get orthogonal init with gain
    sqrt(2), the usual choice for PPO torsos.
    """
    _activation(activation)  # validate before building anything
    layers: list[nn.Module] = []
    prev = in_dim
    for width in hidden:
        layers.append(init_linear(nn.Linear(prev, width), math.sqrt(2.0)))
        if layer_norm:
            layers.append(nn.LayerNorm(width))
        layers.append(_activation(activation))
        prev = width
    return nn.Sequential(*layers)
