"""AlphaZero: a policy-value network that acts by searching the real game, trained from a replay.

Acting (:class:`AlphaZeroPolicy`, in the policy workers, batching the rows of many actors, or inline): every row
that is its player's move is searched on a copy of the game rebuilt from its observation
(:class:`srl.search.games.GameSearch`; the env is an OpenSpiel game with ``env.kwargs.history: true``), the network
evaluating each simulation's new positions of every tree at once; the row plays the search's action and writes the
search's policy (``search_policy``), its value of the position (``search_value``) and whether it searched
(``searched``) into its segment. A seat waiting for the opponent is not searched. Self-play explores by the search's
own draws (Gumbel noise, or Dirichlet noise with PUCT); an evaluation searches without them.

Learning (:meth:`AlphaZero.train`): the policy head is fitted to the searches' policies on the searched steps, the
value head to the n-step returns the replay computes, bootstrapped from a target network's value (with ``gamma``
1 and ``nstep`` past a game's end, its outcome), on every step: the value of a position is its observer's return,
whichever seat moves; ``search_value_share`` mixes the search's value into a searched position's target. Each
item's priority is its largest value error. With ``mirror`` set, a random half of each batch's positions are mirrored
left to right, with their policy targets and legal moves. The math is in :mod:`srl.algorithms.search_math`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from srl.algorithms.acting import TensorActing, as_tensors
from srl.algorithms.adam import Adam, scheduled_lr
from srl.algorithms.dqn import BOOT, require_discrete
from srl.algorithms.grad_clip import GradClipper, clip_all
from srl.algorithms.replay_batch import TargetLearner, batch_rows, batch_tensor, frozen_copy, require_batch_fits
from srl.algorithms.search_math import mirror_actions, mirror_planes, policy_loss, value_target
from srl.api.algorithm import AlgorithmContext, PlanView
from srl.api.config import AlphaZeroConfig, ConfigError
from srl.api.config.search import require_search
from srl.api.device import torch_device
from srl.api.schema import Field
from srl.api.spaces import ACTION_MASK, GAME_HISTORY, OBS, obs_parts
from srl.api.worker import Priorities, TrainResult
from srl.nets.distributions import mask_logits
from srl.search.games import GameModel, GameSearch

SEARCH_POLICY, SEARCH_VALUE, SEARCHED = "search_policy", "search_value", "searched"
"""The acting policy's outputs: the search's policy over the actions, its value of the row's position (the
mover's view), and 1 where the row was searched."""


def _settings(ctx: AlgorithmContext) -> AlphaZeroConfig:
    return ctx.args if isinstance(ctx.args, AlphaZeroConfig) else ctx.cfg.alphazero


def require_mirror(obs_space: Any, action_space: Any) -> tuple[tuple[str, ...], int]:
    """The observation parts that are board planes and the board's width, where positions of this game can be
    mirrored: board planes in the observation, all of one shape ``[C, H, W]``, and ``W`` actions (one per column)
    or ``H * W`` (one per cell). One line if not."""
    actions = int(action_space.n)  # Discrete: require_discrete comes first
    parts = [p for p in obs_parts(obs_space) if p.name != GAME_HISTORY]
    planes = [p for p in parts if len(p.shape) == 3]
    shapes = {p.shape[1:] for p in planes}
    if len(shapes) == 1:
        ((height, width),) = shapes
        if actions in (width, height * width):
            return tuple(p.name for p in planes), int(width)
    seen = {p.name: p.shape for p in parts}
    raise ConfigError(
        "alphazero.mirror: mirroring needs board planes [C, H, W] in the observation and one action per column or "
        f"per cell; this game observes {seen} with {actions} actions"
    )


def policy_value(policy: Any, value: Any, obs: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Logits (illegal moves at -inf) and values of a batch, from one pass of the encoder they share."""
    features = policy.encoder(obs)
    logits = policy.head(features)
    if policy.mask is not None:
        logits = mask_logits(logits, obs[policy.mask])
    return logits, value.denormalize(value.head_output(features))


class AlphaZeroPolicy(TensorActing):
    """Acts by searching each row's position with the network as the search's prior and value."""

    def __init__(self, policy: Any, value: Any, search: GameSearch, seed: int = 0) -> None:
        """``policy``: logits over the actions (``models.policy()``, masked to the legal ones); ``value``: a value
        head on its encoder (``models.value(shared_encoder=...)``)."""
        self.policy, self.value, self.search = policy.eval(), value.eval(), search
        self.rng = np.random.default_rng(seed)
        self._split = policy.flat_size()

    def output_fields(self) -> tuple[Field, ...]:
        return (
            Field(SEARCH_POLICY, (self.search.model.actions,), "float32"),
            Field(SEARCH_VALUE, (), "float32"),
            Field(SEARCHED, (), "int8"),
        )

    @torch.no_grad()
    def _evaluate(self, obs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The network on positions (Dict keys, as the game observes them): logits and values."""
        tensors = {f"{OBS}.{k}": x.to(self.device) for k, x in as_tensors(obs).items()}
        logits, values = policy_value(self.policy, self.value, tensors)
        return logits.cpu().numpy(), values.cpu().numpy()

    def act(self, obs: Mapping[str, np.ndarray], deterministic: bool = False) -> dict[str, np.ndarray]:
        seen = {name.split(".", 1)[1]: x for name, x in obs.items() if name.startswith(f"{OBS}.")}
        found = self.search(self._evaluate, seen, None if deterministic else self.rng)
        return {
            "actions": found.actions,
            SEARCH_POLICY: found.policy.astype(np.float32),
            SEARCH_VALUE: found.value.astype(np.float32),
            SEARCHED: found.searched.astype(np.int8),
        }

    def act_tensors(self, obs: Mapping[str, Tensor], deterministic: bool = False) -> Mapping[str, Tensor]:
        out = self.act({k: x.cpu().numpy() for k, x in obs.items()}, deterministic)
        return {k: torch.from_numpy(x).to(self.device) for k, x in out.items()}

    def to_device(self, device: torch.device) -> None:
        self.device = device
        self.policy.to(device)
        self.value.to(device)

    def load_flat(self, flat: np.ndarray) -> None:
        self.policy.load_flat_state(flat[: self._split])
        self.value.load_flat_state(flat[self._split :])

    def flat_size(self) -> int:
        return self._split + self.value.flat_size()

    def flat_state(self) -> np.ndarray:
        return np.concatenate([self.policy.flat_state(), self.value.flat_state()])


class AlphaZero(TargetLearner):
    """The learner (see the module's docstring)."""

    section = "alphazero"
    settings = AlphaZeroConfig
    on_policy = False
    pairs = (("policy", "target_policy"), ("value", "target"))

    def __init__(self, ctx: AlgorithmContext) -> None:
        cfg = _settings(ctx)
        torch.manual_seed(ctx.seed)
        self.cfg, self.collective = cfg, ctx.collective
        self.device = torch_device(ctx.device, "trainer device")
        self.parts = tuple(p.name for p in obs_parts(ctx.obs_space) if p.name != GAME_HISTORY)
        self.planes, self.width = require_mirror(ctx.obs_space, ctx.action_space) if cfg.mirror else ((), 0)
        self.policy = ctx.models.policy().to(self.device)
        self.value = ctx.models.value(shared_encoder=self.policy.encoder).to(self.device)
        self.target_policy = frozen_copy(ctx.models.policy().to(self.device), self.policy)
        self.target = frozen_copy(
            ctx.models.value(shared_encoder=self.target_policy.encoder).to(self.device), self.value
        )
        params = [*self.policy.parameters(), *self.value.head.parameters()]
        self.optimizer = Adam(params, lr=cfg.lr, eps=cfg.adam_eps)
        self.clipper = GradClipper(params, cfg.max_grad_norm)
        self.learner_steps = 0

    @staticmethod
    def acting_policy(ctx: AlgorithmContext) -> AlphaZeroPolicy:
        require_discrete(ctx.action_space, ctx.cfg)
        cfg = _settings(ctx)
        policy = ctx.models.policy()
        value = ctx.models.value(shared_encoder=policy.encoder)
        return AlphaZeroPolicy(policy, value, GameSearch(GameModel(ctx.cfg.env), cfg.search), ctx.seed)

    @staticmethod
    def check(plan: PlanView) -> None:
        """A game it can search on, Discrete actions with a legal-move mask, items long enough for its n-step
        returns, a search to learn from, batches the replay can hold."""
        cfg = plan.cfg
        GameModel(cfg.env)
        for policy in plan.policies:
            require_discrete(policy.action_space, cfg)
            if cfg.alphazero.mirror:
                require_mirror(policy.obs_space, policy.action_space)
        if cfg.model.core != "none":
            raise ConfigError(f"model.core: alphazero has no recurrent network; use none, not {cfg.model.core!r}")
        if cfg.alphazero.nstep > cfg.workers.segment_length:
            raise ConfigError(
                f"alphazero.nstep: {cfg.alphazero.nstep}-step returns are longer than the stored sequences "
                f"(workers.segment_length={cfg.workers.segment_length})"
            )
        require_search("alphazero", cfg.alphazero.search)
        require_batch_fits("alphazero", cfg.alphazero.batch_size, cfg)

    # ------------------------------------------------------------------ Algorithm
    def train(self, batch: Mapping[str, np.ndarray], progress: float) -> TrainResult:
        """One learner step on ``N`` replay items of ``L`` steps: the observation parts and their bootstrap parts
        (``boot_P``) ``[L, N, ...]``, ``returns`` and ``discounts`` ``[L, N]``, the searches' ``search_policy
        [L, N, A]``, ``search_value`` and ``searched [L, N]``, ``weights [N]`` and ``keys [N]``."""
        self.optimizer.lr = scheduled_lr(self.cfg.lr, self.cfg.lr_schedule, progress)
        length, n = batch["actions"].shape[:2]
        obs = {name: batch_rows(batch, name, self.device) for name in self.parts}
        boot = {name: batch_rows(batch, BOOT + name, self.device) for name in self.parts}
        weights = batch_tensor(batch, "weights", self.device).float().repeat(length)
        searched = batch_rows(batch, SEARCHED, self.device).float()
        target_policy = batch_rows(batch, SEARCH_POLICY, self.device).float()
        if self.planes:
            flip = torch.rand(length * n, device=self.device) < 0.5
            obs.update({name: mirror_planes(obs[name], flip) for name in self.planes})
            if ACTION_MASK in obs:
                obs[ACTION_MASK] = mirror_actions(obs[ACTION_MASK], flip, self.width)
            target_policy = mirror_actions(target_policy, flip, self.width)
        with torch.no_grad():
            bootstrap = self.target(boot)
            discounts = batch_rows(batch, "discounts", self.device)
            returns = batch_rows(batch, "returns", self.device) + discounts * bootstrap
            search_value = batch_rows(batch, SEARCH_VALUE, self.device).float()
            target = value_target(returns, search_value, searched, self.cfg.search_value_share)
        logits, values = policy_value(self.policy, self.value, obs)
        legal = obs[ACTION_MASK] > 0 if ACTION_MASK in obs else None
        p_loss = policy_loss(logits, target_policy, legal) * searched
        error = values - target
        loss = (weights * (p_loss + self.cfg.value_weight * error.square())).mean()
        self.optimizer.zero_grad()
        loss.backward()
        if self.collective is not None:
            self.collective.mean_([p.grad for p in self.optimizer.params if p.grad is not None])
        stats = clip_all({"net": self.clipper})
        self.optimizer.step()
        self.learner_steps += 1
        if self.learner_steps % self.cfg.target_every == 0:
            self.target_policy.load_state_dict(self.policy.state_dict())
            self.target.load_state_dict(self.value.state_dict())
        priorities = error.detach().abs().reshape(length, n).amax(dim=0).float().cpu().numpy()
        stats.update(
            loss=float(loss.detach()),
            policy_loss=float(p_loss.detach().sum() / searched.sum().clamp(min=1)),
            value_loss=float(error.detach().square().mean()),
            value_mean=float(values.detach().mean()),
            searched_share=float(searched.mean()),
            learner_steps=float(self.learner_steps),
            lr=self.optimizer.lr,
        )
        return TrainResult(stats, Priorities(np.asarray(batch["keys"]), priorities))

    def policy_state(self) -> np.ndarray:
        """The network's flat state (what :class:`AlphaZeroPolicy` loads)."""
        return np.concatenate([self.policy.flat_state(), self.value.flat_state()])
