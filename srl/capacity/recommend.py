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

from srl.api.config import ConfigError, CostConfig
from srl.capacity.model import (
    Cluster,
    Costs,
    Layout,
    ParamDelivery,
    Prediction,
    actor_seconds,
    allreduce_per_step,
    batch_segments,
    best_params,
    param_delivery,
    policy_seconds,
    predict,
    rate,
    samples_per_version,
    trainer_seconds,
)

SCALES = (1_000, 10_000, 100_000)
"""Core counts of the scale table."""
MAX_ENVS_PER_SLOT = 64
GOOD_ENOUGH = 0.95
"""The recommended ``envs_per_slot`` is the smallest whose layout reaches this share of the fastest one."""
NODE_MARGIN = 0.01
"""How much faster a layout with more trainer nodes must be to be preferred (see ``_best_of``)."""
MIN_TRAINER_EFFICIENCY = 0.5
"""The share of its time a recommended trainer spends on its own update, at least. A ring all-reduce grows by
two steps with every trainer, so past some count each one more adds less than it costs; the model's
throughput still creeps up (it never charges the stragglers every step waits for), and without this floor the
search would fill every node it is given with trainers that mostly wait."""


@dataclass(frozen=True)
class Limits:
    """Caps on the search: what a user can afford or the runtime can place, and what the model leaves out
    (stragglers at each all-reduce grow with the trainers)."""

    max_trainers: int | None = None
    """Data-parallel trainers."""
    max_trainer_nodes: int | None = None
    """Nodes for trainers (``ray.trainer_nodes``)."""
    min_trainer_efficiency: float = MIN_TRAINER_EFFICIENCY
    """See :data:`MIN_TRAINER_EFFICIENCY` (0: trainers as long as they add anything)."""

    def __post_init__(self) -> None:
        for name in ("max_trainers", "max_trainer_nodes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name}: must be >= 1, got {value}")
        if not 0.0 <= self.min_trainer_efficiency < 1.0:
            raise ConfigError(f"min_trainer_efficiency: must be in [0, 1), got {self.min_trainer_efficiency}")


def trainer_efficiency(costs: Costs, cluster: Cluster, layout: Layout) -> float:
    """The share of a trainer's time on its update rather than in the all-reduce (1 for one trainer)."""
    t = trainer_seconds(costs, layout)
    return t / (t + allreduce_per_step(costs, cluster, layout))


def efficient_trainers(costs: Costs, cluster: Cluster, layout: Layout, floor: float) -> int:
    """The most trainers, up to ``layout.trainers``, at which each still has ``floor`` of its time for its update
    (the efficiency falls as trainers are added: bisection)."""

    def ok(p: int) -> bool:
        return trainer_efficiency(costs, cluster, dataclasses.replace(layout, trainers=p)) >= floor

    lo, hi = 1, layout.trainers
    if ok(hi):
        return hi
    while lo + 1 < hi:  # ok(lo), not ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


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
            **({} if lay.batch_segments is None else {"workers.batch_segments": lay.batch_segments}),
            "params.mode": lay.params_mode,
            "params.fan_out": lay.fan_out,
        }


def envs_per_slot_candidates(costs: Costs) -> list[int]:
    """The measured ``envs_per_slot`` and its doublings up to ``MAX_ENVS_PER_SLOT``, as long as a trainer's PPO
    batch can stay as measured (at least one segment of the slot fits in it): a recommendation changes where
    the work runs, not what an update learns from (and a larger batch would hide the all-reduce's cost). A
    replay's batch does not depend on the slot size. Larger slots amortise the fixed cost of each request (round
    trip, inline forward pass); per-step env cost is taken as independent of the slot size, which overstates it
    for larger slots (a conservative error)."""
    largest = MAX_ENVS_PER_SLOT
    if not costs.samples_per_insert:
        largest = min(largest, int(costs.samples_per_version // costs.segment_length))
    out = [costs.envs_per_slot]
    while out[-1] * 2 <= largest:
        out.append(out[-1] * 2)
    return out


def recommend(costs: Costs, cluster: Cluster, limits: Limits = Limits()) -> Recommendation:
    """The layout with the highest predicted throughput, using no more processes than cores.

    One node: trainers, policy workers and actors split its cores. Several nodes: trainer nodes run one
    trainer per GPU (or per ``trainer_threads`` cores), actor nodes the best actor / policy worker split, and the
    number of trainer nodes balances the two. With GPUs, CPU trainers are tried too (a small network gains
    little from a GPU). ``envs_per_slot`` is the smallest candidate within ``GOOD_ENOUGH`` of the fastest, with
    ``batch_segments`` keeping each trainer's PPO batch as measured (a slot larger than that batch grows it to
    one segment). ``limits`` caps trainers and trainer nodes; a costs file measured before the all-reduce was
    (no ``gradient_bytes``) plans one trainer."""
    if cluster.gpus_per_node and costs.gpu_update_speedup is None and costs.device_update_seconds_per_sample is None:
        raise ConfigError(
            "gpu_update_speedup: needed with GPUs when the costs hold no device_update_seconds_per_sample (give "
            "--gpu-speedup, or measure it with srl bench costs --device cuda)"
        )
    if costs.gradient_bytes is None:
        limits = dataclasses.replace(limits, max_trainers=1)
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
    rec = next(rec for rec in per_slot_size if rec.prediction.steps_per_second >= GOOD_ENOUGH * fastest)
    segments = None if costs.samples_per_insert else batch_segments(costs, rec.layout)  # a replay's batch is items
    layout = dataclasses.replace(rec.layout, batch_segments=segments)
    if cluster.nodes > 1:  # one node as fast (within NODE_MARGIN): the others would only draw power
        one = recommend(costs, dataclasses.replace(cluster, nodes=1), limits)
        if one.prediction.steps_per_second >= rec.prediction.steps_per_second * (1 - NODE_MARGIN):
            return one
    return Recommendation(layout, rec.prediction)


def _better(candidate: Recommendation, best: Recommendation | None, margin: float = 1e-9) -> bool:
    """Faster by more than ``margin`` (rounding, by default), so that the first, smallest layout wins ties."""
    return best is None or candidate.prediction.steps_per_second > best.prediction.steps_per_second * (1 + margin)


def _best_one_node(
    costs: Costs, cluster: Cluster, device: Literal["cpu", "gpu"], B: int, limits: Limits
) -> Recommendation | None:
    """Every split of one node's cores into trainers, policy workers and actors (a few thousand at 64 cores)."""
    C = cluster.cores_per_node
    per_trainer = 1 if device == "gpu" else costs.trainer_threads
    most = min(limits.max_trainers or C, cluster.gpus_per_node if device == "gpu" else C // per_trainer)
    if most > 1:
        template = Layout(actor_nodes=1, trainer_nodes=0, actors_per_node=most, policy_workers_per_node=0,
                          trainers=most, trainer_device=device, envs_per_slot=B)  # fmt: skip
        most = efficient_trainers(costs, cluster, template, limits.min_trainer_efficiency)
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
        layout = Layout(
            actor_nodes=N - trainer_nodes,
            trainer_nodes=trainer_nodes,
            actors_per_node=C - pws,
            policy_workers_per_node=pws,
            trainers=min(max_trainers, trainer_nodes * per_node),
            trainer_device=device,
            envs_per_slot=B,
        )
        trainers = efficient_trainers(costs, cluster, layout, limits.min_trainer_efficiency)
        trainers -= trainers % trainer_nodes  # the Ray runtime splits trainers evenly over their nodes
        if trainers < trainer_nodes:  # trainer nodes the efficient trainers cannot all have one on
            return None
        layout = dataclasses.replace(layout, trainers=trainers)
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
    """The fastest of ``best`` (found at ``best_at`` trainer nodes) and the layouts ``evaluate`` gives along
    ``grid``, and where it was found; within ``NODE_MARGIN`` the one with fewer trainer nodes wins: once the
    trainers are capped, more trainer nodes only move the rounding of trainers to a multiple of the nodes."""
    for n in grid:
        rec = evaluate(n)
        if rec is None:
            continue
        if best is None or (
            _better(rec, best, NODE_MARGIN)
            if n > best_at
            else rec.prediction.steps_per_second >= best.prediction.steps_per_second * (1 - NODE_MARGIN)
        ):
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
    costs: Costs, node: Cluster, scales: tuple[int, ...] = SCALES, limits: Limits = Limits()
) -> list[ScaleRow]:
    """At each core count: as many nodes like ``node``'s (cores, GPUs, link) as it takes, the recommended layout,
    and both parameter services (each node a machine of its own, whatever ``node.shared_cores`` says)."""
    rows = []
    for cores in scales:
        cluster = dataclasses.replace(node, nodes=max(1, math.ceil(cores / node.cores_per_node)), shared_cores=None)
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


# ---------------------------------------------------------------------------------------------- energy and money
@dataclass(frozen=True)
class Spend:
    """What a layout costs to run, by the cost settings' model: every core of the nodes it uses (a node left
    idle is not charged: it can be given back) at ``watts_per_core``, each GPU trainer's GPU at ``watts_per_gpu``
    (the planned run keeps them busy), and the prices."""

    cores: int
    gpus: int
    watts: float
    joules_per_million_steps: float
    money_per_hour: float | None

    def to_target(self, env_steps: float, steps_per_second: float) -> dict[str, float | None]:
        """Hours, kilojoules and money to a target ``env_steps`` away at ``steps_per_second``."""
        hours = env_steps / steps_per_second / 3600.0
        money = None if self.money_per_hour is None else self.money_per_hour * hours
        return {"hours": hours, "kilojoules": self.joules_per_million_steps * env_steps / 1e9, "money": money}


def spend(cluster: Cluster, rec: Recommendation, cost: CostConfig) -> Spend:
    """The power, energy per million env steps and money per hour of ``rec`` on ``cluster``."""
    lay = rec.layout
    cores = cluster.shared_cores or (max(1, lay.actor_nodes + lay.trainer_nodes) * cluster.cores_per_node)
    gpus = lay.trainers if lay.trainer_device == "gpu" else 0
    watts = cores * cost.watts_per_core + gpus * cost.watts_per_gpu
    sps = rec.prediction.steps_per_second
    per_million = watts * 1e6 / sps if sps > 0 else math.inf
    return Spend(cores, gpus, watts, per_million, cost.money(cores * 3600.0, gpus * 3600.0, watts * 3600.0))


def energy_ladder(
    costs: Costs, cluster: Cluster, limits: Limits, cost: CostConfig
) -> list[tuple[Cluster, Recommendation, Spend]]:
    """The recommended layout on 1, 2, 4, ... and all of ``cluster``'s nodes, least energy per env step first:
    more nodes finish sooner, but each also draws power, and past the bottleneck it adds power and no speed."""
    counts = sorted({*(2**k for k in range(int(math.log2(cluster.nodes)) + 1)), cluster.nodes})
    out = []
    for n in counts:
        sub = dataclasses.replace(cluster, nodes=n)
        try:
            rec = recommend(costs, sub, limits)
        except ConfigError:  # too few nodes for this layout's roles
            continue
        out.append((sub, rec, spend(sub, rec, cost)))
    return sorted(out, key=lambda row: (row[2].joules_per_million_steps, row[0].nodes))
