"""The ``ray`` section: placement on a Ray cluster, read only by ``runtime: ray``."""

from __future__ import annotations

from dataclasses import dataclass

from srl.api.config.errors import check


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    """Placement on a Ray cluster (``runtime: ray``). Workers are grouped by node; nothing else changes.

    Each *actor node* hosts its actors, its policy workers and one parameter relay, joined by that node's
    shared memory; the trainers fill ``trainer_nodes`` more nodes (the first also hosts the root parameter
    server and the eval worker).
    Segments travel from actor nodes to trainers over ZeroMQ TCP, authenticated by a per-run token.
    """

    address: str | None = None
    """The cluster to join: ``auto`` (the one ``ray start`` made on this machine) or ``HOST:PORT`` of its head;
    null starts a private Ray instance on this machine for the run."""
    actor_nodes: int = 1
    """Node groups that host actors. ``workers.actors`` and ``workers.policy_workers`` are split evenly over them."""
    actors_per_node: int | None = None
    """When set, ``workers.actors`` becomes ``actor_nodes x actors_per_node`` (scale a run with one ``--set``)."""
    policy_workers_per_node: int | None = None
    """When set, ``workers.policy_workers`` becomes ``actor_nodes x policy_workers_per_node``."""
    node_resource: str | None = None
    """A custom resource that marks nodes for actors; each actor node group claims one unit of it, so groups land
    on distinct nodes (``ray start --resources '{"srl_actor": 1}'``). Null: Ray places groups where CPUs are free."""
    trainer_nodes: int = 1
    """Node groups that host the trainers; ``workers.trainers`` is split evenly over them. With more than one,
    the data-parallel trainers meet through a TCP store on the first trainer node and gloo connects them over
    the nodes' own interfaces (on one node: a file store and loopback)."""
    trainer_resource: str | None = None
    """A custom resource that marks trainer nodes; each trainer node group claims one unit, so groups land on
    distinct nodes. Null: wherever CPUs (GPUs) are free."""
    trainer_gpus: float = 0.0
    """GPUs each trainer claims (use with ``workers.trainer_device: cuda``)."""
    cpus_per_actor: float = 1.0
    """CPUs claimed per actor worker (placement only: Ray does not pin threads)."""
    cpus_per_policy_worker: float = 1.0
    """CPUs claimed per policy worker."""
    cpus_per_trainer: float = 1.0
    """CPUs claimed per trainer."""
    cpus_per_stage: float = 0.5
    """CPUs claimed per stage worker (``stage``): one decision per segment is light work."""
    start_timeout_seconds: float = 300.0
    """How long to wait for the cluster to place every node group before giving up with an error."""

    def __post_init__(self) -> None:
        check(self.actor_nodes >= 1, "actor_nodes", f"must be >= 1, got {self.actor_nodes}")
        check(self.trainer_nodes >= 1, "trainer_nodes", f"must be >= 1, got {self.trainer_nodes}")
        for name in ("actors_per_node", "policy_workers_per_node"):
            value = getattr(self, name)
            check(
                value is None or value >= (1 if name == "actors_per_node" else 0),
                name,
                f"must be >= {1 if name == 'actors_per_node' else 0}, got {value}",
            )
        for name in ("trainer_gpus", "cpus_per_actor", "cpus_per_policy_worker", "cpus_per_trainer", "cpus_per_stage"):
            check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        check(self.start_timeout_seconds > 0, "start_timeout_seconds", "must be > 0")
