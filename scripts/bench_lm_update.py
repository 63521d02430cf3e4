"""One ``lm_ppo`` update of ``configs/rlhf_preference.yaml`` (64 of the task's prompts, completions sampled by
the base model and scored by the task's reward model; PPO with a critic, 2 epochs x 2 minibatches), timed four
ways in one process, interleaved round by round: with rows in one group or grouped by prompt length
(``srl.text.generate.PASS_COST``), and with the critic on the trainer's thread or on its own
(``text.critic_thread``). One JSON line per way: the median and the fastest update in seconds.

    python scripts/bench_lm_update.py --rounds 10 --repeats 3

Needs the models of ``configs/rlhf_preference.yaml`` in ``./models`` (``srl train`` makes them on first use).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

import srl.text.generate as gen
from srl.api.config import load_config
from srl.api.config.experiment import ExperimentConfig
from srl.api.spaces import OBS
from srl.text.algorithm import LMPPO
from srl.text.task import TextTask
from srl.wiring import context


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/rlhf_preference.yaml")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)  # as the trainer worker runs
    cfg = load_config(args.config, [])
    algo, batch = trainer_and_batch(cfg, rows=cfg.workers.batch_segments * cfg.workers.envs_per_slot)
    assert algo._critic_pool is not None, "needs PPO with a critic on its own thread"
    pool, grouped = algo._critic_pool, gen.PASS_COST
    ways = {
        "one group, critic in turn": (1e12, None),
        "grouped by prompt length, critic in turn": (grouped, None),
        "one group, critic on its thread": (1e12, pool),
        "grouped by prompt length, critic on its thread": (grouped, pool),
    }
    for _ in range(3):  # warm-up
        algo.train(batch, 0.0)
    times: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(args.rounds):
        for way, (cost, thread) in ways.items():
            gen.PASS_COST, algo._critic_pool = cost, thread
            for _ in range(args.repeats):
                t = time.perf_counter()
                algo.train(batch, 0.0)
                times[way].append(time.perf_counter() - t)
    for way, ts in times.items():
        print(json.dumps({"way": way, "median_s": round(statistics.median(ts), 4), "min_s": round(min(ts), 4)}))


def trainer_and_batch(cfg: ExperimentConfig, rows: int) -> tuple[LMPPO, dict[str, np.ndarray]]:
    """The config's trainer, and ``rows`` of the task's training prompts with the base model's sampled
    completions (and the reference's log-probs where the config takes them in the generator), scored by the
    task's reward."""
    task = TextTask(**cfg.env.kwargs, num_envs=rows)
    ctx = context(task.single_observation_space, task.single_action_space, cfg, cfg.seed, None, "cpu", None)
    torch.manual_seed(0)
    obs = task.reset(0)
    out = LMPPO.acting_policy(ctx).act(obs)
    batch = {k: v[None] for k, v in out.items()}
    batch.update({OBS: obs[OBS][None], "rewards": task.step(out["actions"]).reward[None].astype(np.float32)})
    return LMPPO(ctx), batch


if __name__ == "__main__":
    main()
