"""Stable-Baselines3-contrib ``RecurrentPPO`` on CartPole with its velocities hidden: the peer of
``configs/cartpole_masked_lstm.yaml``.

The task is srl's: CartPole-v1 observing only the cart's position and the pole's angle (entries 0 and 2), as
the RL Zoo's ``CartPoleNoVel-v1`` does. The settings are the Zoo's ``ppo_lstm`` entry for ``CartPoleNoVel-v1``
(8 envs, ``n_steps`` 32, batch 256, 20 epochs, lr and clip range linear from 1e-3 and 0.2, gamma 0.98, GAE
lambda 0.8, no entropy bonus, observation normalization; ``MlpLstmPolicy`` with a 64-unit LSTM, a critic LSTM
of its own, ReLU heads of 64, no orthogonal init), for at most ``--steps`` env steps.

Solved, as for srl: the mean return of the last 20 training episodes reaches 475. Prints one JSON line:
seconds from the script's first line (its own clock, before any import, as ``srl`` takes it) to solved, env
steps then, and the total.

    /work/sb3-venv/bin/python scripts/peers/sb3_recurrent.py --seed 1
"""

from __future__ import annotations

import time

START = time.time()  # the first line, before the imports it counts

import argparse  # noqa: E402
import json  # noqa: E402
from collections import deque  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from sb3_contrib import RecurrentPPO  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.vec_env import VecNormalize  # noqa: E402

KEEP = [0, 2]  # the cart's position and the pole's angle
TARGET, WINDOW = 475.0, 20


class Positions(gym.ObservationWrapper):
    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        box = env.observation_space
        self.observation_space = gym.spaces.Box(box.low[KEEP], box.high[KEEP], dtype=box.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[KEEP]


class StopWhenSolved(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.returns: deque[float] = deque(maxlen=WINDOW)
        self.solved_at: float | None = None
        self.solved_steps: int | None = None

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(float(info["episode"]["r"]))
        if len(self.returns) == WINDOW and np.mean(self.returns) >= TARGET:
            self.solved_at, self.solved_steps = time.time(), int(self.num_timesteps)
            return False
        return True


def linear(start: float):
    return lambda remaining: remaining * start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=300_000)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    env = make_vec_env(lambda: Positions(gym.make("CartPole-v1")), n_envs=8, seed=args.seed)
    env = VecNormalize(env, norm_obs=True, norm_reward=False)
    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        gamma=0.98,
        gae_lambda=0.8,
        ent_coef=0.0,
        policy_kwargs=dict(
            ortho_init=False,
            activation_fn=torch.nn.ReLU,
            lstm_hidden_size=64,
            enable_critic_lstm=True,
            net_arch=dict(pi=[64], vf=[64]),
        ),
        seed=args.seed,
        device="cpu",
        verbose=0,
    )
    callback = StopWhenSolved()
    model.learn(total_timesteps=args.steps, callback=callback)
    end = time.time()
    print(
        json.dumps(
            {
                "system": "sb3-contrib RecurrentPPO",
                "seed": args.seed,
                "solved": callback.solved_at is not None,
                "solved_wall_seconds": None if callback.solved_at is None else round(callback.solved_at - START, 2),
                "solved_env_steps": callback.solved_steps,
                "env_steps": int(model.num_timesteps),
                "wall_seconds": round(end - START, 2),
                "last_returns_mean": float(np.mean(callback.returns)) if callback.returns else None,
            }
        )
    )


if __name__ == "__main__":
    main()
