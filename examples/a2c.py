"""A custom algorithm written only against srl's public API: synchronous advantage actor-critic (A2C).

Train it with ``srl train examples/a2c.yaml`` (run from the repository root): the
experiment file names it as ``algorithm: examples.a2c:A2C`` and passes its own
settings under ``algorithm_args``. Everything else — actors, policy workers,
the sample stream, parameter versions, checkpoints, evaluation,
``srl.load_policy`` — is srl's, unchanged.

An algorithm is a class with ``acting_policy(ctx)`` (what actors run) and a
constructor ``A2C(ctx)`` returning the trainer's object; ``ctx.models`` builds
the networks from the ``model`` section (so ``model.encoder`` plugins work here
too). It declares its settings as a dataclass (``settings = A2CSettings``):
``algorithm_args`` is built into it when the run starts, so a wrong key or value
is one line naming ``algorithm_args.<field>``, and ``ctx.args`` is the typed object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from srl.algorithms.acting import NetActing
from srl.api.algorithm import AlgorithmContext
from srl.api.config.errors import check
from srl.api.schema import Field
from srl.api.spaces import obs_parts
from srl.api.worker import TrainResult


@dataclass(frozen=True, kw_only=True)
class A2CSettings:
    """A2C's settings (``algorithm_args``)."""

    lr: float = 1e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor (the actors' reward scaling follows it too)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Clip of the gradients' global norm."""

    def __post_init__(self) -> None:
        for name in ("lr", "vf_coef", "max_grad_norm"):
            check(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
        check(0.0 <= self.gamma <= 1.0, "gamma", f"must be in [0, 1], got {self.gamma}")
        check(self.ent_coef >= 0, "ent_coef", f"must be >= 0, got {self.ent_coef}")


class A2CPolicy(NetActing):
    """What actors run: the actor network, sampling actions; A2C needs no extra field per step. ``NetActing`` gives
    it ``act`` on arrays (on its device) and the snapshot of its network."""

    def __init__(self, actor: torch.nn.Module) -> None:
        self.net = actor.eval()

    def output_fields(self) -> tuple[Field, ...]:
        return ()

    def act_tensors(self, obs: Mapping[str, torch.Tensor], deterministic: bool = False) -> dict[str, torch.Tensor]:
        actions, _ = self.net.act(obs, deterministic)
        return {"actions": actions}


class A2C:
    """One gradient step per batch of segments: n-step returns bootstrapped by the critic, policy gradient with
    the advantage, value regression, optional entropy bonus."""

    settings: ClassVar[type] = A2CSettings

    @staticmethod
    def acting_policy(ctx: AlgorithmContext) -> A2CPolicy:
        return A2CPolicy(ctx.models.policy())

    def __init__(self, ctx: AlgorithmContext) -> None:
        self.args: A2CSettings = ctx.args
        torch.manual_seed(ctx.seed)
        self.actor, self.critic = ctx.models.policy(), ctx.models.value()
        self.params = list(self.actor.parameters()) + list(self.critic.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=self.args.lr)
        self.parts = obs_parts(ctx.obs_space)

    def train(self, batch: Mapping[str, np.ndarray], progress: float) -> TrainResult:
        a = self.args
        T, N = batch["rewards"].shape
        obs = {p.name: torch.from_numpy(batch[p.name]).flatten(0, 1) for p in self.parts}  # [(T + 1) N, ...]
        values = self.critic(obs).reshape(T + 1, N)
        rewards = torch.from_numpy(batch["rewards"])
        terminated = torch.from_numpy(batch["terminated"])
        truncated = torch.from_numpy(batch["truncated"])
        with torch.no_grad():
            next_values = values[1:].clone()
            if truncated.any() and self.parts[0].final_name in batch:  # a time limit: bootstrap from the last state
                final = {p.name: torch.from_numpy(batch[p.final_name])[truncated] for p in self.parts}
                next_values[truncated] = self.critic(final)
            returns = torch.empty(T, N)
            ret = values[T]
            for t in reversed(range(T)):
                ended = terminated[t] | truncated[t]
                ret = rewards[t] + a.gamma * torch.where(ended, next_values[t] * ~terminated[t], ret)
                returns[t] = ret
        step_obs = {name: x[: T * N] for name, x in obs.items()}
        logp, entropy = self.actor.evaluate(step_obs, torch.from_numpy(batch["actions"]).flatten(0, 1))
        advantages = returns.reshape(-1) - values[:T].reshape(-1)
        policy_loss = -(logp * advantages.detach()).mean()
        value_loss = advantages.pow(2).mean()
        loss = policy_loss + a.vf_coef * value_loss - a.ent_coef * entropy.mean()
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, a.max_grad_norm)
        self.optimizer.step()
        stats = {
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            "entropy": entropy.mean().item(),
            "grad_norm": float(grad_norm),
        }
        return TrainResult(stats)

    def policy_state(self) -> np.ndarray:
        return self.actor.flat_state()

    def state_dict(self) -> dict[str, Any]:
        return {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(state["optimizer"])

    def synchronize(self) -> None:
        """One trainer only: nothing to make identical."""
