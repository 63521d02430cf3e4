"""PPO as an :class:`~srl.api.worker.Algorithm` for the trainer worker, and the acting policy.

The trainer keeps a policy (actor) network and a value (critic) network.
With the default decentralized critic only the policy's flat snapshot is
published: policy workers never see the critic, several data-parallel
trainers all-reduce actor gradients only and each trains its own critic on
its own shard, and values for advantages are recomputed here at training time
with the current critic (fresh, not rollout-time values). The centralized
critic is kept for comparison: its gradients are all-reduced too and its
weights ship in every snapshot.

With ``td_compensation`` the update corrects for policy lag: the clipped ratio
is taken against the current (proximal) policy and each sample's surrogate is
weighted by its truncated importance weight against the behaviour policy
(decoupled PPO); ``vtrace_targets`` also corrects TD errors and traces
(V-trace). The math lives in :mod:`srl.algorithms.ppo_math`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import nn

from srl.algorithms.acting import TensorActing
from srl.algorithms.adam import Adam, scheduled_lr
from srl.algorithms.grad_clip import GradClipper, clip_all
from srl.algorithms.ppo_math import explained_variance, gae, normalize_advantages, ppo_loss
from srl.api.algorithm import ActorNet, AlgorithmContext, CriticNet, Obs, PlanView
from srl.api.config import ConfigError, PPOConfig
from srl.api.device import autocast, field, torch_device
from srl.api.schema import MEMORY, Field, memory_field
from srl.api.spaces import STATE, obs_parts
from srl.api.worker import TrainResult
from srl.nets.memory import After, Sequences, carried_rows, encode


class RunningMoments(Protocol):
    """A running mean/variance (``srl.nets.normalizer.RunningMeanStd``): fold in a batch's moments."""

    def moments(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]: ...

    def update_moments(self, mean: torch.Tensor, var: torch.Tensor, n: int) -> None: ...


def _critic(ctx: AlgorithmContext, actor: ActorNet) -> CriticNet:
    """A new critic for ``actor``: a head on its encoder with ``model.shared_encoder``, else a network of its own."""
    shared = actor.encoder if ctx.cfg.model.shared_encoder else None
    return ctx.models.value(shared, normalize_values=ctx.args.normalize_values)


def _normalizer_inputs(encoder: nn.Module, obs: Obs) -> list[tuple[RunningMoments, torch.Tensor]]:
    """An encoder's running normalizers with their batches; a plugin encoder without any has none."""
    inputs = getattr(encoder, "normalizer_inputs", None)
    return [] if inputs is None else inputs(obs)


class ActingPolicy(TensorActing):
    """Numpy-in, numpy-out wrapper of an actor network (``models.policy()``) for actors and policy workers.

    The snapshot it loads is the actor's flat state, followed by the critic's when one is given
    (centralized critic).
    """

    def __init__(self, net: ActorNet, critic: CriticNet | None = None) -> None:
        self.net = net.eval()
        self.critic = None if critic is None else critic.eval()
        self._actor_size = net.flat_size()
        self.memory = int(getattr(net, "memory_size", 0))

    def output_fields(self) -> tuple[Field, ...]:
        """Besides the actions: the behaviour log-prob of each step (importance weights, the PPO ratio), and
        with a recurrent core its state (:data:`~srl.api.schema.MEMORY`)."""
        return (Field("logp", (), "float32"),) + ((memory_field(self.memory),) if self.memory else ())

    def to_device(self, device: torch.device) -> None:
        """Act on ``device`` (a policy worker's ``workers.policy_device``)."""
        self.device = device
        self.net.to(device)
        if self.critic is not None:
            self.critic.to(device)

    def act_tensors(self, obs: Obs, deterministic: bool = False) -> dict[str, torch.Tensor]:
        """With memory, ``obs`` carries each environment's state as ``obs[MEMORY]`` and the answer the next."""
        tensors = dict(obs)
        if self.memory:
            state = tensors.pop(MEMORY)
            actions, logp, after = self.net.act_with_memory(tensors, state, deterministic)
            return {"actions": actions, "logp": logp, MEMORY: after}
        actions, logp = self.net.act(tensors, deterministic)
        return {"actions": actions, "logp": logp}

    def load_flat(self, flat: np.ndarray) -> None:
        if self.critic is None:
            self.net.load_flat_state(flat)
            return
        if len(flat) != self.flat_size():  # name the whole snapshot, not one half of it
            raise ValueError(f"flat state has wrong length: expected {self.flat_size()}, got {len(flat)}")
        self.net.load_flat_state(flat[: self._actor_size])
        self.critic.load_flat_state(flat[self._actor_size :])

    def flat_size(self) -> int:
        return self._actor_size + (0 if self.critic is None else self.critic.flat_size())

    def flat_state(self, out: np.ndarray | None = None) -> np.ndarray:
        """The snapshot this policy would load (actor, then critic when centralized)."""
        if out is None:
            out = np.empty(self.flat_size(), np.float32)
        self.net.flat_state(out[: self._actor_size])
        if self.critic is not None:
            self.critic.flat_state(out[self._actor_size :])
        return out


@dataclass(frozen=True)
class Rollout:
    """A batch made ready for the epochs: its ``T x N`` steps as rows, and what the losses compare against."""

    T: int
    N: int
    obs: Obs
    critic_obs: Obs
    """The critic's inputs (``obs`` itself unless it reads the global state)."""
    actions: torch.Tensor
    old_logp: torch.Tensor
    """The log-probs the ratio starts from: the behaviour policy's, or with TD compensation the current one's."""
    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor
    """The current critic's values of the steps (on the returns' scale)."""
    weights: torch.Tensor | None
    """Truncated importance weights of the steps (TD compensation), or None."""
    acted: torch.Tensor | None
    """Which rows acted (multi-agent ``alive``), or None: all."""
    seq: Sequences | None
    """The rows in time, for a recurrent core."""
    stats: dict[str, float]
    """The importance weights' statistics, when there are any."""
    returns_head: torch.Tensor
    """The returns on the critic head's scale (standardized with value normalization)."""
    values_head: torch.Tensor


@dataclass(frozen=True)
class Minibatch:
    """One gradient step's rows: ``obs``/``critic_obs`` all of them; ``acted`` picks the policy's among them and
    ``crit`` the critic's (None: all); the other tensors are the picked rows' already."""

    obs: Obs
    critic_obs: Obs
    acted: torch.Tensor | None
    actions: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor
    weights: torch.Tensor | None
    seq: Sequences | None
    crit: torch.Tensor | None


class PPO:
    """Clipped-surrogate PPO with GAE, value clipping, entropy bonus and running observation normalization.

    With ``model.shared_encoder`` the critic is a head on the actor's encoder: one encoder pass per
    minibatch serves both losses. Otherwise the critic owns a full network of its own. With a
    ``collective`` this is one of several data-parallel replicas (see the module docstring).
    """

    section: ClassVar[str] = "ppo"
    settings: ClassVar[type] = PPOConfig
    on_policy: ClassVar[bool] = True
    trainer_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16")

    def __init__(self, ctx: AlgorithmContext) -> None:
        cfg: PPOConfig = ctx.args
        torch.manual_seed(ctx.seed)
        self.cfg = cfg
        self.collective = ctx.collective
        self.centralized = cfg.critic == "centralized"
        self.device = torch_device(ctx.device, "trainer device")
        self.dtype = ctx.cfg.workers.trainer_dtype  # bfloat16: forward passes and losses under autocast
        self.parts = obs_parts(ctx.obs_space)
        # the critic's inputs: the observation parts, or (MAPPO) the env's global state carried for the trainer
        self.critic_parts = self.parts if ctx.state_space is None else obs_parts(ctx.state_space, STATE)
        self.policy: ActorNet = ctx.models.policy().to(self.device)
        self.value: CriticNet = _critic(ctx, self.policy).to(self.device)
        actor_params, critic_params = list(self.policy.parameters()), list(self.value.parameters())
        self.optimizer = Adam(actor_params + critic_params, lr=cfg.lr, eps=cfg.adam_eps)
        self._reduced = actor_params + (critic_params if self.centralized else [])
        self._clippers = {
            name: GradClipper(
                params,
                cfg.max_grad_norm,
                adaptive=cfg.grad_clip == "adaptive",
                percentile=cfg.grad_clip_percentile,
                window=cfg.grad_clip_window,
                unitwise=cfg.unitwise_clip,
            )
            for name, params in (("actor", actor_params), ("critic", critic_params))
        }
        self._gen = torch.Generator().manual_seed(ctx.seed + 1)
        # recurrent cores (``model.core``): the actor's state is in the batch; a critic with a core of its own
        # (no shared encoder) starts each segment from zeros, since it never acts
        self.memory = int(getattr(self.policy, "memory_size", 0))
        self.critic_memory = not self.value.shared and hasattr(self.value.encoder, "state_size")
        self.burn_in = cfg.burn_in if cfg.memory == "recompute" else 0

    @staticmethod
    def acting_policy(ctx: AlgorithmContext) -> ActingPolicy:
        """What policy workers and actors hold: the actor, plus the critic when it is centralized."""
        net = ctx.models.policy()
        return ActingPolicy(net, _critic(ctx, net) if ctx.args.critic == "centralized" else None)

    @staticmethod
    def check(plan: PlanView) -> None:
        """Each minibatch needs rows: whole segments' columns with an unrolled core, else samples."""
        for policy in plan.policies:
            cfg, w = policy.cfg, policy.cfg.workers
            unrolled = cfg.model.core != "none" and cfg.ppo.memory == "recompute"
            rows = w.batch_segments * policy.columns_per_slot * (1 if unrolled else w.segment_length)
            if rows < cfg.ppo.minibatches:
                what = "segment columns (a core is unrolled over whole segments)" if unrolled else "samples"
                raise ConfigError(
                    f"ppo.minibatches: {cfg.ppo.minibatches} minibatches of an update of {rows} {what}: "
                    "lower it, or raise workers.batch_segments or workers.envs_per_slot"
                )

    # ------------------------------------------------------------------ Algorithm
    def policy_state(self) -> np.ndarray:
        """The actor's flat state, then the critic's when it is centralized (what :class:`ActingPolicy` loads)."""
        a = self.policy.flat_size()
        out = np.empty(a + (self.value.flat_size() if self.centralized else 0), np.float32)
        self.policy.flat_state(out[:a])
        if self.centralized:
            self.value.flat_state(out[a:])
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(),
            "value": self.value.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "minibatches": self._gen.get_state()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.value.load_state_dict(state["value"])
        self.optimizer.load_state_dict(state["optimizer"])
        if "rng" in state:
            torch.set_rng_state(state["rng"]["torch"])
            self._gen.set_state(state["rng"]["minibatches"])

    def reconfigure(self, settings: PPOConfig) -> None:
        """New settings while training (a population member's explore): every update reads ``self.cfg`` (the
        learning rate included); the clipping threshold and Adam's epsilon are set here. Settings that shape the
        networks or the batch are not searched (the population's keys are checked at plan time)."""
        self.cfg = settings
        self.optimizer.eps = settings.adam_eps
        for clipper in self._clippers.values():
            clipper.max_norm = settings.max_grad_norm

    def synchronize(self) -> None:
        """Data-parallel replicas: start from rank 0's actor (and centralized critic) weights and statistics."""
        if self.collective is not None:
            nets = [self.policy] + ([self.value] if self.centralized else [])
            self.collective.broadcast_(
                [t for net in nets for t in net.state_dict().values() if t.dtype == torch.float32]
            )

    def train(self, batch: Mapping[str, np.ndarray], progress: float) -> TrainResult:
        cfg = self.cfg
        self.optimizer.lr = lr = scheduled_lr(cfg.lr, cfg.lr_schedule, progress)
        rollout = self._rollout(batch)  # the batch as rows; advantages and targets from the current networks
        sums: dict[str, float] = {}
        count = 0
        for _ in range(cfg.epochs):
            for minibatch in self._minibatches(rollout):
                for k, v in self._minibatch(minibatch).items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        self._update_statistics(rollout)
        out = {**rollout.stats, **{k: v / count for k, v in sums.items()}}
        out.update(explained_variance=explained_variance(rollout.values, rollout.returns), lr=lr)
        if self.collective is not None:
            out.update(bytes_reduced=self.collective.bytes_reduced, seconds_reduced=self.collective.seconds_reduced)
        return TrainResult({k: float(v) for k, v in out.items()})

    # ------------------------------------------------------------------ the steps of an update
    def _rollout(self, batch: Mapping[str, np.ndarray]) -> Rollout:
        """The batch's rows, the current networks' values (and with importance weights log-probs) of them, the
        advantages and the critic's targets."""
        cfg = self.cfg
        T, N = batch["rewards"].shape
        flat_obs = {p.name: self._rows(batch, p.name) for p in self.parts}  # [(T+1) N, ...] per part
        obs = {name: x[: T * N] for name, x in flat_obs.items()}
        if self.critic_parts is self.parts:
            flat_critic, critic_obs = flat_obs, obs
        else:
            flat_critic = {p.name: self._rows(batch, p.name) for p in self.critic_parts}
            critic_obs = {name: x[: T * N] for name, x in flat_critic.items()}
        actions = self._tensor(batch, "actions").reshape(T * N, *batch["actions"].shape[2:])
        behaviour_logp = self._tensor(batch, "logp").reshape(-1)
        seq = self._sequences(batch) if self.memory else None  # the critic has a core only beside the actor's
        with autocast(self.device, self.dtype):
            v_all, prox_logp, after = self._evaluate_rollout(flat_obs, obs, actions, flat_critic, seq)
        v_all, prox_logp = v_all.float(), None if prox_logp is None else prox_logp.float()
        stats: dict[str, float] = {}
        weights = rho = c = None
        old_logp = behaviour_logp
        if prox_logp is not None:
            # Importance weights of the current (proximal) policy against the behaviour policy that acted.
            ratio = (prox_logp - behaviour_logp).exp()
            truncated = ratio.clamp(max=cfg.is_rho_clip)
            if cfg.td_compensation:
                weights, old_logp = truncated, prox_logp
            if cfg.vtrace_targets:
                rho, c = truncated.reshape(T, N), ratio.clamp(max=cfg.is_c_clip).reshape(T, N)
            stats.update(
                is_weight_mean=float(ratio.mean()),
                is_weight_max=float(ratio.max()),
                is_weight_truncated=float((ratio > cfg.is_rho_clip).float().mean()),
            )
        with autocast(self.device, self.dtype):  # the bootstrap values of truncated episodes
            advantages, returns, values = self._advantages(batch, v_all.reshape(T + 1, N), T, N, rho, c, after)
        ret, old_v = returns.reshape(-1), values.reshape(-1)
        # Multi-agent segments say which columns acted (``alive``). The critic learns from every step, since a
        # column waiting for its turn or done before the others still has a value (and rewards may reach it
        # while it waits: an opponent's winning move); the policy learns from the steps it acted in only.
        acted = None if "alive" not in batch else self._tensor(batch, "alive").reshape(-1)
        return Rollout(
            T, N, obs, critic_obs, actions, old_logp, advantages.reshape(-1), ret, old_v, weights, acted, seq, stats,
            # the critic regresses on its own scale (standardized returns with value normalization)
            self.value.normalize(ret), self.value.normalize(old_v),
        )  # fmt: skip

    def _minibatches(self, r: Rollout) -> Iterator[Minibatch]:
        """One epoch: exactly ``ppo.minibatches`` minibatches (data-parallel peers stay in lockstep) of steps, or
        with an unrolled recurrent core of whole segments (columns, time-major), in a fresh random order."""
        unroll = r.seq is not None and not r.seq.stored
        size = r.N if unroll else r.T * r.N
        mb = max(1, size // self.cfg.minibatches)
        perm = torch.randperm(size, generator=self._gen).to(self.device)
        for start in range(0, mb * self.cfg.minibatches, mb):
            idx = perm[start : start + mb]
            seq = crit = None  # crit: the rows of idx the losses see (all but a burn-in)
            if r.seq is not None:
                seq = r.seq.columns(idx, r.T) if unroll else r.seq.rows(idx)
                if unroll:  # the columns' steps, time-major
                    idx = (torch.arange(r.T, device=self.device)[:, None] * r.N + idx[None, :]).reshape(-1)
                    if self.burn_in:
                        crit = torch.arange(len(idx), device=self.device) >= self.burn_in * seq.n
            acted = None if r.acted is None else r.acted[idx]
            if crit is not None:
                acted = crit if acted is None else acted & crit
            acted = None if acted is None else acted.nonzero().squeeze(-1)
            crit = None if crit is None else crit.nonzero().squeeze(-1)
            pi = idx if acted is None else idx[acted]  # the policy's rows
            vi = idx if crit is None else idx[crit]  # the critic's
            obs = {name: x[idx] for name, x in r.obs.items()}
            yield Minibatch(
                obs,
                obs if r.critic_obs is r.obs else {name: x[idx] for name, x in r.critic_obs.items()},
                acted,
                r.actions[pi],
                r.old_logp[pi],
                r.advantages[pi],
                r.returns_head[vi],
                r.values_head[vi],
                None if r.weights is None else r.weights[pi],
                seq,
                crit,
            )

    def _update_statistics(self, r: Rollout) -> None:
        """Statistics move only after the update: during it the policy sees its inputs as the behaviour policy did
        (so the ratio starts at 1); the new statistics ship with the next snapshot. Actor statistics are merged
        across trainers (every replica must normalize alike); a decentralized critic keeps its own."""
        obs = r.obs
        if r.acted is not None:  # the policy's statistics come from the steps that were acted in only
            rows = r.acted.nonzero().squeeze(-1)
            obs = {name: x[rows] for name, x in obs.items()}
        for rms, x in _normalizer_inputs(self.policy.encoder, obs):
            self._update_rms(rms, x, merged=True)
        if not self.value.shared:
            for rms, x in _normalizer_inputs(self.value.encoder, r.critic_obs):
                self._update_rms(rms, x, merged=self.centralized)
        self._update_rms(self.value.return_normalizer, r.returns, merged=self.centralized)

    # ------------------------------------------------------------------ internals
    @torch.no_grad()
    def _evaluate_rollout(
        self, flat_obs: Obs, obs: Obs, actions: torch.Tensor, flat_critic: Obs, seq: Sequences | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, After | None]:
        """Current values of all T+1 rows (from the critic's inputs), (with TD compensation) current log-probs
        of the taken actions, and with a recurrent critic its states after each step (:class:`After`)."""
        want_logp = self.cfg.td_compensation or self.cfg.vtrace_targets
        if seq is None:
            if self.value.shared:  # one encoder pass serves both heads
                features = self.policy.encoder(flat_obs)
                v_all = self.value.denormalize(self.value.head_output(features))
                legal = self.policy.legal(flat_obs, len(actions))
                logp = self.policy.evaluate_features(features[: len(actions)], actions, legal)[0] if want_logp else None
                return v_all, logp, None
            return self.value(flat_critic), self.policy.evaluate(obs, actions)[0] if want_logp else None, None
        # with memory: the actor's core runs over all T + 1 rows, so one pass gives its features for both
        features, after = encode(self.policy.encoder, flat_obs, seq)
        logp = None
        if want_logp:
            legal = self.policy.legal(flat_obs, len(actions))
            logp = self.policy.evaluate_features(features[: len(actions)], actions, legal)[0]
        if self.value.shared:
            return self.value.denormalize(self.value.head_output(features)), logp, after
        critic_features, critic_after = encode(self.value.encoder, flat_critic, self._critic_seq(seq))
        v_all = self.value.denormalize(self.value.head_output(critic_features))
        return v_all, logp, critic_after

    @torch.no_grad()
    def _advantages(
        self,
        batch: Mapping[str, np.ndarray],
        v_all: torch.Tensor,
        T: int,
        N: int,
        rho: torch.Tensor | None,
        c: torch.Tensor | None,
        after: After | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GAE (V-trace-corrected with ``rho``/``c``) on current values; truncated episodes bootstrap from their
        final obs (a recurrent critic sees it with the state its episode reached, ``after``)."""
        values, next_values = v_all[:T], v_all[1:].clone()
        truncated = self._tensor(batch, "truncated")
        terminated = self._tensor(batch, "terminated")
        if bool(truncated.any()):
            if self.critic_parts[0].final_name in batch:
                final = {p.name: self._tensor(batch, p.final_name)[truncated] for p in self.critic_parts}
                if after is None:
                    next_values[truncated] = self.value(final).float()
                else:
                    t, n = truncated.nonzero(as_tuple=True)
                    features, _ = self.value.encoder.step(final, after.states(t, n))
                    next_values[truncated] = self.value.denormalize(self.value.head_output(features)).float()
            else:  # image observations carry no final obs: V(s_t) stands in for V(s_{t+1}) (time limits are rare there)
                next_values[truncated] = values[truncated]
        rewards = self._tensor(batch, "rewards")
        adv, ret = gae(
            rewards,
            values,
            next_values,
            terminated.float(),
            (terminated | truncated).float(),
            self.cfg.gamma,
            self.cfg.gae_lambda,
            rho=rho,
            c=c,
        )
        return adv, ret, values

    def _critic_seq(self, seq: Sequences) -> Sequences | None:
        """A critic with a core of its own unrolls from zeros (its state is never kept); None: no core."""
        if not self.critic_memory:
            return None
        return seq.zeros(int(self.value.encoder.state_size))

    def _sequences(self, batch: Mapping[str, np.ndarray]) -> Sequences:
        """The batch's rows in time for the recurrent cores: states at each segment's start (or every row's,
        ``ppo.memory: stored``), where they were zeroed (after an episode's end) and where a step left them as
        they were (a column that sat idle), as the actor carried them (``api.env.carried``)."""
        T, N = batch["rewards"].shape
        resets, idle = carried_rows(batch["terminated"], batch["truncated"], batch.get("alive"), self.device)
        memory = self._tensor(batch, MEMORY)
        if self.cfg.memory == "stored":
            return Sequences(memory.reshape((T + 1) * N, -1), resets, stored=True)
        return Sequences(memory[0], resets, idle=idle)

    def _tensor(self, batch: Mapping[str, np.ndarray], name: str) -> torch.Tensor:
        """Batch field ``name`` as a tensor on the trainer's device (prefetched there, or no copy on the CPU)."""
        return field(batch, name, self.device)

    def _rows(self, batch: Mapping[str, np.ndarray], name: str) -> torch.Tensor:
        """A ``[rows, N, ...]`` batch field as ``[rows * N, ...]`` on the trainer's device."""
        x = self._tensor(batch, name)
        return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])

    def _update_rms(self, rms: RunningMoments | None, x: torch.Tensor, merged: bool) -> None:
        if rms is None:
            return
        mean, var, n = rms.moments(x)
        if merged and self.collective is not None:
            mean, var, n = self.collective.merge_moments(mean, var, n)
        rms.update_moments(mean, var, n)

    def _forward(
        self,
        obs: Obs,
        critic_obs: Obs,
        acted: torch.Tensor | None,
        actions: torch.Tensor,
        seq: Sequences | None,
        crit: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A minibatch's log-probs and entropies of the acted rows, and the critic's head outputs of its rows."""
        policy_obs = obs if acted is None else {name: x[acted] for name, x in obs.items()}
        if seq is not None:
            features, _ = encode(self.policy.encoder, obs, seq, self.burn_in, states=False)
            policy_features = features if acted is None else features[acted]
            logp, entropy = self.policy.evaluate_features(policy_features, actions, self.policy.legal(policy_obs))
            if not self.value.shared:
                features, _ = encode(self.value.encoder, critic_obs, self._critic_seq(seq), self.burn_in, states=False)
            return logp, entropy, self.value.head_output(features if crit is None else features[crit])
        if self.value.shared:  # one encoder pass feeds both heads
            features = self.policy.encoder(obs)
            policy_features = features if acted is None else features[acted]
            logp, entropy = self.policy.evaluate_features(policy_features, actions, self.policy.legal(policy_obs))
            return logp, entropy, self.value.head_output(features)
        logp, entropy = self.policy.evaluate(policy_obs, actions)
        return logp, entropy, self.value.head_output(self.value.encoder(critic_obs))

    def _minibatch(self, mb: Minibatch) -> dict[str, float]:
        """One gradient step: the critic on the rows ``mb.crit`` picks of ``mb.obs`` (all when None), the policy on
        the rows ``mb.acted`` picks (all when None); ``actions``, ``old_logp``, ``advantages`` and ``weights`` are
        the acted rows' already, ``returns`` and ``values`` the critic's. ``seq``: the rows' order in time, for a
        recurrent core (every row is encoded then, burn-in rows without gradient, and the losses pick theirs)."""
        cfg = self.cfg
        adv = normalize_advantages(mb.advantages) if cfg.normalize_advantages else mb.advantages
        with autocast(self.device, self.dtype):  # the forward passes (bfloat16: workers.trainer_dtype)
            logp, entropy, v = self._forward(mb.obs, mb.critic_obs, mb.acted, mb.actions, mb.seq, mb.crit)
        logp, entropy, v = logp.float(), entropy.float(), v.float()  # the losses in float32
        loss, stats = ppo_loss(
            logp,
            mb.old_logp,
            adv,
            v,
            mb.values,
            mb.returns,
            entropy,
            clip=cfg.clip,
            value_clip=cfg.value_clip,
            vf_coef=cfg.vf_coef,
            ent_coef=cfg.ent_coef,
            weights=mb.weights,
        )
        self.optimizer.zero_grad()
        loss.backward()
        if self.collective is not None:
            self.collective.mean_([p.grad for p in self._reduced if p.grad is not None])
        out = {k: float(v) for k, v in stats.items()}
        out.update(clip_all(self._clippers))
        self.optimizer.step()
        return out
