"""The Nature DQN convolutional torso (Mnih et al. 2015), the standard encoder for Atari frames."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["NatureCNN", "bfloat16_is_native"]

_CONVS: tuple[tuple[int, int, int], ...] = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
"""(out channels, kernel, stride) of each convolution, no padding."""


def _conv_out(size: int, kernel: int, stride: int) -> int:
    """Spatial size after one unpadded convolution."""
    return (size - kernel) // stride + 1


def _init_orthogonal(layer: nn.Conv2d | nn.Linear) -> nn.Conv2d | nn.Linear:
    """Orthogonal weights with gain sqrt(2) (ReLU), zero bias: the init PPO's Atari results rely on."""
    nn.init.orthogonal_(layer.weight, gain=math.sqrt(2.0))
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


def bfloat16_is_native() -> bool | None:
    """Whether oneDNN has bfloat16 kernels on this CPU (AVX-512 and newer, or Arm's bf16); None if torch cannot say.

    Without them autocast runs emulated bfloat16: on an AVX2-only AMD EPYC (2026-12-03) Pong's update ran 10x
    slower than in float32 (``srl bench compute --config configs/pong_ppo.yaml``: 18.5 against 190.7 samples/s).
    """
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a private check: a torch without it says nothing
        return None


class NatureCNN(nn.Module):
    """``uint8 [N, C, H, W]`` frames -> 512 float32 features: three ReLU convolutions, then a ReLU linear layer.

    Observations stay uint8 all the way to here (4x less memory and copying in
    the streams than float32); scaling to [0, 1] happens inside ``forward``.
    """

    def __init__(self, obs_shape: tuple[int, int, int], dtype: str = "float32") -> None:
        """``dtype``: ``bfloat16`` computes under autocast (``model.cnn_dtype``); weights stay float32."""
        super().__init__()
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"NatureCNN: dtype {dtype!r} is neither float32 nor bfloat16")
        self.bf16 = dtype == "bfloat16"
        channels, height, width = (int(d) for d in obs_shape)
        layers: list[nn.Module] = []
        for out_channels, kernel, stride in _CONVS:
            layers += [_init_orthogonal(nn.Conv2d(channels, out_channels, kernel, stride)), nn.ReLU()]
            channels = out_channels
            height, width = _conv_out(height, kernel, stride), _conv_out(width, kernel, stride)
        if height < 1 or width < 1:
            raise ValueError(f"NatureCNN: image {tuple(obs_shape)} is too small for its convolutions (needs >= 36x36)")
        self.out_dim: int = 512
        layers += [nn.Flatten(), _init_orthogonal(nn.Linear(channels * height * width, self.out_dim)), nn.ReLU()]
        # Channels-last (NHWC) weights and activations: oneDNN's convolutions run ~1.3x faster
        # forward+backward on CPU in this layout (measured at batch 256, 1 and 2 threads).
        self.layers = nn.Sequential(*layers).to(memory_format=torch.channels_last)  # type: ignore[call-overload]

    def forward(self, obs: Tensor) -> Tensor:
        """``[N, C, H, W]`` pixels in 0..255 (any real dtype) -> features ``[N, 512]``."""
        x = obs.to(torch.float32, memory_format=torch.channels_last, copy=True).mul_(1.0 / 255.0)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            y = self.layers(x)
        return y.float()  # the heads, losses and normalizers after the CNN stay float32 (a no-op in float32)
