"""A custom dataflow: a stage between the actors and the trainers that drops stale segments where they are made.

Train with it: ``srl train examples/fresh_segments.yaml`` (from the repository
root). The experiment file adds the stage with ``stage.worker:
examples.fresh_segments:FreshSegments`` and its settings under ``stage.args``;
nothing in ``srl/`` knows this class. The same file runs under ``--set
runtime=ray``, where the stage runs on the actors' node.

Why a stage and not the trainer's own ``workers.max_policy_lag``: the trainer
drops a stale segment only after it has arrived, across the network under Ray,
and after it has waited in the trainer's queue. This stage drops it on the
actors' node, as soon as it is finished: a segment whose oldest step was acted
by a policy more than ``max_lag`` versions older than the newest published
version never leaves the node, and its buffer is free for fresher data at
once. Dropped segments are counted in the run's summary
(``stages.stage0.dropped``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from srl.api.stage import StageContext


class FreshSegments:
    """Keep a segment only when its behaviour policy is at most ``max_lag`` versions behind the newest one."""

    def __init__(self, ctx: StageContext) -> None:
        self.max_lag = int(ctx.args.get("max_lag", 4))
        if self.max_lag < 0:
            raise ValueError(f"stage.args.max_lag must be >= 0, got {self.max_lag}")
        self.policy_version = ctx.policy_version
        self.lag_sum = 0
        self.seen = 0

    def keep(self, segment: Mapping[str, np.ndarray]) -> bool:
        lag = max(0, self.policy_version() - int(segment["version"].min()))
        self.lag_sum += lag
        self.seen += 1
        return lag <= self.max_lag

    def metrics(self) -> Mapping[str, float]:
        return {"mean_lag": self.lag_sum / max(1, self.seen)}
