"""``srl bench search``: what the search trees cost per simulation, batched and one tree at a time, beside what
evaluating a leaf costs (a forward pass of a small policy-value network over the same batch).

The trees see a synthetic game of ``actions`` moves a node whose evaluations are random (no network), so the
figure is the tree's own cost: selection, expansion and backup. The leaf evaluation is timed separately on the
leaves' batch, on one torch thread, which is what a search adds per simulation besides the tree.

With ``--config`` (an algorithm that acts by searching a model, MuZero), the config's own acting policy searches
B observations at once (as a policy worker batches its actors' rows) and the same B one at a time: tree and
network together, in simulations per second.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from srl.api.config import ConfigError, ExperimentConfig
from srl.api.config.search import SearchConfig
from srl.search.tree import Trees


def _search(trees: Sequence[Trees], rng: np.random.Generator, actions: int, depth: int) -> None:
    """One search of every tree of ``trees`` (each a batch) over a synthetic game that ends ``depth`` moves in."""
    for t in trees:
        b = t.batch
        t.reset(rng.normal(size=(b, actions)), rng.normal(size=b), np.ones((b, actions), bool), rng)
        level = np.zeros((b, t.visits.shape[1]), np.int64)
        for _ in range(t.simulations):
            parents, _ = t.select()
            rows = np.arange(b)
            child = level[rows, parents] + 1
            level[rows, t.new_node] = child
            t.expand(
                rng.normal(size=(b, actions)),
                np.tanh(rng.normal(size=b)),
                np.ones((b, actions), bool),
                np.zeros(b),
                -np.ones(b),
                child >= depth,
            )


def bench_search(
    batches: Sequence[int], simulations: int = 32, actions: int = 7, rule: str = "gumbel", seconds: float = 2.0
) -> list[dict[str, Any]]:
    """For each batch size B: tree microseconds per tree-simulation when B trees search together and when the same
    B trees search one at a time, and a leaf evaluation's microseconds per leaf over B leaves (a 3-layer MLP of
    width 128 on a Connect Four-sized input)."""
    settings = SearchConfig(simulations=simulations, rule=rule, considered=min(16, actions))
    torch.set_num_threads(1)
    net = torch.nn.Sequential(
        torch.nn.Linear(126, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, actions + 1),
    )  # fmt: skip
    out = []
    for b in batches:
        rng = np.random.default_rng(0)
        per_tree: dict[str, float] = {}
        for name, trees in (
            ("batched", [Trees(b, actions, settings)]),
            ("one_at_a_time", [Trees(1, actions, settings) for _ in range(b)]),
        ):
            done, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds or not done:
                _search(trees, rng, actions, depth=6)
                done += b * simulations
            per_tree[name] = (time.perf_counter() - t0) / done * 1e6
        x = torch.randn(b, 126)
        with torch.inference_mode():
            calls, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds / 2 or not calls:
                net(x)
                calls += 1
        leaf = (time.perf_counter() - t0) / (calls * b) * 1e6
        out.append(
            {
                "trees": b,
                "simulations": simulations,
                "actions": actions,
                "rule": rule,
                "tree_us_per_simulation_batched": round(per_tree["batched"], 2),
                "tree_us_per_simulation_one_at_a_time": round(per_tree["one_at_a_time"], 2),
                "speedup": round(per_tree["one_at_a_time"] / per_tree["batched"], 1),
                "leaf_eval_us_per_leaf": round(leaf, 2),
                "tree_simulations_per_s_batched": round(1e6 / per_tree["batched"]),
            }
        )
    return out


def bench_policy_search(cfg: ExperimentConfig, batches: Sequence[int], seconds: float = 2.0) -> list[dict[str, Any]]:
    """For each batch size B: simulations per second of the config's acting policy searching B random observations
    in one call, and the same B observations one call each (one torch thread)."""
    from srl.bench.throughput import random_obs
    from srl.runtime.plan import make_plan

    torch.set_num_threads(1)
    one = make_plan(cfg).only("srl bench search --config")
    policy = one.acting_policy()
    settings = getattr(getattr(policy, "search", None), "settings", None)
    if not isinstance(settings, SearchConfig):
        raise ConfigError(f"--config: algorithm {cfg.algorithm} does not act by searching")
    rng = np.random.default_rng(cfg.seed)
    out = []
    for b in batches:
        obs = random_obs(one, rng, (b,))
        rows = [{k: x[i : i + 1] for k, x in obs.items()} for i in range(b)]
        rates = {}
        for name, calls in (("batched", [obs]), ("one_at_a_time", rows)):
            done, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds or not done:
                for call in calls:
                    policy.act(call)
                done += b * settings.simulations
            rates[name] = done / (time.perf_counter() - t0)
        out.append(
            {
                "config": cfg.name,
                "trees": b,
                "simulations": settings.simulations,
                "simulations_per_s_batched": round(rates["batched"]),
                "simulations_per_s_one_at_a_time": round(rates["one_at_a_time"]),
                "speedup": round(rates["batched"] / rates["one_at_a_time"], 1),
            }
        )
    return out
