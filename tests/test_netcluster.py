"""The Ray runtime across a cluster of network namespaces (:mod:`srl.testing.netcluster`): a head with the trainers
and two actor nodes, each with its own address, its own ``/dev/shm`` and ``/tmp``, joined only by veth links.

The runs are ``srl train`` exactly as a user types it, started inside the head's namespaces; the cluster's
faults (a cut link, a crashed node) come from outside. Runs stop on conditions the test reads in the run's
files, never on a clock racing the machine's speed (the 20 s partition is the fault itself).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import last_record, worker_pids

from srl.api.config import load_config
from srl.runtime.plan import make_plan
from srl.system.remote_samples import segment_bytes
from srl.testing.netcluster import NetCluster, NetClusterError, Shape, main, netem_available, ray_settings, sweep

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.xdist_group("netcluster"),
    pytest.mark.slow,
    pytest.mark.skipif(
        sys.platform != "linux" or os.geteuid() != 0 or shutil.which("ip") is None,
        reason="network namespaces need Linux, root and iproute2 (CI runs as root on Linux)",
    ),
]
SAFETY_NET = 300.0
"""Seconds a wait below gives a broken run before failing; conditions, never this clock, decide how runs stop."""
PARTITION = 20.0
NAME = "test"


def _netns_left(name: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"srlnc-{name}-")]


def _links_left(name: str) -> list[str]:
    return [p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith(f"nc{name}")]


def _mounts_left(name: str) -> list[str]:
    return [
        line for line in Path("/proc/self/mountinfo").read_text().splitlines() if f"/srl-netcluster/{name}/" in line
    ]


@pytest.fixture(scope="module")
def cluster():
    c = NetCluster(3, NAME, cpus=2.0)
    c.up()
    try:
        yield c
    finally:
        c.down()
    assert not _netns_left(NAME) and not _links_left(NAME) and not _mounts_left(NAME), "the cluster left things behind"


def _sets(c: NetCluster, *more: str) -> list[str]:
    return [*ray_settings(c.address, actor_nodes=2), "run.log_interval_seconds=0.5", *more]


def _train(c: NetCluster, run: Path, *sets: str) -> subprocess.Popen[str]:
    """``srl train`` on CartPole from the head's namespace (its driver joins the cluster at ``ray.address``)."""
    argv = [sys.executable, "-m", "srl.cli.main", "train", str(ROOT / "configs" / "cartpole_ppo.yaml"), "--quiet"]
    argv += ["--run-dir", str(run), *[a for s in sets for a in ("--set", s)]]
    return c.popen(0, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _until(proc: subprocess.Popen[str], ready: Any, what: str) -> Any:
    deadline = time.monotonic() + SAFETY_NET
    while not (value := ready()):
        assert proc.poll() is None, f"the run ended while waiting for {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} within {SAFETY_NET:.0f} s"
        time.sleep(0.2)
    return value


def _node_of(c: NetCluster, host: str) -> int:
    return next(i for i in range(len(c.nodes)) if c.ip(i) == host)


def _endless_run_and_its_first_group(c: NetCluster, run: Path) -> tuple[subprocess.Popen[str], dict[str, Any], int]:
    """An endless CartPole run across the cluster, once it trains: its process, where each worker runs, and the
    node of group 0 (the one a fault will hit)."""
    proc = _train(c, run, *_sets(c, "run.target_return=null", "run.total_env_steps=1000000000"))
    try:
        workers = _until(proc, lambda: (w := worker_pids(run)) and "actor1" in w and w, "every worker placed")
        _until(proc, lambda: last_record(run).get("env_steps", 0) >= 2000, "training")
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, workers, _node_of(c, workers["actor0"]["host"])


def _stop(proc: subprocess.Popen[str], run: Path) -> dict[str, Any]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=SAFETY_NET)
    assert proc.returncode == 130, err
    return json.loads((run / "summary.json").read_text())


def test_cartpole_solves_across_nodes_each_with_its_own_shared_memory_and_the_samples_on_the_links(cluster, tmp_path):
    """Each group on its own node; a node's ``/dev/shm`` holds only its own group's segments (the actor nodes'
    pools, the head's parameter buffer); the samples cross the actor nodes' veth links; nothing is left after."""
    c, run = cluster, tmp_path / "run"
    before = [c.counters(i) for i in range(3)]
    proc = _train(c, run, *_sets(c))
    try:
        workers = _until(proc, lambda: (w := worker_pids(run)) and "actor1" in w and w, "every worker placed")
        _until(proc, lambda: last_record(run).get("env_steps", 0) > 0, "training")
        shm = [[s for s in c.shm(i) if s.startswith("srl_")] for i in range(3)]
        _, err = proc.communicate(timeout=SAFETY_NET)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["solved"] and summary["train_return_mean"] >= 475, summary
    assert summary["rejected_segment_messages"] == 0
    # the trainers, the root and the eval on the head; each actor group (actor, relay) on an actor node of its own
    assert {workers[w]["host"] for w in ("trainer0", "param_root0")} == {c.ip(0)}
    groups = [{workers[f"{r}{g}"]["host"] for r in ("actor", "relay")} for g in range(2)]
    assert all(len(g) == 1 for g in groups) and set().union(*groups) == {c.ip(1), c.ip(2)}
    # shared memory stays on its node: one run tag per node, no tag on two nodes, pools only on actor nodes
    tags = [{"_".join(s.split("_")[:3]) for s in names} for names in shm]
    assert all(len(t) == 1 for t in tags) and len(set().union(*tags)) == 3, shm
    assert not any("_pool_" in s for s in shm[0]) and all(any("_pool_" in s for s in shm[i]) for i in (1, 2)), shm
    assert not any(s.startswith("srl_") for i in range(3) for s in c.shm(i)), "segments outlived the run"
    # the sample stream's bytes went out through each actor node's link
    cfg = load_config(ROOT / "configs" / "cartpole_ppo.yaml", _sets(c))
    w = cfg.workers
    per_step = segment_bytes(make_plan(cfg).policies[0].layout.fields) / (w.segment_length * w.envs_per_slot)
    sent = [c.counters(i)["tx_bytes"] - before[i]["tx_bytes"] for i in range(3)]
    assert sent[1] + sent[2] >= per_step * summary["env_steps"], (sent, per_step, summary["env_steps"])
    assert min(sent[1], sent[2]) >= 0.2 * per_step * summary["env_steps"], sent  # both nodes sent their share


def test_a_partitioned_actor_node_returns_and_the_run_solves(cluster, tmp_path):
    """The node of group 0 is cut off for 20 s: the trainer goes on with the other node's samples, nothing
    leaves the cut node, and once the link is back the group feeds the trainer again and its relay catches up.
    The run has no target; the test stops it once it has seen all that and a return of 475 or more."""
    c, run = cluster, tmp_path / "run"
    proc, workers, victim = _endless_run_and_its_first_group(c, run)
    try:
        cut_at = last_record(run)
        c.cut(victim)
        sent_at = c.counters(victim)["tx_bytes"]  # read once the link is down: what was on its way is counted
        try:
            time.sleep(PARTITION)  # the fault: a partition of this length
            cut_sent = c.counters(victim)["tx_bytes"] - sent_at
            during = last_record(run)
        finally:
            c.restore(victim)
        back_at = c.counters(victim)["tx_bytes"]
        _until(proc, lambda: c.counters(victim)["tx_bytes"] - back_at > 256 * 1024, "samples from the cut node again")
        then = last_record(run)
        _until(
            proc,
            lambda: (r := last_record(run))["policy_version"] >= then["policy_version"] + 5 and r["return_mean"] >= 475,
            "more training and a return of 475",
        )
    finally:
        summary = _stop(proc, run) if proc.poll() is None else {}
    assert cut_sent == 0, "bytes left a cut node"
    assert during["env_steps"] > cut_at["env_steps"] + 1000, "training stopped with one node cut"
    assert during["policy_version"] > cut_at["policy_version"]
    assert summary["stop_reason"] == "interrupted", summary
    # the cut group's relay is fed again: it holds a version close to the newest
    relay = next(k for k, w in workers.items() if k.startswith("relay") and w["host"] == c.ip(victim))
    assert summary["param_service"][relay]["version"] >= summary["policy_version"] - 5, summary


def test_a_crashed_node_s_group_is_placed_again_when_the_node_returns(cluster, tmp_path):
    """Every process of group 0's node is killed (its shared memory lost with them): the run keeps training on
    the other node, and when the node starts again its group is placed there afresh and trains."""
    c, run = cluster, tmp_path / "run"
    proc, workers, victim = _endless_run_and_its_first_group(c, run)
    try:
        c.kill(victim)
        assert not c.pids(victim) and not c.shm(victim)
        lost = _until(
            proc, lambda: (r := last_record(run)).get("restarts", 0) >= 1 and r, "the run seeing its workers go"
        )
        _until(proc, lambda: last_record(run)["env_steps"] > lost["env_steps"] + 2000, "training on the other node")
        c.start(victim)
        back = _until(
            proc,
            lambda: (w := worker_pids(run)).get("actor0", {}).get("pid") not in (None, workers["actor0"]["pid"]) and w,
            "group 0 placed again",
        )
        then = last_record(run)
        _until(
            proc,
            lambda: (
                (r := last_record(run))["env_steps"] >= then["env_steps"] + 3000
                and r["policy_version"] >= then["policy_version"] + 5
            ),
            "training after the node's return",
        )
    finally:
        summary = _stop(proc, run) if proc.poll() is None else {}
    assert back["actor0"]["host"] == back["relay0"]["host"] == c.ip(victim)
    assert summary["restarts"].get("actor0", 0) >= 1 and summary["restarts"].get("actor1", 0) == 0, summary
    assert summary["param_service"]["relay0"]["version"] >= summary["policy_version"] - 5, summary
    assert not [s for s in c.shm(victim) if s.startswith("srl_")]  # the run's end freed the new group's memory


def test_random_kills_stalls_crashes_and_cuts_across_the_nodes_keep_every_invariant(cluster, tmp_path):
    """srl.testing.chaos on the cluster: workers killed and stalled, actor nodes crashed and cut off, at random env
    steps from the first checkpoint; the run still solves, with exit 0, restarts that match the kills, versions
    that never went back, and no process or shared memory left on any node."""
    from srl.testing.chaos import Schedule, run

    c = cluster
    faults = ("kill", "stall", "node", "cut")
    schedule = Schedule(seed=3, every=None, every_steps=5000, faults=faults, stall_seconds=2.0, outage_seconds=5.0)
    settings = _sets(c, "run.checkpoint_interval_seconds=1")
    config = ROOT / "configs" / "cartpole_ppo.yaml"
    report = run(config, tmp_path / "run", schedule, settings, expect_return=475, timeout=SAFETY_NET, cluster=c)
    assert report.ok, report.breaches
    assert sum(report.faults.values()) >= 3, report.faults
    log = [json.loads(line) for line in (tmp_path / "run" / "chaos.jsonl").read_text().splitlines()]
    crashed = [r for r in log if r.get("fault") == "node" and r["landed"]]
    assert all(r["workers"] for r in crashed)  # a crashed node held workers, each counted as killed
    assert all(not c.nodes[i].down and not c.nodes[i].cut for i in range(3))  # every node back after


def test_a_rate_limited_link_carries_no_more_than_its_rate(cluster):
    """Node 2's link shaped live to 8 Mbit/s: 2 MB from node 2 to the head take at least 2 s (tbf, which every
    kernel has); unshaped again, the same bytes take less."""
    c = cluster
    c.shape(2, Shape(rate_mbit=8.0))
    try:
        shaped = _send_seconds(c, 2, 0, 2_000_000)
    finally:
        c.shape(2, Shape())
    unshaped = _send_seconds(c, 2, 0, 2_000_000)
    assert shaped >= 2_000_000 * 8 / 8e6 / 1.15, shaped  # within the bucket's first burst of the rate
    assert unshaped < shaped


def _send_seconds(c: NetCluster, src: int, dst: int, nbytes: int) -> float:
    """Seconds node ``src`` takes to send ``nbytes`` to a receiver on node ``dst`` (the receiver times it)."""
    port = 47001
    receiver = c.popen(
        dst,
        [sys.executable, "-c", _RECEIVER, c.ip(dst), str(port), str(nbytes)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        sender = c.exec(src, [sys.executable, "-c", _SENDER, c.ip(dst), str(port), str(nbytes)], timeout=120)
        assert sender.returncode == 0, sender.stderr
        out, _ = receiver.communicate(timeout=120)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    return float(out.strip())


_RECEIVER = """
import socket, sys, time
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
conn, _ = srv.accept()
got, start = 0, None
while got < int(sys.argv[3]):
    chunk = conn.recv(1 << 16)
    if not chunk:
        break
    start = start or time.monotonic()
    got += len(chunk)
print(time.monotonic() - start)
"""
_SENDER = """
import socket, sys, time
for _ in range(200):
    try:
        s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
        break
    except ConnectionRefusedError:
        time.sleep(0.05)
s.sendall(bytes(int(sys.argv[3])))
s.close()
"""


def test_delay_and_loss_need_netem_and_say_so_in_one_line(cluster):
    c = cluster
    if netem_available():
        c.shape(1, Shape(delay_ms=5.0))
        try:
            rtt = c.exec(1, [sys.executable, "-c", _RTT, c.ip(0)], timeout=60)
        finally:
            c.shape(1, Shape())
        assert float(rtt.stdout) >= 0.005, rtt
    else:
        with pytest.raises(NetClusterError, match=r"^netcluster: this kernel has no netem qdisc \(sch_netem\)"):
            c.shape(1, Shape(delay_ms=5.0))
    for bad, field in ((Shape(rate_mbit=-1), "rate_mbit"), (Shape(loss_pct=101), "loss_pct")):
        with pytest.raises(NetClusterError, match=field):
            c.shape(1, bad)


_RTT = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
start = time.monotonic()
try:
    s.connect((sys.argv[1], 9))  # nothing listens: the refusal comes back after one round trip
except OSError:
    pass
print(time.monotonic() - start)
"""


def test_the_command_sweeps_what_a_killed_harness_left_and_names_what_is_wrong(capsys):
    """A harness killed half way leaves namespaces, links and mounts; ``down`` (and the next ``up``) removes them
    all. Verbs on a cluster that is not up, and bad nodes, get one line and exit 2."""
    half = NetCluster(2, "swept")
    half._make()  # what a harness killed before ``ray start`` leaves
    assert _netns_left("swept") and _links_left("swept") and _mounts_left("swept")
    assert main(["--name", "swept", "down"]) == 0
    assert not _netns_left("swept") and not _links_left("swept") and not _mounts_left("swept")
    sweep("swept")  # and again: nothing to do is fine
    assert main(["--name", "absent", "status"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: netcluster: no cluster named 'absent' is up (no /run/srl-netcluster/absent/state.json)"]
    for bad in (lambda: NetCluster(1), lambda: NetCluster(2, "Bad-Name")):
        with pytest.raises(NetClusterError):
            bad()


def test_a_node_with_its_own_tmp_still_runs_an_interpreter_from_a_virtualenv_under_tmp(tmp_path):
    """A virtualenv under ``/tmp`` (as a CI job makes one): a node whose ``/tmp`` is its own still finds the
    interpreter there, and srl with it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    script = (
        "import sys\n"
        "from srl.testing.netcluster import NetCluster, sweep\n"
        "c = NetCluster(2, 'venv')\n"
        "try:\n"
        "    c._make()\n"
        "    out = c.exec(1, [sys.executable, '-c', 'import srl, sys; print(sys.prefix)'], timeout=60)\n"
        "    print(out.returncode, out.stdout.strip(), out.stderr.strip()[-300:])\n"
        "finally:\n"
        "    sweep('venv')\n"
    )
    python = venv / "bin" / "python"
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["0", str(venv)], out.stdout
    assert not _netns_left("venv") and not _mounts_left("venv")


def test_without_root_it_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["--name", "noroot", "up", "--nodes", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: netcluster needs root (network namespaces, veth links and mounts); run it as root"
    ]
    assert not _netns_left("noroot")


def test_no_node_has_a_route_off_the_machine(cluster):
    """Each node knows only the bridge's subnet: no default route, so its traffic reaches the other nodes only."""
    for i in range(3):
        routes = cluster.exec(i, ["ip", "-4", "route"]).stdout.strip().splitlines()
        assert routes == [f"198.18.0.0/24 dev eth0 proto kernel scope link src {cluster.ip(i)}"]
