"""What a stage plugin implements, and what the runtime hands it.

A stage is a worker between the actors and the trainers, added by
configuration (``stage.worker: my_pkg.module:MyStage``). It sees every
finished segment once, in the order it arrives, and decides whether it goes on
to its trainer: a filter (drop stale or corrupt segments before they cross the
network), a prioritizer (keep the segments that teach the most), a recorder.

The named object is a class (or factory) called with a :class:`StageContext`;
what it returns implements :class:`Stage`. The segment it is shown is a view
into the actors' shared memory, laid out ``[T(+1), B, ...]`` by the run's
sample schema (``ctx.fields``): read it and never keep it (the buffer is
reused once the stage has decided). A stage that scores segments writes its
scores into the ``rewards`` of a segment it keeps (the text task's reward
worker, ``srl/text/reward_stage.py``), and then reports the episodes' returns
itself through the optional ``episode_returns()``: the returns of the episodes
it has scored since the last call, which the run's ``return_mean`` counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from srl.api.config import ExperimentConfig
    from srl.api.schema import FieldSpec


@dataclass(frozen=True)
class StageContext:
    """What a stage is built from."""

    index: int
    """Which stage worker this is (``stage0``, ``stage1``, ...)."""
    fields: Mapping[str, FieldSpec]
    """The segment fields it is shown: name -> shape ``[T(+1), B, ...]`` and dtype."""
    args: Mapping[str, Any]
    """``stage.args`` from the experiment file."""
    cfg: ExperimentConfig
    """The whole experiment (e.g. ``cfg.ppo.gamma``)."""
    policy_version: Callable[[], int]
    """The newest policy version published that this node sees now (-1 before the first); cheap: one read of a
    version word in shared memory (in ``params.mode: flat``, of the root server's newest answer)."""


class Stage(Protocol):
    """A stage's decisions."""

    def keep(self, segment: Mapping[str, np.ndarray]) -> bool:
        """Whether ``segment`` (field name -> array) goes on to its trainer; False drops it (counted)."""

    def metrics(self) -> Mapping[str, float]:
        """Numbers of its own for the run's metrics and summary (reported with the kept and dropped counts)."""

    # optional: ``episode_returns(self) -> np.ndarray``, for a stage that writes the rewards (see above)


class StageClass(Protocol):
    """What ``stage.worker`` names."""

    def __call__(self, ctx: StageContext) -> Stage: ...
