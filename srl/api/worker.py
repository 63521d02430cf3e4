"""The worker model and the interfaces workers are handed.

A worker is a plain object with ``setup`` / ``poll`` / ``teardown``; the base
class owns the loop and a runtime decides where the loop runs (in turn with
other workers in one process, in a process of its own, or in a Ray actor).
Workers never know their placement: they receive endpoints (streams, the
parameter service, a reporter) already built for them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from srl.api.schema import Field


class Reporter(Protocol):
    """Where a worker sends metrics and events (the controller reads them)."""

    def report(self, kind: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> None:
        """Send one record; ``kind`` names the schema (``actor``, ``trainer``, ``policy``, ``error``)."""


class Policy(Protocol):
    """What actors and policy workers need of a policy: act on a batch, load a parameter snapshot."""

    def output_fields(self) -> tuple[Field, ...]:
        """The sample fields :meth:`act` answers with besides ``actions`` (e.g. ``logp``): its schema declaration."""

    def act(self, obs: Mapping[str, np.ndarray], deterministic: bool = False) -> Mapping[str, np.ndarray]:
        """For a batch of observations (part name -> ``[N, ...]``): ``actions`` and every declared output."""

    def load_flat(self, flat: np.ndarray) -> None:
        """Load a flat parameter snapshot as published by the trainer."""

    def flat_size(self) -> int:
        """Length of the flat snapshot."""

    def flat_state(self) -> np.ndarray:
        """The snapshot this policy holds now (what :meth:`load_flat` would load to act the same)."""


class DevicePolicy(Policy, Protocol):
    """A policy that also acts on tensors on a device: what a policy worker runs on ``workers.policy_device``
    (its :meth:`act` then takes and gives numpy arrays as before, moving them itself)."""

    def to_device(self, device: torch.device) -> None:
        """Move its networks (and every tensor it acts with) to ``device``."""

    def act_tensors(self, obs: Mapping[str, Tensor], deterministic: bool = False) -> Mapping[str, Tensor]:
        """:meth:`act` on tensors on its device: ``actions`` and every declared output, ``[N, ...]`` each."""


def is_device_policy(policy: Policy) -> bool:
    """Whether ``policy`` can act on a device (:class:`DevicePolicy`)."""
    return callable(getattr(policy, "act_tensors", None)) and callable(getattr(policy, "to_device", None))


class Collective(Protocol):
    """Collective operations among the data-parallel trainers of one policy (rank 0 publishes)."""

    rank: int
    world_size: int
    bytes_reduced: int
    """Payload bytes this trainer has put into reductions so far."""
    seconds_reduced: float
    """Seconds this trainer has spent in those reductions so far (waiting for its peers included)."""

    def connect(self) -> None:
        """Join the group; blocks until every trainer has joined."""

    def close(self) -> None:
        """Leave the group."""

    def mean_(self, tensors: Sequence[Tensor]) -> None:
        """Average the tensors across trainers, in place (one reduction for the whole list)."""

    def broadcast_(self, tensors: Sequence[Tensor]) -> None:
        """Overwrite the tensors with rank 0's, in place."""

    def broadcast_bytes(self, data: bytes) -> bytes:
        """Rank 0's ``data`` on every trainer (the others pass anything, ``b""``): a state one trainer received
        for all of them."""

    def merge_moments(self, mean: Tensor, var: Tensor, n: int) -> tuple[Tensor, Tensor, int]:
        """Mean, variance and size of the union of every trainer's batch, from each batch's moments."""

    def maximum(self, values: Sequence[int]) -> list[int]:
        """Every trainer's ``values``, their element-wise maximum over the trainers (a barrier: all must call it,
        with as many values): whether any trainer stops, the newest population copy any was asked to take."""


@dataclass(frozen=True)
class Priorities:
    """New sampling priorities for the replay items of a batch, named by their keys (``batch["keys"]``): the
    replay applies each only while that key's item is still stored, so an update never lands on a newer item."""

    keys: np.ndarray
    """int64 ``[N]``: the items' keys, as the batch carried them."""
    values: np.ndarray
    """float ``[N]``: their new priorities (e.g. absolute TD errors); zero is floored, NaN refused and counted."""


@dataclass(frozen=True)
class TrainResult:
    """What one update gives back: statistics for the metrics, and what goes back upstream (priorities)."""

    stats: Mapping[str, float]
    """Scalars written to the metrics under their names (``loss``, ``q_mean``, ...)."""
    priorities: Priorities | None = None
    """New priorities of the batch's replay items, where the algorithm has them."""


class TrainerPort(Protocol):
    """A role's end inside each trainer of a policy (the role's ``port``): the lead trainer's port answers the
    commands on its command channel between updates; what it was told to carry out together, every trainer of the
    policy carries out at their lockstep before the next update (:meth:`take`), so data-parallel trainers stay
    equal. A population's member link is one: export the state, import another member's."""

    asked: int
    """The newest command this trainer was told to carry out with its peers (-1: none)."""
    taken: int
    """The newest one it carried out."""
    pause_max: float
    """The longest a command held its trainer up (seconds)."""

    def serve(self, trainer: Any) -> int:
        """Answer the commands that came since the last call (a trainer without peers carries out what it was told
        now); how many."""

    def take(self, trainer: Any, seq: int) -> None:
        """Carry out command ``seq`` (at the lockstep, every trainer of the policy together)."""

    def restore(self, trainer: Any, state: Mapping[str, Any]) -> None:
        """Continue from a checkpoint: what :meth:`checkpoint` kept, and anything told since."""

    def checkpoint(self) -> dict[str, Any]:
        """What a checkpoint keeps of the port."""


class Algorithm(Protocol):
    """What a trainer worker needs of a learning algorithm."""

    def train(self, batch: Mapping[str, np.ndarray], progress: float) -> TrainResult:
        """One update on a batch (on-policy segments ``[T(+1), N, ...]``, or replay items ``[L, N, ...]`` with
        ``keys``); ``progress`` in [0, 1]."""

    def policy_state(self) -> np.ndarray:
        """Flat snapshot of what acting needs (actor parameters and normalizer statistics)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume (networks, optimizer)."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""

    def synchronize(self) -> None:
        """Make data-parallel replicas identical (rank 0's weights); called once the collective is connected."""


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
