"""Peer measurement: Stable-Baselines3 PPO on Pong with rl-baselines3-zoo's ``atari`` settings, env steps/s.

    python scripts/peers/sb3_pong.py --seconds 90 [--threads N]

Prints one JSON line: {"peer": "sb3", "version": ..., "env_steps": ..., "seconds": ..., "env_steps_per_second":
..., "updates": ..., "torch_threads": ...}.

What is measured, and how it matches ``srl bench train`` (``train_fps`` and ``trained_samples_per_second``):

* Clock: from SB3's first env step (model and envs built, start-up not counted, as srl's ``train_fps`` counts
  from its first env step) until the first rollout that ends after ``--seconds``; every step SB3 samples is
  trained on (PPO's rollout buffer), so its sampled and trained rates are one number.
* Settings: rl-baselines3-zoo 2.9 ``hyperparams/ppo.yml``, ``atari``: ``AtariWrapper`` (noop reset, frame skip 4
  with max-pool, episodic life, fire reset, 84x84 grey, rewards clipped), 4 stacked frames, ``CnnPolicy`` (the
  Nature CNN, one encoder for actor and critic), 8 envs, n_steps 128, n_epochs 4, batch_size 256,
  learning_rate lin_2.5e-4, clip_range lin_0.1, vf_coef 0.5, ent_coef 0.01; the rest SB3's defaults (gamma
  0.99, gae_lambda 0.95, max_grad_norm 0.5). The zoo's env is ``PongNoFrameskip-v4`` (no sticky actions) in a
  ``DummyVecEnv`` (all 8 envs stepped in this process).
* Threads: torch's default (every core) unless ``--threads`` is given; the zoo sets none.

Nothing is downloaded at run time (the ROM ships in ale-py).
"""

from __future__ import annotations

import argparse
import json
import time

import ale_py
import gymnasium as gym
import stable_baselines3
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack

gym.register_envs(ale_py)


def lin(initial_value: float):
    """The zoo's ``lin_X`` schedule: X * progress_remaining."""
    return lambda progress_remaining: progress_remaining * initial_value


class Clock(BaseCallback):
    """Start the clock at the first env step; stop at the end of the first rollout after ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.t0: float | None = None
        self.steps0 = 0
        self.t1: float | None = None
        self.steps1 = 0
        self.rollouts = 0

    def _on_step(self) -> bool:
        if self.t0 is None:
            self.t0, self.steps0 = time.perf_counter(), int(self.num_timesteps)
        return True

    def _on_rollout_start(self) -> None:  # the previous rollout has been trained on
        if self.t0 is not None:
            self.rollouts += 1
            if time.perf_counter() - self.t0 >= self.seconds and self.t1 is None:
                self.t1, self.steps1 = time.perf_counter(), int(self.num_timesteps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, every core)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    env = VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=8, seed=args.seed), n_stack=4)
    model = PPO(
        "CnnPolicy",
        env,
        n_steps=128,
        n_epochs=4,
        batch_size=256,
        learning_rate=lin(2.5e-4),
        clip_range=lin(0.1),
        vf_coef=0.5,
        ent_coef=0.01,
        seed=args.seed,
        device="cpu",
        verbose=0,
    )
    clock = Clock(args.seconds)

    class Stop(BaseCallback):
        def _on_step(self) -> bool:
            return clock.t1 is None

    # the budget in steps is only an upper bound: the clock's stop ends the run
    model.learn(total_timesteps=10_000_000, callback=[clock, Stop()])
    env.close()
    assert clock.t0 is not None and clock.t1 is not None
    seconds = clock.t1 - clock.t0
    steps = clock.steps1 - clock.steps0
    print(
        json.dumps(
            {
                "peer": "sb3",
                "version": stable_baselines3.__version__,
                "env": "PongNoFrameskip-v4",
                "env_steps": steps,
                "seconds": round(seconds, 2),
                "env_steps_per_second": round(steps / seconds, 1),
                "updates": clock.rollouts,
                "torch_threads": torch.get_num_threads(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
