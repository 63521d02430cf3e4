"""Peer measurement: Stable-Baselines3 DQN on Pong with rl-baselines3-zoo's ``atari`` settings, for a wall time.

    python scripts/peers/sb3_pong_dqn.py --minutes 60 --curve sb3_pong_dqn.jsonl

Prints the one JSON line of :mod:`sb3_record` at the end; ``--curve FILE`` gets one line per finished game;
``--threads N`` sets torch's threads.

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

import functools  # noqa: E402

import ale_py  # noqa: E402
import gymnasium as gym  # noqa: E402
from sb3_record import arguments, measure  # noqa: E402  (beside this script)
from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.env_util import make_atari_env  # noqa: E402
from stable_baselines3.common.vec_env import VecFrameStack  # noqa: E402

gym.register_envs(ale_py)

ENV_ID = "PongNoFrameskip-v4"
RETURN_WINDOW = 20  # srl's run.return_window
N_TIMESTEPS = 10_000_000  # the zoo's: the exploration schedule's length


def pong(seed: int) -> VecFrameStack:
    """One env of Pong under the zoo's Atari wrappers, 4 frames stacked."""
    return VecFrameStack(make_atari_env(ENV_ID, n_envs=1, seed=seed), n_stack=4)


def main() -> None:
    args = arguments(__doc__, minutes=60.0)
    model = DQN(
        "CnnPolicy",
        pong(args.seed),
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
    measure(model, START, args, ENV_ID, RETURN_WINDOW, functools.partial(pong, args.seed + 1000), 3, N_TIMESTEPS)


if __name__ == "__main__":
    main()
