"""``srl bench allreduce``: what one gradient all-reduce among data-parallel trainers costs on this machine.

Real trainer processes (``world`` of them, spawned) join one gloo group through
the project's own :class:`~srl.system.collective.TorchCollective` on loopback,
as a run's trainers do, and time its ``mean_`` (pack, ``all_reduce``, divide,
unpack) over a float32 gradient of the given size: each round starts at a
barrier, and rank 0's median is reported. The capacity model charges a ring
(``2 (p - 1)`` steps of ``1/p`` of the bytes each); :func:`ring_fit` takes its
hop time and byte rate from two sizes at ``world = 2``, where a ring is one
send and one receive each way.

Results cross the process boundary as JSON files in a private directory, never
as pickles; every child is joined, or killed, before it returns.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor

    from srl.runtime.plan import Plan

SMALL_GRADIENT_FLOATS = 1_000
"""The small size of the fit (4 kB in float32): the hop dominates the bytes."""
LARGE_GRADIENT_FLOATS = 250_000
"""The large size of the fit when the real gradient is smaller (1 MB in float32): the bytes dominate the hop."""
JOIN_SECONDS = 120.0
"""How long the measurement may take before its processes are killed."""


def _rank(rank: int, world: int, folder: str, floats: int, rounds: int, warmup: int) -> None:
    """One trainer process: join the group, time ``rounds`` reductions, write its times (rank 0 only)."""
    import torch
    import torch.distributed as dist

    from srl.system.collective import TorchCollective

    torch.set_num_threads(1)
    collective = TorchCollective(rank, world, f"file://{folder}/store", timeout=JOIN_SECONDS)
    collective.connect()
    try:
        grad = torch.randn(floats)
        times = []
        for i in range(warmup + rounds):
            dist.barrier()
            start = time.perf_counter()
            collective.mean_([grad])
            if i >= warmup:
                times.append(time.perf_counter() - start)
        if rank == 0:
            out = Path(folder) / "rank0.json"
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps({"seconds": times}))
            tmp.replace(out)
    finally:
        collective.close()


def measure(world: int, floats: int, rounds: int = 30, warmup: int = 5) -> dict[str, Any]:
    """Median seconds of one ``mean_`` of ``floats`` float32 among ``world`` trainer processes here."""
    if world < 2:
        raise ValueError(f"an all-reduce needs 2 or more trainers, got {world}")
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="srl-allreduce-") as folder:
        procs = [ctx.Process(target=_rank, args=(r, world, folder, floats, rounds, warmup)) for r in range(world)]
        try:
            for p in procs:
                p.start()
            deadline = time.monotonic() + JOIN_SECONDS
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
        bad = [p.exitcode for p in procs if p.exitcode != 0]
        if bad:
            raise RuntimeError(f"srl bench allreduce: a trainer process failed (exit codes {bad})")
        seconds = json.loads((Path(folder) / "rank0.json").read_text())["seconds"]
    return {
        "bench": "allreduce",
        "world": world,
        "gradient_bytes": 4 * floats,
        "rounds": rounds,
        "seconds_median": statistics.median(seconds),
        "seconds_min": min(seconds),
    }


def ring_fit(floats: int, rounds: int = 30) -> dict[str, float]:
    """The ring's hop time and byte rate on this machine, from ``world = 2``, where ``t = 2 hop + bytes / rate``:
    the line through a small gradient (the hop dominates) and the real one or, when that is small too, a larger
    one (the bytes dominate)."""
    sizes = (SMALL_GRADIENT_FLOATS, max(floats, LARGE_GRADIENT_FLOATS))
    t = [measure(2, n, rounds)["seconds_median"] for n in sizes]
    small, large = (4.0 * n for n in sizes)
    if t[1] <= t[0]:  # noise swamped the bytes: charge the large reduction's time to bytes, the small one's to the hop
        return {"allreduce_hop_seconds": t[0] / 2, "allreduce_bytes_per_second": large / t[1]}
    rate = (large - small) / (t[1] - t[0])
    return {"allreduce_hop_seconds": max(0.0, (t[0] - small / rate) / 2), "allreduce_bytes_per_second": rate}


def bench_allreduce(cfg: Any, worlds: list[int], rounds: int = 30) -> list[dict[str, Any]]:
    """The capacity model's all-reduce term against measurement, for ``cfg``'s gradient: the ring fitted at 2
    trainers (two sizes), then for each trainer count the measured median beside the ring's prediction."""
    from srl.runtime.plan import make_plan

    plan = make_plan(cfg)
    reduced = gradient_reductions(plan)
    floats = reduced["gradient_bytes"] // 4
    ring = ring_fit(floats, rounds)
    hop, rate = ring["allreduce_hop_seconds"], ring["allreduce_bytes_per_second"]
    out = []
    for world in worlds:
        measured = measure(world, floats, rounds)
        predicted = 2 * (world - 1) * (hop + 4 * floats / world / rate)
        out.append(
            {
                **measured,
                "env": cfg.env.id,
                "reductions_per_update": reduced["reductions_per_update"],
                **ring,
                "predicted_seconds": predicted,
                "error": predicted / measured["seconds_median"] - 1,
            }
        )
    return out


class CountingCollective:
    """A collective of one trainer that only counts what an update reduces (how many reductions, how many bytes),
    so one real update says what data-parallel trainers would all-reduce."""

    rank, world_size = 0, 1

    def __init__(self) -> None:
        self.bytes_reduced, self.seconds_reduced, self.reductions = 0, 0.0, 0

    def connect(self) -> None:
        """Nothing to join."""

    def close(self) -> None:
        """Nothing to leave."""

    def mean_(self, tensors: Sequence[Tensor]) -> None:
        if tensors:
            self.reductions += 1
            self.bytes_reduced += sum(t.numel() * t.element_size() for t in tensors)

    def broadcast_(self, tensors: Sequence[Tensor]) -> None:
        """Rank 0's tensors are these already."""

    def broadcast_bytes(self, data: bytes) -> bytes:
        return data

    def merge_moments(self, mean: Tensor, var: Tensor, n: int) -> tuple[Tensor, Tensor, int]:
        return mean, var, n

    def maximum(self, values: Sequence[int]) -> list[int]:
        return list(values)


def gradient_reductions(plan: Plan, batch: Mapping[str, np.ndarray] | None = None) -> dict[str, int]:
    """What one update over a full batch (``batch``, or on-policy segments of random content) all-reduces:
    bytes per reduction and reductions per update."""
    from srl.bench.throughput import segment_batch
    from srl.wiring import make_algorithm

    cfg, one = plan.cfg, plan.only("srl bench costs")
    counter = CountingCollective()
    algo = make_algorithm(
        one.obs_space, one.action_space, cfg, cfg.seed, counter, state_space=one.state_space, agents=one.agents_per_env
    )
    if batch is None:
        batch = segment_batch(one, cfg, np.random.default_rng(cfg.seed))
    algo.train(batch, 0.0)
    if not counter.reductions:
        raise RuntimeError(f"srl bench costs: an update of {cfg.algorithm!r} reduced no gradient")
    return {"gradient_bytes": counter.bytes_reduced // counter.reductions, "reductions_per_update": counter.reductions}
