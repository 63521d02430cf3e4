"""The ``params`` section: how parameter snapshots travel from the lead trainer to their readers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from srl.api.config.errors import check


@dataclass(frozen=True, kw_only=True)
class ParamsConfig:
    """The parameter service: how snapshots travel from the lead trainer to the policy workers."""

    mode: Literal["hierarchical", "flat"] = "hierarchical"
    """``hierarchical``: one relay per node group mirrors each snapshot into the group's shared memory, where its
    readers load it, so the root sends one copy per relay; ``flat``: every reader subscribes to the root itself
    (one copy per reader; kept for comparison)."""
    groups: int = 1
    """Node groups (on one machine, simulated: each group gets its own relay and buffer). With 1 group in
    hierarchical mode the readers share the trainer's buffer and nothing goes over a socket."""
    fan_out: int = 8
    """Children per server in the relay tree: the root serves at most this many relays, which serve the rest."""
    transfer_dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    """Dtype of snapshots on the network; readers compute in float32. float16 and bfloat16 halve the bytes;
    bfloat16 keeps float32's range (what language models are trained in), float16 more precision but no value
    past 65504."""

    def __post_init__(self) -> None:
        check(self.groups >= 1, "groups", f"must be >= 1, got {self.groups}")
        check(self.fan_out >= 1, "fan_out", f"must be >= 1, got {self.fan_out}")
