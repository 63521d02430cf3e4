"""The Q network of value-based algorithms (DQN): observation -> one value per Discrete action.

It reads the observation parts through the encoder the run's ``model`` section builds (the built-in
:class:`~srl.nets.policy.ObsEncoder` with its ``hidden`` torso, or a plugin encoder), then either one linear
head or a dueling pair of heads (a state value and per-action advantages, joined by the rule it is handed:
:func:`srl.algorithms.dqn_math.dueling`, which :class:`srl.wiring.NetModels` passes in, since networks do not
import algorithms). Like the actor it travels as one flat vector, normalizer
statistics included, so acting and training normalize alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from gymnasium import spaces
from torch import Tensor, nn

from srl.api.spaces import STATE, UnsupportedSpace, action_spec, mask_part, obs_parts
from srl.nets.distributions import mask_logits
from srl.nets.memory import Recurrent, Sequences, encode
from srl.nets.mlp import init_linear
from srl.nets.normalizer import RunningMeanStd
from srl.nets.policy import Flattened, ObsEncoder

__all__ = ["MonotonicMixer", "QNetwork"]


class QNetwork(Flattened):
    """Q values ``[N, A]`` for a Discrete action space of ``A`` actions; ``greedy`` acts on them.

    With a dueling rule, Q comes from a value head ``[N, 1]`` and an advantage head ``[N, A]`` on the same
    features (Wang et al. 2016), which learns a state's value from every action's updates.
    """

    def __init__(
        self,
        obs_space: spaces.Space,
        action_space: spaces.Space,
        encoder: nn.Module,
        dueling: Callable[[Tensor, Tensor], Tensor] | None = None,
    ) -> None:
        """``encoder``: an ``nn.Module`` with ``out_dim`` mapping the observation parts to features; ``dueling``:
        the rule joining value and advantages into Q, or None for one plain Q head."""
        super().__init__()
        action = action_spec(action_space)
        if action.kind != "discrete":
            raise UnsupportedSpace(f"a Q network needs a Discrete action space, not {action_space}")
        self.encoder: ObsEncoder = encoder  # type: ignore[assignment]  # a plugin encoder offers out_dim and forward too
        self.actions: int = action.nvec[0]
        mask = mask_part(obs_parts(obs_space), action)
        self.mask: str | None = None if mask is None else mask.name
        """The observation part that holds legal actions, or None."""
        self._dueling = dueling
        width = self.encoder.out_dim
        self.head: nn.Linear = init_linear(nn.Linear(width, self.actions), 1.0)
        """The Q values, or with ``dueling`` the advantages."""
        self.value: nn.Linear | None = init_linear(nn.Linear(width, 1), 1.0) if dueling is not None else None
        self._init_flat()

    @property
    def obs_normalizer(self) -> RunningMeanStd | None:
        """The normalizer of a plain vector observation (or None), shipped inside ``flat_state``."""
        return getattr(self.encoder, "obs_normalizer", None)

    def forward(self, obs: Mapping[str, Tensor]) -> Tensor:
        """Q values ``[N, A]`` of every action, illegal ones included (:meth:`legal` says which are)."""
        return self.q_values(self.encoder.forward(obs))

    def q_values(self, features: Tensor) -> Tensor:
        """The heads on the encoder's (or the recurrent core's) features ``[N, width]``: Q values ``[N, A]``."""
        out = self.head.forward(features)
        if self.value is None or self._dueling is None:
            return out
        return self._dueling(self.value.forward(features), out)

    @property
    def memory_size(self) -> int:
        """State floats per environment of a recurrent core (``model.core``), 0 without one."""
        return self.encoder.state_size if isinstance(self.encoder, Recurrent) else 0

    def unroll(self, obs: Mapping[str, Tensor], seq: Sequences, burn_in: int = 0) -> Tensor:
        """Q values ``[L * n, A]`` of sequences' time-major rows, the recurrent core unrolled over ``seq`` from
        its states (the first ``burn_in`` rows only rebuild the state: no gradient reaches them)."""
        features, _ = encode(self.encoder, obs, seq, burn_in, states=False)
        return self.q_values(features)

    @torch.no_grad()
    def greedy_with_memory(self, obs: Mapping[str, Tensor], state: Tensor) -> tuple[Tensor, Tensor]:
        """One step of a recurrent Q network: the best legal action of each row, and each row's next state."""
        core = self.encoder
        if not isinstance(core, Recurrent):
            raise TypeError("greedy_with_memory: this Q network has no recurrent core (model.core is none)")
        features, after = core.step(obs, state)
        return self._best(self.q_values(features), obs), after

    def legal(self, obs: Mapping[str, Tensor]) -> Tensor | None:
        """The legal-action mask ``[N, A]`` (nonzero: legal), or None when the observation has none."""
        return None if self.mask is None else obs[self.mask]

    @torch.no_grad()
    def greedy(self, obs: Mapping[str, Tensor]) -> Tensor:
        """The best legal action of each row, int64 ``[N]`` (a row with no legal action picks among all)."""
        return self._best(self.forward(obs), obs)

    def _best(self, q: Tensor, obs: Mapping[str, Tensor]) -> Tensor:
        legal = self.legal(obs)
        return (q if legal is None else mask_logits(q, legal)).argmax(dim=-1)


class MonotonicMixer(nn.Module):
    """QMIX's mixer: the agents' chosen values ``[M, N]`` and the global state ``[M, S]`` -> the team's value
    ``[M]``, by the rule it is handed (:func:`srl.algorithms.qmix_math.monotonic_mix`, which takes the weights'
    absolute values). The weights come from hypernetworks on the state (QMIX's two-layer ones, ``hyper`` wide);
    the final bias from a small network of its own. The state is standardized by running statistics first (the
    learner folds each batch's states in before it mixes them, :meth:`normalizer_inputs`): an env's raw state
    (LBF's grid coordinates, up to the grid's size) would otherwise scale the mixer's weights, and the team's
    first values, with it."""

    def __init__(self, agents: int, state_dim: int, embed: int = 32, hyper: int = 64) -> None:
        super().__init__()
        self.agents, self.embed = agents, embed
        self.normalizer = RunningMeanStd(state_dim)
        self.w1 = nn.Sequential(nn.Linear(state_dim, hyper), nn.ReLU(), nn.Linear(hyper, agents * embed))
        self.b1 = nn.Linear(state_dim, embed)
        self.w2 = nn.Sequential(nn.Linear(state_dim, hyper), nn.ReLU(), nn.Linear(hyper, embed))
        self.b2 = nn.Sequential(nn.Linear(state_dim, embed), nn.ReLU(), nn.Linear(embed, 1))

    def normalizer_inputs(self, inputs: Mapping[str, Tensor]) -> list[tuple[RunningMeanStd, Tensor]]:
        """The running statistics and what folds into them: the states ``[M, S]`` of ``inputs[STATE]``."""
        return [(self.normalizer, inputs[STATE])]

    def forward(self, q: Tensor, alive: Tensor, state: Tensor, mix: Callable[..., Tensor]) -> Tensor:
        m = len(q)
        state = self.normalizer.normalize(state)
        w1 = self.w1(state).view(m, self.agents, self.embed)
        return mix(q, alive, w1, self.b1(state), self.w2(state), self.b2(state).squeeze(-1))
