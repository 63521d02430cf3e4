"""The ``stage`` section: an optional worker between actors and trainers (a custom dataflow)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from srl.api.config.errors import check


@dataclass(frozen=True, kw_only=True)
class StageConfig:
    """A stage sees every finished segment once, before any trainer, and keeps or drops it (``srl/api/stage.py``).
    Segments do not move inside a node: a stage reads them in the actors' shared memory and passes on only a
    small record, so it costs its own work and nothing more. Under Ray a stage runs on the actors' node, before
    the segment crosses the network."""

    worker: str | None = None
    """``package.module:Stage``, the stage's class (see ``examples/fresh_segments.py``); null: no stage."""
    args: Mapping[str, Any] = field(default_factory=dict)
    """The stage's own settings, handed to it as ``ctx.args``."""
    per_node: int = 1
    """Stage workers per node group (actors are spread over them by pool row, as over policy workers)."""

    def __post_init__(self) -> None:
        check(self.per_node >= 1, "per_node", f"must be >= 1, got {self.per_node}")
