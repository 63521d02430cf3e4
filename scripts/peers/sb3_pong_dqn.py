"""Peer measurement: Stable-Baselines3 DQN on Pong with rl-baselines3-zoo's ``atari`` settings, for a wall time.

    python scripts/peers/sb3_pong_dqn.py --minutes 60 --curve sb3_pong_dqn.jsonl

Prints one JSON line at the end: {"peer": "sb3", "version": ..., "env_steps": ..., "updates": ...,
"wall_seconds": ..., "env_steps_per_second": ..., "updates_per_second": ..., "samples_per_insert": ...,
"train_return_mean": ..., "final_eval_returns": [...], "torch_threads": ...}; ``--curve`` gets one line per
finished game: {"wall_seconds", "env_steps", "return"}.

What is measured, and how it matches ``srl train configs/pong_apex.yaml --set run.max_wall_seconds=3600``:

* Clock: wall seconds from this script's first line (before its imports), as ``srl train`` counts
  ``run.max_wall_seconds`` from its start; training stops at the first env step after ``--minutes``.
* Returns: whole games (21 points), as SB3's Monitor records them under the zoo's wrappers (Monitor sits
  inside ``AtariWrapper``, so a life lost does not end a recorded episode); ``train_return_mean`` is the mean
  of the last 20 finished games, srl's ``run.return_window``. Then 3 greedy games (``deterministic=True``) on a
  fresh env, as srl's final eval plays ``run.eval_episodes: 3`` with the greedy policy.
* Settings: rl-baselines3-zoo 2.9 ``hyperparams/dqn.yml``, ``atari``: ``AtariWrapper`` (noop reset, frame skip 4
  with max-pool, episodic life, fire reset, 84x84 grey, rewards clipped), 4 stacked frames, ``CnnPolicy`` (the
  Nature CNN), 1 env of ``PongNoFrameskip-v4`` (no sticky actions, as in configs/pong_apex.yaml), buffer_size
  100,000, learning_rate 1e-4, batch_size 32, learning_starts 100,000, target_update_interval 1,000, train_freq
  4, gradient_steps 1, exploration_fraction 0.1, exploration_final_eps 0.01, n_timesteps 1e7 (the schedule's
  length); the rest SB3's defaults (gamma 0.99, Huber loss, max_grad_norm 10, Adam). Its samples per insert is
  batch_size / train_freq = 8, the setting of configs/pong_apex.yaml.
* Threads: torch's default (every core); the zoo sets none.

Nothing is downloaded at run time (the ROM ships in ale-py).
"""

from __future__ import annotations

import time

START = time.time()  # the first line, before the imports it counts

import argparse  # noqa: E402
import json  # noqa: E402
from collections import deque  # noqa: E402
from pathlib import Path  # noqa: E402

import ale_py  # noqa: E402
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import stable_baselines3  # noqa: E402
import torch  # noqa: E402
from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_atari_env  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402
from stable_baselines3.common.vec_env import VecFrameStack  # noqa: E402

gym.register_envs(ale_py)

ENV_ID = "PongNoFrameskip-v4"
RETURN_WINDOW = 20  # srl's run.return_window
N_TIMESTEPS = 10_000_000  # the zoo's: the exploration schedule's length


class Recorder(BaseCallback):
    """Every finished game's return on the curve; stops training at the first step after the deadline."""

    def __init__(self, deadline: float, curve: Path | None) -> None:
        super().__init__()
        self.deadline = deadline
        self.curve = curve.open("w") if curve is not None else None
        self.returns: deque[float] = deque(maxlen=RETURN_WINDOW)

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            episode = info.get("episode")
            if episode is not None:
                self.returns.append(float(episode["r"]))
                if self.curve is not None:
                    line = {"wall_seconds": round(time.time() - START, 1), "env_steps": int(self.num_timesteps)}
                    self.curve.write(json.dumps({**line, "return": float(episode["r"])}) + "\n")
                    self.curve.flush()
        return time.time() < self.deadline


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--curve", type=Path, default=None)
    args = p.parse_args()

    env = VecFrameStack(make_atari_env(ENV_ID, n_envs=1, seed=args.seed), n_stack=4)
    model = DQN(
        "CnnPolicy",
        env,
        buffer_size=100_000,
        learning_rate=1e-4,
        batch_size=32,
        learning_starts=100_000,
        target_update_interval=1000,
        train_freq=4,
        gradient_steps=1,
        exploration_fraction=0.1,
        exploration_final_eps=0.01,
        optimize_memory_usage=False,
        seed=args.seed,
        device="cpu",
        verbose=0,
    )
    recorder = Recorder(START + 60.0 * args.minutes, args.curve)
    model.learn(total_timesteps=N_TIMESTEPS, callback=recorder)
    wall = time.time() - START
    env.close()
    eval_env = VecFrameStack(make_atari_env(ENV_ID, n_envs=1, seed=args.seed + 1000), n_stack=4)
    returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=3, deterministic=True, return_episode_rewards=True)
    eval_env.close()
    steps, updates = int(model.num_timesteps), int(model._n_updates)
    print(
        json.dumps(
            {
                "peer": "sb3",
                "version": stable_baselines3.__version__,
                "env": ENV_ID,
                "env_steps": steps,
                "updates": updates,
                "wall_seconds": round(wall, 1),
                "env_steps_per_second": round(steps / wall, 1),
                "updates_per_second": round(updates / wall, 2),
                "samples_per_insert": round(updates * 32 / max(1, steps - 100_000), 2),
                "train_return_mean": float(np.mean(recorder.returns)) if recorder.returns else None,
                "final_eval_returns": [float(r) for r in returns],
                "torch_threads": torch.get_num_threads(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
