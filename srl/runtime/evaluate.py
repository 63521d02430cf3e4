"""Final evaluation: play the newest policy deterministically for a number of episodes."""

from __future__ import annotations

import numpy as np
import torch

from srl.algorithms.ppo import make_acting_policy
from srl.api.config import ExperimentConfig
from srl.envs.slots import make_slot
from srl.runtime.plan import Plan


def evaluate(plan: Plan, flat_params: np.ndarray, episodes: int, seed: int,
             deterministic: bool = True, max_steps: int = 100_000) -> dict[str, float]:
    """Mean/std return over ``episodes`` episodes, one per environment of one slot (one forward per step).

    An env without a time limit could run forever under a deterministic policy: after ``max_steps``
    the episodes still running are counted with their return so far (``unfinished`` says how many).
    """
    cfg: ExperimentConfig = plan.cfg
    policy = make_acting_policy(plan.obs_space, plan.action_space, cfg)
    policy.load_flat(flat_params)
    slot = make_slot(cfg.env, episodes)
    try:
        obs = slot.reset(seed)
        returns = np.zeros(episodes)
        finished = np.zeros(episodes, bool)
        with torch.inference_mode():
            for _ in range(max_steps):
                if finished.all():
                    break
                actions, _ = policy.act(obs, deterministic=deterministic)
                step = slot.step(actions)
                obs = step.obs
                returns += np.where(finished, 0.0, step.reward)
                finished |= step.episode_end
    finally:
        slot.close()
    return {"return_mean": float(returns.mean()), "return_std": float(returns.std()), "episodes": episodes,
            "unfinished": int((~finished).sum())}
