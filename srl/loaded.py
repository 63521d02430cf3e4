"""A trained policy for your own code: ``srl.load_policy(run_dir).act(obs)``.

It reads the checkpoint safely (``torch.load(weights_only=True)``), rebuilds
the acting policy of the run's algorithm from the config saved inside, checks
that the env's spaces are the ones it was trained on, and loads the policy
snapshot (so it works for any algorithm plugin, not only PPO). ``act`` takes
observations as the env gives them: one observation, or a batch of them
(nested dicts and tuples for Dict and Tuple spaces), and returns actions the
env accepts (Box actions clipped to the bounds, ``start`` offsets added).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from srl.api.config import ExperimentConfig
from srl.api.spaces import ObsPart, flatten_obs, obs_parts
from srl.api.worker import Policy


class LoadedPolicy:
    """The acting policy of a checkpoint, for single observations or batches."""

    def __init__(
        self, policy: Policy, cfg: ExperimentConfig, obs_space: spaces.Space, action_space: spaces.Space, info: dict
    ) -> None:
        self.policy, self.config = policy, cfg
        self.observation_space, self.action_space = obs_space, action_space
        self.version: int = int(info["version"])
        self.checkpoint: str = info["checkpoint"]
        self._parts: tuple[ObsPart, ...] = obs_parts(obs_space)

    def act(self, obs: Any, deterministic: bool = True) -> Any:
        """Actions for ``obs`` (one observation, or a batch with a leading dimension); greedy unless told not."""
        parts = flatten_obs(self._parts, obs)
        first = self._parts[0]
        single = np.ndim(parts[first.name]) == len(first.shape)
        batch = {p.name: np.asarray(parts[p.name], dtype=p.dtype).reshape((-1, *p.shape)) for p in self._parts}
        with torch.inference_mode():
            actions = np.asarray(self.policy.act(batch, deterministic=deterministic)["actions"])
        actions = self._to_env(actions)
        return actions[0] if single else actions

    def _to_env(self, actions: np.ndarray) -> np.ndarray:
        space = self.action_space
        if isinstance(space, spaces.Box):
            return np.clip(actions.reshape((-1, *space.shape)), space.low, space.high).astype(space.dtype)
        if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
            return actions + np.asarray(space.start)
        return actions


def load(target: Path) -> LoadedPolicy:
    """See :func:`srl.load_policy`."""
    from gymnasium.wrappers import ClipAction

    from srl.envs.factory import ShiftActions, make_env
    from srl.evaluate import load_policy

    cfg, policy, info = load_policy(target)
    env = make_env(cfg.env)
    try:
        # Observations as the configured env (with its preprocessing) gives them; actions as the env takes them
        # before our own action adapter (clipping, start offsets), which act() applies instead.
        inner = env.env if isinstance(env, (ClipAction, ShiftActions)) else env
        obs_space, action_space = env.observation_space, inner.action_space
    finally:
        env.close()
    return LoadedPolicy(policy, cfg, obs_space, action_space, info)
