"""Sanity check of srl's DQN in a plain loop, without the runtime: CartPole-v1, a numpy replay, n-step at sampling.

    python scripts/dqn_cartpole_loop.py --seed 1 [--config configs/cartpole_dqn.yaml] [--set dqn.lr=0.001 ...]

One seed per process. Prints one JSON line: the seed, whether and at how many env steps the mean return of
the last ``run.return_window`` training episodes reached ``run.target_return``, learner steps, and the replay
settings used. Stops there, or at ``run.total_env_steps``.

What it runs is what the runtime runs, in one process and in turn: one actor's vector env of
``workers.envs_per_slot`` envs (Gymnasium's same-step autoreset, as srl's slots), acting with the greedy
:class:`~srl.algorithms.dqn.QPolicy` and exploring with :meth:`DQN.explorer`; each segment of
``workers.segment_length`` steps is inserted at once, then the learner (:class:`~srl.algorithms.dqn.DQN`)
takes as many batches as ``--samples-per-insert`` allows past ``--min-size`` items (the rate limiter's
contract, without its error buffer), and the actor acts on the new weights for the next segment. The replay
keeps the last ``--max-size`` transitions and samples uniformly; each item's n-step return, discount and
bootstrap observation come from :func:`srl.algorithms.nstep.nstep` when it is sampled, truncations bootstrapping
from the env's final observation.

The settings it reaches the target with, on 6 seeds of 6, are configs/cartpole_dqn.yaml's; the numbers are in
docs/benchmarks.md ("DQN on CartPole-v1 in a plain loop").
"""

from __future__ import annotations

import argparse
import json
from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from srl.algorithms.dqn import BOOT, DQN
from srl.algorithms.nstep import nstep
from srl.api.config import ExperimentConfig, load_config
from srl.api.explore import make_explorer
from srl.wiring import acting_policy, context, make_algorithm


class Ring:
    """The last ``steps`` vector steps of ``envs`` envs: each step's observation, action, reward, flags and (where
    a time limit cut the episode) final observation, plus the observation after the newest step."""

    def __init__(self, steps: int, envs: int, obs_shape: tuple[int, ...]) -> None:
        self.steps, self.envs = steps, envs
        self.obs = np.zeros((steps, envs, *obs_shape), np.float32)
        self.final_obs = np.zeros_like(self.obs)
        self.actions = np.zeros((steps, envs), np.int64)
        self.rewards = np.zeros((steps, envs), np.float32)
        self.terminated = np.zeros((steps, envs), bool)
        self.truncated = np.zeros((steps, envs), bool)
        self.written = 0
        """Steps recorded so far; the observation of step ``written`` (not yet taken) is stored too."""

    def start(self, obs: np.ndarray) -> None:
        self.obs[0] = obs

    def record(
        self,
        actions: np.ndarray,
        rewards: np.ndarray,
        term: np.ndarray,
        trunc: np.ndarray,
        info: dict,
        next_obs: np.ndarray,
    ) -> None:
        """Step ``written``'s outcome, then the observation the next step acts on."""
        t = self.written % self.steps
        self.actions[t], self.rewards[t], self.terminated[t], self.truncated[t] = actions, rewards, term, trunc
        if "_final_obs" in info and info["_final_obs"].any():
            ended = info["_final_obs"]
            self.final_obs[t, ended] = np.stack(info["final_obs"][ended])
        self.written += 1
        self.obs[self.written % self.steps] = next_obs

    def sample(self, batch: int, n: int, gamma: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """``batch`` uniform transitions with their n-step targets, as the trainer is handed them (``L = 1``)."""
        lo = max(0, self.written - self.steps + 1)  # the oldest step whose observation is not overwritten
        t = rng.integers(lo, self.written - n + 1, batch)  # steps with n steps recorded after them
        e = rng.integers(0, self.envs, batch)
        window = (t[:, None] + np.arange(n)) % self.steps
        returns, discounts, boot_index = nstep(
            self.rewards[window, e[:, None]],
            self.terminated[window, e[:, None]],
            self.truncated[window, e[:, None]],
            gamma,
            n,
        )
        k = (t + boot_index) % self.steps
        boot = np.where(self.truncated[k, e][:, None], self.final_obs[k, e], self.obs[(k + 1) % self.steps, e])
        return {
            "obs": self.obs[t % self.steps, e][None],
            BOOT + "obs": boot[None],
            "actions": self.actions[t % self.steps, e][None],
            "returns": returns[None].astype(np.float32),
            "discounts": discounts[None].astype(np.float32),
            "weights": np.ones(batch, np.float32),
            "keys": (t * self.envs + e).astype(np.int64),
        }


@dataclass
class Outcome:
    env_steps: int = 0
    learner_steps: int = 0
    solved_env_steps: int | None = None
    last_mean: float = 0.0
    best_mean: float = 0.0


def run(cfg: ExperimentConfig, samples_per_insert: float, min_size: int, max_size: int, verbose: bool) -> Outcome:
    """Act and learn in turn until solved or ``run.total_env_steps``."""
    envs, length = cfg.workers.envs_per_slot, cfg.workers.segment_length
    venv = SyncVectorEnv([lambda: gym.make(cfg.env.id)] * envs, autoreset_mode=AutoresetMode.SAME_STEP)
    obs_space, action_space = venv.single_observation_space, venv.single_action_space
    policy = acting_policy(obs_space, action_space, cfg)
    algorithm = make_algorithm(obs_space, action_space, cfg, seed=cfg.seed)
    explorer = make_explorer(DQN, context(obs_space, action_space, cfg), 0, envs, envs, 1)
    assert explorer is not None
    rng = np.random.default_rng(cfg.seed)
    ring = Ring(max(max_size // envs, length + cfg.dqn.nstep), envs, obs_space.shape)
    obs, _ = venv.reset(seed=cfg.seed)
    ring.start(obs)
    episode, returns, out = np.zeros(envs), deque(maxlen=cfg.run.return_window), Outcome()
    sampled, stats = 0, {}
    while out.env_steps < cfg.run.total_env_steps and out.solved_env_steps is None:
        policy.load_flat(algorithm.policy_state())
        for _ in range(length):
            actions = policy.act({"obs": obs})["actions"]
            explorer.explore(actions, {"obs": obs}, slice(0, envs), out.env_steps, rng)
            obs, reward, term, trunc, info = venv.step(actions)
            ring.record(actions, reward, term, trunc, info, obs)
            out.env_steps += envs
            episode += reward
            for i in np.flatnonzero(term | trunc):
                returns.append(episode[i])
                episode[i] = 0.0
            if len(returns) == returns.maxlen and np.mean(returns) >= cfg.run.target_return:
                out.solved_env_steps = out.env_steps
                break
        inserted = ring.written * envs
        while samples_per_insert * (inserted - min_size) - sampled >= cfg.dqn.batch_size:
            batch = ring.sample(cfg.dqn.batch_size, cfg.dqn.nstep, cfg.dqn.gamma, rng)
            stats = algorithm.train(batch, out.env_steps / cfg.run.total_env_steps).stats
            sampled += cfg.dqn.batch_size
            out.learner_steps += 1
        out.last_mean = float(np.mean(returns)) if returns else 0.0
        if len(returns) == returns.maxlen:
            out.best_mean = max(out.best_mean, out.last_mean)
        if verbose and out.env_steps % 4096 < envs * length:
            progress = {"env_steps": out.env_steps, "mean_return": round(out.last_mean, 1), **explorer.stats()}
            print(json.dumps({**progress, **{k: round(v, 3) for k, v in stats.items()}}))
    venv.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/cartpole_dqn.yaml")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--samples-per-insert", type=float, default=32.0)
    parser.add_argument("--min-size", type=int, default=1000)
    parser.add_argument("--max-size", type=int, default=100_000)
    parser.add_argument("--verbose", action="store_true", help="a progress line every 4096 env steps")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.config, [*args.set, f"seed={args.seed}"])
    out = run(cfg, args.samples_per_insert, args.min_size, args.max_size, args.verbose)
    print(
        json.dumps(
            {
                "seed": args.seed,
                "solved": out.solved_env_steps is not None,
                "solved_env_steps": out.solved_env_steps,
                "env_steps": out.env_steps,
                "learner_steps": out.learner_steps,
                "last_mean_return": round(out.last_mean, 1),
                "best_mean_return": round(out.best_mean, 1),
                "samples_per_insert": args.samples_per_insert,
                "min_size": args.min_size,
                "max_size": args.max_size,
                "overrides": args.set,
            }
        )
    )


if __name__ == "__main__":
    main()
