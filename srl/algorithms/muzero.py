"""MuZero: a learned model that acts by searching its own latent states, trained from a replay by unrolling it.

The network (:class:`MuZeroNet`, one flat snapshot) is three functions (Schrittwieser et al., 2020):
representation ``s0 = h(o)`` (the run's observation encoder, then a linear map to the latent width), dynamics
``s', r = g(s, a)`` and prediction ``p, v = f(s)``. Latent states are scaled to ``[0, 1]`` per state; the value
and the reward are predicted as distributions over an integer support of the scaled value (``value_support``,
``reward_support``; :mod:`srl.algorithms.search_math`), their heads zero at the start.

Acting (:class:`MuZeroPolicy`, in the policy workers, batching the rows of many actors, or inline): every row is
searched in latent space (:class:`srl.search.latent.LatentSearch`), one dynamics-and-prediction pass per
simulation over all rows; the row plays the search's action and writes the search's policy (``search_policy``)
into its segment. Self-play explores by the search's own draws (Gumbel noise); an evaluation searches without.

Learning (:meth:`MuZero.train`): items are ``K + 1`` consecutive steps (``replay.item_length = unroll + 1``).
The model starts from the first step's observation and is unrolled ``K`` steps along the stored actions; at each
position it is fitted to the stored search policy, to the position's n-step return bootstrapped from a target
network's value of the observation ``nstep`` steps on (the replay computes the returns), and, after each step,
to that step's reward. Positions past an episode's end are absorbing after a termination, untargeted after a time
limit (:func:`srl.algorithms.search_math.unroll_targets`). The unrolled steps' losses weigh ``1 / K`` and the
gradient into each dynamics step is halved, as in MuZero. Each item's priority is its first value error.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor, nn

from srl.algorithms.acting import NetActing, Obs
from srl.algorithms.adam import Adam, scheduled_lr
from srl.algorithms.alphazero import SEARCH_POLICY
from srl.algorithms.dqn import BOOT, require_discrete
from srl.algorithms.grad_clip import GradClipper, clip_all
from srl.algorithms.replay_batch import (
    TargetLearner,
    batch_rows,
    batch_tensor,
    fold_observations,
    frozen_copy,
    require_batch_fits,
)
from srl.algorithms.search_math import categorical_loss, from_categorical, policy_loss, unroll_targets
from srl.api.algorithm import AlgorithmContext, PlanView
from srl.api.config import ConfigError, MuZeroConfig
from srl.api.config.search import require_search
from srl.api.device import torch_device
from srl.api.schema import Field
from srl.api.spaces import ACTION_MASK, GAME_HISTORY, obs_parts
from srl.api.worker import Priorities, TrainResult
from srl.nets.mlp import mlp
from srl.nets.policy import Flattened
from srl.search.latent import LatentSearch


def _settings(ctx: AlgorithmContext) -> MuZeroConfig:
    return ctx.args if isinstance(ctx.args, MuZeroConfig) else ctx.cfg.muzero


def _halve(grad: Tensor) -> Tensor:
    """The gradient into each dynamics step, halved (MuZero's: the unrolled steps' gradients add up otherwise)."""
    return grad * 0.5


def _scaled(x: Tensor) -> Tensor:
    """Each latent state min-max scaled to ``[0, 1]`` (MuZero's: keeps the dynamics' inputs in one range)."""
    lo = x.min(dim=1, keepdim=True).values
    hi = x.max(dim=1, keepdim=True).values
    return (x - lo) / (hi - lo).clamp(min=1e-5)


class MuZeroNet(Flattened):
    """Representation, dynamics and prediction (see the module's docstring)."""

    def __init__(self, encoder: nn.Module, actions: int, cfg: MuZeroConfig, activation: str) -> None:
        super().__init__()
        z, h = cfg.latent, cfg.hidden
        self.actions, self.value_support, self.reward_support = actions, cfg.value_support, cfg.reward_support
        self.encoder = encoder
        self.represent_head = nn.Linear(int(encoder.out_dim), z)  # type: ignore[arg-type]
        self.dynamics_torso = mlp(z + actions, [h], activation)
        self.latent_head = nn.Linear(h, z)
        self.reward_head = nn.Linear(h, 2 * cfg.reward_support + 1)
        self.prediction_torso = mlp(z, [h], activation)
        self.policy_head = nn.Linear(h, actions)
        self.value_head = nn.Linear(h, 2 * cfg.value_support + 1)
        for head in (self.reward_head, self.value_head, self.policy_head):  # uniform: no value, reward or preference
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
        self._init_flat()

    def represent(self, obs: Obs) -> Tensor:
        """Observation parts -> latent states ``[N, latent]``."""
        return _scaled(self.represent_head(self.encoder(obs)))

    def dynamics(self, latent: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Latent states and actions ``[N]`` -> the next latent states and the reward logits of the moves."""
        onehot = torch.nn.functional.one_hot(actions.long(), self.actions).to(latent.dtype)
        x = self.dynamics_torso(torch.cat([latent, onehot], dim=1))
        return _scaled(self.latent_head(x)), self.reward_head(x)

    def predict(self, latent: Tensor) -> tuple[Tensor, Tensor]:
        """Latent states -> policy logits ``[N, A]`` and value logits over the support."""
        x = self.prediction_torso(latent)
        return self.policy_head(x), self.value_head(x)

    # ------------------------------------------------------------------ as a search's model (LatentModel)
    def initial(self, obs: Obs) -> tuple[Tensor, Tensor, Tensor]:
        latent = self.represent(obs)
        logits, value = self.predict(latent)
        return latent, logits, from_categorical(value, self.value_support)

    def recurrent(self, latent: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        child, reward = self.dynamics(latent, actions)
        logits, value = self.predict(child)
        return child, from_categorical(reward, self.reward_support), logits, from_categorical(value, self.value_support)


def make_net(ctx: AlgorithmContext) -> MuZeroNet:
    """The run's network: the ``model`` section's encoder (its ``hidden`` torso), the ``muzero`` section's model."""
    return MuZeroNet(ctx.models.encoder(), int(ctx.action_space.n), _settings(ctx), ctx.cfg.model.activation)  # type: ignore[attr-defined]


class MuZeroPolicy(NetActing):
    """Acts by searching each row in the network's latent space."""

    net: MuZeroNet

    def __init__(self, net: MuZeroNet, search: LatentSearch, seed: int = 0) -> None:
        self.net, self.search = net.eval(), search
        self.rng = np.random.default_rng(seed)

    def output_fields(self) -> tuple[Field, ...]:
        return (Field(SEARCH_POLICY, (self.net.actions,), "float32"),)

    def act_tensors(self, obs: Obs, deterministic: bool = False) -> Mapping[str, Tensor]:
        legal = obs[ACTION_MASK].cpu().numpy() > 0 if ACTION_MASK in obs else None
        found = self.search(self.net, obs, legal, None if deterministic else self.rng)
        return {
            "actions": torch.from_numpy(found.actions).to(self.device),
            SEARCH_POLICY: torch.from_numpy(found.policy.astype(np.float32)).to(self.device),
        }


class MuZero(TargetLearner):
    """The learner (see the module's docstring)."""

    section = "muzero"
    settings = MuZeroConfig
    on_policy = False
    pairs = (("net", "target"),)

    def __init__(self, ctx: AlgorithmContext) -> None:
        cfg = _settings(ctx)
        torch.manual_seed(ctx.seed)
        self.cfg, self.collective = cfg, ctx.collective
        self.device = torch_device(ctx.device, "trainer device")
        self.parts = tuple(p.name for p in obs_parts(ctx.obs_space) if p.name != GAME_HISTORY)
        self.net = make_net(ctx).to(self.device)
        self.target = frozen_copy(make_net(ctx).to(self.device), self.net)
        params = list(self.net.parameters())
        self.optimizer = Adam(params, lr=cfg.lr, eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
        self.clipper = GradClipper(params, cfg.max_grad_norm)
        self.learner_steps = 0

    @staticmethod
    def acting_policy(ctx: AlgorithmContext) -> MuZeroPolicy:
        require_discrete(ctx.action_space, ctx.cfg)
        cfg = _settings(ctx)
        search = LatentSearch(cfg.search, int(ctx.action_space.n), cfg.gamma)  # type: ignore[attr-defined]
        return MuZeroPolicy(make_net(ctx), search, ctx.seed)

    @staticmethod
    def check(plan: PlanView) -> None:
        """Discrete actions, no recurrent core, items of ``unroll + 1`` steps, a search to learn from, batches the
        replay can hold."""
        cfg = plan.cfg
        for policy in plan.policies:
            require_discrete(policy.action_space, cfg)
        if cfg.model.core != "none":
            raise ConfigError(f"model.core: muzero's model is its own recurrence; use none, not {cfg.model.core!r}")
        if cfg.replay.item_length != cfg.muzero.unroll + 1:
            raise ConfigError(
                f"replay.item_length: muzero unrolls its model {cfg.muzero.unroll} steps along each item "
                f"(muzero.unroll), so items are {cfg.muzero.unroll + 1} steps; got {cfg.replay.item_length}"
            )
        require_search("muzero", cfg.muzero.search)
        require_batch_fits("muzero", cfg.muzero.batch_size, cfg)

    # ------------------------------------------------------------------ Algorithm
    def train(self, batch: Mapping[str, np.ndarray], progress: float) -> TrainResult:
        """One learner step on ``N`` items of ``K + 1`` steps: the observation parts and their bootstrap parts
        ``[K + 1, N, ...]``, ``actions``, ``rewards``, ``terminated``, ``truncated``, ``returns`` and
        ``discounts`` ``[K + 1, N]``, the searches' ``search_policy [K + 1, N, A]``, ``weights [N]`` and
        ``keys [N]``."""
        cfg, net = self.cfg, self.net
        self.optimizer.lr = scheduled_lr(cfg.lr, cfg.lr_schedule, progress)
        length, n = batch["actions"].shape[:2]
        unroll = length - 1
        obs = {name: batch_tensor(batch, name, self.device) for name in self.parts}
        actions = batch_tensor(batch, "actions", self.device).long()
        weights = batch_tensor(batch, "weights", self.device).float()
        search_policy = batch_tensor(batch, SEARCH_POLICY, self.device).float()
        with torch.no_grad():
            boot = {name: batch_rows(batch, BOOT + name, self.device) for name in self.parts}
            _, boot_values = self.target.predict(self.target.represent(boot))
            bootstrap = from_categorical(boot_values, cfg.value_support).reshape(length, n)
            stored = (
                batch_tensor(batch, "returns", self.device) + batch_tensor(batch, "discounts", self.device) * bootstrap
            )
            t = unroll_targets(
                stored,
                batch_tensor(batch, "rewards", self.device).float(),
                batch_tensor(batch, "terminated", self.device).bool(),
                batch_tensor(batch, "truncated", self.device).bool(),
            )
        latent = net.represent({name: x[0] for name, x in obs.items()})
        p_losses, v_losses, r_losses = [], [], []
        for k in range(length):
            if k:
                latent, reward_logits = net.dynamics(latent, actions[k - 1])
                latent.register_hook(_halve)
                r_losses.append(categorical_loss(reward_logits, t.rewards[k - 1], cfg.reward_support))
            logits, value_logits = net.predict(latent)
            if k == 0:
                first_value = from_categorical(value_logits.detach(), cfg.value_support)
            legal = obs[ACTION_MASK][k] > 0 if ACTION_MASK in obs else None
            p_losses.append(policy_loss(logits, search_policy[k], legal))
            v_losses.append(categorical_loss(value_logits, t.values[k], cfg.value_support))
        p_loss = torch.stack(p_losses) * t.policy_mask  # [K + 1, N]
        v_loss = torch.stack(v_losses) * t.value_mask
        r_loss = torch.stack(r_losses) * t.reward_mask  # [K, N]
        step = p_loss + cfg.value_weight * v_loss
        per_item = step[0] + (step[1:].sum(0) + r_loss.sum(0)) / unroll  # the unrolled steps weigh 1 / K
        loss = (weights * per_item).mean()
        self.optimizer.zero_grad()
        loss.backward()
        if self.collective is not None:
            self.collective.mean_([p.grad for p in self.optimizer.params if p.grad is not None])
        stats = clip_all({"net": self.clipper})
        self.optimizer.step()
        fold_observations(net.encoder, {name: x[0] for name, x in obs.items()}, self.collective)
        self.learner_steps += 1
        if self.learner_steps % cfg.target_every == 0:
            self.target.load_state_dict(net.state_dict())
        error = (first_value - t.values[0]).abs()
        stats.update(
            loss=float(loss.detach()),
            policy_loss=float(p_loss.detach().mean()),
            value_loss=float(v_loss.detach().mean()),
            reward_loss=float(r_loss.detach().mean()),
            value_mean=float(first_value.mean()),
            target_mean=float(t.values[0].mean()),
            learner_steps=float(self.learner_steps),
            lr=self.optimizer.lr,
        )
        return TrainResult(stats, Priorities(np.asarray(batch["keys"]), error.float().cpu().numpy()))

    def policy_state(self) -> np.ndarray:
        """The network's flat state (what :class:`MuZeroPolicy` loads)."""
        return self.net.flat_state()
