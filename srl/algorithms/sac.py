"""SAC and TD3 as :class:`~srl.api.worker.Algorithm` s for the trainer worker, with their acting policies.

Both learn Box actions from replay items (the batch :meth:`SAC.train` describes), with twin critics whose
targets follow by Polyak averaging, an actor updated every ``actor_delay`` learner steps, n-step returns from the
replay and prioritized replay's importance weights (each item's new priority is its largest ``|td|`` of the two
critics). Networks work in the unit box: env actions are mapped into it for the critics
(:func:`~srl.algorithms.sac_math.unscale`) and the acting policy maps the actor's back onto the Box's bounds.

- **SAC** (Haarnoja et al. 2018): a tanh-squashed Gaussian actor, the entropy bonus in the target and the actor's
  loss, and its temperature tuned towards ``-|A|`` (or a fixed one). Exploration is the policy's own sampling;
  evaluation and ``srl.load_policy`` take the mean action.
- **TD3** (Fujimoto et al. 2018): a deterministic actor, target-policy smoothing, delayed actor and target updates,
  and Gaussian exploration noise added by the acting policy (none when evaluating).

Acting and learning overlap: actors step and act through policy workers while the trainer updates, and the
replay's rate limiter holds the update-to-data ratio (``replay.samples_per_insert``). The math lives in
:mod:`srl.algorithms.sac_math`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from srl.algorithms.acting import NetActing
from srl.algorithms.adam import Adam
from srl.algorithms.dqn import BOOT
from srl.algorithms.grad_clip import GradClipper, clip_all
from srl.algorithms.replay_batch import (
    batch_rows,
    batch_tensor,
    fold_observations,
    follow,
    frozen_copy,
    require_batch_fits,
)
from srl.algorithms.sac_math import (
    actor_loss,
    clipped_double_q_target,
    rescale,
    smoothed_target_actions,
    soft_q_target,
    squashed_gaussian,
    target_entropy,
    temperature_loss,
    unscale,
)
from srl.api.algorithm import AlgorithmContext, Obs, PlanView
from srl.api.config import ConfigError, ExperimentConfig, SACConfig, TD3Config
from srl.api.device import torch_device
from srl.api.schema import Field
from srl.api.spaces import obs_parts
from srl.api.worker import Priorities, TrainResult
from srl.nets.continuous import DeterministicActor, SquashedActor, TwinQ

__all__ = ["SAC", "TD3", "BoxPolicy", "RandomStart"]


def require_bounded_box(name: str, action_space: spaces.Space, cfg: ExperimentConfig) -> None:
    """One line naming the space, and what fits it, unless the actions are a Box with finite bounds."""
    if not isinstance(action_space, spaces.Box):
        raise ConfigError(
            f"algorithm: {name} needs a Box action space; env {cfg.env.id!r} has {action_space}: use dqn or ppo"
        )
    if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
        raise ConfigError(
            f"algorithm: {name} maps its actions onto the Box's bounds; env {cfg.env.id!r} has unbounded "
            f"{action_space}: set env.action_scale to bound it, or use ppo"
        )


@contextmanager
def weights_held(net: torch.nn.Module) -> Iterator[None]:
    """``net``'s weights out of the backward passes inside: the actor's loss needs the critics' gradient with
    respect to their input (the action) only, and their weight gradients would be a sixth of an update's matrix
    products, computed to be thrown away (measured: 14.5 -> 12.4 ms per HalfCheetah update on one thread)."""
    params = [p for p in net.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def _bounds(action_space: spaces.Space) -> tuple[torch.Tensor, torch.Tensor]:
    box = action_space
    assert isinstance(box, spaces.Box)
    low = torch.as_tensor(np.asarray(box.low, np.float32).reshape(-1))
    high = torch.as_tensor(np.asarray(box.high, np.float32).reshape(-1))
    return low, high


class BoxPolicy(NetActing):
    """Numpy-in, numpy-out acting on a SAC or TD3 actor: Box actions ``[N, D]`` within the bounds.

    SAC samples its squashed Gaussian (``deterministic``: its mean); TD3 adds Gaussian noise of
    ``exploration_noise`` half-ranges to its action (``deterministic``: none).
    """

    net: SquashedActor | DeterministicActor

    def __init__(self, net: SquashedActor | DeterministicActor, action_space: spaces.Space, noise: float = 0.0) -> None:
        self.net = net.eval()
        self.low, self.high = _bounds(action_space)
        self.noise = noise

    def output_fields(self) -> tuple[Field, ...]:
        """Nothing besides the actions: a transition is all the replay needs."""
        return ()

    def to_device(self, device: torch.device) -> None:
        """Act on ``device`` (a policy worker's ``workers.policy_device``), its bounds beside its network."""
        super().to_device(device)
        self.low, self.high = self.low.to(device), self.high.to(device)

    @torch.no_grad()
    def act_tensors(self, obs: Obs, deterministic: bool = False) -> dict[str, torch.Tensor]:
        if isinstance(self.net, SquashedActor):
            mean, log_std = self.net(obs)
            unit = torch.tanh(mean) if deterministic else squashed_gaussian(mean, log_std)[0]
        else:
            unit = self.net(obs)
            if not deterministic and self.noise > 0:
                unit = (unit + self.noise * torch.randn_like(unit)).clamp(-1.0, 1.0)
        return {"actions": rescale(unit, self.low, self.high)}


class RandomStart:
    """One actor's exploration before the policy takes over: uniformly random actions within the Box for the run's
    first ``steps`` env steps, estimated as this actor's times the number of actors (actors step at about one
    speed), then the policy's own (:mod:`srl.api.explore`)."""

    def __init__(self, action_space: spaces.Space, steps: int, actors: int) -> None:
        low, high = _bounds(action_space)
        self.low, self.high = low.numpy(), high.numpy()
        self.steps, self.actors = steps, actors
        self.random = True

    def explore(
        self,
        actions: np.ndarray,
        obs: Mapping[str, np.ndarray],
        columns: slice,
        env_steps: int,
        rng: np.random.Generator,
    ) -> None:
        self.random = env_steps * self.actors < self.steps
        if self.random:
            shape = (len(actions), self.low.size)
            actions[...] = rng.uniform(self.low, self.high, shape).reshape(actions.shape).astype(actions.dtype)

    def stats(self) -> dict[str, float]:
        """``random_actions``: 1 while this actor still acts at random."""
        return {"random_actions": float(self.random)}


class SAC:
    """Soft actor-critic on a replay: twin critics with Polyak targets, a squashed Gaussian actor, an entropy
    temperature tuned to a target entropy, Adam on each, and an optional gradient-norm clip.

    With a ``collective`` this is one of several data-parallel replicas: gradients and observation statistics
    are averaged across them, so their networks stay identical.
    """

    name = "sac"
    section = "sac"
    settings: type[SACConfig] | type[TD3Config] = SACConfig
    on_policy = False

    def __init__(self, ctx: AlgorithmContext) -> None:
        cfg = self._settings(ctx)
        torch.manual_seed(ctx.seed)
        self.cfg = cfg
        self.collective = ctx.collective
        self.device = torch_device(ctx.device, "trainer device")
        self.parts = tuple(p.name for p in obs_parts(ctx.obs_space))
        low, high = _bounds(ctx.action_space)
        self.low, self.high = low.to(self.device), high.to(self.device)
        self.dims = int(low.numel())
        self.actor = self._actor(ctx).to(self.device)
        self.critic: TwinQ = ctx.models.twin_q().to(self.device)
        self.critic_target: TwinQ = frozen_copy(ctx.models.twin_q().to(self.device), self.critic)
        self.actor_optimizer = Adam(self.actor.parameters(), lr=cfg.actor_lr, eps=cfg.adam_eps)
        self.critic_optimizer = Adam(self.critic.parameters(), lr=cfg.critic_lr, eps=cfg.adam_eps)
        self.clippers = {
            "actor": GradClipper(list(self.actor.parameters()), cfg.max_grad_norm),
            "critic": GradClipper(list(self.critic.parameters()), cfg.max_grad_norm),
        }
        self.learner_steps = 0
        """Critic updates so far (what the actor's delay counts)."""
        self._init_extra(ctx)

    # ------------------------------------------------------------------ what SAC and TD3 do differently
    @classmethod
    def _settings(cls, ctx: AlgorithmContext) -> Any:
        """The run's section of this algorithm: the typed settings the context carries, or the config's own."""
        return ctx.args if isinstance(ctx.args, cls.settings) else getattr(ctx.cfg, cls.section)

    def _actor(self, ctx: AlgorithmContext) -> SquashedActor | DeterministicActor:
        actor: SquashedActor = ctx.models.squashed_actor()
        return actor

    def _init_extra(self, ctx: AlgorithmContext) -> None:
        """The temperature: learned as ``log alpha`` when ``autotune``, else fixed."""
        cfg: SACConfig = self.cfg
        initial = torch.tensor([float(np.log(cfg.alpha))], device=self.device)
        self.log_alpha = torch.nn.Parameter(initial, requires_grad=cfg.autotune)
        self.target_entropy = cfg.target_entropy if cfg.target_entropy is not None else target_entropy(self.dims)
        self.alpha_optimizer = Adam([self.log_alpha], lr=cfg.alpha_lr, eps=cfg.adam_eps) if cfg.autotune else None

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    @torch.no_grad()
    def _target(self, boot: Obs, returns: torch.Tensor, discounts: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.actor(boot)
        action, log_prob, _ = squashed_gaussian(mean, log_std)
        q1, q2 = self.critic_target(boot, action)
        return soft_q_target(returns, discounts, q1, q2, log_prob, self.alpha)

    def _actor_step(self, obs: Obs) -> dict[str, float]:
        """The actor's loss and step, then the temperature's."""
        mean, log_std = self.actor(obs)
        action, log_prob, _ = squashed_gaussian(mean, log_std)
        with weights_held(self.critic):
            q1, q2 = self.critic(obs, action)
            loss = actor_loss(q1, q2, log_prob, self.alpha)
            stats = self._step(self.actor_optimizer, loss, self.actor.parameters(), "actor")
        stats.update(actor_loss=float(loss.detach()), entropy=float(-log_prob.detach().mean()))
        if self.alpha_optimizer is not None:
            alpha_loss = temperature_loss(self.log_alpha, log_prob, self.target_entropy)
            self._step(self.alpha_optimizer, alpha_loss, [self.log_alpha])
            stats["alpha_loss"] = float(alpha_loss.detach())
        stats["alpha"] = self.alpha
        return stats

    def _after_actor_step(self) -> None:
        """SAC's critic targets follow after every critic step (:meth:`_after_critic_step`); nothing more here."""

    def _after_critic_step(self) -> None:
        self._polyak(self.critic_target, self.critic)

    # ------------------------------------------------------------------ the algorithm API
    @classmethod
    def acting_policy(cls, ctx: AlgorithmContext) -> BoxPolicy:
        """The acting policy; the run's plan builds one first, so an unfit action space is refused here too."""
        require_bounded_box(cls.name, ctx.action_space, ctx.cfg)
        return BoxPolicy(ctx.models.squashed_actor(), ctx.action_space)

    @classmethod
    def explorer(cls, ctx: AlgorithmContext, first: int, count: int, total: int, actors: int) -> RandomStart | None:
        """Uniformly random actions for the run's first ``random_steps`` env steps, or None when that is 0."""
        steps = cls._settings(ctx).random_steps
        if not steps:
            return None
        require_bounded_box(cls.name, ctx.action_space, ctx.cfg)
        return RandomStart(ctx.action_space, steps, actors)

    @classmethod
    def check(cls, plan: PlanView) -> None:
        """What only the probed env tells: bounded Box actions; and what the replay's items must hold."""
        cfg = plan.cfg
        settings = getattr(cfg, cls.section)
        for policy in plan.policies:
            require_bounded_box(cls.name, policy.action_space, cfg)
        if cfg.model.core != "none":
            raise ConfigError(f"model.core: {cls.name} has no recurrent networks; use none, not {cfg.model.core!r}")
        if settings.nstep > cfg.workers.segment_length:
            raise ConfigError(
                f"{cls.section}.nstep: {settings.nstep}-step returns are longer than the stored sequences "
                f"(workers.segment_length={cfg.workers.segment_length})"
            )
        require_batch_fits(cls.section, settings.batch_size, cfg)

    def train(self, batch: Mapping[str, np.ndarray], progress: float) -> TrainResult:
        """One learner step on ``N`` replay items of ``L`` steps: for each observation part ``P``, ``P`` and
        ``boot_P`` ``[L, N, ...]``, ``actions [L, N, D]`` (env actions, within the Box), ``returns`` and
        ``discounts`` ``[L, N]`` (n-step reward sums and ``gamma^m``, 0 after a terminal), ``alive [L, N]`` in a
        multi-agent env's batch (a step its agent did not take weighs nothing), ``weights [N]`` (importance
        weights) and ``keys [N]``. The critics train every step, the actor (and with it the
        temperature) every ``actor_delay``-th. Learning rates are constant: ``progress`` is not read."""
        length, n = batch["actions"].shape[:2]
        obs = {name: self._rows(batch, name) for name in self.parts}
        boot = {name: self._rows(batch, BOOT + name) for name in self.parts}
        actions = unscale(self._rows(batch, "actions").float().reshape(length * n, self.dims), self.low, self.high)
        weights = self._tensor(batch, "weights").float().repeat(length)  # rows are time-major: item i is row t*N+i
        discounts = self._rows(batch, "discounts")
        alive = self._rows(batch, "alive").float() if "alive" in batch else None
        if alive is not None:  # a step its agent did not take (it left the env) is no transition: weight 0
            weights, discounts = weights * alive, discounts * alive
        target = self._target(boot, self._rows(batch, "returns"), discounts)
        q1, q2 = self.critic(obs, actions)
        td1, td2 = q1 - target, q2 - target
        if alive is not None:
            td1, td2 = td1 * alive, td2 * alive
        critic_loss = (weights * (td1.pow(2) + td2.pow(2))).mean()
        stats = self._step(self.critic_optimizer, critic_loss, self.critic.parameters(), "critic")
        self.learner_steps += 1
        self._after_critic_step()
        if self.learner_steps % self.cfg.actor_delay == 0:
            stats.update(self._actor_step(obs))
            self._after_actor_step()
        self._update_normalizers(obs if alive is None else {k: v[alive > 0] for k, v in obs.items()})
        td = torch.maximum(td1.detach().abs(), td2.detach().abs())
        priorities = td.reshape(length, n).amax(dim=0).float().cpu().numpy()
        stats.update(
            critic_loss=float(critic_loss.detach()),
            td_abs_mean=float(td.mean()),
            q_mean=float(q1.detach().mean()),
            target_mean=float(target.mean()),
            learner_steps=float(self.learner_steps),
        )
        return TrainResult(stats, Priorities(np.asarray(batch["keys"]), priorities))

    def policy_state(self) -> np.ndarray:
        """The actor's flat state (what :class:`BoxPolicy` loads)."""
        return self.actor.flat_state()

    def state_dict(self) -> dict[str, Any]:
        out = {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "learner_steps": self.learner_steps,
        }
        return {**out, **self._extra_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.learner_steps = int(state["learner_steps"])
        self._load_extra(state)

    def _extra_state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"log_alpha": self.log_alpha.detach().clone()}
        if self.alpha_optimizer is not None:
            out["alpha_optimizer"] = self.alpha_optimizer.state_dict()
        return out

    def _load_extra(self, state: Mapping[str, Any]) -> None:
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        if self.alpha_optimizer is not None:
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])

    def synchronize(self) -> None:
        """Data-parallel replicas: start from rank 0's networks and statistics, the targets copies of them."""
        if self.collective is None:
            return
        for net in self._online():
            self.collective.broadcast_([t for t in net.state_dict().values() if t.dtype == torch.float32])
        self.collective.broadcast_([self.log_alpha.data])
        self.critic_target.load_state_dict(self.critic.state_dict())
        self._sync_extra()

    def _sync_extra(self) -> None:
        """SAC has no target actor."""

    # ------------------------------------------------------------------ internals
    def _online(self) -> list[torch.nn.Module]:
        return [self.actor, self.critic]

    def _step(
        self, optimizer: Adam, loss: torch.Tensor, params: Iterable[torch.Tensor], clipper: str | None = None
    ) -> dict[str, float]:
        """One step of ``optimizer`` on ``loss``: gradients averaged across replicas, then clipped by the named
        network's clipper (its stats returned)."""
        optimizer.zero_grad()
        loss.backward()
        self._reduce(params)
        stats = clip_all({clipper: self.clippers[clipper]}) if clipper is not None else {}
        optimizer.step()
        return stats

    def _reduce(self, params: Iterable[torch.Tensor]) -> None:
        """Average gradients across data-parallel replicas."""
        if self.collective is not None:
            self.collective.mean_([p.grad for p in params if p.grad is not None])

    def _polyak(self, target: torch.nn.Module, online: torch.nn.Module) -> None:
        """Move ``target`` a step ``tau`` towards ``online``; its observation statistics are copied outright."""
        follow(target, online, self.cfg.tau)

    def _update_normalizers(self, obs: Obs) -> None:
        """Fold the batch into every network's running observation statistics (merged across replicas)."""
        for net in self._online():
            for encoder in _encoders(net):
                fold_observations(encoder, obs, self.collective)

    def _tensor(self, batch: Mapping[str, np.ndarray], name: str) -> torch.Tensor:
        return batch_tensor(batch, name, self.device)

    def _rows(self, batch: Mapping[str, np.ndarray], name: str) -> torch.Tensor:
        return batch_rows(batch, name, self.device)


def _encoders(net: torch.nn.Module) -> list[torch.nn.Module]:
    """The observation encoders inside ``net`` (one per actor or critic)."""
    if isinstance(net, TwinQ):
        return [net.q1.encoder, net.q2.encoder]
    return [net.encoder]  # type: ignore[list-item]


class TD3(SAC):
    """TD3 on a replay: twin critics with target-policy smoothing, a deterministic actor and its target, both
    targets moved only when the actor is (every ``actor_delay`` learner steps)."""

    name = "td3"
    section = "td3"
    settings = TD3Config

    def _actor(self, ctx: AlgorithmContext) -> SquashedActor | DeterministicActor:
        actor: DeterministicActor = ctx.models.deterministic_actor()
        return actor

    def _init_extra(self, ctx: AlgorithmContext) -> None:
        self.actor_target: DeterministicActor = frozen_copy(
            ctx.models.deterministic_actor().to(self.device), self.actor
        )

    @torch.no_grad()
    def _target(self, boot: Obs, returns: torch.Tensor, discounts: torch.Tensor) -> torch.Tensor:
        cfg: TD3Config = self.cfg
        action = smoothed_target_actions(self.actor_target(boot), cfg.target_noise, cfg.target_noise_clip)
        q1, q2 = self.critic_target(boot, action)
        return clipped_double_q_target(returns, discounts, q1, q2)

    def _actor_step(self, obs: Obs) -> dict[str, float]:
        """The deterministic policy gradient through the first critic (Fujimoto et al.): ``-mean Q1(s, pi(s))``."""
        with weights_held(self.critic):
            q1 = self.critic.q1(obs, self.actor(obs))
            zero = torch.zeros_like(q1)
            loss = actor_loss(q1, q1, zero, 0.0)
            stats = self._step(self.actor_optimizer, loss, self.actor.parameters(), "actor")
        return {**stats, "actor_loss": float(loss.detach())}

    def _after_critic_step(self) -> None:
        """TD3 moves its targets with the actor, not after every critic step."""

    def _after_actor_step(self) -> None:
        self._polyak(self.critic_target, self.critic)
        self._polyak(self.actor_target, self.actor)

    @classmethod
    def acting_policy(cls, ctx: AlgorithmContext) -> BoxPolicy:
        require_bounded_box(cls.name, ctx.action_space, ctx.cfg)
        return BoxPolicy(ctx.models.deterministic_actor(), ctx.action_space, cls._settings(ctx).exploration_noise)

    def _extra_state(self) -> dict[str, Any]:
        return {"actor_target": self.actor_target.state_dict()}

    def _load_extra(self, state: Mapping[str, Any]) -> None:
        self.actor_target.load_state_dict(state["actor_target"])

    def _sync_extra(self) -> None:
        self.actor_target.load_state_dict(self.actor.state_dict())
