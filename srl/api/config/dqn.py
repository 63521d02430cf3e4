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

    lr: float = 5e-4
    """Adam learning rate."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    gamma: float = 0.99
    """Discount factor of the n-step returns and the bootstrap."""
    nstep: int = 3
    """Steps summed into each return before bootstrapping (computed by the replay when it samples, so it may
    change without re-inserting anything); at most ``workers.segment_length``."""
    batch_size: int = 64
    """Replay items per learner step."""
    double_q: bool = True
    """Double DQN: the online network picks the bootstrap action and the target network values it, which
    removes the max operator's overestimation of noisy Q values."""
    dueling: bool = True
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


@dataclass(frozen=True, kw_only=True)
class R2D2Config(DQNConfig):
    """R2D2 (Kapturowski et al. 2019): DQN with a recurrent core (``model.core``) learning from sequences of
    ``replay.item_length`` steps, each unrolled from the state its actor acted with, after a burn-in that only
    rebuilds that state. Everything of ``dqn`` applies; ``nstep`` targets are made within each sequence."""

    nstep: int = 5
    """Steps summed into each return before bootstrapping, within the sequence (cut at its end)."""
    burn_in: int = 8
    """Steps at each sequence's start that only rebuild the recurrent state: no loss and no gradient reach them.
    Fewer than ``replay.item_length``."""
    stored_state: bool = True
    """Start each sequence from the state its actor acted on its first step with (R2D2's stored state); false: from
    zeros (the paper's zero-state ablation)."""
    eta: float = 0.9
    """A sequence's priority: ``eta`` times its largest ``|td|`` plus ``1 - eta`` times their mean."""
    value_rescale: bool = True
    """Learn Q in rescaled units ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x``, so rewards of any size fit one
    network without clipping."""
    rescale_eps: float = 1e-3
    """The ``eps`` of ``h``."""
    loss: Literal["huber", "mse"] = "mse"
    """R2D2's squared TD error (``huber``: quadratic within 1, linear beyond)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.burn_in >= 0, "burn_in", f"must be >= 0, got {self.burn_in}")
        check(0.0 <= self.eta <= 1.0, "eta", f"must be in [0, 1], got {self.eta}")
        check(self.rescale_eps >= 0, "rescale_eps", f"must be >= 0, got {self.rescale_eps}")


@dataclass(frozen=True, kw_only=True)
class QMixConfig(R2D2Config):
    """QMIX (Rashid et al. 2018) and VDN (Sunehag et al. 2018): a team of agents sharing one recurrent Q network,
    learning one team value that mixes the agents' values of their chosen actions, from sequences that hold every
    agent of an environment. Everything of ``r2d2`` applies to the agents' network and the sequences."""

    mixer: Literal["qmix", "vdn"] = "qmix"
    """``qmix``: a monotonic mix whose weights hypernetworks make from the global state; ``vdn``: the sum."""
    mixing_embed: int = 32
    """QMIX: the mixer's hidden width."""
    hypernet_hidden: int = 64
    """QMIX: the hidden width of the hypernetworks that make the mixer's weights."""
    critic_input: Literal["state", "obs"] = "state"
    """What the mixer reads: the env's global state (``state``: segments carry it), or the agents' observations
    joined (``obs``: an env without a global state)."""
    team_reward: Literal["sum", "mean"] = "sum"
    """The team's reward from its agents' rewards: their ``sum`` (EPyMARL's) or their ``mean`` (an env that
    already hands every agent the shared reward)."""
    standardize_rewards: bool = False
    """Learn from the team's rewards standardized by their running mean and std (EPyMARL's ``standardise_rewards``):
    a sparse reward stands out, and every step without one pays a little less than nothing, so the agents' values
    of what they have not tried stay above those of what they have (LBF's foraging teams explore by it)."""
    value_rescale: bool = False
    """Learn Q in rescaled units (off: a mix of rescaled values is not the rescaled team value)."""
    nstep: int = 1
    """Steps summed into each team return before bootstrapping, within the sequence (QMIX's: 1)."""
    burn_in: int = 0
    """Steps at each sequence's start that only rebuild the recurrent state (whole episodes need none)."""
    dueling: bool = False
    """A dueling head on the agents' network (QMIX's agents have none)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("mixing_embed", "hypernet_hidden"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
