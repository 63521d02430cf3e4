"""Peer measurement: Stable-Baselines3 SAC on HalfCheetah-v5 with rl-baselines3-zoo's HalfCheetah settings, for a
wall time.

    python scripts/peers/sb3_halfcheetah_sac.py --minutes 20 --curve sb3_halfcheetah_sac.jsonl

Prints the one JSON line of :mod:`sb3_record` at the end; ``--curve FILE`` gets one line per finished episode;
``--threads N`` sets torch's threads.

What is measured, and how it matches ``srl train configs/halfcheetah_sac.yaml --set run.max_wall_seconds=1200``:

* Clock: wall seconds from this script's first line (before its imports), as ``srl train`` counts
  ``run.max_wall_seconds`` from its start; training stops at the first env step after ``--minutes``.
* Returns: whole episodes (1,000 steps, the time limit), as SB3's Monitor records them; ``train_return_mean`` is
  the mean of the last 10 finished episodes. Then 10 episodes of the deterministic policy (the squashed mean,
  ``deterministic=True``) on a fresh env, as srl's final eval plays ``run.eval_episodes: 10`` with its greedy
  policy.
* Settings: rl-baselines3-zoo 2.9 ``hyperparams/sac.yml``, ``HalfCheetah-v4`` (the MuJoCo defaults: ``MlpPolicy``,
  n_timesteps 1e6, learning_starts 10,000), on ``HalfCheetah-v5`` as srl runs it (the same task; v5 fixes
  model details); the rest SB3 2.9's SAC defaults: 1 env, buffer_size 1e6, learning_rate 3e-4 (actor, critics and
  temperature), batch_size 256, tau 0.005, gamma 0.99, train_freq 1, gradient_steps 1, ent_coef ``auto`` (from
  1.0) toward target_entropy ``auto`` (-|A| = -6), twin critics and actor of [256, 256] ReLU, no gSDE. Its
  samples per insert is batch_size * gradient_steps / train_freq = 256, the setting of
  configs/halfcheetah_sac.yaml; the number printed is measured (updates * 256 / env steps after learning starts).
  The 10,000 steps before learning are uniform random actions (SB3's warm-up), as srl's are
  (``sac.random_steps``).
* Device: the CPU (SB3's ``auto`` would take a GPU when there is one; srl's config trains on the CPU).
* Threads: ``--threads N`` sets torch's threads; by default torch's default (every core); the zoo sets none.
"""

from __future__ import annotations

import time

START = time.time()  # the first line, before the imports it counts

import functools  # noqa: E402

from sb3_record import arguments, measure  # noqa: E402  (beside this script)
from stable_baselines3 import SAC  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

ENV_ID = "HalfCheetah-v5"
RETURN_WINDOW = 10  # the episodes train_return_mean averages
EVAL_EPISODES = 10  # srl's run.eval_episodes in configs/halfcheetah_sac.yaml
N_TIMESTEPS = 1_000_000  # the zoo's


def main() -> None:
    args = arguments(__doc__, minutes=20.0)
    model = SAC(
        "MlpPolicy",
        make_vec_env(ENV_ID, n_envs=1, seed=args.seed),
        learning_rate=3e-4,
        buffer_size=1_000_000,
        learning_starts=10_000,
        batch_size=256,
        tau=0.005,
        gamma=0.99,
        train_freq=1,
        gradient_steps=1,
        ent_coef="auto",
        target_entropy="auto",
        seed=args.seed,
        device="cpu",
        verbose=0,
    )
    fresh = functools.partial(make_vec_env, ENV_ID, n_envs=1, seed=args.seed + 1000)
    measure(model, START, args, ENV_ID, RETURN_WINDOW, fresh, EVAL_EPISODES, N_TIMESTEPS)


if __name__ == "__main__":
    main()
