"""Data-parallel trainers: collective operations over ``torch.distributed`` (gloo on CPU).

Each trainer process of a policy joins one process group. Rendezvous goes
through a file store in the run's private directory (local runtime) or a
TCP store address handed out by the runtime; gloo's own connections bind to
the loopback interface unless the trainers span several nodes (then the
interface of the node's address) or ``GLOO_SOCKET_IFNAME`` says otherwise.

Every reduction packs its tensors into one preallocated flat buffer, so a
minibatch costs one all-reduce whatever the number of parameter tensors.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
from torch import Tensor


class TorchCollective:
    """A gloo process group of ``world_size`` trainers; this process is ``rank``."""

    def __init__(
        self, rank: int, world_size: int, init_method: str, timeout: float = 1800.0, interface: str | None = "lo"
    ) -> None:
        """``timeout`` bounds every collective. It is long on purpose: a trainer waits in the pre-update
        agreement until its slowest peer has a full batch. A peer that dies closes its connections, which
        fails the others at once; a hung one is the controller's to stop. ``interface``: where gloo listens
        unless ``GLOO_SOCKET_IFNAME`` is set (None: gloo's own choice)."""
        self.rank, self.world_size, self.init_method, self.interface = rank, world_size, init_method, interface
        self.timeout = timeout
        self.bytes_reduced = 0
        self.seconds_reduced = 0.0
        self._group: object | None = None
        self._buffers: dict[tuple[int, torch.dtype, torch.device], Tensor] = {}

    def connect(self) -> None:
        """Join the group (blocks until every trainer has joined, or ``timeout``)."""
        import torch.distributed as dist

        if self.interface is not None:  # never listen beyond this machine unless told to
            os.environ.setdefault("GLOO_SOCKET_IFNAME", self.interface)
        store_timeout = timedelta(seconds=self.timeout)
        dist.init_process_group(
            "gloo", init_method=self.init_method, rank=self.rank, world_size=self.world_size, timeout=store_timeout
        )
        self._group = dist.group.WORLD

    def close(self) -> None:
        """Leave the group (safe when never connected)."""
        if self._group is not None:
            import torch.distributed as dist

            dist.destroy_process_group()
            self._group = None

    # ------------------------------------------------------------------ operations
    def _flat(self, tensors: Sequence[Tensor]) -> Tensor:
        n = sum(t.numel() for t in tensors)
        key = (n, tensors[0].dtype, tensors[0].device)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = torch.empty(n, dtype=tensors[0].dtype, device=tensors[0].device)
        torch.cat([t.reshape(-1) for t in tensors], out=buf)
        return buf

    @staticmethod
    def _unflat(buf: Tensor, tensors: Sequence[Tensor]) -> None:
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(buf[offset : offset + n].view(t.shape))
            offset += n

    @torch.no_grad()
    def mean_(self, tensors: Sequence[Tensor]) -> None:
        import torch.distributed as dist

        if not tensors:
            return
        start = time.perf_counter()
        buf = self._flat(tensors)
        dist.all_reduce(buf)
        buf.div_(self.world_size)
        self.bytes_reduced += buf.numel() * buf.element_size()
        self._unflat(buf, tensors)
        self.seconds_reduced += time.perf_counter() - start

    @torch.no_grad()
    def broadcast_(self, tensors: Sequence[Tensor]) -> None:
        import torch.distributed as dist

        if not tensors:
            return
        buf = self._flat(tensors)
        dist.broadcast(buf, src=0)
        self._unflat(buf, tensors)

    def broadcast_bytes(self, data: bytes) -> bytes:
        import torch.distributed as dist

        size = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(size, src=0)
        n = int(size.item())
        buf = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if self.rank == 0 and n
            else torch.empty(n, dtype=torch.uint8)
        )
        if n:
            dist.broadcast(buf, src=0)
        return buf.numpy().tobytes()

    @torch.no_grad()
    def merge_moments(self, mean: Tensor, var: Tensor, n: int) -> tuple[Tensor, Tensor, int]:
        import torch.distributed as dist

        mean, var = mean.to(torch.float64), var.to(torch.float64)
        packed = torch.cat(
            [
                torch.tensor([float(n)], dtype=torch.float64, device=mean.device),
                (mean * n).reshape(-1),
                ((var + mean.pow(2)) * n).reshape(-1),
            ]
        )
        dist.all_reduce(packed)
        total = round(float(packed[0].item()))
        if total == 0:
            return mean, var, 0
        k = mean.numel()
        g_mean = (packed[1 : 1 + k] / total).view(mean.shape)
        g_var = (packed[1 + k :] / total).view(mean.shape) - g_mean.pow(2)
        return g_mean, g_var.clamp_(min=0.0), total

    def maximum(self, values: Sequence[int]) -> list[int]:
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [int(v) for v in t.tolist()]
