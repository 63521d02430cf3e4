"""The ``workers`` section: worker counts and shapes (placement is the runtime's job)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from srl.api.config.errors import check


def is_device(name: str) -> bool:
    """``cpu``, ``cuda`` or ``cuda:N``: the devices a worker may run on."""
    return name in ("cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit())


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
    """Auto-batching cap: a policy worker merges at most this many pending requests (slots) per forward pass (with
    ``measure_inference_batch``, the most it measures)."""
    measure_inference_batch: bool = True
    """A policy worker times its forward pass (copies included) at 1, 2, 4, ... ``max_inference_batch`` slots as it
    starts and caps its batches at the fewest slots within 5% of the best throughput it saw: larger batches only
    make the first requests wait longer (``srl.system.policy_worker.batch_cap``; ``policyN_batch_cap`` in the
    metrics). Never under the inline runtime, whose runs stay reproducible; false: the cap is
    ``max_inference_batch``."""
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
    roles: tuple[str, ...] = ()
    """Roles the run adds to the built-in ones (trainers, parameter servers, policy workers, actors, and the
    eval, league and population workers where their sections ask for them): each a plugin's
    ``srl.runtime.topology.Role`` named ``package.module:ROLE``, whose declaration says how many workers it has,
    what they read and serve, how they restart and what they report (docs/architecture.md, "How to add a role").
    Roles on the sample path go in ``path``."""
    max_policy_lag: int = 16
    """Segments whose oldest step is more than this many versions behind the trainer are dropped (and counted)
    before the algorithm sees them."""
    sample_buffers: int = 0
    """Segment buffers per actor (in flight + queued for the trainer); 0 picks ``ring_size + 2``.
    Fewer buffers bound policy lag by back-pressure; more let actors run ahead of the trainer. The bound holds
    across nodes too (Ray): a sent segment's buffer is free again only when the trainer has taken the segment."""
    torch_threads: int = 1
    """Torch intra-op threads in each worker process."""
    autotune: bool = False
    """Idle cores go to the bottleneck: a CPU trainer that has hardly waited for segments since its last update
    (the actors are waiting for it) runs its updates on its share of the node's cores while they run faster
    that way, measured as it goes, and gives them back after each (``update_threads`` in the metrics). Never
    under the inline runtime, whose runs stay reproducible. Off by default: on 2 cores with an actor and a
    policy worker beside the trainer no core is idle, and it gained nothing (docs/benchmarks.md)."""
    trainer_device: str = "cpu"
    """Where trainers run the update: ``cpu``, ``cuda`` or ``cuda:N``. On CUDA each batch is copied to the device on
    a stream of its own while the update before it runs (``srl.system.prefetch``)."""
    trainer_dtype: Literal["float32", "bfloat16"] = "float32"
    """What the update computes in: ``bfloat16`` runs the algorithm's forward passes and losses under
    ``torch.autocast`` on the trainer's device (weights, gradients and the optimizer stay float32). Unlike
    ``model.cnn_dtype`` it covers the whole network, and only the trainer: acting stays float32."""
    policy_device: str = "cpu"
    """Where policy workers run the acting policy: ``cpu``, ``cuda`` or ``cuda:N``. A batch's observations are
    gathered into a host staging buffer (pinned on CUDA) and copied in once, its answers copied out once. Needs
    ``policy_workers`` >= 1 (actors that run the policy themselves run it on the CPU)."""
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
        for name in ("trainer_device", "policy_device"):
            device = getattr(self, name)
            check(is_device(device), name, f"must be cpu, cuda or cuda:N, got {device!r}")
        check(
            self.policy_device == "cpu" or self.policy_workers >= 1,
            "policy_device",
            f"{self.policy_device} needs policy workers (policy_workers: 0 runs the policy in each actor, on the CPU)",
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
