"""Fixed-order packing of tensors into one float32 vector and back: how every network's snapshot travels
(policy and value networks, and a language model's parameters)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


class FlatState:
    """Fixed-order packing of tensors into one float32 vector, and back.

    Buffers include the normalizer statistics, so a policy worker normalizes
    exactly like the trainer that published the snapshot.
    """

    def __init__(self, tensors: Sequence[Tensor]) -> None:
        self.size: int = sum(t.numel() for t in tensors)
        self._staging = np.empty(self.size, dtype=np.float32)

    def pack(self, tensors: Sequence[Tensor], out: np.ndarray | None) -> np.ndarray:
        """Copy every tensor into ``out`` (allocated if None) and return it."""
        if out is None:
            out = np.empty(self.size, dtype=np.float32)
        elif out.shape != (self.size,) or out.dtype != np.float32:
            raise ValueError(f"out must be float32 of shape ({self.size},), got {out.dtype} {out.shape}")
        with torch.no_grad():
            dst = torch.from_numpy(out)
            pieces = [t.reshape(-1) for t in tensors]
            if all(t.device.type == "cpu" for t in tensors):
                torch.cat(pieces, out=dst)  # one kernel, writes straight into ``out``
            else:  # one device->host transfer instead of one per tensor
                dst.copy_(torch.cat([p.float() for p in pieces]))
        return out

    def unpack(self, tensors: Sequence[Tensor], flat: np.ndarray) -> None:
        """Copy ``flat`` into the tensors in place, after checking its length."""
        flat = np.asarray(flat)
        if flat.ndim != 1 or flat.shape[0] != self.size:
            raise ValueError(f"flat state has wrong length: expected {self.size}, got {flat.size} (shape {flat.shape})")
        # Staging copy: accepts read-only (shared-memory) and float64 sources,
        # and gives one contiguous host tensor to move to the device at once.
        np.copyto(self._staging, flat, casting="same_kind")
        src = torch.from_numpy(self._staging)
        if tensors and tensors[0].device.type != "cpu":
            src = src.to(tensors[0].device)
        with torch.no_grad():
            offset = 0
            for t in tensors:
                n = t.numel()
                t.copy_(src[offset : offset + n].view(t.shape))
                offset += n
