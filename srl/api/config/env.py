"""The ``env`` section: which environment each actor slot runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from srl.api.config.errors import check


@dataclass(frozen=True, kw_only=True)
class EnvConfig:
    """Which environment each actor slot runs."""

    id: str = "CartPole-v1"
    """A Gymnasium id (``CartPole-v1``) or ``package.module:factory`` returning a ``gymnasium.Env``."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments for the environment constructor."""
    max_episode_steps: int | None = None
    """Override of the time limit; ``None`` keeps the environment's own."""
    backend: Literal["gymnasium", "envpool"] = "gymnasium"
    """Slot backend: a Gymnasium vector env (the reference) or an EnvPool batch (faster, optional extra)."""
    normalize_reward: bool = False
    """Scale training rewards by the running std of the discounted return (MuJoCo); reported returns stay true."""
    reward_clip: float | None = None
    """Clip training rewards to ``[-reward_clip, reward_clip]`` after scaling (Atari: 1); ``None`` disables."""
    agent_id: bool = False
    """Multi-agent envs: each column also observes which agent it is (``obs.agent``, one-hot; a plain observation
    moves to ``obs.observation``): parameter sharing with the agent's index as a switch, so one shared policy can
    act differently per agent, or play every seat of a game whose observation does not say whose turn it is."""
    action_scale: float | None = None
    """A Box action space's infinite bounds replaced by ``-action_scale`` / ``+action_scale`` (finite bounds stay):
    the env shows that bounded Box and is driven within it, so an algorithm that maps its actions onto the bounds
    (SAC, TD3) can run an env whose Box is unbounded. Only for such a Box; ``None`` keeps the env's own space."""
    nonfinite: Literal["fail", "sanitize"] = "fail"
    """A NaN or infinite observation or reward: ``fail`` ends the run naming the env and step; ``sanitize``
    replaces it by 0 and counts it (``nonfinite_steps`` in the metrics)."""

    def __post_init__(self) -> None:
        check(bool(self.id.strip()), "id", "must name an environment")
        check(self.reward_clip is None or self.reward_clip > 0, "reward_clip", "must be > 0 or null")
        check(
            self.action_scale is None or self.action_scale > 0,
            "action_scale",
            f"must be > 0 or null, got {self.action_scale}",
        )
        check(
            self.max_episode_steps is None or self.max_episode_steps > 0,
            "max_episode_steps",
            f"must be > 0, got {self.max_episode_steps}",
        )
