"""One ``lm_ppo`` update of ``configs/rlhf_preference.yaml`` (64 completions sampled by the base model, PPO with a
critic, 2 epochs x 2 minibatches), timed four ways in one process, interleaved round by round: with rows in one
group or grouped by prompt length (``srl.text.generate.PASS_COST``), and with the critic on the trainer's thread or
on its own (``text.critic_thread``). One JSON line per way: the median and the fastest update in seconds.

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
from srl.api.spaces import OBS
from srl.runtime.plan import make_plan
from srl.text.algorithm import LMPPO
from srl.text.hf import load_tokenizer
from srl.text.preference import prompts
from srl.wiring import context, make_algorithm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/rlhf_preference.yaml")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)  # as the trainer worker runs
    cfg = load_config(args.config, [])
    one = plan_for(cfg)
    algo = make_algorithm(one.obs_space, one.action_space, cfg, cfg.seed)
    assert isinstance(algo, LMPPO) and algo._critic_pool is not None, "needs PPO with a critic on its own thread"
    batch = sampled_batch(cfg, one, rows=cfg.workers.batch_segments * cfg.workers.envs_per_slot)
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


def plan_for(cfg):  # type: ignore[no-untyped-def]
    return make_plan(cfg).only("bench_lm_update.py")


def sampled_batch(cfg, one, rows: int) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """``rows`` training prompts, left-padded, and the base model's sampled completions of them (with the
    reference's log-probs where the config takes them in the generator); standard-normal scores."""
    tokenizer = load_tokenizer(cfg.text.model)
    policy = LMPPO.acting_policy(context(one.obs_space, one.action_space, cfg, cfg.seed, None, "cpu", None))
    rng = np.random.default_rng(0)
    width = one.obs_space.shape[0]
    ids = []
    for _ in range(rows):
        row = tokenizer(prompts(rng, "train"))["input_ids"][:width]
        ids.append([tokenizer.pad_token_id] * (width - len(row)) + row)
    obs = np.asarray(ids, np.int64)
    torch.manual_seed(0)
    out = policy.act({OBS: obs})
    batch = {k: v[None] for k, v in out.items()}
    batch.update({OBS: obs[None].repeat(2, 0), "rewards": rng.normal(size=(1, rows)).astype(np.float32)})
    return batch


if __name__ == "__main__":
    main()
