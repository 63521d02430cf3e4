"""The parameter service: the trainer publishes versioned policy snapshots, readers pull the newest.

Storage is a :class:`~srl.base.seqlock.VersionedBuffer` (in-process for the
inline runtime, node-local shared memory for the local runtime), so a reader
never sees a torn snapshot and versions only go up. Readers elsewhere load
from a node-local buffer kept current by a relay, or (flat mode) straight
from the root server (:mod:`srl.system.param_service`); the subscriber is
the same over either source.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from srl.api.worker import Policy
from srl.base.seqlock import VersionedBuffer


class SnapshotSource(Protocol):
    """Where versioned snapshots come from: a shared buffer, or a server upstream (``param_service``)."""

    def version(self) -> int:
        """Newest version available (-1 before any)."""

    def read_into(self, out: np.ndarray, min_version: int) -> int | None:
        """Copy a snapshot newer than ``min_version`` into ``out``; its version, or None."""


class ParamPublisher:
    """Trainer side: publish a flat snapshot under a new, larger version."""

    def __init__(self, buffer: VersionedBuffer) -> None:
        self.buffer = buffer
        self.bytes_published = 0
        self.published = 0
        """Snapshots this publisher wrote (a resumed or restarted trainer counts from 0 again)."""

    def publish(self, version: int, flat: np.ndarray) -> None:
        self.buffer.write(version, flat)
        self.bytes_published += flat.nbytes
        self.published += 1


class ParamSubscriber:
    """Reader side: keeps ``policy`` at the newest snapshot; ``current`` is its version (-1 before any).

    ``stride`` > 1 injects staleness for experiments: after the first snapshot, a newer one is loaded
    only once it is at least ``stride`` versions ahead of the one held.
    """

    def __init__(self, buffer: SnapshotSource, policy: Policy, stride: int = 1) -> None:
        self.buffer, self.policy, self.stride = buffer, policy, stride
        self.current = -1
        self._scratch = np.empty(policy.flat_size(), np.float32)

    def refresh(self) -> bool:
        """Load a newer snapshot if one is there (cheap when none is: one integer read)."""
        newest = self.buffer.version()
        if newest <= self.current or (self.current >= 0 and newest < self.current + self.stride):
            return False
        got = self.buffer.read_into(self._scratch, self.current)
        if got is None:
            return False
        self.policy.load_flat(self._scratch)
        self.current = got
        return True

    def wait_first(self, should_stop: Callable[[], bool], timeout: float = 120.0) -> bool:
        """Block until the first snapshot is loaded; False if stopped first.

        Raises TimeoutError after ``timeout`` seconds: acting with unversioned random weights would be silent.
        """
        deadline = time.monotonic() + timeout
        while not self.refresh():
            if should_stop():
                return False
            if time.monotonic() > deadline:
                raise TimeoutError(f"no parameter snapshot from the trainer after {timeout:.0f} s")
            time.sleep(0.002)
        return True


class Subscribers:
    """The subscribers of several policies (one each) kept up together: ``current`` is the oldest version held,
    so a reader of every policy (the eval worker) moves on when each has moved."""

    def __init__(self, subscribers: list[ParamSubscriber]) -> None:
        self.subscribers = subscribers

    @property
    def current(self) -> int:
        return min(s.current for s in self.subscribers)

    def refresh(self) -> bool:
        return any([s.refresh() for s in self.subscribers])  # a list: every one refreshes

    def wait_first(self, should_stop: Callable[[], bool], timeout: float = 120.0) -> bool:
        return all(s.wait_first(should_stop, timeout) for s in self.subscribers)
