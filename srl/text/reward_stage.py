"""The reward worker of a text task: every actor's completions scored between the actors and the trainers.

``env.kwargs.reward_on: stage`` with ``stage.worker: srl.text.reward_stage:RewardStage``. The actors then
sample and submit completions without scoring them; this stage (one per node group, ``stage.per_node``)
scores each segment it is handed with the task's own reward (``env.kwargs.reward`` and ``reward_args``:
a function, or a reward model such as ``srl.text.reward_model:RewardModelScorer``), writes the scores into
the segment's ``rewards`` in place and passes it on to its trainer. So a reward model is loaded once per node
instead of once per actor slot, runs on a core of its own, and scores the completions of all the node's
actors; the numbers are those of scoring in the actors (the same prompts, completions and function). The
returns of the run (``return_mean``) are the scores this worker reports.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from srl.api.config import ConfigError
from srl.api.spaces import OBS
from srl.api.stage import StageContext
from srl.text.task import TextTask

NAME = "srl.text.reward_stage:RewardStage"
"""What ``stage.worker`` names for a text task with ``env.kwargs.reward_on: stage``."""


class RewardStage:
    """Scores the completions of each segment (see the module docstring); keeps every segment."""

    def __init__(self, ctx: StageContext) -> None:
        kwargs = dict(ctx.cfg.env.kwargs)
        if kwargs.get("reward_on") != "stage":
            raise ConfigError(f"stage.worker: {NAME} scores a text task with env.kwargs.reward_on: stage")
        kwargs.update(reward_on="actor", split="train")  # the reward is built here, and scores here
        self.task = TextTask(1, **kwargs)
        self._returns: list[float] = []
        self.scored = 0
        self.t_score = 0.0

    def keep(self, segment: Mapping[str, np.ndarray]) -> bool:
        t0 = time.perf_counter()
        prompts, tokens, rewards = segment[OBS], segment["actions"], segment["rewards"]
        for t in range(rewards.shape[0]):  # each step of a segment is one completion per environment
            scores = self.task.score(self.task.prompt_texts(prompts[t]), self.task.completions(tokens[t]))
            rewards[t] = scores
            self._returns.extend(scores.tolist())
            self.scored += len(scores)
        self.t_score += time.perf_counter() - t0
        return True

    def metrics(self) -> Mapping[str, float]:
        return {"completions_scored": float(self.scored), "score_seconds": self.t_score}

    def episode_returns(self) -> np.ndarray:
        """The scores given since the last call (each completion is one episode)."""
        out = np.asarray(self._returns, np.float32)
        self._returns = []
        return out
