"""The worker model and the interfaces workers are handed.

A worker is a plain object with ``setup`` / ``poll`` / ``teardown``; the base
class owns the loop and a runtime decides where the loop runs (in turn with
other workers in one process, in a process of its own, or in a Ray actor).
Workers never know their placement: they receive endpoints (streams, the
parameter service, a reporter) already built for them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Mapping, Protocol

import numpy as np


class Reporter(Protocol):
    """Where a worker sends metrics and events (the controller reads them)."""

    def report(self, kind: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> None:
        """Send one record; ``kind`` names the schema (``actor``, ``trainer``, ``policy``, ``error``)."""


class Policy(Protocol):
    """What actors and policy workers need of a policy: act on a batch, load a parameter snapshot."""

    def act(self, obs: np.ndarray, deterministic: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Actions and their log-probabilities for a batch of observations."""

    def load_flat(self, flat: np.ndarray) -> None:
        """Load a flat parameter snapshot as published by the trainer."""

    def flat_size(self) -> int:
        """Length of the flat snapshot."""


class Algorithm(Protocol):
    """What a trainer worker needs of a learning algorithm."""

    def train(self, batch: Mapping[str, np.ndarray], progress: float) -> dict[str, float]:
        """One update on a batch of segments laid out ``[T(+1), N, ...]``; ``progress`` in [0, 1]."""

    def policy_state(self) -> np.ndarray:
        """Flat snapshot of what acting needs (actor parameters and normalizer statistics)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume (networks, optimizer)."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""


class Worker(ABC):
    """Base of every worker: subclasses implement ``poll``; the loop lives here."""

    name: str = "worker"
    should_stop: Callable[[], bool] = staticmethod(lambda: False)
    """Set by the runtime before ``setup``; long waits inside a worker check it."""

    def setup(self) -> None:
        """Acquire resources (envs, networks, stream endpoints). Called once, in the worker's process."""

    @abstractmethod
    def poll(self) -> int:
        """Do one unit of work; return how much was done (0 when idle, e.g. waiting on a stream)."""

    def teardown(self) -> None:
        """Release resources; called once, also after errors."""

    def run(self, should_stop: Callable[[], bool]) -> None:
        """The worker loop used by process-per-worker runtimes."""
        self.should_stop = should_stop
        try:
            self.setup()
            while not should_stop():
                self.poll()
        finally:
            self.teardown()
