"""The controller: the run's clock, and a table of report handlers keyed by report kind.

Placement (starting and watching processes) belongs to the runtimes; they feed this object every report and
call :meth:`Controller.tick` periodically. What a report of a kind means is its role's: each role declares the
aggregator of its reports (:mod:`srl.api.report`), which the runtime attaches here (:meth:`Controller.attach`)
with the plan's names of the workers. The controller itself knows no role: it keeps what every run has (the
clock, the run's counts in a :class:`~srl.system.tally.Tally`, warnings, failures and restarts, each worker's
time), decides why the run stops, prints the progress line, and writes the records and the summary, each
aggregator adding its part.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TextIO

import numpy as np

from srl.api.config import ExperimentConfig
from srl.api.report import Aggregator
from srl.base.stop_signals import held
from srl.system.cost import CostLedger
from srl.system.progress import ProgressLine
from srl.system.run_dir import Resume, RunCounters, RunDir, RunDirError, RunDirFull
from srl.system.tally import Tally

MIN_RECORD_SECONDS = 0.1
"""The shortest interval between metrics records (at the start of training; see ``Controller.record_interval``)."""
CORE_KINDS = ("error", "info", "spent")
"""Report kinds of every run, handled here: a worker's failure, a warning, and a worker process's last word on
what it spent (:mod:`srl.system.cost`: the entries every report of a process carries, sent once more as it ends,
whatever its role reports)."""
COUNTS = ("dropped_segments", "rejected_segment_messages")
"""Summary and record entries several kinds of report add to (each aggregator its share)."""


class Controller:
    """The clock and the report table of one run."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: RunDir | None,
        start_time: float,
        progress: TextIO | None = sys.stderr,
        resume: Resume | None = None,
        stop_request: threading.Event | None = None,
    ) -> None:
        """``resume``: what a resumed run continues from (its env steps, its policies' versions, the counters of
        the processes before this one). ``stop_request``: once set (from any thread), the run stops with
        ``stop_reason == "requested"``."""
        self.cfg, self.run_dir, self.start_time = cfg, run_dir, start_time
        self.progress = progress
        self.line = ProgressLine(progress)
        self.tally = Tally(cfg, self.warn, resume)
        self.wall_offset = 0.0 if resume is None or resume.counters is None else resume.counters.wall_seconds
        self.cost = CostLedger(cfg, None if resume is None or resume.counters is None else resume.counters.spent)
        """What the run spends: core-seconds by role, GPU-seconds, energy, money (its reports' entries)."""
        """Seconds the run ran in earlier processes (a resumed run's): its wall time counts on from them."""
        self.aggregators: dict[str, Aggregator] = {}
        """The report table: each kind's aggregator (:meth:`attach`)."""
        self.roles: dict[str, str] = {}
        """Each worker's role, by the names the plan gave them (the run waits on a role, not on a name)."""
        self.warnings: list[str] = []
        self.supervised: frozenset[str] = frozenset()
        """Workers the runtime restarts (by name): their error reports are kept for it instead of ending the run."""
        self.worker_errors: dict[str, str] = {}
        self.tracebacks: dict[str, str] = {}
        """The newest traceback of each failed worker (by name), until its restart warning or the run's error shows
        it."""
        self._shown: set[str] = set()  # tracebacks printed so far: a restart that fails alike does not repeat one
        self.restarts: dict[str, int] = {}
        self._skipped_writes = 0  # run directory writes skipped since its disk filled up
        self.restart_dropped_segments = 0
        self.timing: dict[str, dict[str, float]] = {}
        """Each worker's cumulative phase seconds (``total``, ``wait``, ...), from the ``t_`` entries of its reports."""
        self._timing_at_tick: dict[str, dict[str, float]] = {}  # ``timing`` as the last record saw it
        self.error: str | None = None
        self.stop_reason: str | None = None
        self.stop_request = stop_request
        self._last_tick = self._last_shown = time.time()
        self._last_steps = self.tally.env_steps
        self._fps = 0.0

    def attach(self, aggregators: Mapping[str, Aggregator], roles: Mapping[str, str]) -> None:
        """The run's report table (each kind's aggregator) and each worker's role, from the plan."""
        self.aggregators, self.roles = dict(aggregators), dict(roles)

    @property
    def kinds(self) -> frozenset[str]:
        """The report kinds this run takes: what a control channel accepts."""
        return frozenset((*CORE_KINDS, *self.aggregators))

    # ------------------------------------------------------------------ reports
    def handle(self, kind: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Take one worker report (dispatched by the control channel or called directly). Raises KeyError for a
        kind the run has no handler of (the control channel counts and logs it)."""
        worker = str(meta.get("worker", "?"))
        meta = self.cost.take(worker, meta)
        if "t_total" in meta:
            self.timing[worker] = {k[2:]: float(v) for k, v in meta.items() if k.startswith("t_")}
        if kind == "info":  # a warning: printed on its own line and counted, the run goes on
            self.warn(f"{worker}: {meta.get('message', '')}")
        elif kind == "error":
            self.worker_failed(worker, str(meta.get("message", "failed")), str(meta.get("traceback", "")))
        elif kind == "spent":  # taken above
            pass
        elif kind in self.aggregators:
            self.aggregators[kind].handle(worker, meta, arrays)
        else:  # the control channel counts and logs it
            raise KeyError(f"no handler of report kind {kind!r} in this run")

    # RunFacts: what the aggregators feed
    def add_env_steps(self, worker: str, steps: int) -> None:
        self.tally.add_steps(worker, steps)

    def add_episodes(self, returns: np.ndarray, owners: np.ndarray | None = None) -> None:
        self.tally.add_episodes(returns, owners)

    def set_version(self, policy: int, version: int) -> None:
        self.tally.versions[policy] = version

    def solve_by_best_policy(self) -> None:
        self.tally.by_best_policy = True

    def worker_failed(self, worker: str, message: str, traceback: str = "") -> None:
        """``worker`` failed with ``message``. Its traceback goes to the run directory's ``errors.log`` now, and to
        the progress stream with its restart warning or the run's error. A supervised worker's error waits for the
        runtime's decision (restart or end); another's ends the run."""
        if traceback:
            self.tracebacks[worker] = traceback
            self._write(lambda rd: rd.log_failure(worker, message, traceback))
        if worker in self.supervised:
            self.worker_errors[worker] = message
        else:
            self.fail(f"{worker}: {message}", worker)

    def fail(self, message: str, worker: str | None = None) -> None:
        """Stop the run with ``message`` as its error (the first one stands); when the failure is ``worker``'s, its
        traceback is printed."""
        if self.error is None:
            self.error = message
            self.stop_reason = "error"
            self.show_traceback(worker)

    def show_traceback(self, worker: str | None) -> None:
        """Print the traceback ``worker`` reported on lines of its own, unless the same one was printed already."""
        text = self.tracebacks.pop(worker, "") if worker is not None else ""
        if text and text not in self._shown:
            self._shown.add(text)
            self.line.note(text.rstrip("\n"))

    def _write(self, write: Callable[[RunDir], None]) -> None:
        """Write to the run directory; a lost one (deleted or moved) ends the run with one line. While its disk is
        full the writes are skipped (one warning, and another once they go through again) and the run goes on."""
        if self.run_dir is None:
            return
        try:
            write(self.run_dir)
        except RunDirFull as exc:
            self._skipped_writes += 1
            if self._skipped_writes == 1:
                self.warn(f"{exc}: skipped while the disk is full; the run goes on")
            return
        except RunDirError as exc:
            self.fail(str(exc))
            return
        if self._skipped_writes:
            self.warn(f"run directory {self.run_dir.path}: written again, {self._skipped_writes} write(s) skipped")
            self._skipped_writes = 0

    def note_restart(self, worker: str, cause: str, dropped_segments: int) -> None:
        """The runtime restarted ``worker`` after ``cause``: counted, said, and its new start counts from 0 (its
        earlier starts' counts are kept)."""
        self.restarts[worker] = self.restarts.get(worker, 0) + 1
        self.restart_dropped_segments += dropped_segments
        self.tally.restarted(worker)
        self.cost.restarted(worker)
        for aggregator in self.aggregators.values():
            aggregator.restarted(worker)
        self.handle(
            "info",
            {
                "worker": worker,
                "message": f"restarted ({self.restarts[worker]}) after: {cause}; "
                f"{dropped_segments} segments it held dropped",
            },
            {},
        )
        self.show_traceback(worker)

    # ------------------------------------------------------------------ the run's state
    @property
    def env_steps(self) -> int:
        """Env steps the run has taken, resumed runs' earlier processes included."""
        return self.tally.env_steps

    def worker_env_steps(self, worker: str) -> int:
        """Env steps ``worker`` took in this process, over all its starts (as reported)."""
        return self.tally.worker_steps(worker)

    @property
    def policy_version(self) -> int:
        """The version every policy has reached."""
        return self.tally.policy_version

    def version_of(self, policy: int) -> int:
        """Policy ``policy``'s newest version: its lead trainer's report, or the one this process started at."""
        return self.tally.versions[policy]

    @property
    def wall_seconds(self) -> float:
        """Seconds the run has run: this process's since its start, and those of the processes it resumes."""
        return self.wall_offset + time.time() - self.start_time

    def counters(self) -> RunCounters:
        """What a resumed run continues from."""
        return self.tally.counters(self.wall_seconds, self.cost.spent(self.roles))

    # ------------------------------------------------------------------ periodic
    def should_stop(self) -> str | None:
        """Why the run should stop now, or None."""
        if self.stop_reason is not None:
            return self.stop_reason
        run, started = self.cfg.run, self.tally.first_step_at
        if self.stop_request is not None and self.stop_request.is_set():
            self.stop_reason = "requested"
        elif self.tally.solved_at is not None:
            self.stop_reason = "solved"
            self.cost.reached_target(self.roles, self.wall_seconds, self.tally.solved_env_steps or self.env_steps)
        elif self.tally.env_steps >= run.total_env_steps:
            self.stop_reason = "env_steps"
        elif run.max_wall_seconds is not None and time.time() - self.start_time >= run.max_wall_seconds:
            self.stop_reason = "wall_time"
        elif run.max_train_seconds is not None and started is not None:
            if time.time() - started >= run.max_train_seconds:
                self.stop_reason = "train_time"
        return self.stop_reason

    def tick(self, force: bool = False) -> None:
        """A metrics record when one is due (:meth:`record_interval`), and the progress line every
        ``log_interval_seconds``."""
        now = time.time()
        if not force and now - self._last_tick < self.record_interval(now):
            return
        steps = self.tally.env_steps
        dt = now - self._last_tick
        self._fps = (steps - self._last_steps) / dt if dt > 0 else 0.0
        self._last_tick, self._last_steps = now, steps
        record = self.record()
        self._write(lambda rd: rd.log(record, steps))
        self._write(lambda rd: rd.write_counters(self.counters()))  # after the record: never older than it
        if self.progress is not None and (force or now - self._last_shown >= self.cfg.run.log_interval_seconds):
            self._last_shown = now
            self.line.show(self._progress_text(record))

    def _progress_text(self, record: Mapping[str, Any]) -> str:
        """The progress line: the clock and the run's counts, each kind's part, the role the run waits on."""
        parts = "".join(
            part for a in self.aggregators.values() if (part := getattr(a, "progress", lambda r: "")(record))
        )
        return (
            f"[{record['wall_seconds']:7.1f}s] steps {record['env_steps']:>10,d}  fps {self._fps:>9,.0f}  "
            f"return {_mean_text(record['return_mean']):>8s}  episodes {self.tally.episodes:>6d}  "
            f"version {record['policy_version']:>5d}  {parts}waits on {record.get('bottleneck', '-'):<7s}  "
        )

    def record_interval(self, now: float) -> float:
        """Seconds between metrics records: ``log_interval_seconds``, but while training is young an eighth of its
        time so far (at least :data:`MIN_RECORD_SECONDS`), so that a run of a few seconds (the quick start's)
        draws its curves from a dozen records, not two."""
        interval, started = self.cfg.run.log_interval_seconds, self.tally.first_step_at
        if started is None:
            return interval
        return min(interval, max(MIN_RECORD_SECONDS, (now - started) / 8))

    def record(self) -> dict[str, Any]:
        """The current metrics record: the run's counts, each kind's entries, where the workers' time went."""
        tally = self.tally
        rec: dict[str, Any] = {
            "wall_seconds": self.wall_seconds,
            "env_steps": tally.env_steps,
            "fps": self._fps,
            "episodes": tally.episodes,
            "return_mean": tally.return_mean,
            "policy_version": tally.policy_version,
            "dropped_segments": self.restart_dropped_segments,
            "restarts": sum(self.restarts.values()),
        }
        if len(tally.names) > 1:  # each policy's own, as ``<policy>/<metric>``
            rec.update({f"{name}/return_mean": tally.policy_return_mean(k) for k, name in enumerate(tally.names)})
        for aggregator in self.aggregators.values():
            _merge(rec, aggregator.record())
        rec.update(self.time_fractions())
        rec.update(self.cost.record(self.roles))
        now_load = {w: busy_fraction(times, self._timing_at_tick.get(w)) for w, times in sorted(self.timing.items())}
        self._timing_at_tick = {w: dict(times) for w, times in self.timing.items()}
        rec.update({f"busy/{w}": b for w, b in now_load.items() if b is not None})
        slowest = bottleneck(now_load, self.roles)
        if slowest is not None:
            rec["bottleneck"] = slowest
        return rec

    def time_fractions(self) -> dict[str, float]:
        """Where each worker's time went, as fractions of its lifetime: ``actor0/env``, ``trainer0/train``, ..."""
        out = {}
        for worker, times in sorted(self.timing.items()):
            total = times.get("total", 0.0)
            if total > 0:
                out.update({f"{worker}/{k}": v / total for k, v in times.items() if k != "total"})
        return out

    def warn(self, message: str) -> None:
        """Record a warning for ``summary.json`` and print it on its own line; the run goes on."""
        self.warnings.append(message)
        self.line.note(f"warning: {message}")

    def summary(self, final_eval: Mapping[str, Any] | None) -> dict[str, Any]:
        """``summary.json`` content (see DESIGN.md for the contract).

        ``wall_seconds``, ``solved_wall_seconds`` and ``episodes`` count the whole run, a resumed run's earlier
        processes included; ``train_fps`` and ``trained_samples_per_second`` are this process's rates (its env
        steps and trained samples over its seconds since its first env step), as ``srl bench`` and ``srl tune``
        measure them."""
        now, tally = time.time(), self.tally
        train_seconds = now - (tally.first_step_at or now)
        out: dict[str, Any] = {
            "name": self.cfg.name,
            "env_id": self.cfg.env.id,
            "runtime": self.cfg.runtime,
            "stop_reason": self.stop_reason or "interrupted",
            "env_steps": tally.env_steps,
            "episodes": tally.episodes,
            "wall_seconds": self.wall_offset + now - self.start_time,
            "train_fps": (tally.env_steps - tally.steps_offset) / train_seconds if train_seconds > 0 else 0.0,
            "train_return_mean": tally.return_mean,
            "policy_version": tally.policy_version,
            "dropped_segments": self.restart_dropped_segments,
            "warnings": self.warnings[-20:],
            "restarts": dict(sorted(self.restarts.items())),
            "time_fractions": self.time_fractions(),
        }
        for aggregator in self.aggregators.values():
            _merge(out, aggregator.summary())
        # samples that reached an update (this process), per second: below train_fps when the trainer binds
        # and segments too stale for it are dropped, or are still in flight at the end
        trained = int(out.get("trained_samples", 0))
        out["trained_samples_per_second"] = trained / train_seconds if train_seconds > 0 else 0.0
        whole_run = bottleneck({w: busy_fraction(times) for w, times in self.timing.items()}, self.roles)
        if whole_run is not None:
            out["bottleneck"] = whole_run
        out["final_eval_return_mean"] = None  # part of the contract: null when no evaluation ran
        if final_eval is not None:
            out.update({f"final_eval_{k}": v for k, v in final_eval.items() if k not in ("policies", "best")})
            for aggregator in self.aggregators.values():  # what a kind reads in it (the best of several members)
                if callable(final := getattr(aggregator, "final", None)):
                    _merge(out, final(final_eval))
        out["policies"] = self._policies_summary(final_eval)
        out["cost"] = self.cost.summary(self.roles)
        if self.cfg.run.target_return is not None:
            out["target_return"] = self.cfg.run.target_return
            out["solved"] = tally.solved_at is not None
            if tally.solved_at is not None:
                out["solved_wall_seconds"] = self.wall_offset + tally.solved_at - self.start_time
                out["solved_env_steps"] = tally.solved_env_steps
                out["solved_return_mean"] = tally.solved_return_mean
        if self.error is not None:
            out["error"] = self.error
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in out.items()}

    def _policies_summary(self, final_eval: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
        """Per policy: its version, its agents' recent training return and their final evaluation return."""
        out, tally = {}, self.tally
        per_policy = (final_eval or {}).get("policies", {})
        for k, name in enumerate(tally.names):
            if len(tally.names) == 1:  # the run's own numbers (its evaluation has no per-policy part)
                final = None if final_eval is None else final_eval.get("return_mean")
            else:
                final = per_policy.get(name, {}).get("return_mean")
            out[name] = {
                "policy_version": tally.versions[k],
                "train_return_mean": tally.policy_return_mean(k) if tally.policy_windows[k] else None,
                "final_eval_return_mean": final,
            }
        return out


def _merge(into: dict[str, Any], part: Mapping[str, Any]) -> None:
    """An aggregator's entries into a record or summary: a count several kinds add to (:data:`COUNTS`) is summed,
    and a section several kinds fill (a dict: the trainers count copies in another kind's) is merged."""
    for key, value in part.items():
        if key in COUNTS:
            into[key] = into.get(key, 0) + value
        elif isinstance(value, Mapping) and isinstance(into.get(key), Mapping):
            into[key] = {**into[key], **value}
        else:
            into[key] = value


@contextlib.contextmanager
def stop_on_signals(controller: Controller) -> Iterator[None]:
    """Inside this block the first SIGINT or SIGTERM, or one that came while the run was starting, stops the run
    as ``interrupted``; a second raises KeyboardInterrupt, and the runtime stops waiting for its workers but still
    cleans up (why: :mod:`srl.base.stop_signals`). Every runtime uses this one block."""

    def interrupted() -> None:
        controller.stop_reason = controller.stop_reason or "interrupted"

    with held(interrupted):
        yield


def _mean_text(mean: float) -> str:
    """A mean return for the progress line: ``-`` before any episode has ended (not ``nan``)."""
    return f"{mean:.2f}" if np.isfinite(mean) else "-"


def busy_fraction(times: Mapping[str, float], before: Mapping[str, float] | None = None) -> float | None:
    """The share of a worker's time it was busy, from its cumulative phase seconds (``total`` and its phases),
    since ``before`` (an earlier report of the same worker) or over its life: everything but waiting for work
    (``wait``: an actor for its actions, a policy worker for requests, a trainer for samples); a worker without a
    ``wait`` phase (a stage) is busy in the phases it names. None: no time passed (or the worker restarted, so
    its counters went back)."""

    def delta(key: str) -> float:
        return times.get(key, 0.0) - (before.get(key, 0.0) if before is not None else 0.0)

    total = delta("total")
    if total <= 0.0:
        return None
    if "wait" in times:
        busy = total - delta("wait")
    else:
        busy = sum(delta(k) for k in times if k != "total")
    return min(1.0, max(0.0, busy / total))


def bottleneck(load: Mapping[str, float | None], roles: Mapping[str, str]) -> str | None:
    """The role the run waits on: the one whose workers are busiest on average (the others wait for it); None
    before any worker reported time. ``roles``: each worker's role, as the plan names them."""
    by_role: dict[str, list[float]] = {}
    for worker, busy in load.items():
        if busy is not None and worker in roles:
            by_role.setdefault(roles[worker], []).append(busy)
    if not by_role:
        return None
    return max(sorted(by_role), key=lambda role: sum(by_role[role]) / len(by_role[role]))
