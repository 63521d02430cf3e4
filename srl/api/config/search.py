"""A search's settings (tree search as a policy, :mod:`srl.search`): how many simulations, which rule, and the
rule's constants."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from srl.api.config.errors import ConfigError, check

RULES = ("gumbel", "puct", "prior")


@dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """How a search runs."""

    simulations: int = 32
    """Simulations per search (at least 2): each expands one node of every tree."""
    rule: str = "gumbel"
    """``gumbel`` (Gumbel-top-k and sequential halving at the root), ``puct``, or ``prior``: no search, the
    network alone (its most likely legal move; a draw from its prior when exploring), an evaluation's baseline
    (``srl eval --set alphazero.search.rule=prior``) that training refuses."""
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


def require_search(section: str, settings: SearchConfig) -> None:
    """A training run searches: ``prior`` (the network alone) is an evaluation's setting."""
    if settings.rule == "prior":
        raise ConfigError(
            f"{section}.search.rule: prior plays the network alone, an evaluation's setting (srl eval --set "
            f"{section}.search.rule=prior); training learns from a search: gumbel or puct"
        )


def _check_learner(cfg: AlphaZeroConfig | MuZeroConfig, counts: tuple[str, ...]) -> None:
    """What a learner from search's settings share: positive rates and weights, a discount in [0, 1], counts of
    at least 1 (``counts``: its own besides the common ones), a clip > 0 or none."""
    for name in ("lr", "adam_eps", "value_weight"):
        check(getattr(cfg, name) > 0, name, f"must be > 0, got {getattr(cfg, name)}")
    check(0.0 <= cfg.gamma <= 1.0, "gamma", f"must be in [0, 1], got {cfg.gamma}")
    for name in ("nstep", "batch_size", "target_every", *counts):
        check(getattr(cfg, name) >= 1, name, f"must be >= 1, got {getattr(cfg, name)}")
    check(cfg.max_grad_norm is None or cfg.max_grad_norm > 0, "max_grad_norm", "must be > 0 or null")


@dataclass(frozen=True, kw_only=True)
class AlphaZeroConfig:
    """AlphaZero (``algorithm: alphazero``): a policy-value network that acts by searching the real game
    (``search``), trained from a replay on the searches' policies and on n-step returns bootstrapped from a
    target network's value."""

    lr: float = 1e-3
    """Adam learning rate."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """``linear`` anneals the learning rate to 0 at ``run.total_env_steps``."""
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
    search_value_share: float = 0.0
    """The share of the search's root value in a searched position's value target, the rest its n-step return
    (0: the return alone, AlphaZero's; 0.5: the mean of the game's outcome and the search's value)."""
    target_every: int = 100
    """Learner steps between copies of the network into the target network the bootstrap reads."""
    max_grad_norm: float | None = 1.0
    """Gradient-norm clip; ``None`` disables it."""
    mirror: bool = False
    """Train on half of each batch's positions mirrored left to right (their policy targets and legal moves too):
    for games whose rules are the same mirrored (Connect Four, tic-tac-toe), whose observation is board planes
    ``[C, H, W]`` and whose actions name the board's columns or cells."""
    search: SearchConfig = field(default_factory=SearchConfig)
    """How each move is searched (training games and evaluation alike; an evaluation draws no noise)."""

    def __post_init__(self) -> None:
        _check_learner(self, ())
        check(
            0.0 <= self.search_value_share <= 1.0,
            "search_value_share",
            f"{self.search_value_share} is outside [0, 1]",
        )


@dataclass(frozen=True, kw_only=True)
class MuZeroConfig:
    """MuZero (``algorithm: muzero``): a learned model (representation, dynamics, prediction) that acts by searching
    its own latent states (``search``), trained from a replay by unrolling the model ``unroll`` steps along the
    stored actions, to each step's reward, n-step value and search policy."""

    lr: float = 1e-3
    """Adam learning rate."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """``linear`` anneals the learning rate to 0 at ``run.total_env_steps``."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    weight_decay: float = 1e-4
    """L2 weight decay (MuZero's)."""
    gamma: float = 0.997
    """Discount of rewards, of the n-step value targets and inside the search."""
    nstep: int = 10
    """Steps summed into each value target before bootstrapping from the target network."""
    unroll: int = 5
    """K: steps the dynamics network is unrolled per item (items are ``replay.item_length = unroll + 1`` steps)."""
    batch_size: int = 128
    """Replay items per learner step."""
    latent: int = 64
    """Width of the latent state (scaled to [0, 1] per state, as MuZero does)."""
    hidden: int = 128
    """Width of the dynamics' and prediction's hidden layer."""
    value_support: int = 20
    """S: the value is predicted as a distribution over the integers ``-S..S`` of the scaled value."""
    reward_support: int = 5
    """The same for the reward."""
    value_weight: float = 0.25
    """The value loss's weight beside the policy's and the reward's (MuZero's reanalyse uses 0.25)."""
    target_every: int = 100
    """Learner steps between copies of the network into the target network the value targets bootstrap from."""
    max_grad_norm: float | None = 5.0
    """Gradient-norm clip; ``None`` disables it."""
    search: SearchConfig = field(default_factory=lambda: SearchConfig(simulations=16))
    """How each step is searched (the latent model's; an evaluation draws no noise)."""

    def __post_init__(self) -> None:
        check(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        _check_learner(self, ("unroll", "latent", "hidden", "value_support", "reward_support"))


@dataclass(frozen=True, kw_only=True)
class ReanalyzeConfig:
    """Reanalyze workers (``reanalyze`` section): each searches steps stored in a replay again with the newest
    network and writes the refreshed search targets back to them, by key (MuZero's Reanalyse; an algorithm whose
    acting policy stores search targets: ``alphazero``, ``muzero``)."""

    workers: int = 0
    """Reanalyze workers in the run (0: none), dealt to the replays in turn; each sits with its replay."""
    share: float = 0.5
    """Steps re-searched per step trained on (a trained item counts its ``replay.item_length`` steps), in
    ``[0, 1]``: the workers hold back when they are ahead of it (and fall behind it when too few to keep up)."""
    batch: int = 64
    """Stored steps searched together (one batched search)."""

    def __post_init__(self) -> None:
        check(self.workers >= 0, "workers", f"must be >= 0, got {self.workers}")
        check(0.0 <= self.share <= 1.0, "share", f"{self.share} is outside [0, 1]")
        check(self.batch >= 1, "batch", f"must be >= 1, got {self.batch}")
