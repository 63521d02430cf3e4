"""The ``sac`` and ``td3`` sections: the hyper-parameters of the two actor-critic algorithms for continuous
actions that learn from a replay.

The replay itself (size, sampler, samples per insert: the update-to-data ratio) is the ``replay`` section's;
``replay.min_size`` is where learning starts. These sections hold what the learner reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from srl.api.config.errors import check


@dataclass(frozen=True, kw_only=True)
class _ActorCritic:
    """What SAC and TD3 share: twin critics with Polyak targets, an actor updated every few critic steps."""

    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 1e-3
    """Adam learning rate of the twin critics."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    gamma: float = 0.99
    """Discount factor of the n-step returns and the bootstrap."""
    nstep: int = 1
    """Steps summed into each return before bootstrapping (computed by the replay when it samples)."""
    batch_size: int = 256
    """Replay items per learner step."""
    tau: float = 0.005
    """Polyak rate of the target networks after each learner step, in (0, 1]."""
    actor_delay: int = 1
    """Learner steps per actor (and target) update: the critics train every step, the actor every
    ``actor_delay``-th."""
    max_grad_norm: float | None = None
    """Gradient-norm clip of each network; ``None`` disables it."""
    random_steps: int = 0
    """The run's first env steps act uniformly at random over the Box (as SB3's and CleanRL's SAC and TD3 do until
    learning starts), so the replay starts from the whole action box; 0: the policy acts from the first step."""

    def __post_init__(self) -> None:
        for name in ("actor_lr", "critic_lr", "adam_eps"):
            check(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
        check(0.0 <= self.gamma <= 1.0, "gamma", f"must be in [0, 1], got {self.gamma}")
        check(self.random_steps >= 0, "random_steps", f"must be >= 0, got {self.random_steps}")
        for name in ("nstep", "batch_size", "actor_delay"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        check(0.0 < self.tau <= 1.0, "tau", f"must be in (0, 1], got {self.tau}")
        check(self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm", "must be > 0 or null")


@dataclass(frozen=True, kw_only=True)
class SACConfig(_ActorCritic):
    """Soft actor-critic (Haarnoja et al. 2018): a tanh-squashed Gaussian actor, twin critics, and an entropy
    temperature tuned to a target entropy."""

    alpha: float = 0.2
    """The entropy temperature at the start (fixed when ``autotune`` is off)."""
    autotune: bool = True
    """Tune the temperature so the policy's entropy stays at ``target_entropy``."""
    alpha_lr: float = 1e-3
    """Adam learning rate of ``log alpha``."""
    target_entropy: float | None = None
    """The entropy the temperature holds the policy at; None: ``-|A|`` (the number of action dimensions)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.alpha > 0, "alpha", f"must be > 0, got {self.alpha}")
        check(self.alpha_lr > 0, "alpha_lr", f"must be > 0, got {self.alpha_lr}")


@dataclass(frozen=True, kw_only=True)
class TD3Config(_ActorCritic):
    """TD3 (Fujimoto et al. 2018): a deterministic actor, twin critics with target-policy smoothing, delayed
    actor updates, and Gaussian exploration noise in the acting policy."""

    actor_delay: int = 2
    """Learner steps per actor (and target) update (TD3's policy delay)."""
    exploration_noise: float = 0.1
    """Standard deviation of the acting policy's Gaussian noise, in units of half the action range."""
    target_noise: float = 0.2
    """Standard deviation of the target-policy smoothing noise, in units of half the action range."""
    target_noise_clip: float = 0.5
    """The smoothing noise is clipped to ``+-target_noise_clip`` (same units)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("exploration_noise", "target_noise", "target_noise_clip"):
            check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
