"""Peer measurement: Stable-Baselines3 PPO on CartPole-v1, time from process start to solved.

    python scripts/peer_sb3_cartpole.py --seed 1

One seed per process. Prints one JSON line:
{"peer": "sb3", "version": ..., "seed": N, "solved": bool, "solved_wall_seconds": ...,
 "solved_env_steps": ..., "torch_threads": 1}

What is measured, and how it matches ``srl bench solve`` (srl/bench/throughput.py ``bench_solve``):

* Clock: ``solved_wall_seconds`` is wall-clock seconds from this script's first line (its own clock, taken
  before any import, as ``srl train`` takes ``START`` in srl/cli/main.py) to the moment the target is first
  reached, so imports (torch, SB3, gymnasium), env and model construction all count, as they do for each fresh
  ``srl train`` process that ``bench_solve`` starts; the interpreter's start-up before that line counts for
  neither.
* Solved: the mean return of the last 20 finished training episodes (over all 8 envs, in the order they
  finish) is >= 475, with at least 20 episodes finished; the same rule as srl's controller with
  ``run.target_return: 475`` and ``run.return_window: 20`` (configs/cartpole_ppo.yaml). Returns are the raw,
  undiscounted episode returns recorded by SB3's Monitor wrapper (``info["episode"]["r"]``), checked after
  every vectorised step; training stops there.
* ``solved_env_steps``: SB3's ``num_timesteps`` at that moment, i.e. env steps summed over all envs, as srl
  counts them.
* Threads: ``torch.set_num_threads(1)``, the same as srl's CartPole config (``workers.torch_threads: 1``).
  Device is CPU.

Hyperparameters: rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1 entry ("# Tuned"): n_envs 8,
policy MlpPolicy, n_timesteps 1e5, n_steps 32, batch_size 256, gae_lambda 0.8, gamma 0.98, n_epochs 20,
ent_coef 0.0, learning_rate lin_0.001, clip_range lin_0.2. "lin_X" is the zoo's SimpleLinearSchedule:
``progress_remaining * X``, annealed to 0 over n_timesteps (so ``total_timesteps`` stays 1e5 and a run that
has not solved by then reports ``"solved": false``). Everything else is the SB3 default, as in the zoo
(vf_coef 0.5, max_grad_norm 0.5, tanh [64, 64] separate actor and critic nets). Envs are made as the zoo makes
them: ``make_vec_env`` with its default DummyVecEnv (all 8 envs stepped in this one process) and Monitor,
seeded with ``--seed``; the model is seeded with the same seed. No VecNormalize (the zoo uses none for
CartPole-v1). SB3's logger is off (``verbose=0``), like ``srl train --quiet``.

Nothing is downloaded at run time.
"""

from __future__ import annotations

import time

START = time.time()  # the first line, before the imports it counts

import argparse  # noqa: E402
import json  # noqa: E402
from collections import deque  # noqa: E402

import numpy as np  # noqa: E402
import stable_baselines3  # noqa: E402
import torch  # noqa: E402
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

TORCH_THREADS = 1  # srl configs/cartpole_ppo.yaml: workers.torch_threads: 1
TARGET_RETURN = 475.0  # srl configs/cartpole_ppo.yaml: run.target_return
RETURN_WINDOW = 20  # srl configs/cartpole_ppo.yaml: run.return_window

# rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1.
N_ENVS = 8
N_TIMESTEPS = 100_000


def lin(initial_value: float):
    """The zoo's ``lin_X`` schedule (rl_zoo3.utils.SimpleLinearSchedule): X * progress_remaining."""

    def schedule(progress_remaining: float) -> float:
        return progress_remaining * initial_value

    return schedule


class SolvedCallback(BaseCallback):
    """Stop training once the mean return of the last ``window`` finished episodes reaches ``target``."""

    def __init__(self, target: float, window: int) -> None:
        super().__init__()
        self.target = target
        self.returns: deque[float] = deque(maxlen=window)
        self.solved_at: float | None = None
        self.solved_env_steps: int | None = None

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            episode = info.get("episode")
            if episode is not None:
                self.returns.append(float(episode["r"]))
        if len(self.returns) == self.returns.maxlen and float(np.mean(self.returns)) >= self.target:
            self.solved_at = time.time()
            self.solved_env_steps = int(self.num_timesteps)
            return False
        return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, required=True)
    args = p.parse_args()

    torch.set_num_threads(TORCH_THREADS)
    env = make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=args.seed)  # DummyVecEnv + Monitor
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=lin(1e-3),
        clip_range=lin(0.2),
        seed=args.seed,
        device="cpu",
        verbose=0,
    )
    cb = SolvedCallback(TARGET_RETURN, RETURN_WINDOW)
    model.learn(total_timesteps=N_TIMESTEPS, callback=cb)
    env.close()

    solved = cb.solved_at is not None
    print(
        json.dumps(
            {
                "peer": "sb3",
                "version": stable_baselines3.__version__,
                "seed": args.seed,
                "solved": solved,
                "solved_wall_seconds": round(cb.solved_at - START, 3) if solved else None,
                "solved_env_steps": cb.solved_env_steps,
                "torch_threads": torch.get_num_threads(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
