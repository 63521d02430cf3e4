"""QMIX (Rashid et al. 2018) and VDN (Sunehag et al. 2018): a team's value, mixed from its agents' values, learned
from a replay of the team's sequences.

Acting is R2D2's, one column per agent: every agent of every environment acts with the one shared recurrent Q
network (``model.core``) and its own state, greedily over its legal actions, and each actor explores its columns
epsilon-greedily (:meth:`srl.algorithms.dqn.DQN.explorer`), through the policy workers or inline. Nothing there
knows of teams.

Learning reads *team items* (``team_items``): the replay keeps an environment's agents together, so an item is
every agent's sequence over the same ``replay.item_length`` steps, with each agent's stored state
(:class:`srl.replay.spec.ReplaySpec`, ``team``). A learner step, for each item:

1. unrolls the agents' network (online and target) over every agent's observations from its stored state, as
   R2D2 does per column, the first ``burn_in`` steps only rebuilding the state;
2. mixes the agents' values of the actions they took into the team's value (``mixer``: QMIX's monotonic
   hypernetwork mix on the global state, or VDN's sum), an agent that is not alive weighing nothing;
3. values each next row by double Q per agent, mixed by the target mixer on that row's state, and makes n-step
   targets of the team's reward (the ``sum`` or ``mean`` of its agents', standardized by its running statistics
   with ``standardize_rewards``) within the sequence; the team's episode ends where every agent's has;
4. trains the team values of the steps after the burn-in, weighted by the item's importance weight, and hands
   back the item's priority ``eta max |td| + (1 - eta) mean |td|``.

The mixer reads the env's global state (``critic_input: state``, carried in the segments), or the agents'
observations joined. The math is in :mod:`srl.algorithms.qmix_math`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from srl.algorithms.adam import Adam
from srl.algorithms.dqn import require_discrete
from srl.algorithms.dqn_math import td_loss
from srl.algorithms.grad_clip import GradClipper
from srl.algorithms.qmix_math import chosen_values, monotonic_mix, vdn_mix
from srl.algorithms.r2d2 import R2D2, require_sequences
from srl.algorithms.r2d2_math import sequence_priority, sequence_targets
from srl.algorithms.replay_batch import fold, fold_observations, frozen_copy
from srl.api.algorithm import AlgorithmContext, PlanView
from srl.api.config import ConfigError, QMixConfig
from srl.api.schema import MEMORY
from srl.api.spaces import STATE, obs_parts
from srl.api.worker import Priorities, TrainResult
from srl.nets.normalizer import RunningMeanStd
from srl.nets.q import MonotonicMixer

__all__ = ["QMIX"]

_WHOLE = ("weights", "keys")
"""Batch fields of a whole item, with no agent axis."""


class QMIX(R2D2):
    """QMIX or VDN on a team's sequences (see the module's docstring)."""

    section = "qmix"
    settings = QMixConfig
    team_items = True
    cfg: QMixConfig

    def __init__(self, ctx: AlgorithmContext) -> None:
        super().__init__(ctx)
        cfg, self.agents = self.cfg, ctx.agents
        if cfg.critic_input == "state" and ctx.state_space is not None:
            self.state_parts = tuple(p.name for p in obs_parts(ctx.state_space, STATE))
            width = sum(math.prod(p.shape) for p in obs_parts(ctx.state_space, STATE))
        else:
            self.state_parts = ()
            width = self.agents * sum(math.prod(p.shape) for p in obs_parts(ctx.obs_space))
        self.pairs = (("q", "target"),)
        params = list(self.q.parameters())
        if cfg.mixer == "qmix":
            self.mixer = MonotonicMixer(self.agents, width, cfg.mixing_embed, cfg.hypernet_hidden).to(self.device)
            self.target_mixer = frozen_copy(
                MonotonicMixer(self.agents, width, cfg.mixing_embed, cfg.hypernet_hidden).to(self.device), self.mixer
            )
            self.pairs += (("mixer", "target_mixer"),)
            params += list(self.mixer.parameters())
        self.optimizer = Adam(params, lr=cfg.lr, eps=cfg.adam_eps)
        self.clipper = GradClipper(params, cfg.max_grad_norm)
        self.reward_stats = RunningMeanStd(())  # the team's rewards, standardized by it (standardize_rewards)

    @staticmethod
    def check(plan: PlanView) -> None:
        """Discrete actions; one team of several agents, all of one policy, in an env that is not a game of
        opposing players; a recurrent core; sequences longer than their burn-in."""
        cfg = plan.cfg
        for policy in plan.policies:
            require_discrete(policy.action_space, cfg)
        bases = cfg.base_policies  # a population's members are teams of their own, each of one policy
        if len(bases) > 1:
            raise ConfigError(
                f"agents: qmix learns one team's value, and the agents rules map its agents to {len(bases)} "
                f"policies ({', '.join(bases)}): map every agent to one policy"
            )
        if plan.game_players:
            raise ConfigError(
                f"env.id: {cfg.env.id!r} is a game of {plan.game_players} opposing players; qmix learns the shared "
                "reward of one cooperating team"
            )
        if plan.policies[0].agents_per_env < 2:
            raise ConfigError(
                f"env.id: {cfg.env.id!r} has one agent; qmix mixes the values of a team of several (use r2d2 or dqn)"
            )
        require_sequences(cfg, "qmix")

    # ------------------------------------------------------------------ Algorithm
    def train(self, batch: Mapping[str, np.ndarray], progress: float) -> TrainResult:
        """One learner step on ``N`` team items of ``L`` steps of ``K`` agents (:meth:`ReplaySpec.batch_fields`
        with ``team``): each observation (and state) part ``[L + 1, N, K, ...]``; ``actions``, ``rewards``,
        ``terminated``, ``truncated`` and ``alive`` ``[L, N, K]``; :data:`MEMORY` ``[N, K, S]``; ``weights`` and
        ``keys`` ``[N]``. The learning rate is constant: ``progress`` is not read."""
        cfg = self.cfg
        length, n, k = batch["actions"].shape[:3]
        columns = _columns(batch)  # every agent a column of its own: [L, N * K, ...]
        obs = {name: self._rows(columns, name) for name in self.parts}
        seq = self._sequences(columns)
        q_all = self.q.unroll(obs, seq, cfg.burn_in).reshape(length + 1, n, k, -1)
        alive = (
            self._tensor(batch, "alive").float() if "alive" in batch else torch.ones(length, n, k, device=self.device)
        )
        state = self._state(batch)
        if cfg.mixer == "qmix":  # the mixer's state statistics, before its first use: both mixers read them
            fold_observations(self.mixer, {STATE: state[:length].reshape(-1, state.shape[-1])}, self.collective)
            self.target_mixer.normalizer.load_state_dict(self.mixer.normalizer.state_dict())
        with torch.no_grad():
            q_next = self.target.unroll(obs, seq).reshape(length + 1, n, k, -1)
            agent_next = self._values(q_all.detach(), q_next, obs)  # [L + 1, N, K], double Q per agent
            # the row after the last step: its agents as that step's
            values = self._mix("target_mixer", agent_next, torch.cat([alive, alive[-1:]]), state)  # [L + 1, N]
            rewards, terminated, truncated = self._team_steps(batch)
            eps = cfg.rescale_eps if cfg.value_rescale else None
            target = sequence_targets(rewards, terminated, truncated, values, cfg.gamma, cfg.nstep, eps)
        actions = self._tensor(batch, "actions").long()
        q_tot = self._mix("mixer", chosen_values(q_all[:length], actions), alive, state[:length])  # [L, N]
        trained = slice(cfg.burn_in, length)
        weight = (alive[trained].sum(dim=-1) > 0).float()  # a step no agent took is no transition
        weights = self._tensor(batch, "weights").float()[None, :] * weight
        loss, td = td_loss(q_tot[trained].reshape(-1), target[trained].reshape(-1), weights.reshape(-1), cfg.loss)
        td = td.reshape(weight.shape) * weight
        stats = self._descend(loss)
        steps = {name: x[: length * n * k] for name, x in obs.items()}  # the observations the steps act on
        if "alive" in batch:
            steps = {name: x[self._alive_rows(columns)] for name, x in steps.items()}
        self._update_normalizers(steps)

        priorities = sequence_priority(td.abs(), weight, cfg.eta)
        stats.update(
            loss=float(loss.detach()),
            td_abs_mean=float(td.abs().mean()),
            q_tot_mean=float(q_tot.detach().mean()),
            q_max=float(q_all.detach().max()),
            target_mean=float(target[trained].mean()),
            learner_steps=float(self.learner_steps),
        )
        return TrainResult(stats, Priorities(np.asarray(batch["keys"]), priorities.float().cpu().numpy()))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "reward_stats": self.reward_stats.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.reward_stats.load_state_dict(state["reward_stats"])

    # ------------------------------------------------------------------ internals
    def _standardized(self, rewards: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """The team's rewards ``[L, N]`` less their running mean, over their running std, once the rewards of the
        ``steps`` some agent took are folded into those statistics (EPyMARL's, with no clip)."""
        fold(self.reward_stats, torch.as_tensor(rewards[steps]), self.collective)
        mean, var = float(self.reward_stats.mean), float(self.reward_stats.var)
        return ((rewards - mean) / math.sqrt(var + 1e-8)).astype(np.float32)

    def _mix(self, mixer: str, q: Tensor, alive: Tensor, state: Tensor) -> Tensor:
        """The team values ``[..., N]`` of agents' values ``q`` ``[..., N, K]`` by the named mixer (VDN: the sum),
        on ``state`` ``[..., N, W]``."""
        if self.cfg.mixer == "vdn":
            return vdn_mix(q, alive)
        module: nn.Module = getattr(self, mixer)
        lead, k = q.shape[:-1], q.shape[-1]
        mixed = module(q.reshape(-1, k), alive.reshape(-1, k), state.reshape(-1, state.shape[-1]), monotonic_mix)
        return mixed.reshape(lead)

    def _state(self, batch: Mapping[str, Any]) -> Tensor:
        """What the mixer reads at each row ``[L + 1, N, W]``: the global state (as every agent's column carries
        it, agent 0's), or every agent's observation parts joined."""
        if self.state_parts:
            parts = [self._tensor(batch, name)[:, :, 0].float().flatten(2) for name in self.state_parts]
        else:
            parts = [self._tensor(batch, name).float().flatten(2) for name in self.parts]
        return torch.cat(parts, dim=-1)

    def _team_steps(self, batch: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The team's reward and episode ends ``[L, N]``: the sum (or the mean) of its living agents' rewards
        (standardized with ``standardize_rewards``, the statistics folding in this batch's steps some agent took);
        its episode ends at a step after which no agent goes on (each ended there or had left), cut by a time limit
        (truncated) where any agent's was."""
        ended = np.asarray(batch["terminated"]) | np.asarray(batch["truncated"])
        alive = np.asarray(batch["alive"]) if "alive" in batch else np.ones_like(ended)
        rewards = np.where(alive, np.asarray(batch["rewards"], np.float32), np.float32(0.0)).sum(axis=-1)
        if self.cfg.team_reward == "mean":
            rewards /= np.maximum(alive.sum(axis=-1), 1)
        if self.cfg.standardize_rewards:
            rewards = self._standardized(rewards, np.asarray(alive.any(axis=-1)))
        end = (ended | ~alive).all(axis=-1) & ended.any(axis=-1)
        truncated = end & np.asarray(batch["truncated"]).any(axis=-1)
        return rewards, end & ~truncated, truncated


def _columns(batch: Mapping[str, Any]) -> dict[str, Any]:
    """A team batch with every agent a column of its own (R2D2's layout): ``[rows, N, K, ...]`` -> ``[rows, N * K,
    ...]``, :data:`MEMORY` ``[N, K, S]`` -> ``[N * K, S]``."""
    out: dict[str, Any] = {}
    for name, x in batch.items():
        if name in _WHOLE:
            out[name] = x
        elif name == MEMORY:
            out[name] = x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])
        else:
            out[name] = x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])
    return out
