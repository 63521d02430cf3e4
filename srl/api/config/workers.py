"""The ``workers`` section: worker counts and shapes (placement is the runtime's job)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from srl.api.config.errors import check


@dataclass(frozen=True, kw_only=True)
class WorkersConfig:
    """How many workers of each kind, and how they are shaped. Placement is the runtime's job."""

    actors: int = 1
    """Actor workers; each owns a ring of environment slots."""
    ring_size: int = 2
    """Environment slots per actor. While one slot waits for its actions the actor steps another."""
    envs_per_slot: int = 8
    """Environments in one slot (one Gymnasium vector env); one inference request covers them all."""
    policy_workers: int = 1
    """Policy (inference) workers. 0 means inline inference: each actor runs the policy itself."""
    trainers: int = 1
    """Trainer workers for the policy, data-parallel over torch.distributed (gloo on CPU); actor ``a`` feeds
    trainer ``a % trainers``, so ``actors`` must be at least ``trainers``. Several need the local runtime."""
    max_inference_batch: int = 64
    """Auto-batching cap: a policy worker merges at most this many pending requests (slots) per forward pass."""
    segment_length: int = 32
    """Steps per trajectory segment ``[T, B, ...]`` sent on the sample stream."""
    batch_segments: int = 4
    """Segments per trainer update, for any algorithm: a batch holds ``batch_segments * segment_length *
    envs_per_slot`` samples."""
    path: tuple[str, ...] | None = None
    """The roles segments pass through between the actors and the trainers, in order: ``stage`` (the ``stage``
    section's worker), ``replay`` (keeps them and serves the trainers sampled batches: off-policy algorithms),
    or a plugin's role ``package.module:ROLE`` (a ``srl.runtime.topology.Role`` with a ``Hop``). null: ``stage``
    when ``stage.worker`` names one, then ``replay`` when the algorithm learns from a replay."""
    max_policy_lag: int = 16
    """Segments whose oldest step is more than this many versions behind the trainer are dropped (and counted)
    before the algorithm sees them."""
    sample_buffers: int = 0
    """Segment buffers per actor (in flight + queued for the trainer); 0 picks ``ring_size + 2``.
    Fewer buffers bound policy lag by back-pressure; more let actors run ahead of the trainer."""
    torch_threads: int = 1
    """Torch intra-op threads in each worker process."""
    autotune: bool = False
    """Idle cores go to the bottleneck: a CPU trainer that has hardly waited for segments since its last update
    (the actors are waiting for it) runs its updates on its share of the node's cores while they run faster
    that way, measured as it goes, and gives them back after each (``update_threads`` in the metrics). Never
    under the inline runtime, whose runs stay reproducible. Off by default: on 2 cores with an actor and a
    policy worker beside the trainer no core is idle, and it gained nothing (docs/benchmarks.md)."""
    trainer_device: str = "cpu"
    """Where trainers run the update: ``cpu``, ``cuda`` or ``cuda:N`` (policy workers and actors stay on the CPU)."""
    param_pull_interval: int = 1
    """Policy workers check the parameter service every this many forward passes."""
    param_version_stride: int = 1
    """Staleness injection for experiments: policy workers load a new snapshot only once it is at least this
    many versions newer than the one they hold. 1 (always the newest) is the normal setting."""
    max_restarts: int = 3
    """Every runtime but ``inline``: a worker that dies is restarted up to this many times each (an actor's
    unfinished segments are dropped and counted; trainers restart together from the newest checkpoint); one
    more death ends the run. 0 disables restarts."""
    request_timeout_seconds: float = 10.0
    """An actor asks again for a slot's actions after waiting this long (its policy worker may have died)."""
    start_method: Literal["auto", "fork", "exec"] = "auto"
    """How the local runtime starts worker processes: ``fork`` (Linux; torch is imported once) or ``exec``
    (a fresh interpreter per worker, handed its config as JSON; the only choice off Linux). ``auto`` picks."""

    def __post_init__(self) -> None:
        for name in (
            "actors",
            "ring_size",
            "envs_per_slot",
            "trainers",
            "max_inference_batch",
            "segment_length",
            "torch_threads",
            "param_pull_interval",
            "param_version_stride",
            "batch_segments",
        ):
            value = getattr(self, name)
            check(value >= 1, name, f"must be >= 1, got {value}")
        check(self.policy_workers >= 0, "policy_workers", f"must be >= 0, got {self.policy_workers}")
        check(self.max_restarts >= 0, "max_restarts", f"must be >= 0, got {self.max_restarts}")
        check(self.max_policy_lag >= 0, "max_policy_lag", f"must be >= 0, got {self.max_policy_lag}")
        check(
            self.request_timeout_seconds > 0,
            "request_timeout_seconds",
            f"must be > 0, got {self.request_timeout_seconds}",
        )
        check(
            self.trainer_device == "cpu"
            or self.trainer_device == "cuda"
            or (self.trainer_device.startswith("cuda:") and self.trainer_device[5:].isdigit()),
            "trainer_device",
            f"must be cpu, cuda or cuda:N, got {self.trainer_device!r}",
        )
        check(
            self.actors >= self.trainers,
            "trainers",
            f"each trainer needs at least one actor feeding it: {self.trainers} trainers, {self.actors} actors",
        )
        check(
            self.sample_buffers == 0 or self.sample_buffers >= self.ring_size + 1,
            "sample_buffers",
            f"must be 0 (auto) or >= ring_size + 1 = {self.ring_size + 1}, got {self.sample_buffers}",
        )

    @property
    def buffers_per_actor(self) -> int:
        """Segment buffers each actor owns in the sample stream."""
        return self.sample_buffers or self.ring_size + 2
