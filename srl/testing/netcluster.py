"""A Ray cluster on one machine whose nodes do not share what real nodes do not share.

``ray.cluster_utils.Cluster`` starts several Ray nodes as processes of one host: they share ``/dev/shm``, the
loopback interface and every port, so a stream that quietly relied on another node's shared memory, or a
parameter service that floods a thin link, passes every test. Here each node is

- a network namespace on a bridge, with its own address in 198.18.0.0/15 (reserved for network benchmarks) and
  no route anywhere else, so its traffic goes only to the other nodes, through its veth pair, whose interface
  counters say how many bytes crossed;
- a mount namespace with a private tmpfs on ``/dev/shm`` (and on ``/tmp`` for every node but the head, which
  keeps the machine's files: it is where ``srl train`` runs and writes its run directory);
- one ``ray start`` (the head on node 0 with the trainers' resource, the others with the actors').

Each node's link can be shaped live: its rate both ways with ``tbf``, and its uplink's delay, jitter and loss
with ``netem`` where the kernel has it (a kernel without ``sch_netem`` gets one line saying so; rate shaping
and the faults below need only what every kernel has). Faults: cut a node off (its link down) and restore it,
kill every process of a node (a crash: its ``/dev/shm`` and ``/tmp`` are lost with them) and start it again.

Everything is made with iproute2, ``unshare`` and ``nsenter`` (util-linux), so it needs root, or says in one
line that it cannot. ``down`` removes namespaces, links, mounts and processes; ``up`` first sweeps what a killed
run of the same name left. As a command::

    python -m srl.testing.netcluster up --nodes 3 [--rate-mbit 100] [--delay-ms 5]
    python -m srl.testing.netcluster exec 0 -- srl train configs/cartpole_ppo.yaml --set runtime=ray \\
        --set ray.address=198.18.0.1:6379 --set ray.actor_nodes=2 --set ray.node_resource=srl_actor \\
        --set ray.trainer_resource=srl_trainer
    python -m srl.testing.netcluster status | shape 1 --rate-mbit 10 | cut 1 --seconds 20 | kill 1 | start 1
    python -m srl.testing.netcluster down
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_ROOT = Path("/run/srl-netcluster")
"""Where each cluster keeps its state file and the handles of its nodes' mount namespaces (a private mount, so
the handles can be bind mounts)."""
SUBNET = "198.18.0"
"""Node ``i`` is ``198.18.0.(i+1)/24``: the benchmark range (RFC 2544), routed nowhere."""
RAY_PORT = 6379
TRAINER_RESOURCE = "srl_trainer"
ACTOR_RESOURCE = "srl_actor"
START_TIMEOUT = 120.0
"""How long the whole cluster may take to register every node with the head."""


class NetClusterError(RuntimeError):
    """What went wrong, in one line."""


@dataclass
class Shape:
    """One node's link. ``rate_mbit`` limits both directions; ``delay_ms`` (with ``jitter_ms``) is added to every
    packet the node sends, so a hop between two nodes with the same shape takes ``delay_ms`` each way; ``loss_pct``
    drops that share of the packets it sends. All zero: unshaped."""

    rate_mbit: float = 0.0
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0

    def check(self) -> None:
        for name, value in asdict(self).items():
            if not value >= 0:
                raise NetClusterError(f"link shape: {name} must be >= 0, got {value}")
        if self.loss_pct > 100:
            raise NetClusterError(f"link shape: loss_pct must be <= 100, got {self.loss_pct}")
        if self.jitter_ms and not self.delay_ms:
            raise NetClusterError("link shape: jitter_ms needs a delay_ms")

    @property
    def needs_netem(self) -> bool:
        return bool(self.delay_ms or self.loss_pct)


@dataclass
class Node:
    index: int
    cpus: float
    resources: dict[str, float]
    shape: Shape = field(default_factory=Shape)
    down: bool = False
    """Killed (or never started) and not started again."""
    cut: bool = False


def _run(argv: Sequence[str], check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(argv), capture_output=True, text=True)
    if check and out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()
        raise NetClusterError(f"{' '.join(argv)}: {why[-1] if why else f'exit {out.returncode}'}")
    return out


def require_privileges() -> None:
    """One line, naming what is missing, when this machine cannot make namespaces."""
    if sys.platform != "linux":
        raise NetClusterError(f"netcluster needs Linux network and mount namespaces; this is {sys.platform}")
    if os.geteuid() != 0:
        raise NetClusterError("netcluster needs root (network namespaces, veth links and mounts); run it as root")
    for tool in ("ip", "tc", "nsenter", "unshare", "mount", "umount"):
        if shutil.which(tool) is None:
            raise NetClusterError(f"netcluster needs `{tool}` (iproute2 / util-linux), which is not on PATH")


def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (delay, jitter, loss); rate shaping needs only ``tbf``."""
    probe = "srlnc-probe"
    _run(["ip", "netns", "add", probe], check=False)
    try:
        out = _run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem"], check=False)
        return out.returncode == 0
    finally:
        _run(["ip", "netns", "del", probe], check=False)


class NetCluster:
    """``nodes`` Ray nodes on one machine, each in its own network and mount namespaces (see the module doc).

    ``cpus``: the CPUs each node's Ray claims (they share this machine's cores, as the namespaces do). Node 0 is
    the head and carries ``srl_trainer``; the others carry ``srl_actor``. Use it as a context manager, or call
    :meth:`up` and :meth:`down`. ``keep``: restart a node's Ray when its raylet exits while the node is neither cut
    nor killed (the head declared it dead during a partition), as a cluster manager restarts a failed pod.
    """

    def __init__(
        self,
        nodes: int = 3,
        name: str = "srl",
        cpus: float = 2.0,
        shape: Shape | None = None,
        shm_mb: int = 2048,
        object_store_mb: int = 256,
        keep: bool = True,
    ) -> None:
        if not 2 <= nodes <= 200:
            raise NetClusterError(f"netcluster: nodes must be within [2, 200], got {nodes}")
        if not (name.isalnum() and name.islower() and len(name) <= 6):
            raise NetClusterError(f"netcluster: name must be up to 6 lowercase letters or digits, got {name!r}")
        self.name, self.cpus, self.shm_mb, self.object_store_mb, self.keep = name, cpus, shm_mb, object_store_mb, keep
        shape = shape or Shape()
        shape.check()
        self.nodes = [
            Node(i, cpus, {TRAINER_RESOURCE if i == 0 else ACTOR_RESOURCE: 1.0}, Shape(**asdict(shape)))
            for i in range(nodes)
        ]
        self.state = STATE_ROOT / name
        self.token = secrets.token_hex(32)
        """Every node and driver of this cluster authenticates to Ray with it (Ray's token mode)."""
        self._lock = threading.Lock()
        self._keeper: threading.Thread | None = None
        self._stop_keeper = threading.Event()

    # ------------------------------------------------------------------ names
    def netns(self, i: int) -> str:
        return f"srlnc-{self.name}-n{i}"

    def host_link(self, i: int) -> str:
        """The host side of node ``i``'s veth pair (on the bridge); the node side is ``eth0`` in its namespace."""
        return f"nc{self.name}h{i}"

    @property
    def bridge(self) -> str:
        return f"nc{self.name}br"

    def ip(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    @property
    def address(self) -> str:
        """The head's GCS, for ``ray.address``."""
        return f"{self.ip(0)}:{RAY_PORT}"

    def _mnt(self, i: int) -> Path:
        return self.state / f"n{i}.mnt"

    def prefix(self, i: int) -> list[str]:
        """The command prefix that runs a program inside node ``i`` (its network and mount namespaces), in this
        process's folder (but for a folder under ``/tmp`` that the node does not keep (:func:`kept_in_tmp`), on a
        node with its own ``/tmp``: ``/`` there)."""
        here = Path.cwd()
        kept = i == 0 or not here.is_relative_to("/tmp") or any(here.is_relative_to(k) for k in kept_in_tmp())
        wd = here if kept else Path("/")
        return ["nsenter", f"--net=/run/netns/{self.netns(i)}", f"--mount={self._mnt(i)}", f"--wd={wd}", "--"]

    def env(self, i: int) -> dict[str, str]:
        """The environment of programs in node ``i``: its own temp folder, and Ray's workers at normal priority."""
        env = dict(os.environ)
        env["TMPDIR"] = str(self.state / "n0-tmp") if i == 0 else "/tmp"
        env["RAY_worker_niceness"] = "0"
        env["RAY_AUTH_MODE"], env["RAY_AUTH_TOKEN"] = "token", self.token  # the cluster's own secret
        env.pop("RAY_AUTH_TOKEN_PATH", None)
        for leaked in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_TMPDIR"):  # a caller's own Ray's
            env.pop(leaked, None)
        return env

    # ------------------------------------------------------------------ up / down
    def __enter__(self) -> NetCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self, timeout: float = START_TIMEOUT) -> NetCluster:
        """Make the namespaces, the bridge and the links, start Ray on every node and wait until the head has them
        all. Whatever fails on the way is torn down before the error is raised."""
        require_privileges()
        if any(n.shape.needs_netem for n in self.nodes) and not netem_available():
            raise NetClusterError(_NO_NETEM)
        sweep(self.name)
        try:
            self._make()
            for node in self.nodes:
                self._start_ray(node)
            self.wait_for_nodes(len(self.nodes), timeout)
        except BaseException:
            self.down()
            raise
        if self.keep:
            self._stop_keeper.clear()
            self._keeper = threading.Thread(target=self._keep, name=f"netcluster-{self.name}-keeper", daemon=True)
            self._keeper.start()
        return self

    def _make(self) -> None:
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        if not _is_private_mount(STATE_ROOT):  # mount-namespace handles may only be bound under a private mount
            _run(["mount", "--bind", str(STATE_ROOT), str(STATE_ROOT)])
            _run(["mount", "--make-private", str(STATE_ROOT)])
        self.state.mkdir(exist_ok=True)
        (self.state / "n0-tmp").mkdir(exist_ok=True)
        self._save()
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "link", "set", self.bridge, "up"])
        for node in self.nodes:
            i, ns = node.index, self.netns(node.index)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", self.host_link(i), "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "link", "set", self.host_link(i), "master", self.bridge, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            self._make_mounts(i)
            self._apply_shape(node)

    def _make_mounts(self, i: int) -> None:
        """A fresh mount namespace for node ``i`` with its own ``/dev/shm`` (and ``/tmp`` but on the head, with this
        package's checkout still in it when it lives there)."""
        mnt = self._mnt(i)
        if mnt.exists():
            _run(["umount", str(mnt)], check=False)
        mnt.touch()
        _run(["unshare", f"--mount={mnt}", "--propagation", "private", "true"])
        enter = ["nsenter", f"--mount={mnt}", "--"]
        _run(
            [*enter, "mount", "-t", "tmpfs", "-o", f"size={self.shm_mb}m,mode=1777", f"{self.netns(i)}-shm", "/dev/shm"]
        )
        if i == 0:
            return
        # The code and the interpreter are installed on every node, the rest of /tmp is not: what lives under /tmp
        # of those is held aside, /tmp replaced, and each moved back in at its path.
        keep = kept_in_tmp()
        holds = [self.state / f"n{i}-keep{k}" for k in range(len(keep))]
        for path, hold in zip(keep, holds, strict=True):
            hold.mkdir(exist_ok=True)
            _run([*enter, "mount", "--bind", str(path), str(hold)])
        _run([*enter, "mount", "-t", "tmpfs", "-o", "size=4g,mode=1777", f"{self.netns(i)}-tmp", "/tmp"])
        for path, hold in zip(keep, holds, strict=True):
            _run([*enter, "mkdir", "-p", str(path)])
            _run([*enter, "mount", "--move", str(hold), str(path)])

    def _save(self) -> None:
        data = {"name": self.name, "nodes": [asdict(n) for n in self.nodes], "address": self.address}
        data["token"] = self.token
        tmp = self.state / "state.json.tmp"
        tmp.touch(mode=0o600)
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(self.state / "state.json")

    def down(self) -> None:
        """Stop every node's processes and remove the namespaces, links, mounts and state (every exit path)."""
        self._stop_keeper.set()
        if self._keeper is not None:
            self._keeper.join(timeout=10.0)
            self._keeper = None
        sweep(self.name)

    # ------------------------------------------------------------------ Ray
    def _start_ray(self, node: Node) -> None:
        i = node.index
        argv = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            f"--node-ip-address={self.ip(i)}",
            f"--num-cpus={node.cpus:g}",
            f"--resources={json.dumps(node.resources)}",
            f"--object-store-memory={self.object_store_mb * 2**20}",
            "--disable-usage-stats",
        ]
        if i == 0:
            argv += ["--head", f"--port={RAY_PORT}", "--include-dashboard=false", f"--temp-dir={self.state / 'n0-ray'}"]
        else:
            argv += [f"--address={self.address}"]
        out = subprocess.run([*self.prefix(i), *argv], capture_output=True, text=True, env=self.env(i))
        if out.returncode != 0:
            why = [line for line in (out.stderr + out.stdout).splitlines() if line.strip()]
            raise NetClusterError(f"node {i}: ray start failed: {why[-1] if why else out.returncode}")
        node.down = False
        self._save()

    def wait_for_nodes(self, count: int, timeout: float = START_TIMEOUT) -> None:
        """Wait until the head counts ``count`` live nodes."""
        deadline = time.monotonic() + timeout
        script = (
            "import ray,sys,time\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False)\n"
            f"d = time.monotonic() + {timeout}\n"
            f"while sum(n['Alive'] for n in ray.nodes()) < {count} and time.monotonic() < d: time.sleep(0.5)\n"
            "print(sum(n['Alive'] for n in ray.nodes()))\n"
        )
        while True:
            out = self.exec(0, [sys.executable, "-c", script], timeout=timeout + 30)
            alive = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
            if alive and int(alive[0]) >= count:
                return
            if time.monotonic() > deadline:
                why = alive[0] + " alive" if alive else (out.stderr.strip().splitlines() or ["no answer"])[-1]
                raise NetClusterError(f"netcluster: the head did not see {count} nodes within {timeout:.0f} s ({why})")
            time.sleep(1.0)

    def raylet_alive(self, i: int) -> bool:
        return any(_comm(pid) == "raylet" for pid in self.pids(i))

    def _keep(self) -> None:
        """Restart Ray on a node whose raylet exited while nobody cut or killed it (the head declared it dead)."""
        while not self._stop_keeper.wait(1.0):
            for node in self.nodes:
                with self._lock:
                    if node.down or node.cut or self.raylet_alive(node.index):
                        continue
                    self._kill_processes(node.index)
                    try:
                        self._start_ray(node)
                    except NetClusterError:
                        pass  # tried again in a second

    # ------------------------------------------------------------------ programs in a node
    def exec(self, i: int, argv: Sequence[str], timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside node ``i`` to its end; its output is captured."""
        return subprocess.run(
            [*self.prefix(i), *argv], capture_output=True, text=True, env=self.env(i), timeout=timeout
        )

    def popen(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside node ``i``."""
        kwargs.setdefault("env", self.env(i))
        return subprocess.Popen([*self.prefix(i), *argv], **kwargs)

    def pids(self, i: int) -> list[int]:
        """Every process in node ``i``'s network namespace."""
        return _netns_pids(self.netns(i))

    def shm(self, i: int) -> list[str]:
        """What node ``i``'s ``/dev/shm`` holds."""
        out = _run([*self.prefix(i), "ls", "-A", "/dev/shm"], check=False)
        return out.stdout.split()

    def counters(self, i: int) -> dict[str, int]:
        """Bytes and packets node ``i`` has sent (``tx``) and received (``rx``) over its link, read on the host
        side of its veth pair."""
        stats = Path("/sys/class/net") / self.host_link(i) / "statistics"
        # the host side receives what the node sends
        return {
            "tx_bytes": int((stats / "rx_bytes").read_text()),
            "rx_bytes": int((stats / "tx_bytes").read_text()),
            "tx_packets": int((stats / "rx_packets").read_text()),
            "rx_packets": int((stats / "tx_packets").read_text()),
        }

    # ------------------------------------------------------------------ faults and shapes
    def shape(self, i: int, shape: Shape) -> None:
        """Change node ``i``'s link now (a live run keeps going)."""
        shape.check()
        if shape.needs_netem and not netem_available():
            raise NetClusterError(_NO_NETEM)
        node = self.nodes[i]
        node.shape = shape
        self._apply_shape(node)
        self._save()

    def _apply_shape(self, node: Node) -> None:
        s, ns, host = node.shape, self.netns(node.index), self.host_link(node.index)
        inside = ["ip", "netns", "exec", ns]
        _run([*inside, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        _run(["tc", "qdisc", "del", "dev", host, "root"], check=False)
        tbf = ["tbf", "rate", f"{s.rate_mbit:g}mbit", "burst", f"{_burst_bytes(s.rate_mbit)}", "latency", "200ms"]
        if s.needs_netem:  # uplink: netem (delay, jitter, loss) with the rate limit below it
            netem = ["netem", "limit", "100000"]
            if s.delay_ms:
                netem += ["delay", f"{s.delay_ms:g}ms"] + ([f"{s.jitter_ms:g}ms"] if s.jitter_ms else [])
            if s.loss_pct:
                netem += ["loss", f"{s.loss_pct:g}%"]
            _run([*inside, "tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", *netem])
            if s.rate_mbit:
                _run([*inside, "tc", "qdisc", "add", "dev", "eth0", "parent", "1:", "handle", "2:", *tbf])
        elif s.rate_mbit:
            _run([*inside, "tc", "qdisc", "add", "dev", "eth0", "root", *tbf])
        if s.rate_mbit:  # downlink
            _run(["tc", "qdisc", "add", "dev", host, "root", *tbf])

    def cut(self, i: int, seconds: float | None = None) -> None:
        """Cut node ``i`` off (its link down: nothing in or out); with ``seconds``, restore it then (blocking)."""
        with self._lock:
            self.nodes[i].cut = True
            _run(["ip", "link", "set", self.host_link(i), "down"])
            self._save()
        if seconds is not None:
            time.sleep(seconds)
            self.restore(i)

    def restore(self, i: int) -> None:
        with self._lock:
            _run(["ip", "link", "set", self.host_link(i), "up"])
            self.nodes[i].cut = False
            self._save()

    def kill(self, i: int) -> None:
        """Crash node ``i``: SIGKILL every process in it, and lose its ``/dev/shm`` and ``/tmp`` (a fresh mount
        namespace for :meth:`start`). It stays down until :meth:`start`."""
        with self._lock:
            self.nodes[i].down = True
            self._kill_processes(i)
            self._make_mounts(i)
            self._save()

    def start(self, i: int) -> None:
        """Start Ray on node ``i`` again (after :meth:`kill`)."""
        with self._lock:
            self._start_ray(self.nodes[i])

    def _kill_processes(self, i: int) -> None:
        _kill_netns(self.netns(i))

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "nodes": [
                {
                    "node": n.index,
                    "ip": self.ip(n.index),
                    "netns": self.netns(n.index),
                    "raylet": self.raylet_alive(n.index),
                    "processes": len(self.pids(n.index)),
                    "cut": n.cut,
                    "shape": asdict(n.shape),
                    **self.counters(n.index),
                }
                for n in self.nodes
            ],
        }

    @classmethod
    def attach(cls, name: str = "srl") -> NetCluster:
        """The cluster ``up`` left running under ``name`` (for the command's other verbs)."""
        path = STATE_ROOT / name / "state.json"
        if not path.exists():
            raise NetClusterError(f"netcluster: no cluster named {name!r} is up (no {path})")
        data = json.loads(path.read_text())
        nodes = data["nodes"]
        cluster = cls(len(nodes), name, float(nodes[0]["cpus"]), keep=False)
        cluster.token = str(data["token"])
        for node, saved in zip(cluster.nodes, nodes, strict=True):
            node.shape, node.down, node.cut = Shape(**saved["shape"]), bool(saved["down"]), bool(saved["cut"])
        return cluster


_NO_NETEM = (
    "netcluster: this kernel has no netem qdisc (sch_netem), so links cannot be given delay, jitter or loss; "
    "rate limits (tbf) and cuts still work"
)


def kept_in_tmp() -> list[Path]:
    """What a node with a ``/tmp`` of its own must still find there: this package's checkout and the interpreter's
    environment (a virtualenv's prefix, or the Python build under it), where they live under ``/tmp``. Without
    them a node could not start ``sys.executable`` ("nsenter: failed to execute .../bin/python"), nor import srl.
    The outermost paths only: one holds the others."""
    found = {Path(__file__).resolve().parents[2], *(Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix))}
    under = [p for p in found if p.is_relative_to("/tmp") and p != Path("/tmp")]
    return sorted(p for p in under if not any(p != q and p.is_relative_to(q) for q in under))


def _burst_bytes(rate_mbit: float) -> int:
    """A token bucket deep enough for the rate at a 1 ms timer (and at least a few full frames)."""
    return max(32 * 1024, int(rate_mbit * 1e6 / 8 / 1000))


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _is_private_mount(path: Path) -> bool:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        parts = line.split()
        if parts[4] == str(path):
            return not any(opt.startswith("shared:") for opt in parts[6 : parts.index("-")])
    return False


def _netns_pids(ns: str) -> list[int]:
    return [int(p) for p in _run(["ip", "netns", "pids", ns], check=False).stdout.split()]


def _kill_netns(ns: str) -> None:
    """SIGKILL every process in network namespace ``ns`` until none is left (10 s at most)."""
    deadline = time.monotonic() + 10.0
    while (pids := _netns_pids(ns)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def ray_settings(address: str, actor_nodes: int, actors_per_node: int = 1) -> list[str]:
    """The ``--set`` keys that place a run on such a cluster: trainers on the head (``srl_trainer``),
    ``actors_per_node`` actors on each of ``actor_nodes`` actor nodes (``srl_actor``)."""
    return [
        "runtime=ray",
        f"ray.address={address}",
        f"ray.actor_nodes={actor_nodes}",
        f"ray.actors_per_node={actors_per_node}",
        f"ray.node_resource={ACTOR_RESOURCE}",
        f"ray.trainer_resource={TRAINER_RESOURCE}",
    ]


def sweep(name: str) -> None:
    """Remove everything cluster ``name`` made: its processes, namespaces, links, mounts and state. Safe to call on
    a cluster that is half made, gone already, or left by a killed run."""
    prefix = f"srlnc-{name}-n"
    names = [line.split()[0] for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines() if line]
    mine = [ns for ns in names if ns.startswith(prefix) and ns[len(prefix) :].isdigit()]
    for ns in mine:  # processes first, so nothing holds a mount or a socket
        _kill_netns(ns)
    links = Path("/sys/class/net")
    for link in links.iterdir() if links.is_dir() else ():  # deleting one end of a veth pair deletes both, now
        if link.name.startswith(f"nc{name}h") and link.name[len(name) + 3 :].isdigit():
            _run(["ip", "link", "del", link.name], check=False)
    for ns in mine:
        _run(["ip", "netns", "del", ns], check=False)
    _run(["ip", "link", "del", f"nc{name}br"], check=False)
    state = STATE_ROOT / name
    if state.is_dir():
        for mnt in state.glob("n*.mnt"):
            _run(["umount", str(mnt)], check=False)
        shutil.rmtree(state, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m srl.testing.netcluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="srl", help="the cluster's name (several can be up at once)")
    sub = parser.add_subparsers(dest="verb", required=True)
    up = sub.add_parser("up", help="make the nodes and start Ray on them")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--cpus", type=float, default=2.0, help="CPUs each node's Ray offers")
    for p in (up, shape := sub.add_parser("shape", help="change one node's link now")):
        p.add_argument("--rate-mbit", type=float, default=0.0)
        p.add_argument("--delay-ms", type=float, default=0.0)
        p.add_argument("--jitter-ms", type=float, default=0.0)
        p.add_argument("--loss-pct", type=float, default=0.0)
    shape.add_argument("node", type=int)
    sub.add_parser("down", help="remove everything the cluster made")
    sub.add_parser("status", help="nodes, processes, links and byte counters (JSON)")
    cut = sub.add_parser("cut", help="cut a node off; restore it after --seconds")
    cut.add_argument("node", type=int)
    cut.add_argument("--seconds", type=float, default=None)
    for verb, text in (
        ("restore", "bring a cut node back"),
        ("kill", "kill every process of a node"),
        ("start", "start Ray on a killed node"),
    ):
        sub.add_parser(verb, help=text).add_argument("node", type=int)
    run = sub.add_parser("exec", help="run a command inside a node")
    run.add_argument("node", type=int)
    run.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        require_privileges()
        if args.verb == "up":
            s = Shape(args.rate_mbit, args.delay_ms, args.jitter_ms, args.loss_pct)
            cluster = NetCluster(args.nodes, args.name, args.cpus, s, keep=False).up()
            print(f"netcluster {args.name}: {args.nodes} nodes up; ray.address={cluster.address}")
            return 0
        if args.verb == "down":
            sweep(args.name)
            return 0
        cluster = NetCluster.attach(args.name)
        if not 0 <= getattr(args, "node", 0) < len(cluster.nodes):
            raise NetClusterError(f"netcluster: node must be within [0, {len(cluster.nodes) - 1}], got {args.node}")
        if args.verb == "status":
            print(json.dumps(cluster.status(), indent=1))
        elif args.verb == "shape":
            cluster.shape(args.node, Shape(args.rate_mbit, args.delay_ms, args.jitter_ms, args.loss_pct))
        elif args.verb == "cut":
            cluster.cut(args.node, args.seconds)
        elif args.verb == "restore":
            cluster.restore(args.node)
        elif args.verb == "kill":
            cluster.kill(args.node)
        elif args.verb == "start":
            cluster.start(args.node)
        elif args.verb == "exec":
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            if not command:
                raise NetClusterError("netcluster exec: give the command after the node, e.g. `exec 0 -- ray status`")
            return subprocess.call([*cluster.prefix(args.node), *command], env=cluster.env(args.node))
        return 0
    except NetClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
