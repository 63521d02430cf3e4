"""Per-call cost of replay sampling: srl's prioritized sampler beside cpprb's, and uniform draws beside numpy.

    python scripts/bench_replay_sampling.py [--capacity 1000000] [--batch 256] [--repeats 5] [--number 200]

Prints one JSON line per measurement: the median over ``repeats`` of the mean time of
``number`` calls, in microseconds. Every buffer is full (``capacity`` items).

- ``prioritized_sample_update``: sample a batch with importance weights (alpha 0.6, beta
  0.4), read its items, then set a new priority for each sampled item. cpprb 11's
  ``PrioritizedReplayBuffer`` stores one int64 field (``idx``) and returns it with every
  sample; srl's side gathers the same int64 column by the sampled slots, so both read the
  same bytes.
- ``uniform_sample``: 256 slots drawn uniformly and the same int64 column read, by numpy's
  ``rng.integers`` plus ``take`` and by cpprb's ``ReplayBuffer``.

cpprb is optional: without it (``pip install 'cpprb==11.*'``) its lines are replaced by a note.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from srl.base.prioritized import PrioritizedSampler
from srl.bench.replay import median_seconds

ALPHA, BETA = 0.6, 0.4


def _median_us(fn: Callable[[], Any], repeats: int, number: int) -> float:
    """Median over repeats of the mean time per call, in microseconds (after one warm-up round)."""
    return median_seconds(fn, repeats, number) * 1e6


def _emit(measure: str, impl: str, args: argparse.Namespace, us: float) -> None:
    row = {"measure": measure, "impl": impl, "capacity": args.capacity, "batch": args.batch}
    print(json.dumps({**row, "us_per_call": round(us, 2), "repeats": args.repeats, "number": args.number}))


def _srl(args: argparse.Namespace, column: np.ndarray, priorities: list[np.ndarray]) -> None:
    rng = np.random.default_rng(0)
    sampler = PrioritizedSampler(args.capacity, ALPHA, BETA)
    sampler.insert(np.arange(args.capacity))
    sampler.size = args.capacity
    new_priorities = itertools.cycle(priorities)

    def prioritized() -> None:
        idx, _w = sampler.sample(args.batch, rng)
        column.take(idx)
        sampler.set_priorities(idx, next(new_priorities))

    _emit("prioritized_sample_update", "srl", args, _median_us(prioritized, args.repeats, args.number))
    _emit(
        "uniform_sample",
        "numpy",
        args,
        _median_us(lambda: column.take(rng.integers(0, args.capacity, args.batch)), args.repeats, args.number),
    )


def _cpprb(args: argparse.Namespace, column: np.ndarray, priorities: list[np.ndarray]) -> None:
    try:
        import cpprb
    except ImportError:
        print(json.dumps({"note": "cpprb is not installed: pip install 'cpprb==11.*' to measure it"}))
        return
    fields = {"idx": {"dtype": np.int64}}
    per = cpprb.PrioritizedReplayBuffer(args.capacity, fields, alpha=ALPHA)
    per.add(idx=column)
    new_priorities = itertools.cycle(priorities)

    def prioritized() -> None:
        batch = per.sample(args.batch, beta=BETA)
        per.update_priorities(batch["indexes"], next(new_priorities))

    _emit("prioritized_sample_update", "cpprb", args, _median_us(prioritized, args.repeats, args.number))
    uniform = cpprb.ReplayBuffer(args.capacity, fields)
    uniform.add(idx=column)
    _emit("uniform_sample", "cpprb", args, _median_us(lambda: uniform.sample(args.batch), args.repeats, args.number))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--number", type=int, default=200)
    args = parser.parse_args()
    column = np.arange(args.capacity, dtype=np.int64)
    priorities = list(np.random.default_rng(1).random((64, args.batch)) + 1e-3)
    _srl(args, column, priorities)
    _cpprb(args, column, priorities)


if __name__ == "__main__":
    main()
