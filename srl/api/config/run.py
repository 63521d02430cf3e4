"""The ``run`` section: when a run stops and what it records."""

from __future__ import annotations

from dataclasses import dataclass

from srl.api.config.errors import check

SELF_PLAY_EVAL_EVERY_VERSIONS = 10
"""The eval worker's cadence when ``run.eval_every_versions`` is unset and one policy plays a two-player
turn-based game: 100 games against random cost about a tenth of a second there, against seconds of training for
10 versions."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """When to stop, what to record."""

    total_env_steps: int = 1_000_000
    """Stop after this many environment steps."""
    target_return: float | None = None
    """Stop as solved when the mean return of the last ``return_window`` episodes reaches this after every
    policy's first update (met earlier, by fewer episodes or the untrained policy, it is a warning)."""
    return_window: int = 20
    """Episodes averaged for the progress line and the target."""
    max_wall_seconds: float | None = None
    """Stop after this much wall time from the start (``srl``'s first line, or the call of ``srl.train``);
    ``None`` for no limit."""
    max_train_seconds: float | None = None
    """Stop after this much wall time from the first environment step, so start-up (imports, building envs,
    loading models) is left out: every run measured this way trains as long, as ``train_fps`` counts
    (``srl bench train --seconds``, the tries of ``srl tune``); ``None`` for no limit."""
    checkpoint_interval_seconds: float = 120.0
    """Seconds between periodic checkpoints (a final one is always written)."""
    keep_checkpoints: int = 3
    """Newest checkpoints kept in ``checkpoints/`` (older ones are deleted after each write)."""
    log_interval_seconds: float = 1.0
    """Seconds between progress lines and metrics records."""
    eval_episodes: int = 10
    """Deterministic episodes played with the final policy for ``final_eval_return_mean``; 0 skips."""
    eval_initial: bool = False
    """Also play the final evaluation's episodes with the policy the run started from (the acting policy as the
    config builds it: for a language model, ``text.model``), for ``initial_eval_return_mean``: the score before
    training, on the same episodes (played after training, in the same process)."""
    eval_every_versions: int | None = None
    """During training, an eval worker plays ``eval_episodes`` episodes every this many policy versions and keeps
    the best policy in ``checkpoints/best.pt``; 0 runs no eval worker. ``None`` (default): every 10 versions when
    one policy plays a two-player turn-based game (self-play's returns average 0 whatever the policy, so the
    worker's games against a uniform random player are what shows progress), no eval worker otherwise."""
    tensorboard: bool = True
    """Write TensorBoard event files next to ``metrics.jsonl``."""
    wandb_project: str | None = None
    """Also log every metrics record to this Weights & Biases project (needs ``pip install wandb``;
    ``WANDB_MODE=offline`` keeps it local)."""

    def __post_init__(self) -> None:
        check(self.total_env_steps >= 1, "total_env_steps", f"must be >= 1, got {self.total_env_steps}")
        check(self.return_window >= 1, "return_window", f"must be >= 1, got {self.return_window}")
        check(self.max_wall_seconds is None or self.max_wall_seconds > 0, "max_wall_seconds", "must be > 0 or null")
        check(self.max_train_seconds is None or self.max_train_seconds > 0, "max_train_seconds", "must be > 0 or null")
        check(self.checkpoint_interval_seconds > 0, "checkpoint_interval_seconds", "must be > 0")
        check(self.keep_checkpoints >= 1, "keep_checkpoints", f"must be >= 1, got {self.keep_checkpoints}")
        check(self.log_interval_seconds > 0, "log_interval_seconds", "must be > 0")
        check(self.eval_episodes >= 0, "eval_episodes", f"must be >= 0, got {self.eval_episodes}")
        every = self.eval_every_versions
        check(every is None or every >= 0, "eval_every_versions", f"must be >= 0 or null, got {every}")
        check(not every or self.eval_episodes >= 1, "eval_every_versions", "needs eval_episodes >= 1")
