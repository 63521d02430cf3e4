"""Layout recommendation and the scale table, on top of the capacity model in :mod:`srl.capacity.model`.

Why a search and not a formula: with integer process counts, a GPU or CPU
trainer, inline or served inference and a relay tree, the best split of the
cores is easiest to get right by trying every split the model allows (a few
thousand cheap evaluations) and keeping the fastest; ties go to the smallest
layout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from srl.api.config import ConfigError
from srl.capacity.model import (
    Cluster,
    Costs,
    Layout,
    ParamDelivery,
    Prediction,
    actor_seconds,
    best_params,
    param_delivery,
    policy_seconds,
    predict,
    rate,
    samples_per_version,
)

SCALES = (1_000, 10_000, 100_000)
"""Core counts of the scale table."""
MAX_ENVS_PER_SLOT = 64
GOOD_ENOUGH = 0.95
"""The recommended ``envs_per_slot`` is the smallest whose layout reaches this share of the fastest one."""


@dataclass(frozen=True)
class Limits:
    """Caps on the search, for what the model does not charge for or the runtime cannot place."""

    max_trainers: int | None = None
    """Data-parallel trainers: their all-reduce is not modelled, so a cap asks what a realistic count gives."""
    max_trainer_nodes: int | None = None
    """Nodes for trainers (``ray.trainer_nodes``); each adds an all-reduce hop the model does not charge."""

    def __post_init__(self) -> None:
        for name in ("max_trainers", "max_trainer_nodes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name}: must be >= 1, got {value}")


@dataclass(frozen=True)
class Recommendation:
    """A layout and what the model predicts for it."""

    layout: Layout
    prediction: Prediction

    def settings(self) -> dict[str, Any]:
        """The layout as config settings: ``ray.*`` on several nodes, the local runtime's keys on one."""
        lay = self.layout
        if lay.trainer_nodes:
            where = {
                "ray.actor_nodes": lay.actor_nodes,
                "ray.actors_per_node": lay.actors_per_node,
                "ray.policy_workers_per_node": lay.policy_workers_per_node,
                "ray.trainer_nodes": lay.trainer_nodes,
            }
        else:
            where = {"workers.actors": lay.actors_per_node, "workers.policy_workers": lay.policy_workers_per_node}
        if lay.trainer_nodes and lay.trainer_device == "gpu":
            where["ray.trainer_gpus"] = 1
        return {
            **where,
            "workers.trainers": lay.trainers,
            "workers.trainer_device": "cuda" if lay.trainer_device == "gpu" else "cpu",
            "workers.ring_size": lay.ring_size,
            "workers.envs_per_slot": lay.envs_per_slot,
            "params.mode": lay.params_mode,
            "params.fan_out": lay.fan_out,
        }


def envs_per_slot_candidates(costs: Costs) -> list[int]:
    """The measured ``envs_per_slot`` and its doublings up to ``MAX_ENVS_PER_SLOT``. Larger slots amortise the
    fixed cost of each request (round trip, inline forward pass); per-step env cost is taken as independent of
    the slot size, which overstates it for larger slots (a conservative error)."""
    out = [costs.envs_per_slot]
    while out[-1] * 2 <= MAX_ENVS_PER_SLOT:
        out.append(out[-1] * 2)
    return out


def recommend(costs: Costs, cluster: Cluster, limits: Limits = Limits()) -> Recommendation:
    """The layout with the highest predicted throughput, using no more processes than cores.

    One node: trainers, policy workers and actors split its cores. Several nodes: trainer nodes run one
    trainer per GPU (or per ``trainer_threads`` cores), actor nodes the best actor / policy worker split, and the
    number of trainer nodes balances the two. With GPUs, CPU trainers are tried too (a small network gains
    little from a GPU). ``envs_per_slot`` is the smallest candidate within ``GOOD_ENOUGH`` of the fastest: a
    larger slot also grows the PPO batch. ``limits`` caps trainers and trainer nodes."""
    if cluster.gpus_per_node and costs.gpu_update_speedup is None:
        raise ConfigError("gpu_update_speedup: needed with GPUs (give --gpu-speedup; nothing here measures it)")
    search = _best_one_node if cluster.nodes == 1 else _best_many_nodes
    devices: list[Literal["cpu", "gpu"]] = ["gpu", "cpu"] if cluster.gpus_per_node else ["cpu"]
    per_slot_size = []
    for B in envs_per_slot_candidates(costs):
        best = None
        for device in devices:
            rec = search(costs, cluster, device, B, limits)
            if rec is not None and _better(rec, best):
                best = rec
        if best is not None:
            per_slot_size.append(best)
    if not per_slot_size:
        raise ConfigError(f"cores_per_node: {cluster.cores_per_node} cores leave no room for an actor")
    fastest = max(rec.prediction.steps_per_second for rec in per_slot_size)
    return next(rec for rec in per_slot_size if rec.prediction.steps_per_second >= GOOD_ENOUGH * fastest)


def _better(candidate: Recommendation, best: Recommendation | None) -> bool:
    """Strictly faster (by more than rounding), so that the first, smallest layout wins ties."""
    return best is None or candidate.prediction.steps_per_second > best.prediction.steps_per_second * (1 + 1e-9)


def _best_one_node(
    costs: Costs, cluster: Cluster, device: Literal["cpu", "gpu"], B: int, limits: Limits
) -> Recommendation | None:
    """Every split of one node's cores into trainers, policy workers and actors (a few thousand at 64 cores)."""
    C = cluster.cores_per_node
    per_trainer = 1 if device == "gpu" else costs.trainer_threads
    most = min(limits.max_trainers or C, cluster.gpus_per_node if device == "gpu" else C // per_trainer)
    best = None
    for trainers in range(1, most + 1):
        free = C - trainers * per_trainer
        for pws in range(0, free):
            actors = free - pws
            if actors < trainers:
                continue
            layout = Layout(
                actor_nodes=1,
                trainer_nodes=0,
                actors_per_node=actors,
                policy_workers_per_node=pws,
                trainers=trainers,
                trainer_device=device,
                envs_per_slot=B,
            )
            rec = Recommendation(layout, predict(costs, cluster, layout))
            if _better(rec, best):
                best = rec
    return best


def _best_actor_split(costs: Costs, cluster: Cluster, B: int) -> int:
    """Policy workers per actor node (0: inline inference) maximising that node's own capacity."""
    C = cluster.cores_per_node
    best_rate, best_pws = -1.0, 0
    for pws in range(0, C):
        layout = Layout(
            actor_nodes=1,
            trainer_nodes=1,
            actors_per_node=C - pws,
            policy_workers_per_node=pws,
            trainers=1,
            envs_per_slot=B,
        )
        a_s = actor_seconds(costs, layout)
        p_s = policy_seconds(costs, layout) if pws else 0.0
        speed = min((C - pws) / a_s, rate(pws, p_s) if pws else math.inf, C / (a_s + p_s))
        if speed > best_rate * (1 + 1e-9):
            best_rate, best_pws = speed, pws
    return best_pws


def _best_many_nodes(
    costs: Costs, cluster: Cluster, device: Literal["cpu", "gpu"], B: int, limits: Limits
) -> Recommendation | None:
    """Scan the number of trainer nodes: on a coarse grid first, then around the best point. Throughput is the
    minimum of stages that fall (actor side) and rise (trainer side) with it, so it has one peak."""
    C, N = cluster.cores_per_node, cluster.nodes
    per_node = cluster.gpus_per_node if device == "gpu" else max(1, C // costs.trainer_threads)
    pws = _best_actor_split(costs, cluster, B)
    max_trainers = limits.max_trainers or N * per_node

    def evaluate(trainer_nodes: int) -> Recommendation | None:
        trainers = min(max_trainers, trainer_nodes * per_node)
        trainers -= trainers % trainer_nodes  # the Ray runtime splits trainers evenly over their nodes
        layout = Layout(
            actor_nodes=N - trainer_nodes,
            trainer_nodes=trainer_nodes,
            actors_per_node=C - pws,
            policy_workers_per_node=pws,
            trainers=trainers,
            trainer_device=device,
            envs_per_slot=B,
        )
        if layout.actor_nodes * layout.actors_per_node < layout.trainers:
            return None
        params = best_params(costs, cluster, layout)
        layout = dataclasses.replace(layout, params_mode=params.mode, fan_out=params.fan_out)  # type: ignore[arg-type]
        return Recommendation(layout, predict(costs, cluster, layout))

    hi = min(N - 1, math.ceil(max_trainers / per_node), limits.max_trainer_nodes or N)
    step = max(1, hi // 128)
    best, best_tn = _best_of(evaluate, range(1, hi + 1, step), None, 1)
    if step > 1:  # refine between the coarse neighbours of the best point
        best, _ = _best_of(evaluate, range(max(1, best_tn - step + 1), min(hi, best_tn + step - 1) + 1), best, best_tn)
    return None if best is None else _fewest_actor_nodes(costs, cluster, best)


def _fewest_actor_nodes(costs: Costs, cluster: Cluster, rec: Recommendation) -> Recommendation:
    """When the trainers bind, some actor nodes add nothing: keep the fewest that reach the same throughput
    (bisection; throughput never falls as actor nodes are added, up to rounding)."""
    target = rec.prediction.steps_per_second * (1 - 1e-9)
    lo, hi = 1, rec.layout.actor_nodes
    while lo < hi:
        mid = (lo + hi) // 2
        layout = dataclasses.replace(rec.layout, actor_nodes=mid)
        enough = layout.actors_per_node * mid >= layout.trainers
        if enough and predict(costs, cluster, layout).steps_per_second >= target:
            hi = mid
        else:
            lo = mid + 1
    if hi == rec.layout.actor_nodes:
        return rec
    layout = dataclasses.replace(rec.layout, actor_nodes=hi)
    params = best_params(costs, cluster, layout)
    layout = dataclasses.replace(layout, params_mode=params.mode, fan_out=params.fan_out)  # type: ignore[arg-type]
    return Recommendation(layout, predict(costs, cluster, layout))


def _best_of(
    evaluate: Callable[[int], Recommendation | None], grid: range, best: Recommendation | None, best_at: int
) -> tuple[Recommendation | None, int]:
    """The fastest of ``best`` and the layouts ``evaluate`` gives along ``grid``, and where it was found."""
    for n in grid:
        rec = evaluate(n)
        if rec is not None and _better(rec, best):
            best, best_at = rec, n
    return best, best_at


# ---------------------------------------------------------------------------------------------- scale table
@dataclass(frozen=True)
class ScaleRow:
    """The recommended layout at one core count, and its parameter service flat vs hierarchical."""

    cores: int
    cluster: Cluster
    recommendation: Recommendation
    version_seconds: float
    """Time between two parameter versions at the predicted throughput."""
    flat: ParamDelivery
    hierarchical: ParamDelivery


def scale_table(
    costs: Costs,
    cores_per_node: int,
    gpus_per_node: int = 0,
    link_gbps: float = 10.0,
    scales: tuple[int, ...] = SCALES,
    limits: Limits = Limits(),
) -> list[ScaleRow]:
    """At each core count: nodes of ``cores_per_node``, the recommended layout, and both parameter services."""
    rows = []
    for cores in scales:
        cluster = Cluster(
            nodes=max(1, math.ceil(cores / cores_per_node)),
            cores_per_node=cores_per_node,
            gpus_per_node=gpus_per_node,
            link_gbps=link_gbps,
        )
        rec = recommend(costs, cluster, limits)
        lay = rec.layout
        interval = samples_per_version(costs, lay) / rec.prediction.steps_per_second
        rows.append(
            ScaleRow(
                cores,
                cluster,
                rec,
                interval,
                param_delivery(costs, cluster, lay, "flat"),
                param_delivery(costs, cluster, lay, "hierarchical", lay.fan_out),
            )
        )
    return rows
