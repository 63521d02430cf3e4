"""Devices for policy workers and trainers: staging buffers that move a batch in one copy each way, and waits that
make timings true (what an algorithm sees of devices is ``srl.api.device``).

Why staging buffers: a forward pass on a GPU needs its inputs in device memory. ``tensor.to("cuda")`` from an
ordinary (pageable) numpy array makes the driver copy the bytes through a pinned buffer of its own and wait for
it, once per array. Gathering a batch's observations straight into a pinned buffer instead lets one asynchronous
copy move every field of the batch, and one more move the answers back. The fields lie one after the other for
the batch's own row count, so ``n`` rows of all of them are one prefix of the buffer: no copy moves more bytes
than the batch has. On the CPU the same code runs with the host buffer as the device buffer, and no copy happens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

ALIGN = 64
"""Bytes each field's block starts on (a cache line; any dtype's alignment)."""

Shapes = Mapping[str, tuple[tuple[int, ...], np.dtype]]
"""Named fields: each one's shape per row and its dtype."""


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a CUDA device runs it asynchronously; a timing must wait for it)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


class Staging:
    """A host buffer (pinned when the device is CUDA) and a device buffer for up to ``rows`` rows of named fields.

    For a batch of ``n`` rows, field after field is laid out ``[n, *shape]``, each block aligned, so the batch is
    the buffer's first :meth:`nbytes` bytes: :meth:`to_device` and :meth:`to_host` move it in one copy. On the CPU
    the two buffers are one and nothing is copied.
    """

    def __init__(self, fields: Shapes, rows: int, device: torch.device) -> None:
        self.fields = {name: (tuple(int(d) for d in shape), np.dtype(dtype)) for name, (shape, dtype) in fields.items()}
        self.rows, self.device = rows, device
        cuda = device.type == "cuda"
        size = self.nbytes(rows)
        self.host = torch.empty(size, dtype=torch.uint8, pin_memory=cuda).zero_()
        self.on_device = torch.zeros(size, dtype=torch.uint8, device=device) if cuda else self.host
        self._host = self.host.numpy()
        self._copied = torch.cuda.Event() if cuda else None

    def _blocks(self, n: int) -> dict[str, tuple[int, int]]:
        """Each field's byte range for ``n`` rows."""
        blocks, start = {}, 0
        for name, (shape, dtype) in self.fields.items():
            size = n * math.prod(shape) * dtype.itemsize
            blocks[name] = (start, start + size)
            start += -(-size // ALIGN) * ALIGN
        return blocks

    def nbytes(self, n: int) -> int:
        """The bytes ``n`` rows of every field take: the prefix one copy moves."""
        return max((end for _, end in self._blocks(n).values()), default=0)

    def host_views(self, n: int) -> dict[str, np.ndarray]:
        """``n`` rows of each field in the host buffer, ``[n, *shape]`` (to gather into, or to read answers from)."""
        self._check(n)
        return {
            name: self._host[start:end].view(dtype).reshape(n, *shape)
            for (name, (shape, dtype)), (start, end) in zip(self.fields.items(), self._blocks(n).values())
        }

    def device_views(self, n: int) -> dict[str, Tensor]:
        """``n`` rows of each field in the device buffer, ``[n, *shape]``."""
        self._check(n)
        return {
            name: self.on_device[start:end].view(torch_dtype(dtype)).view(n, *shape)
            for (name, (shape, dtype)), (start, end) in zip(self.fields.items(), self._blocks(n).values())
        }

    def to_device(self, n: int) -> dict[str, Tensor]:
        """Copy ``n`` rows host -> device in one asynchronous copy (the device's stream orders the work that reads
        them after it) and return their device views."""
        if self.on_device is not self.host:
            end = self.nbytes(n)
            self.on_device[:end].copy_(self.host[:end], non_blocking=True)
        return self.device_views(n)

    def to_host(self, n: int) -> dict[str, np.ndarray]:
        """Copy ``n`` rows device -> host in one copy, wait for it, and return their host views."""
        if self.on_device is not self.host:
            end = self.nbytes(n)
            self.host[:end].copy_(self.on_device[:end], non_blocking=True)
            assert self._copied is not None
            self._copied.record(torch.cuda.current_stream(self.device))
            self._copied.synchronize()
        return self.host_views(n)

    def _check(self, n: int) -> None:
        if not 0 <= n <= self.rows:
            raise ValueError(f"staging holds up to {self.rows} rows, asked for {n}")
