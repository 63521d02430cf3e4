"""Training throughput across a cluster of network namespaces (``srl.testing.netcluster``), beside the same layout
under ``ray.cluster_utils.Cluster`` and under the local runtime; and the parameter service's root egress measured
on the head's link.

``train``: one trainer node (the head) and two actor nodes, one actor each, sharing this machine's cores as the
namespaces share them. Each setting is ``srl train CONFIG`` for ``--seconds`` of training (``run.max_train_seconds``:
start-up is not in the rate), rounds interleaved so a shared machine's drifts hit every setting alike. The links
are unshaped, or rate-limited both ways to each ``--rate-mbit`` (tbf); delay needs netem, which not every kernel
has (``--delay-ms`` then fails in one line). Each row records the env steps/s, which stream's bytes crossed
which link (samples out of the actor nodes, parameters out of the head), and the run's own counters.

``faults``: an endless CartPole run across the three nodes; the node of group 0 is cut off for ``--partition``
seconds, or crashed and started again; the seconds until its samples flow again, timed from outside.

``params``: a head and N actor nodes (2 actors each, inline inference: every actor reads parameters), flat
against hierarchical; the head's transmitted bytes per published version, read on its veth, beside the root's
own count.

    python scripts/bench_netcluster.py train --config configs/halfcheetah_ppo.yaml --config configs/pong_ppo_cpu.yaml \
        --seconds 45 --rounds 3 --rate-mbit 1000 --rate-mbit 100 --out docs/data/netcluster/train.jsonl
    python scripts/bench_netcluster.py params --config configs/halfcheetah_ppo.yaml --actor-nodes 2 --actor-nodes 4 \
        --seconds 30 --out docs/data/netcluster/params.jsonl
    python scripts/bench_netcluster.py faults --rounds 3 --out docs/data/netcluster/faults.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from srl.testing.netcluster import NetCluster, Shape, ray_settings

# before Ray is imported: a ray.cluster_utils cluster stays on loopback (else Ray resolves 127.0.0.1 to the machine's
# external address), as tests/test_ray.py keeps it
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

ROOT = Path(__file__).resolve().parents[1]
ENDLESS = ["run.target_return=null", "run.total_env_steps=1000000000", "run.eval_episodes=0", "run.tensorboard=false"]


def _train(prefix: Sequence[str], env: dict[str, str] | None, config: str, sets: Sequence[str]) -> dict[str, Any]:
    """``srl train`` to its summary (run in ``prefix``: a node's namespaces, or nothing)."""
    run = Path(tempfile.mkdtemp(prefix="srlnc-bench-"))
    argv = [*prefix, sys.executable, "-m", "srl.cli.main", "train", config, "--quiet", "--run-dir", str(run / "run")]
    argv += [a for s in sets for a in ("--set", s)]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(f"srl train failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
        return json.loads((run / "run" / "summary.json").read_text())
    finally:
        shutil.rmtree(run, ignore_errors=True)


def _row(summary: dict[str, Any], **more: Any) -> dict[str, Any]:
    keep = ("train_fps", "env_steps", "trained_samples", "trained_samples_per_second", "policy_version", "bottleneck")
    keep += ("dropped_segments", "bytes_published_per_version", "param_service")
    return {**{k: summary.get(k) for k in keep}, **more}


def _on_netcluster(c: NetCluster, config: str, sets: Sequence[str]) -> dict[str, Any]:
    before = [c.counters(i) for i in range(len(c.nodes))]
    summary = _train(c.prefix(0), c.env(0), config, sets)
    after = [c.counters(i) for i in range(len(c.nodes))]
    moved = [{k: after[i][k] - before[i][k] for k in ("tx_bytes", "rx_bytes")} for i in range(len(c.nodes))]
    return _row(summary, links=moved)


def cmd_train(args: argparse.Namespace) -> None:
    # every setting runs the same workers: two actors inferring inline, one trainer
    common = [*ENDLESS, f"run.max_train_seconds={args.seconds}", "workers.policy_workers=0", *args.overrides]
    shapes = [] if args.only_netcluster else [("unshaped", Shape())]
    shapes += [(f"{r:g} Mbit/s", Shape(rate_mbit=r, delay_ms=args.delay_ms)) for r in args.rate_mbit]
    for rnd in range(args.rounds):
        for config in args.config:
            record = {"config": config, "round": rnd, "seconds": args.seconds}
            if not args.only_netcluster:
                local = _train([], None, config, [*common, "runtime=local", "workers.actors=2"])
                _emit(args.out, {**record, "setting": "local", **_row(local)})
                _emit(args.out, {**record, "setting": "ray.cluster_utils", **_on_ray_cluster(config, common)})
            with NetCluster(3, "bench", cpus=args.cpus, keep=False) as c:
                for label, shape in shapes:
                    for i in range(3):
                        c.shape(i, shape)
                    row = _on_netcluster(c, config, [*common, *ray_settings(c.address, 2, 1)])
                    _emit(args.out, {**record, "setting": f"netcluster {label}", "shape": shape.__dict__, **row})


def _on_ray_cluster(config: str, common: Sequence[str]) -> dict[str, Any]:
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"srl_trainer": 1}, "node_ip_address": "127.0.0.1"},
    )
    try:
        for _ in range(2):
            c.add_node(num_cpus=2, resources={"srl_actor": 1}, node_ip_address="127.0.0.1")
        c.wait_for_nodes()
        env = dict(os.environ, RAY_worker_niceness="0")
        return _row(_train([], env, config, [*common, *ray_settings(c.address, 2, 1)]))
    finally:
        c.shutdown()


def cmd_params(args: argparse.Namespace) -> None:
    common = [*ENDLESS, f"run.max_train_seconds={args.seconds}", *args.overrides]
    for nodes in args.actor_nodes:
        with NetCluster(nodes + 1, "bench", cpus=args.cpus, keep=False) as c:
            for mode in ("flat", "hierarchical"):
                sets = [*common, *ray_settings(c.address, nodes, 2), f"params.mode={mode}", "workers.policy_workers=0"]
                row = _on_netcluster(c, args.config, sets)
                versions = max(1, int(row["policy_version"] or 0))
                row["head_tx_bytes_per_version"] = row["links"][0]["tx_bytes"] / versions
                root = (row["param_service"] or {}).get("param_root", {})
                row["root_counted_bytes_per_version"] = root.get("bytes_sent", 0) / versions
                _emit(args.out, {"config": args.config, "actor_nodes": nodes, "actors": 2 * nodes, "mode": mode, **row})


def cmd_faults(args: argparse.Namespace) -> None:
    """The faults of tests/test_netcluster.py on an endless CartPole run, timed: a partition of ``--partition`` s
    and a crashed node, each with the seconds until the node's samples flow again (its link's transmitted bytes
    rise by 64 KiB), and for the crash until its group is placed again."""
    sets = ["run.target_return=null", "run.total_env_steps=1000000000", "run.log_interval_seconds=0.2", *args.overrides]
    for rnd in range(args.rounds):
        for fault in ("partition", "crash"):
            with NetCluster(3, "bench", cpus=args.cpus) as c:
                run = Path(tempfile.mkdtemp(prefix="srlnc-fault-")) / "run"
                argv = [sys.executable, "-m", "srl.cli.main", "train", args.config, "--quiet", "--run-dir", str(run)]
                argv += [a for s in [*sets, *ray_settings(c.address, 2, 1)] for a in ("--set", s)]
                proc = c.popen(0, argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    row = _fault(c, run, fault, args.partition)
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(300)
                summary = json.loads((run / "summary.json").read_text())
                row.update(restarts=summary["restarts"], env_steps=summary["env_steps"])
                _emit(args.out, {"config": args.config, "round": rnd, "fault": fault, **row})
                shutil.rmtree(run.parent, ignore_errors=True)


def _fault(c: NetCluster, run: Path, fault: str, partition: float) -> dict[str, Any]:
    def last() -> dict[str, Any]:
        lines = (run / "metrics.jsonl").read_text().split("\n")[:-1] if (run / "metrics.jsonl").exists() else []
        return json.loads(lines[-1]) if lines else {}

    def workers() -> dict[str, Any]:
        try:
            return json.loads((run / "workers.json").read_text())
        except (OSError, ValueError):
            return {}

    def until(ready: Any) -> float:
        deadline = time.monotonic() + 600
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{fault}: no recovery within 600 s")
            time.sleep(0.05)
        return time.monotonic()

    until(lambda: "actor1" in workers() and last().get("env_steps", 0) >= 2000)
    first = workers()
    victim = next(i for i in (1, 2) if c.ip(i) == first["actor0"]["host"])
    steps_before = last()["env_steps"]
    if fault == "partition":
        c.cut(victim, partition)
        back, sent = time.monotonic(), c.counters(victim)["tx_bytes"]
        flowing = until(lambda: c.counters(victim)["tx_bytes"] > sent + 65536)
        return {
            "seconds_cut": partition,
            "samples_back_s": round(flowing - back, 2),
            "steps_during_cut": last()["env_steps"] - steps_before,
        }
    killed = time.monotonic()
    c.kill(victim)
    noticed = until(lambda: last().get("restarts", 0) >= 1)
    c.start(victim)
    started, sent = time.monotonic(), c.counters(victim)["tx_bytes"]
    placed = until(lambda: workers().get("actor0", {}).get("pid") not in (None, first["actor0"]["pid"]))
    flowing = until(lambda: c.counters(victim)["tx_bytes"] > sent + 65536)
    return {
        "noticed_s": round(noticed - killed, 2),
        "ray_start_s": round(started - noticed, 2),
        "placed_s": round(placed - started, 2),
        "samples_back_s": round(flowing - started, 2),
    }


def _emit(out: Path, record: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(record) + "\n")
    brief = {k: record.get(k) for k in ("config", "setting", "mode", "actor_nodes", "train_fps")}
    print(json.dumps(brief), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    train = sub.add_parser("train")
    train.add_argument("--config", action="append", required=True)
    train.add_argument("--rounds", type=int, default=3)
    train.add_argument("--rate-mbit", type=float, action="append", default=[])
    train.add_argument("--delay-ms", type=float, default=0.0)
    train.add_argument("--only-netcluster", action="store_true", help="only the --rate-mbit rows")
    faults = sub.add_parser("faults")
    faults.add_argument("--config", default="configs/cartpole_ppo.yaml")
    faults.add_argument("--rounds", type=int, default=3)
    faults.add_argument("--partition", type=float, default=20.0)
    params = sub.add_parser("params")
    params.add_argument("--config", required=True)
    params.add_argument("--actor-nodes", type=int, action="append", required=True)
    for p in (train, params, faults):
        p.add_argument("--seconds", type=float, default=45.0)
        p.add_argument("--cpus", type=float, default=2.0, help="CPUs each node's Ray offers")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
        p.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    os.chdir(ROOT)
    {"train": cmd_train, "params": cmd_params, "faults": cmd_faults}[args.cmd](args)


if __name__ == "__main__":
    main()
