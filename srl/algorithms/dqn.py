"""DQN as an :class:`~srl.api.worker.Algorithm` for the trainer worker, its greedy acting policy, and the actors'
epsilon-greedy exploration.

The trainer learns from replay items (see :meth:`DQN.train` for the batch it is handed): double Q targets
over the n-step returns the replay computed when it sampled, an optional dueling head, importance weights of
prioritized replay, and a target network refreshed by a hard copy every ``target_every`` learner steps or by
Polyak averaging. It hands back each item's absolute TD error as its new priority. The math lives in
:mod:`srl.algorithms.dqn_math`.

Exploration is not the policy's: policy workers batch many actors' rows and cannot know whose they are. The
acting policy is greedy (what evaluation and ``srl.load_policy`` run), and each actor explores over its own
columns through :meth:`DQN.explorer` (:mod:`srl.api.explore`): one decaying rate, or Ape-X's fixed ladder of
rates over every env of the run.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from gymnasium import spaces

from srl.algorithms.acting import NetActing
from srl.algorithms.adam import Adam
from srl.algorithms.dqn_math import double_q_target, epsilon_ladder, linear_epsilon, q_target, td_loss
from srl.algorithms.grad_clip import GradClipper, clip_all
from srl.algorithms.replay_batch import (
    TargetLearner,
    batch_rows,
    batch_tensor,
    fold_observations,
    follow,
    frozen_copy,
    require_batch_fits,
)
from srl.api.algorithm import AlgorithmContext, Obs, PlanView, QNet
from srl.api.config import ConfigError, DQNConfig, ExperimentConfig
from srl.api.device import torch_device
from srl.api.schema import MEMORY, Field, memory_field
from srl.api.spaces import action_spec, mask_part, obs_parts
from srl.api.worker import Priorities, TrainResult

BOOT = "boot_"
"""Prefix of the batch fields that hold each step's bootstrap observation (``boot_obs``, ``boot_obs.<key>``)."""


def require_discrete(action_space: spaces.Space, cfg: ExperimentConfig) -> None:
    """One line naming the space, and the algorithms that fit it, unless the actions are Discrete: sac and td3
    are named only for a Box, the one space they act on, so the hint never leads to a second refusal."""
    if not isinstance(action_space, spaces.Discrete):
        fits = "ppo, sac or td3" if isinstance(action_space, spaces.Box) else "ppo"
        raise ConfigError(
            f"algorithm: {cfg.algorithm} needs a Discrete action space; env {cfg.env.id!r} has {action_space}: "
            f"use {fits}"
        )


def dqn_settings(ctx: AlgorithmContext) -> DQNConfig:
    """The run's ``dqn`` section: the typed settings the context carries, or the config's own section."""
    return ctx.args if isinstance(ctx.args, DQNConfig) else ctx.cfg.dqn


class QPolicy(NetActing):
    """Numpy-in, numpy-out greedy acting on a Q network (``models.q()``): the best legal action of each row.

    It never explores, whatever ``deterministic`` says: exploration is the actors' (:meth:`DQN.explorer`). With
    a recurrent core (R2D2), ``obs`` carries each environment's state as ``obs[MEMORY]`` and the answer the next.
    """

    net: QNet

    def __init__(self, net: QNet) -> None:
        self.net = net.eval()
        self.memory = net.memory_size

    def output_fields(self) -> tuple[Field, ...]:
        """Besides the actions, a recurrent core's state (what a sequence item starts from); else nothing: a
        transition is all the replay needs."""
        return (memory_field(self.memory),) if self.memory else ()

    def act_tensors(self, obs: Obs, deterministic: bool = False) -> dict[str, torch.Tensor]:
        tensors = dict(obs)
        if self.memory:
            state = tensors.pop(MEMORY)
            actions, after = self.net.greedy_with_memory(tensors, state)
            return {"actions": actions, MEMORY: after}
        return {"actions": self.net.greedy(tensors)}


class EpsilonGreedy:
    """One actor's epsilon-greedy exploration: each of its columns takes a uniformly random legal action with
    its column's rate, else keeps the policy's (:class:`~srl.api.explore.Explorer`).

    ``linear``: one rate for every column, decaying with the run's env steps, estimated as this actor's times
    the number of actors (actors step at about one speed). ``ladder``: Ape-X's fixed rate per run-global column.
    """

    def __init__(
        self, cfg: DQNConfig, actions: int, mask: str | None, first: int, count: int, total: int, actors: int
    ) -> None:
        self.cfg, self.actions, self.mask, self.actors = cfg, actions, mask, actors
        self.ladder = (
            epsilon_ladder(total, cfg.ladder_base, cfg.ladder_alpha)[first : first + count]
            if cfg.epsilon == "ladder"
            else None
        )
        self.count = count
        self.current = cfg.epsilon_start if self.ladder is None else float(self.ladder.mean())

    def rates(self, columns: slice, env_steps: int) -> np.ndarray | float:
        """The rate of each of the local ``columns`` (one rate for them all with ``linear``)."""
        start, stop, step = columns.indices(self.count)
        if step != 1 or columns.start != start or columns.stop != stop:
            raise ValueError(f"explore: columns {columns} must be a contiguous range of the actor's {self.count}")
        if self.ladder is not None:
            return self.ladder[columns]
        c = self.cfg
        self.current = linear_epsilon(
            env_steps * self.actors, c.epsilon_start, c.epsilon_end, c.epsilon_decay_env_steps
        )
        return self.current

    def explore(
        self,
        actions: np.ndarray,
        obs: Mapping[str, np.ndarray],
        columns: slice,
        env_steps: int,
        rng: np.random.Generator,
    ) -> None:
        eps = self.rates(columns, env_steps)
        if len(actions) != columns.stop - columns.start:
            raise ValueError(
                f"explore: {len(actions)} actions for the {columns.stop - columns.start} columns {columns}"
            )
        rows = np.flatnonzero(rng.random(len(actions)) < eps)
        if not len(rows):
            return
        if self.mask is None:
            actions[rows] = rng.integers(0, self.actions, len(rows))
            return
        legal = np.asarray(obs[self.mask])[rows] != 0
        # the largest of independent uniforms over the legal actions is a uniform pick among them
        picks = np.where(legal, rng.random(legal.shape), -1.0).argmax(axis=1)
        some = legal.any(axis=1)  # a row with no legal action keeps the policy's answer
        actions[rows[some]] = picks[some]

    def stats(self) -> dict[str, float]:
        """``epsilon``: the mean rate over this actor's columns at its last :meth:`explore`."""
        return {"epsilon": float(self.current)}


class DQN(TargetLearner):
    """Double DQN with an optional dueling head, n-step returns from the replay, prioritized replay's weights,
    a hard-copied or Polyak-averaged target network, Adam and a gradient-norm clip.

    With a ``collective`` this is one of several data-parallel replicas, each sampling its own replay: gradients
    and observation statistics are averaged across them, so their networks stay identical.
    """

    section = "dqn"
    settings = DQNConfig
    on_policy = False
    pairs: tuple[tuple[str, str], ...] = (("q", "target"),)
    live_settings = frozenset({"lr", "adam_eps", "max_grad_norm", "target_every", "tau"})
    """What :meth:`reconfigure` takes while training (a population member's explore). The rest shape the
    networks, the replay's batches (``gamma``, ``nstep``: the replay sums the returns) or the actors' exploration
    (``epsilon_*``), none of which a member's trainer can change."""

    def __init__(self, ctx: AlgorithmContext) -> None:
        cfg = dqn_settings(ctx)
        torch.manual_seed(ctx.seed)
        self.cfg = cfg
        self.collective = ctx.collective
        self.device = torch_device(ctx.device, "trainer device")
        self.parts = tuple(p.name for p in obs_parts(ctx.obs_space))
        self.q: QNet = ctx.models.q(cfg.dueling).to(self.device)
        self.target: QNet = frozen_copy(ctx.models.q(cfg.dueling).to(self.device), self.q)
        self.optimizer = Adam(self.q.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.clipper = GradClipper(list(self.q.parameters()), cfg.max_grad_norm)
        self.learner_steps = 0
        """Updates so far (what hard target copies are counted in)."""

    @staticmethod
    def acting_policy(ctx: AlgorithmContext) -> QPolicy:
        """Greedy acting; the run's plan builds one first, so a non-Discrete action space is refused here too."""
        require_discrete(ctx.action_space, ctx.cfg)
        return QPolicy(ctx.models.q(dqn_settings(ctx).dueling))

    @staticmethod
    def explorer(ctx: AlgorithmContext, first: int, count: int, total: int, actors: int) -> EpsilonGreedy:
        """Epsilon-greedy over the run-global columns ``[first, first + count)`` of ``total``."""
        require_discrete(ctx.action_space, ctx.cfg)
        action = action_spec(ctx.action_space)
        mask = mask_part(obs_parts(ctx.obs_space), action)
        cfg = dqn_settings(ctx)
        return EpsilonGreedy(cfg, action.nvec[0], None if mask is None else mask.name, first, count, total, actors)

    @staticmethod
    def check(plan: PlanView) -> None:
        """What only the probed env tells: Discrete actions; and what the replay's items must hold."""
        cfg = plan.cfg
        for policy in plan.policies:
            require_discrete(policy.action_space, cfg)
        if cfg.model.core != "none":
            raise ConfigError(f"model.core: dqn has no recurrent Q network; use none, not {cfg.model.core!r}")
        if cfg.dqn.nstep > cfg.workers.segment_length:
            raise ConfigError(
                f"dqn.nstep: {cfg.dqn.nstep}-step returns are longer than the stored sequences "
                f"(workers.segment_length={cfg.workers.segment_length})"
            )
        require_batch_fits("dqn", cfg.dqn.batch_size, cfg)

    # ------------------------------------------------------------------ Algorithm
    def train(self, batch: Mapping[str, np.ndarray], progress: float) -> TrainResult:
        """One learner step on ``N`` replay items of ``L`` steps: for each observation part ``P``, ``P`` and
        ``boot_P`` ``[L, N, ...]`` (each step's observation and the one its n-step target bootstraps from),
        ``actions [L, N]``, ``returns`` and ``discounts`` ``[L, N]`` (n-step reward sums and ``gamma^m``, 0
        after a terminal), ``alive [L, N]`` in a multi-agent env's batch (a step its agent did not take weighs
        nothing, and its priority is the floor), ``weights [N]`` (importance weights) and ``keys [N]``. The target is
        ``returns + discounts * Q_target(boot, a*)``; each item's new priority is its largest ``|td|``. The learning
        rate is constant: ``progress`` is not read."""
        length, n = batch["actions"].shape[:2]
        obs = {name: self._rows(batch, name) for name in self.parts}
        boot = {name: self._rows(batch, BOOT + name) for name in self.parts}
        actions = self._rows(batch, "actions").long()
        weights = self._tensor(batch, "weights").float().repeat(length)  # rows are time-major: item i is row t*N+i
        discounts = self._rows(batch, "discounts")
        alive = self._rows(batch, "alive").float() if "alive" in batch else None
        if alive is not None:  # a step its agent did not take (it left the env) is no transition: weight 0
            weights, discounts = weights * alive, discounts * alive
        target = self._targets(boot, self._rows(batch, "returns"), discounts)
        q_all = self.q(obs)
        q_taken = q_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        loss, td = td_loss(q_taken, target, weights, self.cfg.loss)
        if alive is not None:
            td = td * alive
        stats = self._descend(loss)
        self._update_normalizers(obs if alive is None else {k: v[alive > 0] for k, v in obs.items()})
        priorities = td.abs().reshape(length, n).amax(dim=0).float().cpu().numpy()
        stats.update(
            loss=float(loss.detach()),
            td_abs_mean=float(td.abs().mean()),
            q_mean=float(q_taken.detach().mean()),
            q_max=float(q_all.detach().max()),
            target_mean=float(target.mean()),
            learner_steps=float(self.learner_steps),
        )
        return TrainResult(stats, Priorities(np.asarray(batch["keys"]), priorities))

    def policy_state(self) -> np.ndarray:
        """The online network's flat state (what :class:`QPolicy` loads)."""
        return self.q.flat_state()

    def reconfigure(self, settings: DQNConfig) -> None:
        """New settings between updates (:attr:`live_settings`): every update reads ``self.cfg``; Adam's step and
        epsilon and the clip's threshold are set here."""
        self.cfg = settings
        self.optimizer.lr, self.optimizer.eps = settings.lr, settings.adam_eps
        self.clipper.max_norm = settings.max_grad_norm

    # ------------------------------------------------------------------ internals
    @torch.no_grad()
    def _targets(self, boot: Obs, returns: torch.Tensor, discounts: torch.Tensor) -> torch.Tensor:
        """``returns + discounts * Q_target(boot, a*)``, ``a*`` the best legal action by the online network
        (double Q) or by the target network."""
        q_next = self.target(boot)
        legal = self.q.legal(boot)
        if self.cfg.double_q:
            return double_q_target(self.q(boot), q_next, returns, discounts, legal)
        return q_target(q_next, returns, discounts, legal)

    def _descend(self, loss: torch.Tensor) -> dict[str, float]:
        """One step of Adam on ``loss`` (gradients averaged across replicas, then clipped), and the target
        network's update that follows it; the clipper's stats."""
        self.optimizer.zero_grad()
        loss.backward()
        if self.collective is not None:
            self.collective.mean_([p.grad for p in self.optimizer.params if p.grad is not None])
        stats = clip_all({"q": self.clipper})
        self.optimizer.step()
        self.learner_steps += 1
        self._update_target()
        return stats

    def _update_target(self) -> None:
        """A hard copy every ``target_every`` learner steps, or a Polyak step after each, of every network into its
        target (:attr:`pairs`); the target's buffers (observation statistics) are copied with it, so it normalizes
        as the weights it holds were trained to."""
        cfg = self.cfg
        if cfg.target_update == "hard" and self.learner_steps % cfg.target_every != 0:
            return
        for online, target in self.pairs:
            follow(getattr(self, target), getattr(self, online), 1.0 if cfg.target_update == "hard" else cfg.tau)

    def _update_normalizers(self, obs: Obs) -> None:
        """Fold the batch into the running observation statistics after the step (merged across replicas)."""
        fold_observations(self.q.encoder, obs, self.collective)

    def _tensor(self, batch: Mapping[str, np.ndarray], name: str) -> torch.Tensor:
        return batch_tensor(batch, name, self.device)

    def _rows(self, batch: Mapping[str, np.ndarray], name: str) -> torch.Tensor:
        return batch_rows(batch, name, self.device)
