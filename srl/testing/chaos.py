"""Faults at random moments in a running run, and the run's invariants checked after it.

Each role has a test of its own where it is killed once, at a chosen moment. A long run meets faults at moments
nobody chose: one worker killed while another restarts, a trainer killed during a checkpoint, a stall during a
replay save. This harness starts ``srl train`` itself (the local runtime, or Ray where the config says so), and
from a seeded schedule injects, one after another:

- ``kill``: SIGKILL of a random worker of any role (``workers.json`` says which process is which);
- ``stall``: SIGSTOP of a random worker, then SIGCONT ``stall_seconds`` later;
- ``disk``: the run directory's disk filled up, then freed ``stall_seconds`` later. For this fault the run runs
  in a mount namespace of its own (``unshare --mount``, as root) with its run directory on a tmpfs of
  ``disk_mb`` (the namespace and the tmpfs go with the run's last process, whatever ends it); the harness
  reads the run's files through ``/proc/PID/root`` and fills that tmpfs, and the run directory is copied out
  when the run ends. A run's last writes wait up to 30 s for room; one that still cannot write its final
  checkpoint or summary ends with exit 1 (its printed summary says how it ended, and the error), the documented
  end for a disk full at that moment, and not counted as a breach;

and, on a cluster of network namespaces (:mod:`srl.testing.netcluster`, the run's driver on its head node):

- ``node``: a random actor node crashed (every process in it killed, its ``/dev/shm`` and ``/tmp`` lost), and
  Ray started on it again ``outage_seconds`` later;
- ``cut``: a random actor node's link down for ``outage_seconds``.

Faults start once every policy of the run (every population member) has a checkpoint (a trainer killed before its
first has nothing to restart from, which the run reports as fatal on purpose). The gap to the next fault is drawn
from an exponential law, its mean in seconds (``every``: a soak) or in env steps (``every_steps``: a run whose
faults do not depend on the machine's speed, as CI needs). Every fault is a line of ``chaos.jsonl`` in the run
directory: when, what, which worker and process, and whether it landed (the process was still there).

After the run the harness checks, and writes to ``chaos_report.json`` beside it:

- the run ended with exit 0 and no error;
- each worker's restarts in ``summary.json`` lie between the kills seen recovered (a new process in
  ``workers.json``) and the kills that landed (a crashed node's workers each count one; a cut may or may not
  cost its node's workers a restart, as Ray decides): no kill went unrestarted, no worker restarted without one;
- policy versions never went back (every policy's and population member's in ``metrics.jsonl``), nor the
  population's copies and decisions;
- a population's copies were never lost: one exploit record in ``population.jsonl`` per copy counted, and each
  member's values at the end the ones its last copy set;
- a replay never lost an item: its size never went back (its store lives in shared memory on the node and
  outlives its worker, so the bound on items lost to a replay worker's kill is 0);
- nothing was left: no process of the run, no shared-memory segment (on any node of a cluster), no file in the
  run's own temporary folder (where its named pipes live);
- where ``expect_return`` is given, the run still reached it (its final greedy evaluation).

As a command (exit 1 and one line per breach when an invariant does not hold)::

    python -m srl.testing.chaos configs/cartpole_ppo.yaml --run-dir runs/chaos --seed 1 --every 20 \\
        --faults kill,stall --expect-return 475 [--set KEY=VALUE ...]
    python -m srl.testing.netcluster up --nodes 3
    python -m srl.testing.chaos configs/cartpole_ppo.yaml --netcluster srl --faults kill,stall,node,cut ...

The restart check assumes each worker restarts alone, as it does with one trainer per policy (data-parallel
trainers restart together: a peer's restart counts as one without a kill).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srl.api.config import ConfigError, load_config
from srl.base.shm import list_segments
from srl.cli.plot import read_lineage, read_metrics
from srl.system.run_dir import policy_checkpoints

if TYPE_CHECKING:
    from srl.testing.netcluster import NetCluster

FAULTS = ("kill", "stall", "disk", "node", "cut")
HARNESS_SETTINGS = ("workers.max_restarts=1000000",)
"""Set before the caller's settings (which may change it): the bound on a worker's restarts (3 by default) ends a
run at its fourth death, and a chaos run kills every worker many times; a worker that dies on its own as well is
caught by the restart check instead (more restarts than kills)."""
NODE_FAULTS = ("node", "cut")
"""The faults that need a cluster of network namespaces."""
SMALL_DISK = """
run=$1; mb=$2; shift 2
mount -t tmpfs -o size="$mb"m srl-chaos "$run" || exit 97
"$@"; rc=$?
stage=$(mktemp -d) && cp -a "$run/." "$stage/" && umount "$run" && cp -a "$stage/." "$run/" && rm -rf "$stage"
exit $rc
"""
"""The ``disk`` fault's run, in a mount namespace of its own (``sh -c SMALL_DISK sh RUN_DIR MB CMD...``): the run
directory on a tmpfs of ``MB`` MiB, copied out onto the real one when the run ends."""
FILL = ".chaos-fill"
"""The file that fills a run directory's disk."""


@dataclass(frozen=True)
class Schedule:
    """When faults come and which."""

    seed: int = 0
    every: float | None = 20.0
    """Mean seconds between faults (an exponential gap), or None to count in env steps."""
    every_steps: int | None = None
    """Mean env steps between faults (the run's own count, from ``metrics.jsonl``), where ``every`` is None."""
    faults: tuple[str, ...] = ("kill", "stall")
    stall_seconds: float = 3.0
    outage_seconds: float = 10.0
    """How long a crashed node stays down, or a cut link cut."""
    workers: str = ""
    """A regular expression over worker names (``actor|replay``); empty: every worker."""
    disk_mb: int = 256
    """The ``disk`` fault's tmpfs under the run directory, in MiB."""

    def __post_init__(self) -> None:
        if (self.every is None) == (self.every_steps is None):
            raise ValueError(
                "chaos: give the mean gap between faults in seconds (--every) or env steps (--every-steps)"
            )
        if (self.every is not None and self.every <= 0) or (self.every_steps is not None and self.every_steps <= 0):
            raise ValueError("chaos: the mean gap between faults must be positive")
        unknown = sorted(set(self.faults) - set(FAULTS))
        if unknown or not self.faults:
            raise ValueError(f"chaos: faults {unknown or '(none)'}: choose from {', '.join(FAULTS)}")
        if self.stall_seconds <= 0 or self.outage_seconds <= 0:
            raise ValueError("chaos: stall_seconds and outage_seconds must be positive")
        if self.disk_mb < 1:
            raise ValueError(f"chaos: disk_mb must be >= 1, got {self.disk_mb}")


@dataclass
class Report:
    """What a chaos run did and found."""

    returncode: int
    faults: dict[str, int]
    landed_kills: dict[str, int]
    recovered_kills: dict[str, int]
    excused_restarts: dict[str, int]
    """Restarts a worker may have had without a kill: one per cut of its node's link."""
    restarts: dict[str, int]
    breaches: list[str]
    summary: dict[str, Any] = field(repr=False)

    @property
    def ok(self) -> bool:
        return not self.breaches


# --------------------------------------------------------------------------- processes and run files
def _is_mp_helper(proc: Path) -> bool:
    """multiprocessing's resource tracker lives as long as the process that started it; not a worker."""
    try:
        return b"resource_tracker" in (proc / "cmdline").read_bytes()
    except OSError:
        return False


def children_of(pid: int) -> set[int]:
    """Live (non-zombie) child processes of ``pid`` (Linux /proc), multiprocessing helpers excluded."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == str(pid) and fields[0] != "Z" and not _is_mp_helper(stat.parent):
            out.add(int(stat.parent.name))
    return out


def started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None where there is none: with the pid, it names
    one process, where a pid alone may be a new process's after the old one's end."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _still(seen: dict[int, int | None]) -> list[int]:
    """The processes of ``seen`` (pid: start time) still running: the same processes, not new ones on old pids."""
    return sorted(pid for pid, born in seen.items() if born is not None and alive(pid) and started(pid) == born)


def _kill(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (srl.base.shm.pid_alive counts a zombie as alive; a leak must not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@dataclass(frozen=True)
class Placed:
    """One worker of ``workers.json``: its process, and its node's address (a Ray run's; None for a local run)."""

    pid: int
    host: str | None = None


def read_workers(run: Path) -> dict[str, Placed]:
    """A run's ``workers.json`` (worker name -> where it runs), or {} before it is written."""
    try:
        found = json.loads((run / "workers.json").read_text())
    except (OSError, ValueError):
        return {}
    return {
        name: Placed(int(v["pid"]), v.get("host")) if isinstance(v, dict) else Placed(int(v))
        for name, v in found.items()
    }


def remember(born: dict[int, int | None], pids: Iterable[int]) -> None:
    """Note when each process not seen before started (see :func:`started`)."""
    for pid in pids:
        if pid not in born:
            born[pid] = started(pid)


def last_record(run: Path) -> dict[str, Any]:
    """A run's newest complete ``metrics.jsonl`` record, or {} before the first (read from the file's end: a long
    run's file is megabytes). A line that does not parse is skipped: read while a full disk made the run cut a
    record back and write the next in its place, the end of the file can change under the read."""
    try:
        with (run / "metrics.jsonl").open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 65536))
            tail = f.read().split(b"\n")[:-1]  # complete lines only
    except OSError:
        return {}
    for line in reversed(tail[1:] if size > 65536 else tail):  # the first may be the end of a line cut by the seek
        with contextlib.suppress(ValueError):
            return dict(json.loads(line))
    return {}


def _checkpointed(run: Path) -> bool:
    """Every policy of the run (every population member) has a checkpoint: a trainer killed before its first
    has nothing to restart from."""
    try:
        cfg = load_config(run / "config.yaml")
    except (OSError, ValueError):  # not written yet, or half written
        return False
    return all(any(policy_checkpoints(run, cfg, name).glob("ckpt_*.pt")) for name in cfg.policy_names)


# --------------------------------------------------------------------------- the harness
class Injector:
    """Draws and injects the faults of a schedule into a run's workers, logging each to ``chaos.jsonl``."""

    def __init__(
        self,
        run: Path,
        schedule: Schedule,
        cluster: NetCluster | None = None,
        born: dict[int, int | None] | None = None,
        view: Path | None = None,
    ) -> None:
        """``born``: when each process seen so far started (:func:`remember`), shared with the caller's own.
        ``view``: where the run's own files are seen while it runs (``run`` itself, or through ``/proc/PID/root``
        for a run in a mount namespace of its own); ``chaos.jsonl`` goes to ``run``."""
        if cluster is None and set(schedule.faults) & set(NODE_FAULTS):
            raise ValueError(f"chaos: faults {', '.join(NODE_FAULTS)} need a cluster of network namespaces")
        self.run, self.schedule, self.cluster = run, schedule, cluster
        self.view = run if view is None else view
        self.full_until: float | None = None  # while the disk fault holds the run directory's disk full
        self.outages: dict[int, tuple[str, float]] = {}  # node -> (node or cut, when it comes back)
        self.excused: Counter[str] = Counter()  # restarts a cut may cost a worker
        self.rng = random.Random(schedule.seed)
        self.pattern = re.compile(schedule.workers) if schedule.workers else None
        self.log = (run / "chaos.jsonl").open("a")
        self.start = time.monotonic()
        self.next_at = self._gap(self._clock())
        self.stalled: dict[int, float] = {}  # pid -> when to resume it
        self.faults: Counter[str] = Counter()
        self.landed: Counter[str] = Counter()
        self.pending: dict[str, int] = {}  # worker -> the pid killed, until workers.json names another
        self.recovered: Counter[str] = Counter()
        self.born = {} if born is None else born

    def _gap(self, now: float) -> float:
        mean = self.schedule.every if self.schedule.every is not None else self.schedule.every_steps
        assert mean is not None
        return now + self.rng.expovariate(1.0 / mean)

    def _clock(self) -> float:
        """Where the schedule counts: seconds since the first fault could come, or the run's env steps."""
        if self.schedule.every is not None:
            return time.monotonic() - self.start
        return float(last_record(self.view).get("env_steps", 0))

    def step(self, workers: dict[str, Placed]) -> None:
        """Resume stalls that are due, note recoveries, and inject the next fault when its moment has come;
        ``workers``: the run's ``workers.json`` now (:func:`read_workers`)."""
        now = time.monotonic()
        for pid, due in list(self.stalled.items()):
            if now >= due:
                self._signal(pid, signal.SIGCONT)
                del self.stalled[pid]
        for node, (kind, due) in list(self.outages.items()):
            if now >= due:
                self._end_outage(node, kind)
        if self.full_until is not None and now >= self.full_until:
            self._free_disk()
        pids = {name: w.pid for name, w in workers.items()}
        remember(self.born, pids.values())
        for name, old in list(self.pending.items()):
            if pids.get(name, old) != old:
                self.recovered[name] += 1
                del self.pending[name]
        clock = self._clock()
        if clock < self.next_at:
            return
        self.next_at = self._gap(clock)
        names = sorted(n for n in pids if self.pattern is None or self.pattern.search(n))
        if not names:
            return
        kind = self.rng.choice(self.schedule.faults)
        if kind in NODE_FAULTS:
            record = self._node_fault(kind, workers)
        elif kind == "disk":
            record = self._fill_disk(now)
        else:
            record = self._worker_fault(kind, self.rng.choice(names), pids, now)
        self.faults[kind] += 1
        record = {"t": round(now - self.start, 3), "fault": kind, **record}
        if self.schedule.every is None:
            record["env_steps"] = int(clock)
        self.log.write(json.dumps(record) + "\n")
        self.log.flush()

    def _worker_fault(self, kind: str, name: str, pids: dict[str, int], now: float) -> dict[str, Any]:
        pid = pids[name]
        landed = alive(pid) and started(pid) == self.born.get(pid)  # still the worker's process, not a new one's
        if landed and kind == "kill" and name not in self.pending:  # a stalled worker may be killed too
            landed = self._signal(pid, signal.SIGKILL)
            if landed:
                self.pending[name] = pid
                self.landed[name] += 1
        elif landed and kind == "stall" and pid not in self.stalled:
            landed = self._signal(pid, signal.SIGSTOP)
            if landed:
                self.stalled[pid] = now + self.schedule.stall_seconds
        else:
            landed = False  # gone already, killed and not restarted yet, or stalled already
        return {"worker": name, "pid": pid, "landed": landed}

    def _node_fault(self, kind: str, workers: dict[str, Placed]) -> dict[str, Any]:
        """Crash or cut an actor node that is up (never the head: the run's driver lives there)."""
        cluster = self.cluster
        assert cluster is not None
        up = [i for i in range(1, len(cluster.nodes)) if i not in self.outages]
        if not up:
            return {"node": None, "landed": False}
        node = self.rng.choice(up)
        there = sorted(name for name, w in workers.items() if w.host == cluster.ip(node))
        if kind == "node":
            cluster.kill(node)
            for name in there:
                if name not in self.pending:
                    self.pending[name] = workers[name].pid
                    self.landed[name] += 1
        else:
            cluster.cut(node)
            self.excused.update(there)
        self.outages[node] = (kind, time.monotonic() + self.schedule.outage_seconds)
        return {"node": node, "workers": there, "landed": True}

    def _fill_disk(self, now: float) -> dict[str, Any]:
        """Fill the run directory's disk (its tmpfs) with one file, to be deleted ``stall_seconds`` later."""
        if self.full_until is not None:
            return {"landed": False}  # full already
        filled = 0
        try:
            with open(self.view / FILL, "wb", buffering=0) as f:
                chunk = b"\0" * (1 << 20)
                while True:
                    filled += f.write(chunk) or 0
        except OSError:  # ENOSPC: full; or the run has ended and its directory is gone from the view
            pass
        self.full_until = now + self.schedule.stall_seconds
        return {"bytes": filled, "landed": filled > 0}

    def _free_disk(self) -> None:
        with contextlib.suppress(OSError):
            (self.view / FILL).unlink()
        self.full_until = None
        self.log.write(json.dumps({"t": round(time.monotonic() - self.start, 3), "back": "disk"}) + "\n")
        self.log.flush()

    def _end_outage(self, node: int, kind: str) -> None:
        assert self.cluster is not None
        if kind == "node":
            self.cluster.start(node)
        else:
            self.cluster.restore(node)
        del self.outages[node]
        self.log.write(json.dumps({"t": round(time.monotonic() - self.start, 3), "back": kind, "node": node}) + "\n")
        self.log.flush()

    def _signal(self, pid: int, sig: int) -> bool:
        """Signal a worker's process (not a process that took its pid since it ended)."""
        if pid in self.born and started(pid) != self.born[pid]:
            return False
        return _kill(pid, sig)

    def close(self) -> None:
        """Resume every stalled process still there (a stopped process would outlive the run); bring every node
        back."""
        for pid in self.stalled:
            self._signal(pid, signal.SIGCONT)
        self.stalled.clear()
        for node, (kind, _) in list(self.outages.items()):
            self._end_outage(node, kind)
        if self.full_until is not None:
            self._free_disk()
        self.log.close()


def require_small_disk(cluster: NetCluster | None) -> None:
    """The ``disk`` fault can be had here: root, ``unshare``, and a run on this machine (one line if not)."""
    if cluster is not None:
        raise ValueError("chaos: the disk fault is for a run on this machine, not on --netcluster")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise ValueError("chaos: the disk fault mounts a tmpfs in a mount namespace of the run's own: it needs root "
                         "and unshare (util-linux)")  # fmt: skip


def run(
    config: str | Path,
    run_dir: Path,
    schedule: Schedule,
    settings: Sequence[str] = (),
    expect_return: float | None = None,
    timeout: float = 3600.0,
    ready: Callable[[Path], bool] = _checkpointed,
    cluster: NetCluster | None = None,
) -> Report:
    """``srl train config`` into ``run_dir`` with ``settings``, faults injected by ``schedule`` from the moment
    ``ready(run_dir)`` holds (its first checkpoint) until the run ends; then the invariants (module docstring).
    ``timeout``: seconds after which the run is killed and reported as a breach (a hang). ``cluster``: a cluster
    of network namespaces that is up; the run's driver starts on its head, its workers on its nodes (``settings``
    place them: :func:`srl.testing.netcluster.ray_settings`)."""
    run_dir = Path(run_dir)
    if "disk" in schedule.faults:
        require_small_disk(cluster)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ValueError(f"chaos: run directory {run_dir} is not empty: a chaos run starts a run of its own")
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="srl-chaos-"))  # the run's own temporary folder: its named pipes
    cmd = [sys.executable, "-m", "srl.cli.main", "train", str(config), "--quiet", "--run-dir", str(run_dir)]
    for setting in (*HARNESS_SETTINGS, *settings):
        cmd += ["--set", setting]
    pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    disk = "disk" in schedule.faults
    if disk:  # its own mount namespace, the run directory on a small tmpfs (the module's docstring)
        where = str(run_dir.resolve())
        namespace = ["unshare", "--mount", "--propagation", "private", "sh", "-c", SMALL_DISK, "sh"]
        cmd = [*namespace, where, str(schedule.disk_mb), *cmd]
    if cluster is None:
        proc = subprocess.Popen(cmd, env=dict(os.environ, TMPDIR=str(tmp)), **pipes)
    else:  # the head keeps this machine's /tmp
        proc = cluster.popen(0, cmd, env=dict(cluster.env(0), TMPDIR=str(tmp)), **pipes)
    view = Path(f"/proc/{proc.pid}/root{run_dir.resolve()}") if disk else run_dir  # the run's files as it sees them
    seen: dict[int, int | None] = {}  # every process of the run seen: when it started
    breaches: list[str] = []
    injector: Injector | None = None
    deadline, scan_at = time.monotonic() + timeout, 0.0
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                breaches.append(f"the run did not end within {timeout:.0f} s (a hang); killed")
                break
            if time.monotonic() >= scan_at:  # /proc once a second: the harness must not cost the run a core
                remember(seen, children_of(proc.pid))
                scan_at = time.monotonic() + 1.0
            workers = read_workers(view)
            if injector is None and ready(view):
                injector = Injector(run_dir, schedule, cluster, born=seen, view=view)
            if injector is not None:
                injector.step(workers)  # it remembers the workers' processes in ``seen``
            else:
                remember(seen, (w.pid for w in workers.values()))
            time.sleep(0.1)
    finally:
        if injector is not None:
            injector.close()
        if proc.poll() is None:  # hung, or the harness itself was interrupted: nothing of the run outlives it
            for pid in sorted(set(_still(seen)) | children_of(proc.pid)):
                _kill(pid, signal.SIGKILL)
            proc.kill()
        out, err = proc.communicate()
    try:  # the run directory's copy: a Ray driver's stdout may carry Ray's own lines too
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):  # not written (a full disk at the end): what srl train printed, its last line
        summary = {}
        with contextlib.suppress(ValueError, IndexError):
            summary = dict(json.loads(out.strip().splitlines()[-1]))
    report = Report(
        returncode=proc.returncode,
        faults=dict(injector.faults) if injector else {},
        landed_kills=dict(injector.landed) if injector else {},
        recovered_kills=dict(injector.recovered) if injector else {},
        excused_restarts=dict(injector.excused) if injector else {},
        restarts=dict(summary.get("restarts", {})),
        breaches=breaches,
        summary=summary,
    )
    # the run's segments carry its driver's pid: the process started here, or (the disk fault) one of its children
    segments = sorted({s for pid in (proc.pid, *seen) for s in list_segments(str(pid))})
    if cluster is not None:
        segments = [s for i in range(len(cluster.nodes)) for s in cluster.shm(i) if s.startswith("srl_")]
    _check(report, run_dir, seen, segments, tmp, err, expect_return)
    shutil.rmtree(tmp, ignore_errors=True)
    (run_dir / "chaos_report.json").write_text(
        json.dumps({k: v for k, v in asdict(report).items() if k != "summary"}, indent=1) + "\n"
    )
    return report


def _never_goes_back(key: str) -> bool:
    """A metric that only grows: a policy's or a member's version, a replay's size (below its capacity it only
    grows; at it, it stays), the population's copies and decisions."""
    return (
        key.endswith(("policy_version", "/version"))
        or re.fullmatch(r"replay\d+_size", key) is not None
        or key in ("population_copies", "population_decisions")
    )


def _population_breaches(run: Path, summary: dict[str, Any]) -> list[str]:
    """A population's copies are never lost: its lineage (``population.jsonl``) holds one exploit record per copy
    counted, and every member's values at the end are the ones its last copy set."""
    population = summary.get("population")
    if not isinstance(population, dict) or not (run / "population.jsonl").exists():
        return []
    lineage = read_lineage(run)
    out = []
    exploits = sum(1 for r in lineage if r.get("event") == "exploit")
    if population.get("copies") != exploits:
        out.append(f"population: {population.get('copies')} copies counted, {exploits} in population.jsonl")
    names = list(dict.fromkeys(k.split("/")[0] for k in population if "/" in k))
    last = {int(r["target"]): r["new"] for r in lineage if r.get("event") == "explore"}
    for target, values in sorted(last.items()):
        for key, value in values.items():
            got = population.get(f"{names[target]}/{key}") if target < len(names) else None
            if got is None or not math.isclose(got, value, rel_tol=1e-9):
                out.append(
                    f"population: {names[target] if target < len(names) else target}'s {key} is {got}, "
                    f"its last copy set {value}"
                )
    return out


def _check(
    report: Report,
    run: Path,
    seen: dict[int, int | None],
    segments: list[str],
    tmp: Path,
    err: str,
    expect_return: float | None,
) -> None:
    """The invariants of the module's docstring, each breach one line in ``report.breaches``."""
    breaches, summary = report.breaches, report.summary
    last = err.strip().splitlines()[-1:] or [""]
    ended = summary.get("stop_reason") not in (None, "error", "interrupted")  # by its own stop condition
    full = ended and report.returncode == 1 and "No space left on device" in str(summary.get("error"))
    if (report.returncode != 0 or "error" in summary) and not full:  # its last writes on a full disk: documented
        breaches.append(f"the run ended with exit {report.returncode}: {summary.get('error') or last[0]}")
    for name in sorted(set(report.landed_kills) | set(report.restarts)):
        landed, recovered = report.landed_kills.get(name, 0), report.recovered_kills.get(name, 0)
        restarts, excused = report.restarts.get(name, 0), report.excused_restarts.get(name, 0)
        if not recovered <= restarts <= landed + excused:
            cuts = f", {excused} cuts" if excused else ""
            breaches.append(
                f"{name}: {restarts} restarts for {landed} kills that landed ({recovered} seen restarted{cuts})"
            )
    try:
        records = read_metrics(run)
    except ConfigError:  # no metrics.jsonl: a run that never started (its exit says why)
        records = []
    for key in sorted({k for r in records for k in r if _never_goes_back(k)}):
        values = [r[key] for r in records if key in r]
        back = next(((a, b) for a, b in itertools.pairwise(values) if b < a), None)
        if back is not None:
            breaches.append(f"metrics {key} went back from {back[0]} to {back[1]}")
    breaches.extend(_population_breaches(run, summary))
    deadline = time.monotonic() + 10.0  # the run has exited; give the kernel a moment to reap what it killed
    while (left := _still(seen)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        breaches.append(f"processes left behind: {left}")
    if segments:
        breaches.append(f"shared memory left behind: {segments}")
    files = sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []
    if files:
        breaches.append(f"temporary files left behind: {files}")
    if expect_return is not None:
        got = summary.get("final_eval_return_mean")
        if got is None or not math.isfinite(got) or got < expect_return:
            breaches.append(f"final evaluation {got} is below {expect_return}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m srl.testing.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    gap = parser.add_mutually_exclusive_group()
    gap.add_argument("--every", type=float, help="mean seconds between faults (default 20)")
    gap.add_argument("--every-steps", type=int, help="mean env steps between faults")
    parser.add_argument("--faults", default="kill,stall", help=f"from {', '.join(FAULTS)} (default kill,stall)")
    parser.add_argument("--stall-seconds", type=float, default=3.0)
    parser.add_argument("--outage-seconds", type=float, default=10.0, help="a crashed node's or a cut's length")
    parser.add_argument(
        "--netcluster", metavar="NAME", help="run on this cluster of namespaces (srl.testing.netcluster up)"
    )
    parser.add_argument("--workers", default="", help="a regular expression over the worker names to fault")
    parser.add_argument("--disk-mb", type=int, default=256, help="the disk fault's tmpfs under the run directory")
    parser.add_argument("--expect-return", type=float)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before the run counts as hung")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        schedule = Schedule(
            seed=args.seed,
            every=args.every if args.every is not None or args.every_steps is not None else 20.0,
            every_steps=args.every_steps,
            faults=tuple(f for f in args.faults.split(",") if f),
            stall_seconds=args.stall_seconds,
            outage_seconds=args.outage_seconds,
            workers=args.workers,
            disk_mb=args.disk_mb,
        )
        cluster = None
        if args.netcluster is not None:
            from srl.testing.netcluster import NetCluster, ray_settings

            cluster = NetCluster.attach(args.netcluster)
            args.settings = [*ray_settings(cluster.address, len(cluster.nodes) - 1), *args.settings]
        elif set(schedule.faults) & set(NODE_FAULTS):
            raise ValueError(f"chaos: faults {', '.join(NODE_FAULTS)} need --netcluster")
        if "disk" in schedule.faults:
            require_small_disk(cluster)
        load_config(args.config, args.settings)  # a config srl train would refuse: its one line, before anything
        if args.run_dir.exists() and any(args.run_dir.iterdir()):
            raise ValueError(f"chaos: run directory {args.run_dir} is not empty: a chaos run starts a run of its own")
    except (ConfigError, ValueError, RuntimeError) as exc:
        print(f"srl: error: {exc}", file=sys.stderr)
        return 2
    report = run(args.config, args.run_dir, schedule, args.settings, args.expect_return, args.timeout, cluster=cluster)
    for line in report.breaches:
        print(f"breach: {line}", file=sys.stderr)
    print(
        json.dumps(
            {
                "faults": report.faults,
                "kills_landed": sum(report.landed_kills.values()),
                "restarts": report.restarts,
                "breaches": len(report.breaches),
                "final_eval_return_mean": report.summary.get("final_eval_return_mean"),
                "stop_reason": report.summary.get("stop_reason"),
            }
        )
    )
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
