"""A search's settings (tree search as a policy, :mod:`srl.search`): how many simulations, which rule, and the
rule's constants."""

from __future__ import annotations

from dataclasses import dataclass, field

from srl.api.config.errors import check

RULES = ("gumbel", "puct")


@dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """How a search runs."""

    simulations: int = 32
    """Simulations per search (at least 2): each expands one node of every tree."""
    rule: str = "gumbel"
    """``gumbel`` (Gumbel-top-k and sequential halving at the root) or ``puct``."""
    considered: int = 16
    """Gumbel: actions considered at the root (fewer when fewer are legal)."""
    c_visit: float = 50.0
    """Gumbel: the visit offset of ``sigma(q) = (c_visit + max visits) * c_scale * q``."""
    c_scale: float = 0.1
    """Gumbel: the scale of the normalised Q in ``sigma``."""
    c_puct: float = 1.25
    """PUCT: the weight of the prior's exploration term."""
    dirichlet_alpha: float = 0.3
    """PUCT: the Dirichlet noise's concentration."""
    dirichlet_fraction: float = 0.0
    """PUCT: the share of the root's prior replaced by Dirichlet noise (AlphaZero's self-play: 0.25)."""

    def __post_init__(self) -> None:
        check(self.simulations >= 2, "simulations", f"a search takes at least 2 simulations, got {self.simulations}")
        check(self.rule in RULES, "rule", f"{self.rule!r} is not one of {', '.join(RULES)}")
        check(self.considered >= 2, "considered", f"at least 2 actions, got {self.considered}")
        check(
            0.0 <= self.dirichlet_fraction <= 1.0,
            "dirichlet_fraction",
            f"{self.dirichlet_fraction} is outside [0, 1]",
        )
        for name in ("c_visit", "c_scale", "c_puct", "dirichlet_alpha"):
            check(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class AlphaZeroConfig:
    """AlphaZero (``algorithm: alphazero``): a policy-value network that acts by searching the real game
    (``search``), trained from a replay on the searches' policies and on n-step returns bootstrapped from a
    target network's value."""

    lr: float = 1e-3
    """Adam learning rate."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    gamma: float = 1.0
    """Discount of the n-step returns (1 in a board game: its outcome)."""
    nstep: int = 16
    """Steps summed into each value target before bootstrapping (a whole game when it is no longer)."""
    batch_size: int = 128
    """Replay items per learner step."""
    value_weight: float = 1.0
    """The value loss's weight beside the policy's."""
    target_every: int = 100
    """Learner steps between copies of the network into the target network the bootstrap reads."""
    max_grad_norm: float | None = 1.0
    """Gradient-norm clip; ``None`` disables it."""
    search: SearchConfig = field(default_factory=SearchConfig)
    """How each move is searched (training games and evaluation alike; an evaluation draws no noise)."""

    def __post_init__(self) -> None:
        for name in ("lr", "adam_eps", "value_weight"):
            check(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
        check(0.0 <= self.gamma <= 1.0, "gamma", f"must be in [0, 1], got {self.gamma}")
        for name in ("nstep", "batch_size", "target_every"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        check(self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm", "must be > 0 or null")
