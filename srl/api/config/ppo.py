"""The ``ppo`` section: Proximal Policy Optimization hyper-parameters, the SRL techniques' switches included."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from srl.api.config.errors import check


@dataclass(frozen=True, kw_only=True)
class PPOConfig:
    """Proximal Policy Optimization hyper-parameters."""

    lr: float = 3e-4
    """Adam learning rate."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """``linear`` anneals the learning rate to 0 at ``run.total_env_steps``."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip: float = 0.2
    """Clipping range of the probability ratio."""
    value_clip: float | None = None
    """Clipping range of the value update around the pre-update values; ``None`` disables it."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    epochs: int = 4
    """Passes over each batch."""
    minibatches: int = 4
    """Minibatches per epoch. With a recurrent core (``model.core``) and ``memory: recompute`` a minibatch is a
    set of whole segments (columns of the batch), each unrolled from its stored start state."""
    memory: Literal["recompute", "stored"] = "recompute"
    """With a recurrent core: ``recompute`` unrolls the core over each segment from the state it started with
    (truncated back-propagation through time over the segment, states recomputed with the current weights);
    ``stored`` reads every step's state as the actor had it (no unroll: each step is a sample of its own, and
    gradients stop at its stored state)."""
    burn_in: int = 0
    """With a recurrent core and ``memory: recompute``: the first steps of each segment only warm the state up
    (no gradient through them, no loss on them)."""
    max_grad_norm: float | None = 0.5
    """Gradient-norm clip, applied to the actor's and the critic's gradients separately; ``None`` disables it.
    With ``grad_clip: adaptive`` it is the threshold used until the window of recent norms has filled."""
    grad_clip: Literal["fixed", "adaptive"] = "fixed"
    """``fixed`` clips at ``max_grad_norm``; ``adaptive`` at the ``grad_clip_percentile``-th percentile of the
    last ``grad_clip_window`` gradient norms (per network), so the threshold follows the gradient scale."""
    grad_clip_percentile: float = 90.0
    """Percentile of recent gradient norms used as the adaptive threshold."""
    grad_clip_window: int = 100
    """Recent gradient norms (minibatches) the adaptive threshold is taken over."""
    unitwise_clip: float | None = None
    """Unit-wise clipping: each output unit's gradient norm is capped at this times its weight norm
    (adaptive gradient clipping of Brock et al. 2021; e.g. 0.1). ``None`` disables it."""
    critic: Literal["decentralized", "centralized"] = "decentralized"
    """``decentralized``: snapshots carry the actor only, and with several trainers each keeps and trains its
    own critic (only actor gradients are all-reduced). ``centralized``: the critic is all-reduced and
    broadcast with the actor, as in designs that evaluate values on the policy workers."""
    critic_input: Literal["obs", "state"] = "obs"
    """What the critic sees: each agent's own observation (``obs``; IPPO in a multi-agent env), or the env's
    global state (``state``: MAPPO's centralized value function, for multi-agent envs with ``state()``; the
    state travels for the trainer only and never reaches policy workers)."""
    td_compensation: bool = False
    """Correct for policy lag: the clipped ratio is taken against the current (proximal) policy, and each
    sample's surrogate is weighted by its importance weight current/behaviour truncated at ``is_rho_clip``
    (decoupled PPO). Samples older than ``workers.max_policy_lag`` are dropped either way."""
    vtrace_targets: bool = False
    """Also correct the TD errors (weights truncated at ``is_rho_clip``) and traces (at ``is_c_clip``) of the
    advantages and value targets: V-trace with a lambda. Measured worse on CartPole (docs/benchmarks.md)."""
    is_rho_clip: float = 1.0
    """Truncation of the importance weights on the surrogate and on TD errors (V-trace's rho bar)."""
    is_c_clip: float = 1.0
    """Truncation of the importance weights on traces (V-trace's c bar)."""
    normalize_values: bool = False
    """Value normalization: the critic predicts returns standardized by running return statistics."""
    normalize_advantages: bool = True
    """Normalize advantages per minibatch."""

    def __post_init__(self) -> None:
        for name in ("lr", "adam_eps", "clip", "vf_coef"):
            check(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
        for name in ("gamma", "gae_lambda"):
            value = getattr(self, name)
            check(0.0 <= value <= 1.0, name, f"must be in [0, 1], got {value}")
        check(self.ent_coef >= 0, "ent_coef", f"must be >= 0, got {self.ent_coef}")
        check(self.value_clip is None or self.value_clip > 0, "value_clip", "must be > 0 or null")
        check(self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm", "must be > 0 or null")
        for name in ("epochs", "minibatches"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        check(self.burn_in >= 0, "burn_in", f"must be >= 0, got {self.burn_in}")
        check(
            0 < self.grad_clip_percentile <= 100,
            "grad_clip_percentile",
            f"must be in (0, 100], got {self.grad_clip_percentile}",
        )
        check(self.grad_clip_window >= 2, "grad_clip_window", f"must be >= 2, got {self.grad_clip_window}")
        check(self.unitwise_clip is None or self.unitwise_clip > 0, "unitwise_clip", "must be > 0 or null")
        for name in ("is_rho_clip", "is_c_clip"):
            check(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
