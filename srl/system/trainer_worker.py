"""The trainer worker: turns batches into new parameter versions.

Its batches come from a :class:`~srl.system.batches.BatchSource`: on-policy
segments gathered from the sample stream (dropping those more than
``max_policy_lag`` versions old, counted), or a replay's sampled items. It runs
one algorithm update per full batch, hands what the update gives back (a
replay's priorities) to the source, publishes the new policy snapshot, and
writes checkpoints atomically.

Several trainers of one policy run data-parallel through a
:class:`~srl.api.worker.Collective`: each consumes its own share of the
sample stream, and before every update all of them agree to go on (one
small reduction), so they enter each update together and leave together
when any of them is asked to stop. Rank 0 publishes and checkpoints.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from srl.api.report import Counts, RunFacts
from srl.api.worker import Algorithm, Collective, Reporter, TrainerPort, Worker
from srl.base.fileio import with_room
from srl.base.timing import Every
from srl.system import run_dir as run_files
from srl.system.batches import BatchSource
from srl.system.checkpoint import checkpoints, save_checkpoint
from srl.system.params import ParamPublisher

BOTTLENECK_WAIT_SHARE = 0.1
"""A trainer that waited for segments less than this share of its last cycle (wait, copy, update) is the
bottleneck: its segments were there before it asked (``workers.autotune``)."""
EXPLORE_EVERY = 8
"""While the trainer is the bottleneck, every this many updates run on the thread count it is not using now."""


class ThreadHandover:
    """The torch threads each update runs on (``workers.autotune``).

    While the trainer is the bottleneck (it waited less than :data:`BOTTLENECK_WAIT_SHARE` of its last cycle,
    so the actors and policy workers are waiting for it), it may take its share of the node's cores, ``most``,
    instead of its own ``base``, but only if updates run faster that way: more threads help a large update and
    slow a small one, and what the other processes leave idle changes as they run. So it measures both: each
    once, then the faster by a moving average of seconds per update, and every :data:`EXPLORE_EVERY`-th update
    the other one again. When the trainer is not the bottleneck, ``base``."""

    def __init__(self, base: int, most: int) -> None:
        self.base, self.most = base, most
        self.seconds: dict[int, float | None] = {base: None, most: None}
        self._tried = 0

    def choose(self, wait_share: float | None) -> int:
        """Threads for the next update, given the share of the last cycle the trainer waited (None: no cycle)."""
        if self.most <= self.base or wait_share is None or wait_share >= BOTTLENECK_WAIT_SHARE:
            return self.base
        self._tried += 1
        for k in (self.most, self.base):
            if self.seconds[k] is None:
                return k
        faster = min(self.seconds, key=lambda k: self.seconds[k] or 0.0)
        slower = self.base if faster == self.most else self.most
        return slower if self._tried % EXPLORE_EVERY == 0 else faster

    def record(self, threads: int, seconds: float) -> None:
        """An update on ``threads`` threads took ``seconds``."""
        if threads in self.seconds:
            last = self.seconds[threads]
            self.seconds[threads] = seconds if last is None else 0.5 * last + 0.5 * seconds


class TrainerWorker(Worker):
    """Consumes ``batch_segments`` segments per update."""

    hold: Callable[[], bool] = staticmethod(lambda: False)
    """Asked when the batch is full: True puts the update off to a later poll. Runtimes whose workers run
    concurrently never hold (the actors go on while the update runs); the inline runtime holds until its other
    workers have done all they can, which is the order those runtimes take when the trainer binds."""

    def __init__(
        self,
        index: int,
        algorithm: Algorithm,
        source: BatchSource,
        publisher: ParamPublisher,
        reporter: Reporter,
        total_env_steps: int,
        checkpoint_dir: Path | None = None,
        checkpoint_interval: float = 120.0,
        keep_checkpoints: int = 3,
        checkpoint_extra: Mapping[str, Any] | None = None,
        wait_timeout: float = 0.05,
        collective: Collective | None = None,
        autotune_peers: int = 0,
        report_interval: float = 0.0,
        port: TrainerPort | None = None,
    ) -> None:
        """``autotune_peers``: with ``workers.autotune``, the trainers sharing this node's cores (0: off).
        ``report_interval``: at most one report per this many seconds, and one at teardown (0: one per update).
        ``port``: a role's end in this trainer (``Role.port``; a population member's link to the population worker,
        whose copies arrive through :meth:`adopt`), served between updates."""
        self.index = index
        self.algorithm, self.source, self.publisher, self.reporter = algorithm, source, publisher, reporter
        self.total_env_steps = total_env_steps
        self.checkpoint_dir = checkpoint_dir
        self._checkpoints = Every(checkpoint_interval)
        self.keep_checkpoints = keep_checkpoints
        self.checkpoint_extra = dict(checkpoint_extra or {})
        self.wait_timeout = wait_timeout
        self.collective = collective
        self.world = 1 if collective is None else collective.world_size
        self.leader = collective is None or collective.rank == 0
        self._left = False  # left the lockstep (every trainer agreed to stop): no more collective calls
        self._in_step = False  # inside a collective sequence: a failure here leaves peers mid-sequence
        self._connected = False
        self.version = 0
        self.samples = 0
        self.updates = 0  # by this process (a resumed trainer starts at a checkpoint's version, not at 0)
        self.trained_items = 0  # batch items (segment env steps, or replay samples) trained on by this process
        self.t_wait = self.t_train = 0.0  # seconds waiting for batches (copying excluded), training
        self.autotune_peers = autotune_peers
        self._handover = ThreadHandover(0, 0)
        self._cycle: tuple[float, float] | None = None  # when the last update started, and t_wait then
        self._reports = Every(report_interval)
        self._newest: tuple[Mapping[str, float], float, int] | None = None  # last update's stats, seconds, threads
        self._unreported = False  # something happened since the last report (an update, or a copy taken)
        self._lags: list[np.ndarray] = []  # of the updates since the last report
        self.port = port
        self.adopted = 0  # copies of another member's state taken

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from a checkpoint (:func:`load_checkpoint`): networks, optimizer, RNG, version, step counters,
        and what its port kept (a population member's hyperparameter values)."""
        self.algorithm.load_state_dict(state["algorithm"])
        self.version = int(state["version"])
        self.samples = int(state.get("trained_samples", state["samples"])) // self.world
        if self.port is not None:
            self.port.restore(self, state)

    def adopt(self, state: Mapping[str, Any], settings: Any) -> None:
        """Take another population member's algorithm state and new settings, live: drop what the old weights
        collected, publish the new policy as the next version (versions never go back), and checkpoint it (a
        restart continues from the copy)."""
        self.algorithm.load_state_dict(state)
        self.reconfigure(settings)
        self.version += 1
        self.adopted += 1
        self.source.discard_older(self.version)
        if self.leader:
            self.publisher.publish(self.version, self.algorithm.policy_state())
        if self.leader and self.checkpoint_dir is not None:
            self._checkpoint()
        self._unreported = True  # its new version in the metrics now, with the newest update's statistics
        self._report(force=True)

    def reconfigure(self, settings: Any) -> None:
        """Hand the algorithm new settings through its optional ``reconfigure`` (see ``srl/api/algorithm.py``); one
        without it has none to change (the plan lets a population search its settings only when it has it)."""
        hook = getattr(self.algorithm, "reconfigure", None)
        if hook is not None:
            hook(settings)

    def setup(self) -> None:
        self.source.setup()
        self._checkpoints.restart()
        if self.collective is not None:
            self._in_step = True
            self.collective.connect()
            self._connected = True
            self.algorithm.synchronize()
            self._in_step = False
        if self.leader:
            self.publisher.publish(self.version, self.algorithm.policy_state())
        self._t_start = time.perf_counter()
        base = torch.get_num_threads()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self._handover = ThreadHandover(base, max(base, cores // self.autotune_peers) if self.autotune_peers else base)
        self._cycle = None  # the first update has no cycle to judge by: it runs on the trainer's own threads

    def poll(self) -> int:
        """Take what is ready until the batch is full; once it is, update (unless held). One or the other per poll,
        so a runtime that holds updates sees the take before it decides (see :attr:`hold`)."""
        stop = self.should_stop()
        if self.port is not None and not stop and self.port.serve(self):
            return 1
        if not self.source.full() and not stop:
            return self._receive()
        if self._left or (self.hold() and not stop):
            return 0
        if self.collective is not None:  # lockstep: all trainers update together (each first taking the newest
            t2 = time.perf_counter()  # population copy any of them was asked to take), or all stop
            asked = -1 if self.port is None else self.port.asked
            left, copy = self.collective.maximum([int(stop), asked])
            self._left = bool(left)
            self.t_wait += time.perf_counter() - t2
            stop = stop or self._left
            if not stop and self.port is not None and copy > self.port.taken:
                self.port.take(self, copy)  # its batch in progress is dropped: every trainer fills a new one
                return 1
        if stop:
            return 0
        self._update()
        if self.leader and self.checkpoint_dir is not None and self._checkpoints.due():
            self._checkpoint()
        return 0

    def _checkpoint(self) -> None:
        try:
            self.save_checkpoint()
        except OSError as exc:  # e.g. a full disk: the previous checkpoint stays; training goes on
            self.reporter.report("info", {"message": exc.strerror or str(exc)})

    def teardown(self) -> None:
        self._report(force=True)
        if self.collective is not None:
            # Release peers waiting to agree on the next update; after a failure mid-update they are stuck
            # in another collective instead and time out on their own.
            if self._connected and not self._left and not self._in_step:
                self._left = bool(self.collective.maximum([1, -1])[0])
            self.collective.close()
        if self.leader and self.checkpoint_dir is not None:  # a disk full for a moment is waited out
            with_room(self.save_checkpoint, run_files.FINAL_WAIT)

    # ------------------------------------------------------------------ internals
    def _receive(self) -> int:
        """Take what is ready (waiting up to ``wait_timeout`` for the first); how many came."""
        t0, copied = time.perf_counter(), self.source.t_copy
        came = self.source.fill(self.version, self.wait_timeout)
        self.t_wait += time.perf_counter() - t0 - (self.source.t_copy - copied)
        return came

    def _update(self) -> None:
        progress = min(1.0, self.samples * self.world / self.total_env_steps)
        t0 = time.perf_counter()
        share = None  # of the last cycle (its update, then this batch's wait and copy) spent waiting
        if self._cycle is not None:
            began, waited = self._cycle
            share = (self.t_wait - waited) / max(t0 - began, 1e-9)
        self._cycle = (t0, self.t_wait)
        base, threads = self._handover.base, self._handover.choose(share)
        if threads != base:
            torch.set_num_threads(threads)
        self._in_step = True
        result = self.algorithm.train(self.source.batch(), progress)
        self._in_step = False
        trained = self.source.done(result)
        if threads != base:  # the cores go back to the actors and policy workers
            torch.set_num_threads(base)
        self._handover.record(threads, time.perf_counter() - t0)
        self.t_train += time.perf_counter() - t0
        self.samples += trained.samples
        self.trained_items += trained.items
        self.version += 1
        self.updates += 1
        if self.leader:
            self.publisher.publish(self.version, self.algorithm.policy_state())
        self._newest = (result.stats, time.perf_counter() - t0, threads)
        self._unreported = True
        if trained.lags is not None:
            self._lags.append(trained.lags)
        self._report()

    def _report(self, force: bool = False) -> None:
        """The newest update's statistics, the counters, and the lags of every update since the last report; at
        most once per ``report_interval``: each report wakes the controller, and a replay's trainer updates many
        times a second."""
        if self._newest is None or not self._unreported or not self._reports.due(force):
            return
        stats, seconds, threads = self._newest
        self._unreported = False
        meta: dict[str, Any] = {
            "trainer": self.index,
            "version": self.version,
            "samples": self.samples,
            "dropped_segments": self.source.dropped,
            "update_seconds": seconds,
            # messages refused by a network sample stream (no run token, malformed); 0 within a node
            "rejected_segment_messages": self.source.rejected,
            "bytes_published": self.publisher.bytes_published,
            "snapshots_published": self.publisher.published,
            "updates": self.updates,
            "trained_items": self.trained_items,
            "t_total": time.perf_counter() - self._t_start,
            "t_wait": self.t_wait,
            "t_copy": self.source.t_copy,
            "t_train": self.t_train,
            "update_threads": threads,
            "adopted": self.adopted,
        }
        if self.port is not None:  # the longest a copy (an export or an import) held this trainer up
            meta["copy_pause_max"] = self.port.pause_max
        meta.update({k: float(v) for k, v in stats.items()})
        arrays = None
        if self._lags:
            lags, self._lags = np.concatenate(self._lags), []
            meta.update(lag_mean=float(lags.mean()), lag_max=int(lags.max()))
            arrays = {"lag_hist": np.bincount(lags, minlength=1).astype(np.int64)}
        self.reporter.report("trainer", meta, arrays)

    def save_checkpoint(self) -> Path:
        """Write ``ckpt_<version>.pt`` atomically and keep the newest ``keep_checkpoints``."""
        assert self.checkpoint_dir is not None
        path = self.checkpoint_dir / f"ckpt_{self.version:08d}.pt"
        state = {
            "version": self.version,
            "samples": self.samples,
            "trained_samples": self.samples * self.world,
            "algorithm": self.algorithm.state_dict(),
            "policy_state": torch.from_numpy(self.algorithm.policy_state()),  # what acting loads, for any algorithm
            **self.checkpoint_extra,
        }
        if self.port is not None:
            state.update(self.port.checkpoint())
        try:
            self.checkpoint_dir.mkdir(exist_ok=True)  # a policy's folder; never a run directory that was deleted
            save_checkpoint(path, state, self._serialize)
        except OSError as exc:
            raise OSError(
                exc.errno, f"checkpoint {path.name} not written ({exc.strerror or exc}); the previous one is intact"
            ) from None
        old = checkpoints(self.checkpoint_dir)[: -self.keep_checkpoints]
        for p in old:
            p.unlink(missing_ok=True)
        return path

    @staticmethod
    def _serialize(state: Mapping[str, Any], f: Any) -> None:
        torch.save(state, f)


class TrainerReports:
    """The trainers' reports (the :class:`~srl.api.report.Aggregator` of their kind): each policy's lead trainer's
    newest version goes to the run's counts; its newest update's statistics to the records (as ``<policy>/<name>``
    in a run of several policies), with every trainer's dropped segments, the policy-lag histogram of the samples
    trained on, the bytes published per version and all-reduced per update, and the copies each trainer took."""

    SKIPPED = ("trainer", "version", "worker")
    """Report entries that are not statistics of the update."""

    def __init__(self, facts: RunFacts) -> None:
        self.facts = facts
        self.per_policy = facts.cfg.workers.trainers
        self.names = facts.cfg.policy_names
        self.newest: dict[int, dict[str, Any]] = {}
        """Each trainer's newest report, by index."""
        self.lag_hist = np.zeros(1, np.int64)
        self.counts = Counts()

    def handle(self, worker: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        trainer = int(meta.get("trainer", 0))
        self.newest[trainer] = dict(meta)
        if trainer % self.per_policy == 0:
            self.facts.set_version(trainer // self.per_policy, int(meta["version"]))
        self.counts.set(worker, {"adopted": int(meta.get("adopted", 0))})
        hist = arrays.get("lag_hist")
        if hist is not None and len(hist):
            if len(hist) > len(self.lag_hist):
                self.lag_hist = np.pad(self.lag_hist, (0, len(hist) - len(self.lag_hist)))
            self.lag_hist[: len(hist)] += hist

    def _stats(self, policy: int, skipped: tuple[str, ...] = SKIPPED) -> dict[str, Any]:
        """Policy ``policy``'s lead trainer's newest statistics (of any trainer of the first, before its lead)."""
        meta = self.newest.get(policy * self.per_policy)
        if meta is None and policy == 0:
            meta = next(iter(self.newest.values()), {})
        return {k: v for k, v in (meta or {}).items() if k not in skipped and not k.startswith("t_")}

    def record(self) -> dict[str, Any]:
        rec = self._stats(0)
        if len(self.names) > 1:  # each policy's own, as ``<policy>/<metric>``, its version too
            for k, name in enumerate(self.names):
                rec.update({f"{name}/{key}": v for key, v in self._stats(k, ("trainer", "worker")).items()})
        rec.update(self._per_version())
        rec["dropped_segments"] = self._sum("dropped_segments")
        rec["lag_histogram"] = self.lag_hist.tolist()  # samples per policy lag so far (TensorBoard: lag_mean/max)
        return rec

    def progress(self, record: Mapping[str, Any]) -> str:
        return f"lag {record.get('lag_mean', 0.0):5.2f}  "

    def summary(self) -> dict[str, Any]:
        # samples that reached an update: counted by policy lag on-policy, by items drawn from a replay
        trained = int(self.lag_hist.sum()) or self._sum("trained_items")
        out: dict[str, Any] = {
            "trained_samples": trained,
            "dropped_segments": self._sum("dropped_segments"),
            # messages a network sample stream refused at the trainers
            "rejected_segment_messages": self._sum("rejected_segment_messages"),
            "lag_histogram": self.lag_hist.tolist(),
            **self._per_version(),
        }
        if self.counts.total("adopted"):  # copies of another population member's state each trainer took
            out["population"] = {"adopted": {w: int(self.counts.of(w, "adopted")) for w in self.counts.workers}}
        return out

    def restarted(self, worker: str) -> None:
        self.counts.restarted(worker)

    def _sum(self, key: str) -> int:
        return sum(int(t.get(key, 0)) for t in self.newest.values())

    def _per_version(self) -> dict[str, float]:
        """Parameter bytes published per snapshot, and gradient bytes all-reduced per update with the seconds the
        reductions took (per trainer, its waits for its peers included)."""
        t = self.newest.get(0) or next(iter(self.newest.values()), {})  # from 0 again after a resume or restart
        out = {}
        if int(t.get("snapshots_published", 0)) > 0:
            out["bytes_published_per_version"] = float(t["bytes_published"]) / int(t["snapshots_published"])
        if int(t.get("updates", 0)) > 0 and "bytes_reduced" in t:
            out["bytes_reduced_per_update"] = float(t["bytes_reduced"]) / int(t["updates"])
        if int(t.get("updates", 0)) > 0 and "seconds_reduced" in t:
            out["reduce_seconds_per_update"] = float(t["seconds_reduced"]) / int(t["updates"])
        return out
