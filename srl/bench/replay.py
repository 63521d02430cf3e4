"""``srl bench replay``: the replay store's rates for a config's chunk shapes, beside two plain baselines.

Measured on a full store of ``replay.max_size`` items (every insert overwrites the oldest chunks), each the
median over ``repeats`` of the mean over ``number`` calls:

- ``insert``: one actor segment (``[T, B, ...]``, every field of the config's pool layout) per call, in items/s,
  for a uniform and a prioritized store (the latter also sets the new items' priorities);
- ``uniform_sample``: a batch of ``batch`` transitions with their n-step targets at the algorithm's ``nstep``
  and ``gamma`` (observation, action, return, discount, bootstrap observation, key, weight), beside a plain
  numpy ring buffer of the same transitions (obs, next obs, action, reward, done: five ``take`` calls);
- ``prioritized_sample_update``: a prioritized batch and a priority update of every item in it, beside cpprb's
  ``PrioritizedReplayBuffer`` with the same fields (not a project dependency: reported as not installed when
  absent).

The rate limiter is set wide open: this measures the store, not the ratio it keeps.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from srl.api.config import ExperimentConfig
from srl.api.config.errors import ConfigError
from srl.api.config.replay import ReplayConfig
from srl.api.schema import FieldSpec
from srl.replay.role import sampling
from srl.replay.spec import ReplaySpec, Sampler
from srl.replay.store import ReplayStore
from srl.replay.worker import Sampling
from srl.runtime.plan import make_plan
from srl.system.streams import PoolLayout
from srl.wiring import learns_on_policy

ALPHA, BETA = 0.6, 0.4
REPEATS, NUMBER = 5, 20
"""Each rate is the median over ``REPEATS`` rounds of the mean over ``NUMBER`` calls."""
OPEN = 1e15
"""An error buffer no benchmark reaches: neither side is ever held."""


Row = Callable[[str, str, int, float], dict[str, Any]]
"""A result line from (measure, implementation, items per call, seconds per call)."""


def bench_replay(
    cfg: ExperimentConfig, batch: int = 256, repeats: int = REPEATS, number: int = NUMBER
) -> Iterator[dict[str, Any]]:
    """One result per measurement and implementation (see the module docstring)."""
    if learns_on_policy(cfg):
        raise ConfigError(
            f"srl bench replay: algorithm {cfg.algorithm} learns on-policy, without a replay; give a config whose "
            "algorithm learns from one (dqn)"
        )
    plan = make_plan(cfg)
    layout, targets = plan.only("srl bench replay").layout, sampling(plan, 0)
    spec = _spec(cfg, layout, batch, "uniform")
    rng = np.random.default_rng(cfg.seed)
    head = {"bench": "replay", "batch": batch, "items": spec.max_items, "repeats": repeats}

    def row(measure: str, impl: str, items: int, seconds: float) -> dict[str, Any]:
        per_call = {"us_per_call": round(seconds * 1e6, 2), "items_per_s": round(items / seconds)}
        return {**head, "measure": measure, "impl": impl, **per_call}

    segments = [random_segment(layout.fields, rng, cfg.replay.frame_stacks) for _ in range(4)]
    samplers: tuple[Sampler, ...] = ("uniform", "prioritized")
    for sampler in samplers:
        store = full_store(_spec(cfg, layout, batch, sampler), segments)
        yield from store_rates(store, segments, targets, repeats, number, rng, row)
        del store  # one store in memory at a time
    columns = _transitions(spec, rng)
    yield row("uniform_sample", "numpy_ring", batch, median_seconds(_ring(columns, batch, rng), repeats, number))
    yield _cpprb(columns, batch, repeats, number, rng, row) or {**head, "impl": "cpprb", "note": "not installed"}


def store_rates(
    store: ReplayStore,
    segments: list[dict[str, np.ndarray]],
    targets: Sampling,
    repeats: int,
    number: int,
    rng: np.random.Generator,
    row: Row,
) -> Iterator[dict[str, Any]]:
    """Insert, then sample (and, by priority, update) on a full store, at the algorithm's n-step targets."""
    spec = store.spec
    calls = iter(range(1 << 62))
    out = batch_buffers(spec)

    def sample() -> None:
        store.sample_into(out, rng, n=targets.nstep, gamma=targets.gamma)

    sample()  # from here on every insert also computes its steps' n-step targets, as in a run
    insert = median_seconds(lambda: store.insert(segments[next(calls) % len(segments)]), repeats, number)
    yield row("insert", f"srl_{spec.sampler}", spec.max_insert_batch, insert)

    if spec.sampler == "uniform":
        yield row(
            "uniform_sample",
            "srl",
            spec.max_sample_batch,
            median_seconds(sample, repeats, number),
        )
        return
    priorities = rng.random((16, spec.max_sample_batch)) + 1e-3

    def prioritized() -> None:
        sample()
        store.update_priorities(out["keys"], priorities[next(calls) % 16])

    yield row("prioritized_sample_update", "srl", spec.max_sample_batch, median_seconds(prioritized, repeats, number))


def _spec(cfg: ExperimentConfig, layout: PoolLayout, batch: int, sampler: Sampler) -> ReplaySpec:
    """The config's replay with this sampler at the benchmark's alpha and beta, its limiter wide open."""
    return open_spec(dataclasses.replace(cfg.replay, sampler=sampler, alpha=ALPHA, beta=BETA), layout, batch)


def open_spec(replay: ReplayConfig, layout: PoolLayout, batch: int, team: int = 1) -> ReplaySpec:
    """``replay``'s store for segments of ``layout``, sampled in batches of ``batch`` items (of ``team`` columns
    each), its rate limiter wide open: a measurement of the store, not of the ratio it keeps (a fifo queue cannot
    be opened so)."""
    return ReplaySpec.of(layout, dataclasses.replace(replay, error_buffer=OPEN), batch, team)


def batch_buffers(spec: ReplaySpec) -> dict[str, np.ndarray]:
    """Arrays for one sampled batch of ``spec.max_sample_batch`` items (what a trainer's batch buffer holds)."""
    return {n: np.zeros(f.shape, f.dtype) for n, f in spec.batch_fields(spec.max_sample_batch).items()}


def random_segment(
    fields: Mapping[str, FieldSpec], rng: np.random.Generator, frame_stacks: tuple[str, ...] = ()
) -> dict[str, np.ndarray]:
    """A segment of random data; done flags rare, as in real episodes (none where parts are frame stacks, whose
    every row is then the last S of one run of random frames)."""
    out = {}
    for name, f in fields.items():
        if name in frame_stacks:
            rows, columns, stack, *frame = f.shape
            frames = rng.integers(0, 256, (columns, rows - 1 + stack, *frame)).astype(f.dtype)
            windows = np.lib.stride_tricks.sliding_window_view(frames, stack, axis=1)  # [B, rows, ..., S]
            out[name] = np.ascontiguousarray(np.moveaxis(windows, -1, 2).swapaxes(0, 1))
        elif f.dtype == "bool":
            out[name] = (rng.random(f.shape) < 0.01) & (not frame_stacks)
        elif np.dtype(f.dtype).kind in "iu":
            out[name] = rng.integers(0, 2, f.shape).astype(f.dtype)
        else:
            out[name] = rng.normal(size=f.shape).astype(f.dtype)
    return out


def full_store(spec: ReplaySpec, segments: list[dict[str, np.ndarray]]) -> ReplayStore:
    """A store filled to capacity (one more insert overwrites its oldest chunks)."""
    store = ReplayStore.in_process(spec)
    k = 0
    while store.size < spec.max_items:
        store.insert(segments[k % len(segments)])
        k += 1
    return store


def median_seconds(fn: Callable[[], Any], repeats: int, number: int) -> float:
    """Median over ``repeats`` of the mean seconds per call of ``number`` calls, after one warm-up round."""
    for _ in range(number):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times)


def _transitions(spec: ReplaySpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A full ring of ``max_items`` transitions of the first observation part: obs, next obs, act, rew, done."""
    part = spec.fields[spec.obs_fields[0]]
    actions = spec.fields["actions"]
    n = spec.max_items
    obs = random_segment({"o": FieldSpec((n, *part.shape[2:]), part.dtype)}, rng)["o"]
    return {
        "obs": obs,
        "next_obs": obs.copy(),
        "act": np.zeros((n, *actions.shape[2:]), actions.dtype),
        "rew": rng.normal(size=n).astype(np.float32),
        "done": np.zeros(n, np.float32),
    }


def _ring(columns: Mapping[str, np.ndarray], batch: int, rng: np.random.Generator) -> Callable[[], Any]:
    n = len(columns["rew"])

    def sample() -> dict[str, np.ndarray]:
        idx = rng.integers(0, n, batch)
        return {name: col.take(idx, axis=0) for name, col in columns.items()}

    return sample


def _cpprb(
    columns: Mapping[str, np.ndarray],
    batch: int,
    repeats: int,
    number: int,
    rng: np.random.Generator,
    row: Row,
) -> dict[str, Any] | None:
    """cpprb's prioritized sample plus update on the same transitions; None when cpprb is not installed."""
    try:
        import cpprb
    except ImportError:
        return None
    env = {name: {"shape": col.shape[1:] or 1, "dtype": col.dtype} for name, col in columns.items()}
    per = cpprb.PrioritizedReplayBuffer(len(columns["rew"]), env, alpha=ALPHA)
    per.add(**columns)
    priorities = rng.random((16, batch)) + 1e-3
    calls = iter(range(1 << 62))

    def prioritized() -> None:
        got = per.sample(batch, beta=BETA)
        per.update_priorities(got["indexes"], priorities[next(calls) % 16])

    return row("prioritized_sample_update", "cpprb", batch, median_seconds(prioritized, repeats, number))
