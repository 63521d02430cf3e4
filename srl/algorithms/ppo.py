"""PPO as an :class:`~srl.api.worker.Algorithm` for the trainer worker, and the acting policy.

The trainer keeps a policy (actor) network and its own value (critic)
network. Only the policy's flat snapshot is published: policy workers never
see the critic, and values for advantages are recomputed here at training
time with the current critic (fresh, not rollout-time values). The math
lives in :mod:`srl.algorithms.ppo_math`.
"""

from __future__ import annotations

from typing import Any, Mapping

import gymnasium as gym
import numpy as np
import torch

from srl.algorithms.adam import Adam
from srl.algorithms.ppo_math import explained_variance, gae, normalize_advantages, ppo_loss
from srl.api.config import ModelConfig, PPOConfig
from srl.nets.policy import PolicyNet, ValueNet


def build_policy_net(obs_space: gym.spaces.Box, action_space: gym.spaces.Space, model: ModelConfig) -> PolicyNet:
    return PolicyNet(obs_space, action_space, hidden=model.hidden, activation=model.activation,
                     layer_norm=model.layer_norm, normalize_obs=model.normalize_obs,
                     init_log_std=model.init_log_std)


class ActingPolicy:
    """Numpy-in, numpy-out wrapper of a :class:`PolicyNet` for actors and policy workers."""

    def __init__(self, net: PolicyNet) -> None:
        self.net = net.eval()

    def act(self, obs: np.ndarray, deterministic: bool = False) -> tuple[np.ndarray, np.ndarray]:
        actions, logp = self.net.act(torch.from_numpy(np.ascontiguousarray(obs)), deterministic)
        return actions.numpy(), logp.numpy()

    def load_flat(self, flat: np.ndarray) -> None:
        self.net.load_flat_state(flat)

    def flat_size(self) -> int:
        return self.net.flat_size()


class PPO:
    """Clipped-surrogate PPO with GAE, value clipping, entropy bonus and running observation normalization."""

    def __init__(self, obs_space: gym.spaces.Box, action_space: gym.spaces.Space,
                 model: ModelConfig, cfg: PPOConfig, seed: int) -> None:
        torch.manual_seed(seed)
        self.cfg = cfg
        self.policy = build_policy_net(obs_space, action_space, model)
        self.value = ValueNet(obs_space, hidden=model.hidden, activation=model.activation,
                              layer_norm=model.layer_norm, normalize_obs=model.normalize_obs)
        params = list(self.policy.parameters()) + list(self.value.parameters())
        self.optimizer = Adam(params, lr=cfg.lr, eps=cfg.adam_eps)
        self._params = params
        self._gen = torch.Generator().manual_seed(seed + 1)

    # ------------------------------------------------------------------ Algorithm
    def policy_state(self) -> np.ndarray:
        return self.policy.flat_state()

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "value": self.value.state_dict(),
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.value.load_state_dict(state["value"])
        self.optimizer.load_state_dict(state["optimizer"])

    def train(self, batch: Mapping[str, np.ndarray], progress: float) -> dict[str, float]:
        cfg = self.cfg
        lr = cfg.lr * (1.0 - progress) if cfg.lr_schedule == "linear" else cfg.lr
        self.optimizer.lr = max(lr, 1e-8)
        obs_all = torch.from_numpy(batch["obs"])  # [T+1, N, ...]
        T, N = batch["rewards"].shape
        flat_obs = obs_all.reshape((T + 1) * N, *obs_all.shape[2:])
        advantages, returns, values = self._advantages(batch, flat_obs, T, N)

        obs = flat_obs[: T * N]
        actions = torch.from_numpy(batch["actions"]).reshape(T * N, *batch["actions"].shape[2:])
        old_logp = torch.from_numpy(batch["logp"]).reshape(-1)
        adv, ret, old_v = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        size = T * N
        mb = max(1, size // cfg.minibatches)
        sums: dict[str, float] = {}
        count = 0
        for _ in range(cfg.epochs):
            perm = torch.randperm(size, generator=self._gen)
            for start in range(0, size - mb + 1, mb):
                idx = perm[start:start + mb]
                stats = self._minibatch(obs[idx], actions[idx], old_logp[idx], adv[idx], ret[idx], old_v[idx])
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        # Normalizer statistics move only after the update: during it the policy sees its inputs as the
        # behaviour policy did (so the ratio starts at 1); the new statistics ship with the next snapshot.
        self.policy.update_normalizer(obs)
        self.value.update_normalizer(obs)
        out = {k: v / count for k, v in sums.items()}
        out["explained_variance"] = explained_variance(values.reshape(-1), returns.reshape(-1))
        out["lr"] = lr
        return out

    # ------------------------------------------------------------------ internals
    @torch.no_grad()
    def _advantages(self, batch: Mapping[str, np.ndarray], flat_obs: torch.Tensor,
                    T: int, N: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GAE with values recomputed by the current critic; truncated episodes bootstrap from their final obs."""
        v_all = self.value(flat_obs).reshape(T + 1, N)
        values, next_values = v_all[:T], v_all[1:].clone()
        truncated = torch.from_numpy(batch["truncated"])
        terminated = torch.from_numpy(batch["terminated"])
        if bool(truncated.any()):
            if "final_obs" in batch:
                next_values[truncated] = self.value(torch.from_numpy(batch["final_obs"])[truncated])
            else:  # image observations carry no final_obs: V(s_t) stands in for V(s_{t+1}) (time limits are rare there)
                next_values[truncated] = values[truncated]
        rewards = torch.from_numpy(batch["rewards"])
        adv, ret = gae(rewards, values, next_values, terminated.float(), (terminated | truncated).float(),
                       self.cfg.gamma, self.cfg.gae_lambda)
        return adv, ret, values

    def _minibatch(self, obs: torch.Tensor, actions: torch.Tensor, old_logp: torch.Tensor,
                   adv: torch.Tensor, ret: torch.Tensor, old_v: torch.Tensor) -> dict[str, float]:
        cfg = self.cfg
        if cfg.normalize_advantages:
            adv = normalize_advantages(adv)
        logp, entropy = self.policy.evaluate(obs, actions)
        v = self.value(obs)
        loss, stats = ppo_loss(logp, old_logp, adv, v, old_v, ret, entropy, clip=cfg.clip,
                               value_clip=cfg.value_clip, vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef)
        self.optimizer.zero_grad()
        loss.backward()
        if cfg.max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self._params, cfg.max_grad_norm)
            stats["grad_norm"] = grad_norm
        self.optimizer.step()
        return {k: float(v) for k, v in stats.items()}
