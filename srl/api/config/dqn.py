"""The ``dqn`` section: DQN's hyper-parameters (double Q, dueling head, n-step, target network, exploration).

The replay itself (size, sampler, priorities' alpha and beta, samples per insert) is the ``replay`` section's;
this one holds what the learner and the actors' exploration read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from srl.api.config.errors import check


@dataclass(frozen=True, kw_only=True)
class DQNConfig:
    """DQN hyper-parameters: the update, the target network and the exploration of the actors."""

    lr: float = 2.3e-3
    """Adam learning rate."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    gamma: float = 0.99
    """Discount factor of the n-step returns and the bootstrap."""
    nstep: int = 1
    """Steps summed into each return before bootstrapping (computed by the replay when it samples, so it may
    change without re-inserting anything); at most ``workers.segment_length``."""
    batch_size: int = 64
    """Replay items per learner step."""
    double_q: bool = True
    """Double DQN: the online network picks the bootstrap action and the target network values it, which
    removes the max operator's overestimation of noisy Q values."""
    dueling: bool = False
    """A dueling head: a state value and mean-subtracted advantages instead of one Q value per action."""
    loss: Literal["huber", "mse"] = "huber"
    """TD loss: ``huber`` (quadratic within 1, linear beyond, so one large error cannot dominate a step) or
    ``mse``."""
    max_grad_norm: float | None = 10.0
    """Gradient-norm clip; ``None`` disables it."""
    target_update: Literal["hard", "polyak"] = "hard"
    """``hard`` copies the online network into the target every ``target_every`` learner steps; ``polyak``
    moves the target a fraction ``tau`` towards it after every learner step."""
    target_every: int = 128
    """Learner steps between hard target copies."""
    tau: float = 0.005
    """Polyak averaging rate of the target network (``target_update: polyak``), in (0, 1]."""
    epsilon: Literal["linear", "ladder"] = "linear"
    """The actors' exploration: ``linear`` decays one rate for every env from ``epsilon_start`` to
    ``epsilon_end`` over ``epsilon_decay_env_steps`` run env steps; ``ladder`` gives env ``i`` of the ``N`` envs
    of every actor a fixed rate ``ladder_base^(1 + ladder_alpha * i / (N - 1))`` (Ape-X)."""
    epsilon_start: float = 1.0
    """Exploration rate at the first env step (``epsilon: linear``)."""
    epsilon_end: float = 0.04
    """Exploration rate from ``epsilon_decay_env_steps`` on (``epsilon: linear``)."""
    epsilon_decay_env_steps: int = 16_000
    """Env steps of the whole run over which the rate decays (``epsilon: linear``); 0: ``epsilon_end`` from the
    start."""
    ladder_base: float = 0.4
    """The highest rate of the Ape-X ladder (its first env), in [0, 1]."""
    ladder_alpha: float = 7.0
    """How steeply the Ape-X ladder falls: the last env explores at ``ladder_base^(1 + ladder_alpha)``."""

    def __post_init__(self) -> None:
        for name in ("lr", "adam_eps"):
            check(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
        for name in ("gamma", "epsilon_start", "epsilon_end", "ladder_base"):
            value = getattr(self, name)
            check(0.0 <= value <= 1.0, name, f"must be in [0, 1], got {value}")
        for name in ("nstep", "batch_size", "target_every"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        check(self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm", "must be > 0 or null")
        check(0.0 < self.tau <= 1.0, "tau", f"must be in (0, 1], got {self.tau}")
        check(
            self.epsilon_decay_env_steps >= 0,
            "epsilon_decay_env_steps",
            f"must be >= 0, got {self.epsilon_decay_env_steps}",
        )
        check(self.ladder_alpha >= 0, "ladder_alpha", f"must be >= 0, got {self.ladder_alpha}")
