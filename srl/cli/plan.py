"""``srl plan``: predicted throughput, bottleneck and recommended layout of a config on a cluster.

    srl plan --costs COSTS.json --nodes N --cores-per-node C [--gpus-per-node G] [--gpu-speedup X]
             [--link-gbps B] [--link-latency-us L] [--max-trainers M] [--json]
    srl plan --config CONFIG [--device cuda] ...   (measures the costs first, as ``srl bench costs`` does)
    ... [--cost KEY=VALUE ...] [--rank energy] [--target-steps N]

Every layout's power, energy per million env steps and money per hour come from the ``cost`` settings' model
(the config's, with ``--cost`` overrides); ``--rank energy`` ranks the recommended layouts on 1, 2, 4, ... of the
nodes by energy per env step, or to a target ``--target-steps`` away (a run's ``solved_env_steps``).

Trainers on GPUs cost what ``srl bench costs --device`` measured there when the costs hold it
(``device_update_seconds_per_sample``); only without it does ``--gpu-speedup`` scale the CPU's update.

The model is ``srl/capacity/model.py``; what it assumes is in docs/scaling.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from srl.api.config import ConfigError, CostConfig
from srl.capacity.model import (
    STAGES,
    Cluster,
    Costs,
    Layout,
    ParamDelivery,
    Prediction,
    allreduce_seconds,
    predict,
    trainer_batch,
)
from srl.capacity.recommend import (
    MIN_TRAINER_EFFICIENCY,
    SCALES,
    Limits,
    Recommendation,
    ScaleRow,
    Spend,
    energy_ladder,
    recommend,
    scale_table,
    spend,
    trainer_efficiency,
)
from srl.cli import add_overrides, check_device


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="capacity model: predicted env steps/s, bottleneck and layout on a cluster")
    p.add_argument("--costs", type=Path, default=None, help="costs JSON written by `srl bench costs --json`")
    p.add_argument("--config", default=None, help="experiment YAML: measure its costs here first")
    add_overrides(p, "with --config: override a config field (repeatable)")
    p.add_argument("--seconds", type=float, default=3.0, help="with --config: seconds per cost measurement")
    p.add_argument(
        "--device",
        default=None,
        help="with --config: also measure the update and inference on this device (cuda, cuda:N, cpu)",
    )
    p.add_argument("--nodes", type=int, required=True, help="nodes in the cluster")
    p.add_argument("--cores-per-node", type=int, required=True, help="CPU cores per node")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (used by trainers only)")
    p.add_argument(
        "--gpu-speedup",
        type=float,
        default=None,
        help="update speed-up of one GPU over the measured CPU trainer (needed with GPUs when the costs hold no "
        "update measured on a device)",
    )
    p.add_argument("--link-gbps", type=float, default=10.0, help="network link per node, Gbit/s (default 10)")
    p.add_argument(
        "--link-latency-us",
        type=float,
        default=50.0,
        help="one message's latency between nodes, microseconds: what each cross-node step of the trainers' "
        "all-reduce ring costs at least (default 50; not measurable here)",
    )
    p.add_argument(
        "--shared-cores",
        type=int,
        default=None,
        help="the nodes all run on one machine with this many cores (network namespaces, ray.cluster_utils): "
        "every node's processes compete for them",
    )
    p.add_argument(
        "--max-trainers",
        type=int,
        default=None,
        help="cap on data-parallel trainers",
    )
    p.add_argument(
        "--min-trainer-efficiency",
        type=float,
        default=MIN_TRAINER_EFFICIENCY,
        help="recommend only as many data-parallel trainers as spend at least this share of their time on their "
        f"own update, not in the all-reduce (default {MIN_TRAINER_EFFICIENCY}; 0: as many as add anything)",
    )
    p.add_argument(
        "--max-trainer-nodes",
        type=int,
        default=None,
        help="cap on trainer nodes (ray.trainer_nodes)",
    )
    p.add_argument(
        "--layout",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also predict this layout: the recommended one with KEY changed (a Layout field, e.g. "
        "actors_per_node=2, policy_workers_per_node=0, trainers, envs_per_slot; repeatable)",
    )
    p.add_argument(
        "--cost",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a cost setting for the energy and money figures: watts_per_core, watts_per_gpu, price_per_core_hour, "
        "price_per_gpu_hour, price_per_kwh (the config's cost section otherwise; repeatable)",
    )
    p.add_argument(
        "--rank",
        choices=("speed", "energy"),
        default="speed",
        help="energy: also rank the recommended layouts on 1, 2, 4, ... nodes by energy per env step (to target)",
    )
    p.add_argument(
        "--target-steps",
        type=float,
        default=None,
        help="env steps to the target return (a run's solved_env_steps): hours, energy and money to it",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument(
        "--markdown",
        action="store_true",
        help="print only the 1k/10k/100k-core table, as a Markdown table (as in docs/scaling.md)",
    )


def read_costs(path: Path) -> Costs:
    """Costs from a JSON file: one object, or one per line (several runs of ``srl bench costs --json``, whose
    per-field medians are taken: this machine is noisy). Any problem raises ConfigError naming the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read costs file ({exc.strerror or exc})") from None
    try:
        runs = [(0, json.loads(text))]
    except json.JSONDecodeError as whole:
        runs = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                runs.append((n, json.loads(line)))
            except json.JSONDecodeError as exc:
                # the first line already fails: a damaged single object, whose own error is the clearer one
                bad, msg = (whole.lineno, whole.msg) if not runs else (n, exc.msg)
                raise ConfigError(f"{path}: invalid JSON at line {bad}: {msg}") from None
    costs = [Costs.from_dict(run, f"{path} line {n}" if n else str(path)) for n, run in runs]
    if not costs:
        raise ConfigError(f"{path}: empty costs file")
    try:
        return costs[0] if len(costs) == 1 else median_costs(costs)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def median_costs(runs: list[Costs]) -> Costs:
    """Per-field median of several measurements (shape fields must agree: they come from the config)."""
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Costs):
        values = [getattr(c, f.name) for c in runs]
        if f.type == "float" or (f.type == "float | None" and None not in values):
            fields[f.name] = statistics.median(values)
        elif len(set(values)) == 1:
            fields[f.name] = values[0]
        else:
            raise ConfigError(
                f"{f.name}: differs between the runs ({sorted(set(map(str, values)))}): one config per file"
            )
    return Costs(**fields)


def parse_layout(items: list[str], base: Layout) -> Layout:
    """``--layout key=value`` overrides of ``base`` (field names of :class:`Layout`)."""
    values: dict[str, Any] = {}
    kinds = {f.name: f.type for f in dataclasses.fields(Layout)}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in kinds:
            raise ConfigError(f"--layout {item!r}: expected KEY=VALUE with KEY one of {', '.join(kinds)}")
        if kinds[key] in ("int", "int | None"):
            try:
                values[key] = int(raw)
            except ValueError:
                raise ConfigError(f"--layout {key}: expected an integer, got {raw!r}") from None
        else:
            values[key] = raw
    if values.get("trainer_device", "cpu") not in ("cpu", "gpu") or values.get("params_mode", "flat") not in (
        "flat",
        "hierarchical",
    ):
        raise ConfigError("--layout: trainer_device must be cpu or gpu, params_mode flat or hierarchical")
    return dataclasses.replace(base, **values)


def _check_args(args: argparse.Namespace) -> None:
    if (args.costs is None) == (args.config is None):
        raise ConfigError("srl plan: give --costs FILE or --config CONFIG (one of them)")
    for flag, value, least in (
        ("--nodes", args.nodes, 1),
        ("--cores-per-node", args.cores_per_node, 1),
        ("--gpus-per-node", args.gpus_per_node, 0),
        ("--shared-cores", 1 if args.shared_cores is None else args.shared_cores, 1),
    ):
        if value < least:
            raise ConfigError(f"{flag}: must be >= {least}, got {value}")
    for flag, value in (
        ("--link-gbps", args.link_gbps),
        ("--gpu-speedup", args.gpu_speedup),
        ("--seconds", args.seconds),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag}: must be > 0, got {value}")
    if args.target_steps is not None and not (math.isfinite(args.target_steps) and args.target_steps > 0):
        raise ConfigError(f"--target-steps: must be > 0, got {args.target_steps}")
    if not (math.isfinite(args.link_latency_us) and args.link_latency_us >= 0):
        raise ConfigError(f"--link-latency-us: must be >= 0, got {args.link_latency_us}")
    if not 0.0 <= args.min_trainer_efficiency < 1.0:
        raise ConfigError(f"--min-trainer-efficiency: must be in [0, 1), got {args.min_trainer_efficiency}")
    for flag, value in (("--max-trainers", args.max_trainers), ("--max-trainer-nodes", args.max_trainer_nodes)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag}: must be >= 1, got {value}")
    check_device("--device", args.device)
    if args.device is not None and args.config is None:
        raise ConfigError("--device: measures costs, so it goes with --config (srl bench costs --device for a file)")
    if args.gpus_per_node and args.gpu_speedup is None and args.config is not None and args.device is None:
        raise ConfigError("--gpu-speedup: needed with --gpus-per-node > 0 (or --device cuda to measure the GPU)")


def _costs(args: argparse.Namespace) -> Costs:
    if args.costs is not None:
        costs = read_costs(args.costs)
    else:
        from srl.bench.costs import bench_costs

        costs = Costs.from_dict(bench_costs(_config(args), args.seconds, args.device), "measured")
    if args.gpu_speedup is not None and costs.device_update_seconds_per_sample is None:
        costs = dataclasses.replace(costs, gpu_update_speedup=args.gpu_speedup)
    elif args.gpu_speedup is not None:
        print(
            f"srl plan: --gpu-speedup not used: the costs hold the update measured on {costs.device}", file=sys.stderr
        )
    if args.gpus_per_node and costs.gpu_update_speedup is None and costs.device_update_seconds_per_sample is None:
        raise ConfigError(
            "--gpu-speedup: needed with --gpus-per-node > 0 (the costs file has neither gpu_update_speedup nor an "
            "update measured on a device: srl bench costs --device cuda)"
        )
    return costs


def _config(args: argparse.Namespace) -> Any:
    from srl.api.config import load_config

    return load_config(args.config, args.overrides)


def _cost(args: argparse.Namespace) -> CostConfig:
    """The cost settings: the config's (with ``--config``) or the defaults, with ``--cost`` on top."""
    from srl.api.config import config_from, load_config

    sets = [f"cost.{item}" for item in args.cost]
    if args.config is not None:
        return load_config(args.config, [*args.overrides, *sets]).cost
    return config_from({}, sets).cost


def _own_layout(args: argparse.Namespace, costs: Costs, cluster: Cluster) -> tuple[Recommendation | None, str]:
    """With ``--config``: the config's own layout (from its topology) and its prediction on the cluster, or why it
    cannot run there."""
    from srl.capacity.model import layout_of
    from srl.runtime.plan import make_plan

    layout = layout_of(make_plan(_config(args)))
    try:
        return Recommendation(layout, predict(costs, cluster, layout)), ""
    except ConfigError as exc:
        return None, f"the config's own layout does not fit this cluster: {exc}"


def run_plan(args: argparse.Namespace) -> int:
    _check_args(args)
    cost = _cost(args)  # a bad price or watts is one line before anything is measured
    costs = _costs(args)
    cluster = Cluster(
        nodes=args.nodes,
        cores_per_node=args.cores_per_node,
        gpus_per_node=args.gpus_per_node,
        link_gbps=args.link_gbps,
        link_latency_us=args.link_latency_us,
        shared_cores=args.shared_cores,
    )
    limits = Limits(
        max_trainers=args.max_trainers,
        max_trainer_nodes=args.max_trainer_nodes,
        min_trainer_efficiency=args.min_trainer_efficiency,
    )
    rec = recommend(costs, cluster, limits)
    given = None
    if args.layout:
        layout = parse_layout(args.layout, rec.layout)
        given = Recommendation(layout, predict(costs, cluster, layout))
    own, own_note = _own_layout(args, costs, cluster) if args.config is not None else (None, "")
    rows = scale_table(costs, cluster, SCALES, limits)
    ladder = energy_ladder(costs, cluster, limits, cost) if args.rank == "energy" else []
    target = args.target_steps
    if args.markdown:
        print(scale_markdown(rows, cost))
    elif args.json:
        out = plan_json(costs, cluster, rec, rows, cost, target)
        for key, other in (("given", given), ("config", own)):
            if other is not None:
                out[key] = {
                    "layout": dataclasses.asdict(other.layout),
                    **_prediction_json(other.prediction),
                    "spend": _spend_json(spend(cluster, other, cost), other, target),
                }
        if own is None and own_note:
            out["config"] = {"error": own_note}
        if ladder:
            out["energy_ranking"] = [
                {
                    "nodes": c.nodes,
                    "layout": r.settings(),
                    **_prediction_json(r.prediction),
                    "spend": _spend_json(sp, r, target),
                }
                for c, r, sp in ladder
            ]
        print(json.dumps(out))
    else:
        text = plan_text(costs, cluster, rec, rows, cost, target)
        if given is not None:
            text += "\n\n" + given_text(given, cluster, cost, target)
        if own is not None:
            text += "\n\n" + given_text(own, cluster, cost, target, "the config's layout")
        elif own_note:
            text += "\n\n" + own_note
        if ladder:
            text += "\n\n" + ladder_text(ladder, cost, target)
        print(text)
    return 0


# ---------------------------------------------------------------------------------------------- JSON
def _finite(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None


def _delivery_json(d: ParamDelivery) -> dict[str, Any]:
    return {**dataclasses.asdict(d), "seconds": round(d.seconds, 6)}


def _prediction_json(pred: Prediction) -> dict[str, Any]:
    return {
        "env_steps_per_second": round(pred.steps_per_second, 1),
        "bottleneck": pred.bottleneck,
        "stages": {k: _finite(v) for k, v in pred.stages.items()},
    }


def _allreduce_json(costs: Costs, cluster: Cluster, layout: Layout) -> dict[str, float]:
    """The trainers' all-reduce in a layout: one reduction's seconds, and the share of each trainer's time on its
    update."""
    return {
        "seconds": allreduce_seconds(costs, cluster, layout),
        "trainer_efficiency": trainer_efficiency(costs, cluster, layout),
    }


def _spend_json(sp: Spend, rec: Recommendation, target_steps: float | None) -> dict[str, Any]:
    """A layout's power, energy per million env steps, money per hour and, given a target, what reaching it takes."""
    out: dict[str, Any] = {
        "cores": sp.cores,
        "gpus": sp.gpus,
        "watts": round(sp.watts, 1),
        "kilojoules_per_million_steps": _finite(sp.joules_per_million_steps / 1e3),
        "money_per_hour": sp.money_per_hour,
    }
    if target_steps is not None:
        out["to_target"] = sp.to_target(target_steps, rec.prediction.steps_per_second)
    return out


def plan_json(
    costs: Costs,
    cluster: Cluster,
    rec: Recommendation,
    rows: list[ScaleRow],
    cost: CostConfig,
    target_steps: float | None = None,
) -> dict[str, Any]:
    """One object: inputs, prediction (stage capacities, ``null`` where a stage cannot bind), layout, its spend
    (by the cost model), scale table."""
    pred = rec.prediction
    return {
        "costs": costs.to_dict(),
        "cluster": dataclasses.asdict(cluster),
        "cost": dataclasses.asdict(cost),
        **_prediction_json(pred),
        "spend": _spend_json(spend(cluster, rec, cost), rec, target_steps),
        "layout": rec.settings(),
        "trainer_nodes": rec.layout.trainer_nodes,
        "params": _delivery_json(pred.params),
        "allreduce": _allreduce_json(costs, cluster, rec.layout) if rec.layout.trainers > 1 else None,
        "scale": [
            {
                "cores": r.cores,
                "nodes": r.cluster.nodes,
                "actor_nodes": r.recommendation.layout.actor_nodes,
                "trainer_nodes": r.recommendation.layout.trainer_nodes,
                "env_steps_per_second": round(r.recommendation.prediction.steps_per_second, 1),
                "bottleneck": r.recommendation.prediction.bottleneck,
                "layout": r.recommendation.settings(),
                "version_seconds": round(r.version_seconds, 6),
                "spend": _spend_json(spend(r.cluster, r.recommendation, cost), r.recommendation, target_steps),
                "flat": _delivery_json(r.flat),
                "hierarchical": _delivery_json(r.hierarchical),
            }
            for r in rows
        ],
    }


# ---------------------------------------------------------------------------------------------- text
def _si(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _secs(s: float) -> str:
    return f"{s * 1000:.3g} ms" if s < 1 else f"{s:.3g} s"


def _us(s: float) -> str:
    return f"{s * 1e6:.3g} us" if s < 1e-3 else _secs(s)


def spend_text(sp: Spend, rec: Recommendation, cost: CostConfig, target_steps: float | None) -> str:
    """``energy ...`` lines of a layout: per million env steps, power, money per hour, and to a target."""
    text = (
        f"energy      {sp.joules_per_million_steps / 1e3:,.3g} kJ per 1M env steps at {_si(sp.watts)}W "
        f"({sp.cores:,} cores at {cost.watts_per_core:g} W"
        + (f", {sp.gpus:,} GPUs at {cost.watts_per_gpu:g} W" if sp.gpus else "")
        + ": the cost model)"
        + ("" if sp.money_per_hour is None else f"; {sp.money_per_hour:,.4g} per hour")
    )
    if target_steps is not None:
        t = sp.to_target(target_steps, rec.prediction.steps_per_second)
        money = "" if t["money"] is None else f", {t['money']:,.4g} in money"
        text += f"\nto target   {target_steps:,.0f} env steps: {_hours(t['hours'])}, {t['kilojoules']:,.4g} kJ{money}"
    return text


def _hours(h: float | None) -> str:
    return "-" if h is None else (f"{h * 60:.3g} min" if h < 1 else f"{h:,.3g} h")


def ladder_text(ladder: list[tuple[Cluster, Recommendation, Spend]], cost: CostConfig, target: float | None) -> str:
    """The energy ranking: the recommended layout on 1, 2, 4, ... nodes, least energy per env step first."""
    lines = [
        "energy ranking (the recommended layout on fewer of the nodes; the cost model's watts)",
        f"{'nodes':>7} {'env steps/s':>11} {'bottleneck':>10} {'power':>8} {'kJ/1M steps':>11}"
        + (f" {'to target':>10} {'kJ to target':>12}" if target is not None else "")
        + (f" {'money/h':>9}" if cost.priced else ""),
    ]
    for c, rec, sp in ladder:
        line = (
            f"{c.nodes:>7,} {_si(rec.prediction.steps_per_second):>11} {rec.prediction.bottleneck:>10} "
            f"{_si(sp.watts) + 'W':>8} {sp.joules_per_million_steps / 1e3:>11,.4g}"
        )
        if target is not None:
            t = sp.to_target(target, rec.prediction.steps_per_second)
            line += f" {_hours(t['hours']):>10} {t['kilojoules']:>12,.4g}"
        if sp.money_per_hour is not None:
            line += f" {sp.money_per_hour:>9,.4g}"
        lines.append(line)
    return "\n".join(lines)


def plan_text(
    costs: Costs,
    cluster: Cluster,
    rec: Recommendation,
    rows: list[ScaleRow],
    cost: CostConfig,
    target_steps: float | None = None,
) -> str:
    pred, lay = rec.prediction, rec.layout
    speed = f", GPU update speed-up {costs.gpu_update_speedup:g}x" if costs.gpu_update_speedup else ""
    if costs.device_update_seconds_per_sample is not None:
        speed = f", GPU update {_us(costs.device_update_seconds_per_sample)}/sample measured on {costs.device}"
    lines = [
        f"srl plan: {costs.env_id} on {cluster.nodes} node(s) x {cluster.cores_per_node} cores, "
        f"{cluster.gpus_per_node} GPU(s)/node, {cluster.link_gbps:g} Gbit/s links{speed}"
        + ("" if cluster.shared_cores is None else f", all on one machine of {cluster.shared_cores} cores"),
        f"costs: env {_us(costs.env_seconds_per_step)}/step (+{_us(costs.actor_seconds_per_step)} actor), "
        f"inference {_us(costs.inference_seconds_per_batch)}/call + {_us(costs.inference_seconds_per_sample)}/sample, "
        f"update {_us(costs.update_seconds_per_sample)}/sample, {costs.bytes_per_sample:.0f} B/sample, "
        f"snapshot {_bytes(costs.param_bytes)}{_replay_costs(costs)}",
        "",
        f"predicted   {pred.steps_per_second:,.0f} env steps/s   bottleneck: {pred.bottleneck}",
        "stages      " + " | ".join(f"{s} {_si(pred.stages[s])}" for s in STAGES) + "   (env steps/s each)",
        spend_text(spend(cluster, rec, cost), rec, cost, target_steps),
        "",
        "recommended layout"
        + (
            f" ({lay.trainer_nodes} trainer node(s), {lay.actor_nodes} actor node(s){_idle(cluster, lay)})"
            if lay.trainer_nodes
            else " (one node: the local runtime's keys)"
        ),
        *[f"  {k:<30} {v}" for k, v in rec.settings().items()],
    ]
    if costs.gradient_bytes is None:
        lines.append(
            "  note: the costs file has no all-reduce measurement: one trainer only (srl bench costs measures it)"
        )
    if lay.trainers > 1:
        reduce = _allreduce_json(costs, cluster, lay)
        where = "across the network" if lay.trainer_nodes > 1 else "on the node"
        lines.append(
            f"  all-reduce: {lay.trainers} trainers {where}, {_secs(reduce['seconds'])} per reduction x "
            f"{costs.reductions_per_update} per update; each trainer updates "
            f"{reduce['trainer_efficiency']:.0%} of its time (waits for stragglers not counted)"
        )
    if lay.envs_per_slot != costs.envs_per_slot and not costs.samples_per_insert:
        lines.append(
            f"  note: envs_per_slot {costs.envs_per_slot} -> {lay.envs_per_slot} with batch_segments "
            f"{lay.batch_segments}: each trainer's PPO batch stays {trainer_batch(costs, lay):,.0f} samples"
        )
    lines += [
        "",
        f"parameter service at scale (nodes of {cluster.cores_per_node} cores; lag = delivery / "
        "time between versions, in versions)",
        _scale_header(),
    ]
    lines += [_scale_line(r, spend(r.cluster, r.recommendation, cost)) for r in rows]
    return "\n".join(lines)


def _replay_costs(costs: Costs) -> str:
    """The replay worker's costs, where the config has a replay."""
    if not costs.samples_per_insert:
        return ""
    return (
        f", replay insert {_us(costs.replay_insert_seconds_per_step)}/step + "
        f"sample {_us(costs.replay_sample_seconds_per_item)}/item x {costs.samples_per_insert:g} per insert"
    )


def given_text(
    given: Recommendation,
    cluster: Cluster,
    cost: CostConfig,
    target_steps: float | None = None,
    title: str = "given layout",
) -> str:
    lay, pred = given.layout, given.prediction
    fields = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(lay).items())
    return (
        f"{title} ({fields})\n"
        f"predicted   {pred.steps_per_second:,.0f} env steps/s   bottleneck: {pred.bottleneck}\n"
        "stages      "
        + " | ".join(f"{s} {_si(pred.stages[s])}" for s in STAGES)
        + "\n"
        + spend_text(spend(cluster, given, cost), given, cost, target_steps)
    )


def _idle(cluster: Cluster, lay: Layout) -> str:
    idle = cluster.nodes - lay.actor_nodes - lay.trainer_nodes
    return f"; {idle} node(s) would add nothing" if idle else ""


def scale_markdown(rows: list[ScaleRow], cost: CostConfig) -> str:
    """The scale table as Markdown: per row the nodes used, each actor node's split, trainers, the prediction,
    the power and energy per million env steps of the nodes used (the cost model), and the parameter service flat
    vs hierarchical (readers or relays, root egress per version, delivery, and in brackets the lag that delivery
    causes, in versions)."""
    lines = [
        "| cores | nodes (actor + trainer) | per actor node | trainers | env steps/s | bottleneck | power "
        "| kJ / 1M env steps | version every | flat: readers, root egress / version, delivery (lag) "
        "| hierarchical: relays, fan-out (depth), root egress / version, delivery (lag) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lay, pred, f, h = r.recommendation.layout, r.recommendation.prediction, r.flat, r.hierarchical
        used, sp = lay.actor_nodes + lay.trainer_nodes, spend(r.cluster, r.recommendation, cost)
        lines.append(
            f"| {r.cores:,} | {used:,} ({lay.actor_nodes:,} + {lay.trainer_nodes:,}) "
            f"| {lay.actors_per_node} actors, {lay.policy_workers_per_node} PW, {lay.envs_per_slot} envs/slot "
            f"| {lay.trainers:,} {lay.trainer_device.upper()} | {_si(pred.steps_per_second)} | {pred.bottleneck} "
            f"| {_si(sp.watts)}W | {sp.joules_per_million_steps / 1e3:,.3g} | {_secs(r.version_seconds)} "
            f"| {f.readers:,}, {_bytes(f.root_bytes)}, {_secs(f.seconds)} ({f.seconds / r.version_seconds:.2f}) "
            f"| {h.relays:,}, {h.fan_out} ({h.depth}), {_bytes(h.root_bytes)}, {_secs(h.seconds)} "
            f"({h.seconds / r.version_seconds:.2f}) |"
        )
    return "\n".join(lines)


def _scale_header() -> str:
    return (
        f"{'cores':>7} {'nodes':>6} {'env steps/s':>11} {'bottleneck':>10} {'kJ/1M steps':>11} {'version every':>13} | "
        f"{'flat: readers':>13} {'root egress':>11} {'delivery':>9} {'lag':>6} | "
        f"{'hier.: relays':>13} {'fan-out':>7} {'depth':>5} {'root egress':>11} {'delivery':>9} {'lag':>6}"
    )


def _scale_line(r: ScaleRow, sp: Spend) -> str:
    pred = r.recommendation.prediction
    f, h = r.flat, r.hierarchical
    return (
        f"{r.cores:>7,} {r.cluster.nodes:>6,} {_si(pred.steps_per_second):>11} {pred.bottleneck:>10} "
        f"{sp.joules_per_million_steps / 1e3:>11,.3g} {_secs(r.version_seconds):>13} | {f.readers:>13,} "
        f"{_bytes(f.root_bytes):>11} {_secs(f.seconds):>9} "
        f"{f.seconds / r.version_seconds:>6.2f} | {h.relays:>13,} {h.fan_out:>7} {h.depth:>5} "
        f"{_bytes(h.root_bytes):>11} {_secs(h.seconds):>9} {h.seconds / r.version_seconds:>6.2f}"
    )
