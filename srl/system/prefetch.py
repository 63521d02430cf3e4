"""A trainer's batches on its device: the next batch is copied there on a stream of its own while the current one
trains (SRL's prefetching), and on the CPU the same interface passes the batch through.

Why: an update on a GPU waits for its batch to be in device memory. Copied when the update starts, from pageable
memory, the copy is synchronous and nothing else runs meanwhile. Here each batch is copied into a pinned staging
buffer as soon as it is complete and moved by one asynchronous copy on a side CUDA stream; the update's stream
waits only for that copy (an event), and a source that sends nothing back (on-policy segments) is asked for the
next batch when an update starts, so its copy runs beside the update on the GPU. Two staging slots take turns;
the side stream waits for the work queued before it reuses a slot, so it never overwrites a batch an update
still reads.

A source whose :meth:`~srl.system.batches.BatchSource.done` sends the update's result back (a replay's
priorities, ``answers_upstream``) keeps its batch until the update ends: its batches are still copied on the side
stream, but never ahead, so the priorities always go to the batch they were computed on (SRL's replay, which
prefetched ahead, sent them to the next one).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from srl.api.device import DeviceBatch, batch_tensor
from srl.api.schema import FieldSpec
from srl.api.worker import TrainResult
from srl.system.batches import BatchSource, Trained
from srl.system.device import Staging


@dataclass
class _Staged:
    """A batch copied into a staging slot: its views, the event its copy records, and, when the source has moved
    on, what the batch stood for (its ``done`` was called when it was taken)."""

    slot: int
    host: dict[str, np.ndarray]
    on_device: dict[str, Tensor]
    trained: Trained | None


class DeviceBatches:
    """A :class:`~srl.system.batches.BatchSource` whose batches carry their fields on ``device`` (see the module
    docstring). ``ahead``: take the next batch when an update starts (default: on CUDA, when the source sends
    nothing back); the CPU passes batches through unless ``ahead`` asks for it (tests)."""

    def __init__(self, source: BatchSource, device: torch.device, ahead: bool | None = None) -> None:
        self.source, self.device = source, device
        self.fields: Mapping[str, FieldSpec] = source.fields
        self.answers_upstream: bool = getattr(source, "answers_upstream", True)
        early = not self.answers_upstream
        self.ahead = (device.type == "cuda" and early) if ahead is None else ahead and early
        self.staged = device.type == "cuda" or self.ahead  # copied into slots, else passed through
        self._cuda = device.type == "cuda"
        self._slots: list[Staging] = []
        self._events: list[torch.cuda.Event] = []
        self._stream: torch.cuda.Stream | None = None  # made in setup: in the worker's process
        self._ready: deque[_Staged] = deque()
        self._version = 0
        self._discarded = 0
        self.prefetched = 0  # batches taken while the update before them ran

    @property
    def dropped(self) -> int:
        return self.source.dropped + self._discarded

    @property
    def rejected(self) -> int:
        return self.source.rejected

    @property
    def t_copy(self) -> float:
        return self.source.t_copy

    @property
    def address(self) -> str:
        """The source's bound address (a network sample stream under Ray)."""
        return str(getattr(self.source, "address"))  # noqa: B009 (a BatchSource in general has none)

    def setup(self) -> None:
        self.source.setup()
        self._ready.clear()
        if self._cuda and self._stream is None:
            self._stream = torch.cuda.Stream(self.device)

    def fill(self, version: int, timeout: float) -> int:
        self._version = version
        if self._ready:
            return 0
        came = self.source.fill(version, timeout)
        if self.staged and self.source.full():
            self._take()
        return came

    def full(self) -> bool:
        return bool(self._ready) if self.staged else self.source.full()

    def batch(self) -> Mapping[str, np.ndarray]:
        if not self.staged:
            host = self.source.batch()
            return DeviceBatch(host, {name: batch_tensor(x, self.device) for name, x in host.items()})
        current = self._ready[0]
        if self.ahead and len(self._ready) == 1:  # the next batch's copy runs beside this update
            self.source.fill(self._version + 1, 0.0)  # its segments are trained on at the next version
            if self.source.full():
                self._take()
                self.prefetched += 1
        if self._cuda:
            torch.cuda.current_stream(self.device).wait_event(self._events[current.slot])
        return DeviceBatch(current.host, current.on_device)

    def done(self, result: TrainResult) -> Trained:
        if not self.staged:
            return self.source.done(result)
        current = self._ready.popleft()
        return current.trained if current.trained is not None else self.source.done(result)

    def discard_older(self, version: int) -> None:
        """Staged batches go too: those the source had let go count as its dropped units (``batch_segments``)."""
        self.source.discard_older(version)
        for staged in self._ready:
            if staged.trained is not None:
                self._discarded += int(getattr(self.source, "batch_segments", 1))
        self._ready.clear()

    def _take(self) -> None:
        """Copy the source's complete batch into a free slot (host, then one asynchronous copy to the device on the
        side stream) and, when it sends nothing back, let the source start the next."""
        host = self.source.batch()
        slot = self._free_slot(host)
        staging = self._slots[slot]
        if self._cuda:
            self._events[slot].synchronize()  # the slot's last copy has read its host buffer
        views = staging.host_views(1)
        for name, x in host.items():
            np.copyto(views[name][0], x)
        on_device = self._copy(slot)
        trained = None if self.answers_upstream else self.source.done(TrainResult({}))
        self._ready.append(
            _Staged(slot, {name: v[0] for name, v in views.items()}, {k: v[0] for k, v in on_device.items()}, trained)
        )

    def _copy(self, slot: int) -> dict[str, Tensor]:
        """The slot's host buffer to the device: on the side stream, after the work queued so far (an update that
        may still read this slot's last batch), recording the slot's event."""
        staging = self._slots[slot]
        if self._stream is None:
            return staging.to_device(1)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            on_device = staging.to_device(1)
            self._events[slot].record(self._stream)
        return on_device

    def _free_slot(self, host: Mapping[str, np.ndarray]) -> int:
        """A slot no staged batch holds (two take turns), made on first use from the batch's shapes."""
        if not self._slots:
            fields = {name: (x.shape, x.dtype) for name, x in host.items()}
            self._slots = [Staging(fields, 1, self.device) for _ in range(2)]
            self._events = [torch.cuda.Event() for _ in range(2)] if self._cuda else []
            if self._cuda:
                for event in self._events:
                    event.record(torch.cuda.current_stream(self.device))
        held = {staged.slot for staged in self._ready}
        return next(i for i in range(len(self._slots)) if i not in held)
