"""Devices as an algorithm sees them: a checked device name, the trainer's autocast, and a batch's fields as
tensors on the trainer's device, prefetched there when the runtime did (``srl.system.prefetch``) or moved there
(shared, not copied, on the CPU). The runtime's side of devices (staging buffers, the prefetcher) is
``srl.system.device`` and ``srl.system.prefetch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager

import numpy as np
import torch
from torch import Tensor


def torch_device(name: str, where: str) -> torch.device:
    """``name`` as a torch device; a CUDA device torch does not see here is one clear error, ``where`` naming the
    setting it came from."""
    device = torch.device(name)
    if device.type != "cuda":
        return device
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        build = f" (torch {torch.__version__} is built without CUDA)" if torch.version.cuda is None else ""
        raise ValueError(f"{where}: {name}: torch sees no CUDA device on this machine{build}")
    if device.index is not None and device.index >= count:
        raise ValueError(f"{where}: {name}: torch sees {count} CUDA device(s) here (cuda:0 to cuda:{count - 1})")
    return device


def autocast(device: torch.device, dtype: str) -> AbstractContextManager[object]:
    """Where an algorithm computes its forward passes and losses: under bfloat16 autocast on ``device`` when
    ``dtype`` (``workers.trainer_dtype``) is ``bfloat16``, else as it is (float32)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")


def batch_tensor(value: np.ndarray | Tensor, device: torch.device) -> Tensor:
    """A batch field as a tensor on ``device``: a prefetched tensor as it is, an array shared with numpy on the
    CPU (no copy) or copied to the device."""
    if isinstance(value, Tensor):
        return value.to(device)
    return torch.from_numpy(np.ascontiguousarray(value)).to(device)


class DeviceBatch(dict[str, np.ndarray]):
    """A batch as the algorithm gets it: its fields as host arrays (what every algorithm reads, as before) and, in
    :attr:`on_device`, as tensors on the trainer's device (what :func:`field` hands an algorithm that asks)."""

    def __init__(self, host: Mapping[str, np.ndarray], on_device: Mapping[str, Tensor]) -> None:
        super().__init__(host)
        self.on_device = on_device


def field(batch: Mapping[str, np.ndarray], name: str, device: torch.device) -> Tensor:
    """Batch field ``name`` as a tensor on ``device``: the prefetched one when the batch carries it (no copy),
    else the host array moved there (shared, not copied, on the CPU)."""
    on_device = getattr(batch, "on_device", None)
    if on_device is not None and name in on_device:
        return on_device[name].to(device)
    return batch_tensor(batch[name], device)
