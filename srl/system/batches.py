"""Where a trainer's batches come from: on-policy segments, or a replay's samples.

Why a protocol: the trainer worker's loop (take what is ready, update when the
batch is full, publish, checkpoint) is the same whether its batch is gathered
from segments that are consumed once or sampled from a replay; what differs is
how a batch fills, what an update sends back (a replay's priorities), and how
many env steps a batch stands for. SRL's ``TrainerStepResult`` and TorchRL's
``sampler.sample(storage, n)`` split it the same way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from srl.api.schema import FieldSpec
from srl.api.worker import TrainResult
from srl.system.streams import SegmentSource


@dataclass(frozen=True)
class Trained:
    """What one trained batch stood for."""

    samples: int
    """Env steps the batch adds to the trainer's count: every env step of its segments, once; or those its
    replay took in since the batch before."""
    items: int
    """Rows the update trained on (segment columns' steps, or replay items)."""
    lags: np.ndarray | None = None
    """Per sample, how many versions behind the trainer its behaviour policy was (on-policy segments)."""


class BatchSource(Protocol):
    """A trainer's supply of batches."""

    fields: Mapping[str, FieldSpec]
    """The batch's fields and shapes."""
    answers_upstream: bool
    """:meth:`done` sends the update's result back (a replay's priorities), so the source keeps its batch until
    the update ends; False lets a prefetcher take the next batch while the update runs (``srl.system.prefetch``).
    A source without the attribute counts as True."""

    @property
    def dropped(self) -> int:
        """Units refused so far (segments past ``max_policy_lag``), counted, never silent."""

    @property
    def rejected(self) -> int:
        """Messages refused by a network stream (no run token, malformed); 0 within a node."""

    @property
    def t_copy(self) -> float:
        """Seconds spent copying what came into the batch (the rest of :meth:`fill` is waiting)."""

    def setup(self) -> None:
        """Allocate what the batch needs (in the worker's process)."""

    def fill(self, version: int, timeout: float) -> int:
        """Take what is ready toward the next batch (waiting up to ``timeout`` for the first); how many came."""

    def full(self) -> bool:
        """The next batch is complete."""

    def batch(self) -> Mapping[str, np.ndarray]:
        """The complete batch (valid until :meth:`done`)."""

    def done(self, result: TrainResult) -> Trained:
        """The batch was trained on: send back what goes upstream, and start the next."""

    def discard_older(self, version: int) -> None:
        """The trainer took another population member's state at ``version``: refuse what older versions (its own
        weights) collected. Dropped units are counted as :attr:`dropped`."""


class SegmentBatches:
    """On-policy: ``batch_segments`` segments copied side by side into one preallocated batch ``[T(+1), N, ...]``.

    Each segment is copied once and its buffer released at once (the actor refills it while we train); a
    segment whose behaviour policy is more than ``max_policy_lag`` versions old is dropped and counted.
    """

    answers_upstream = False
    """Segments send nothing back."""

    def __init__(self, source: SegmentSource, batch_segments: int, max_policy_lag: int, agents_per_env: int = 1):
        """``agents_per_env``: columns per env step (a multi-agent env's agents): samples count env steps."""
        self.source, self.batch_segments, self.max_policy_lag = source, batch_segments, max_policy_lag
        self.agents_per_env = agents_per_env
        self.dropped = 0
        self.t_copy = 0.0
        self.fields = source.fields
        self._filled = 0
        self._lags: list[np.ndarray] = []
        self._batch: dict[str, np.ndarray] = {}
        self._oldest = 0  # segments of an older behaviour version are refused (:meth:`discard_older`)

    @property
    def rejected(self) -> int:
        return self.source.rejected

    @property
    def address(self) -> str:
        """Where a network sample stream is bound (Ray: a ``SampleReceiver``'s)."""
        return str(getattr(self.source, "address"))  # noqa: B009 (a SegmentSource in general has none)

    def setup(self) -> None:
        fields = self.source.fields
        self._B = fields["actions"].shape[1]
        n = self.batch_segments * self._B
        self._batch = {name: np.zeros((spec.shape[0], n, *spec.shape[2:]), spec.dtype) for name, spec in fields.items()}
        self._filled = 0
        self._lags = []

    def fill(self, version: int, timeout: float) -> int:
        records = self.source.receive(self.batch_segments - self._filled, timeout)
        t0 = time.perf_counter()
        for actor, buf in records.tolist():
            self._take(actor, buf, version)
        self.source.ring()
        self.t_copy += time.perf_counter() - t0
        return len(records)

    def _take(self, actor: int, buf: int, version: int) -> None:
        if not self.source.holds(actor, buf):  # a second record of one hand-over (SegmentSource.holds)
            return
        segment = self.source.segment(actor, buf)
        lag = version - segment["version"]
        if int(lag.max()) > self.max_policy_lag or int(segment["version"].min()) < self._oldest:
            self.dropped += 1
            self.source.release(actor, buf)
            return
        lo, hi = self._filled * self._B, (self._filled + 1) * self._B
        for name, dst in self._batch.items():
            dst[:, lo:hi] = segment[name]
        self.source.release(actor, buf)
        self._lags.append(lag.ravel())
        self._filled += 1

    def full(self) -> bool:
        return self._filled >= self.batch_segments

    def discard_older(self, version: int) -> None:
        """The batch so far was collected by the old weights: it is dropped (counted) and refilled."""
        self._oldest = version
        self.dropped += self._filled
        self._filled, self._lags = 0, []

    def batch(self) -> Mapping[str, np.ndarray]:
        return self._batch

    def done(self, result: TrainResult) -> Trained:
        """Segments send nothing back; the batch's env steps count once (one per env, however many agents)."""
        lags = np.concatenate(self._lags)
        self._lags, self._filled = [], 0
        rows = int(self._batch["rewards"].size)
        return Trained(rows // self.agents_per_env, rows, lags)
