"""``srl tune``: the layout that trains a config fastest on this machine, found by measuring the few the
capacity model ranks first.

A full grid sweep of layouts (actors x policy workers x envs per slot) costs tens of training runs. Instead:

1. the config's costs are measured briefly, only the pieces that matter on one machine with one trainer
   (env step, actor bookkeeping, inference per call and per sample, the inference stream, the PPO update;
   ``srl.bench.costs``);
2. the capacity model (``srl.capacity.model.predict``) ranks every layout of the grid below on this
   machine's cores, oversubscribed ones included (several processes per core are common here: the model's
   ``cores`` stage charges them);
3. the ``tries`` layouts it ranks first, and the config's own, are trained for real (``srl bench train``,
   each in a fresh process), and the fastest measured wins. Fastest means samples trained per second
   (``summary.json``'s ``trained_samples_per_second``), not env steps sampled: when the trainer binds, more
   actors sample more steps, but what the trainer cannot take in time ages past ``max_policy_lag`` and is
   dropped, so the sampled rate rewards waste (CartPole with 4 actors instead of 1: 1.5x the env steps
   sampled, the same samples trained, a third of the segments dropped). With ``rank="energy"`` the winner is
   the one that spends the least energy per sample trained instead (``summary.json``'s ``cost``, over each
   try's training): since a layout never changes what an update learns from, it needs the same samples to
   reach a target return, and so the least energy to the target.

The grid: ``workers.actors`` 1-4, ``workers.policy_workers`` 0-2, ``workers.envs_per_slot`` the config's
halved and doubled up to 4x as long as each trainer's PPO batch stays what the config says
(``workers.batch_segments`` set to keep it), ``workers.ring_size`` 2 and 4. A layout never changes what an
update learns from; one trainer (data-parallel trainers are ``srl plan``'s question). The winner is printed
as ``--set`` keys and written as a YAML overlay that ``srl train CONFIG --overlay FILE`` applies.
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path
from typing import Any

import yaml

from srl.api.config import ConfigError, ExperimentConfig, load_config
from srl.capacity.model import Cluster, Costs, Layout, predict

ACTORS = (1, 2, 3, 4)
POLICY_WORKERS = (0, 1, 2)
RING_SIZES = (2, 4)
SLOT_SCALES = (0.5, 1, 2, 4)
"""``envs_per_slot`` as multiples of the config's."""
TIE = 0.02
"""Predictions this close are taken as equal when ranking (the model's error is larger)."""
MIN_TRAIN_SECONDS = 4.0
"""The shortest training run a tried layout gets (start-up and warm-up are not counted in its FPS)."""


def grid(cfg: ExperimentConfig) -> list[dict[str, int]]:
    """Every layout the tuner may pick, as ``workers.*`` settings (the config's own among them)."""
    w = cfg.workers
    batch = w.batch_segments * w.envs_per_slot  # columns of segment_length steps per update
    scaled = [w.envs_per_slot * s for s in SLOT_SCALES]
    sizes = sorted({int(B) for B in scaled if B >= 1 and B == int(B) and batch % int(B) == 0})
    out = []
    for actors, pws, B, ring in itertools.product(ACTORS, POLICY_WORKERS, sizes, RING_SIZES):
        if actors < w.trainers:
            continue
        out.append(
            {
                "workers.actors": actors,
                "workers.policy_workers": pws,
                "workers.envs_per_slot": B,
                "workers.batch_segments": batch // B,
                "workers.ring_size": ring,
            }
        )
    own = own_layout(cfg)
    return out if own in out else [own, *out]


def own_layout(cfg: ExperimentConfig) -> dict[str, int]:
    w = cfg.workers
    return {
        "workers.actors": w.actors,
        "workers.policy_workers": w.policy_workers,
        "workers.envs_per_slot": w.envs_per_slot,
        "workers.batch_segments": w.batch_segments,
        "workers.ring_size": w.ring_size,
    }


def predicted(costs: Costs, cores: int, settings: dict[str, int]) -> float:
    """The capacity model's env steps/s for one layout on this machine (one trainer)."""
    layout = Layout(
        actor_nodes=1,
        trainer_nodes=0,
        actors_per_node=settings["workers.actors"],
        policy_workers_per_node=settings["workers.policy_workers"],
        trainers=1,
        ring_size=settings["workers.ring_size"],
        envs_per_slot=settings["workers.envs_per_slot"],
        batch_segments=settings["workers.batch_segments"],
    )
    return predict(costs, Cluster(nodes=1, cores_per_node=cores), layout).steps_per_second


def rank_key(steps_per_second: float, settings: dict[str, int]) -> tuple[float, int, int, int]:
    """Faster first; within ``TIE`` of each other (the model sees no difference: often, when the trainer binds)
    fewer processes first (more of the cores for the bottleneck), then larger slots (fewer requests), then the
    smaller ring."""
    bucket = -math.floor(math.log(max(steps_per_second, 1e-9)) / math.log(1 + TIE))
    processes = settings["workers.actors"] + settings["workers.policy_workers"]
    return (bucket, processes, -settings["workers.envs_per_slot"], settings["workers.ring_size"])


RANKS = ("speed", "energy")


def tune(
    config: str,
    seconds: float,
    overrides: list[str],
    tries: int = 3,
    cores: int | None = None,
    rank: str = "speed",
) -> dict[str, Any]:
    """Measure ``tries`` model-ranked layouts and the config's own, training about ``seconds`` in all (costs
    first; each try's start-up comes on top, so every try trains as long); the fastest measured (``rank``
    ``energy``: the one of least energy per sample trained), with every tried layout's prediction, measured rates
    and energy per sample."""
    from srl.bench.costs import measure_costs
    from srl.bench.throughput import bench_train

    if tries < 1:
        raise ConfigError(f"--tries: must be >= 1, got {tries}")
    if rank not in RANKS:
        raise ConfigError(f"--rank: one of {', '.join(RANKS)}, got {rank!r}")
    cfg = load_config(config, overrides)
    if cfg.runtime == "ray":
        raise ConfigError("srl tune: tunes the local runtime's layout on this machine (runtime: ray is srl plan's)")
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    costs_seconds = max(0.2, min(2.0, seconds / 40))
    costs = measure_costs(cfg, costs_seconds, one_node=True)
    layouts = grid(cfg)
    ranked = sorted(layouts, key=lambda s: rank_key(predicted(costs, cores, s), s))
    own = own_layout(cfg)
    chosen = [s for s in ranked if s != own][:tries]
    chosen.insert(0, own)
    each = max(MIN_TRAIN_SECONDS, (seconds - 10 * costs_seconds) / len(chosen))
    tried = []
    for settings in chosen:
        sets = [f"{k}={v}" for k, v in settings.items()]
        result = bench_train(config, each, [*overrides, "runtime=local", *sets])
        tried.append(
            {
                "set": sets,
                "own": settings == own,
                "predicted_steps_per_second": round(predicted(costs, cores, settings), 1),
                "trained_samples_per_second": result["trained_samples_per_second"],
                "train_fps": result["train_fps"],
                "joules_per_trained_sample": result["joules_per_trained_sample"],
                "core_seconds_per_trained_sample": result["core_seconds_per_trained_sample"],
                "model_rank": ranked.index(settings) + 1,
            }
        )
    if rank == "energy":
        best = min(tried, key=lambda t: t["joules_per_trained_sample"] or math.inf)
    else:
        best = max(tried, key=lambda t: t["trained_samples_per_second"])
    return {
        "tune": config,
        "rank": rank,
        "energy_method": result["energy_method"],
        "cores": cores,
        "grid_size": len(layouts),
        "seconds_per_try": round(each, 1),
        "tried": tried,
        "best": best["set"],
        "best_trained_samples_per_second": best["trained_samples_per_second"],
        "own_trained_samples_per_second": tried[0]["trained_samples_per_second"],
        "best_joules_per_trained_sample": best["joules_per_trained_sample"],
        "own_joules_per_trained_sample": tried[0]["joules_per_trained_sample"],
    }


def write_overlay(path: Path, sets: list[str]) -> None:
    """The winning keys as a YAML overlay: sections and values, as in an experiment file."""
    data: dict[str, dict[str, Any]] = {}
    for item in sets:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        data.setdefault(section, {})[name] = yaml.safe_load(value)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
