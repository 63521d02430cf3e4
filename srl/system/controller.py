"""The controller's bookkeeping: what the workers report, when the run stops, what is recorded.

Placement (starting and watching processes) belongs to the runtimes; they
feed this object every report and call :meth:`tick` periodically. It keeps
the episode window for the target, prints the progress line, writes metrics
records, and decides why the run stops.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TextIO

import numpy as np

from srl.api.config import ExperimentConfig
from srl.base.stop_signals import held
from srl.system.progress import ProgressLine
from srl.system.run_dir import Resume, RunCounters, RunDir, RunDirError

MIN_RECORD_SECONDS = 0.1
"""The shortest interval between metrics records (at the start of training; see ``Controller.record_interval``)."""


class Controller:
    """Aggregates reports of all workers of one run."""

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
        self.cfg = cfg
        self.env_steps_offset = 0 if resume is None else resume.env_steps
        """Env steps taken before this process: the run counts on from them."""
        self.start_versions = (0,) * len(cfg.policy_names) if resume is None else resume.versions
        """Each policy's version as this process starts (what the progress line shows before its trainer reports)."""
        self.run_dir = run_dir
        self.start_time = start_time
        self.progress = progress
        self.line = ProgressLine(progress)
        self.window: deque[float] = deque(maxlen=cfg.run.return_window)
        self.names = cfg.policy_names
        self.policy_windows: list[deque[float]] = [deque(maxlen=cfg.run.return_window) for _ in self.names]
        """Each policy's recent episode returns (its agents')."""
        self.actor_steps: dict[int, int] = {}
        self.actor_nonfinite: dict[int, int] = {}
        self.actor_lost: dict[int, int] = {}
        """Each actor's segments sent across nodes that no trainer took (the connection dropped), this start's."""
        self.episodes = 0
        self.wall_offset = 0.0
        """Seconds the run ran in earlier processes (a resumed run's): its wall time counts on from them."""
        self.trainers: dict[int, Mapping[str, Any]] = {}
        self.adopted: dict[int, tuple[int, int]] = {}
        """Per trainer: population copies its earlier incarnations took, and its current one's count."""
        self.policy: dict[int, Mapping[str, Any]] = {}
        self.param_service: dict[str, Mapping[str, Any]] = {}
        self.stages: dict[str, dict[str, Any]] = {}
        self.replays: dict[str, dict[str, Any]] = {}
        """Each replay's newest report: its store's size and counters (``replay<i>_...`` in the metrics)."""
        self.actor_explore: dict[int, dict[str, float]] = {}
        """Each actor's newest exploration statistics (``explore_epsilon``), averaged in the metrics."""
        """The newest report of each stage worker, by name (its counters include its earlier incarnations)."""
        self._stage_before: dict[str, dict[str, int]] = {}
        self._replay_rejected_before: dict[str, int] = {}  # messages refused by earlier starts of each replay
        self.evals: list[Mapping[str, Any]] = []
        self.league: dict[str, Any] = {}
        """The league worker's newest round (its Elo ratings, scores and pool)."""
        self.population: dict[str, Any] = {}
        """The population worker's newest report: each member's hyperparameters and score, copies made."""
        self.warnings: list[str] = []
        self.supervised: frozenset[str] = frozenset()
        """Workers the runtime restarts (by name): their error reports are kept for it instead of ending the run."""
        self.worker_errors: dict[str, str] = {}
        self.tracebacks: dict[str, str] = {}
        """The newest traceback of each failed worker (by name), until its restart warning or the run's error shows
        it."""
        self._shown: set[str] = set()  # tracebacks printed so far: a restart that fails alike does not repeat one
        self.restarts: dict[str, int] = {}
        self.restart_dropped_segments = 0
        self._actor_steps_before: dict[int, int] = {}  # env steps of earlier incarnations of each actor
        self.lag_hist = np.zeros(1, np.int64)
        self.timing: dict[str, dict[str, float]] = {}
        self._timing_at_tick: dict[str, dict[str, float]] = {}  # ``timing`` as the last record saw it
        self.error: str | None = None
        self.solved_at: float | None = None
        self.solved_env_steps: int | None = None
        self.solved_return_mean: float | None = None
        self._warned_early = False  # a target met too early to count is said once
        self.stop_reason: str | None = None
        self.stop_request = stop_request
        self._last_tick = self._last_shown = time.time()
        self._last_steps = self.env_steps_offset
        self._fps = 0.0
        self._train_start: float | None = None
        if resume is not None and resume.counters is not None:  # wall time, episodes and the windows go on
            self.restore(resume.counters)

    # ------------------------------------------------------------------ reports
    def handle(self, kind: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Take one worker report (dispatched by the control channel or called directly)."""
        if "t_total" in meta and kind in ("actor", "policy", "trainer", "stage", "replay"):
            self.timing[f"{kind}{meta[kind]}"] = {k[2:]: float(v) for k, v in meta.items() if k.startswith("t_")}
        if kind == "actor":  # its steps first: episodes that end in this report count at the steps that ended them
            self.actor_steps[int(meta["actor"])] = int(meta["env_steps"])
        if kind in ("actor", "stage"):  # a stage that writes the rewards reports the returns (the actors then don't)
            returns = arrays.get("episode_returns")
            if returns is not None and len(returns):
                self.window.extend(float(r) for r in returns)
                self.episodes += len(returns)
                owners = arrays.get("episode_policies")
                if owners is None:  # a stage serves one policy's run
                    self.policy_windows[0].extend(float(r) for r in returns)
                elif len(owners) == len(returns):
                    for k, r in zip(owners.tolist(), returns.tolist()):
                        if 0 <= k < len(self.names):
                            self.policy_windows[k].append(float(r))
                self._check_solved()
        if kind == "actor":
            if self._train_start is None and self.env_steps > self.env_steps_offset:
                self._train_start = time.time()  # the first env step reported: training rates count from here
            self.actor_nonfinite[int(meta["actor"])] = int(meta.get("nonfinite_steps", 0))
            self.actor_lost[int(meta["actor"])] = int(meta.get("lost_segments", 0))
            explore = {k: float(v) for k, v in meta.items() if k.startswith("explore_")}
            if explore:  # an algorithm's exploration (epsilon), averaged over the actors in the metrics
                self.actor_explore[int(meta["actor"])] = explore
        elif kind == "trainer":
            trainer = int(meta.get("trainer", 0))
            self.trainers[trainer] = dict(meta)
            earlier, last = self.adopted.get(trainer, (0, 0))
            now = int(meta.get("adopted", 0))
            self.adopted[trainer] = (earlier + last, now) if now < last else (earlier, now)  # restarted: from 0
            hist = arrays.get("lag_hist")
            if hist is not None and len(hist):
                if len(hist) > len(self.lag_hist):
                    self.lag_hist = np.pad(self.lag_hist, (0, len(hist) - len(self.lag_hist)))
                self.lag_hist[: len(hist)] += hist
        elif kind == "policy":
            self.policy[int(meta["policy"])] = dict(meta)
        elif kind == "info":  # a warning: printed on its own line and counted, the run goes on
            self.warn(f"{meta.get('worker', '?')}: {meta.get('message', '')}")
        elif kind == "eval":
            self.evals.append(dict(meta))
        elif kind == "league":
            self.league = dict(meta)
        elif kind == "population":
            self.population = dict(meta)
        elif kind == "params":
            self.param_service[str(meta["service"])] = dict(meta)
        elif kind == "stage":
            name = f"stage{int(meta['stage'])}"
            before = self._stage_before.get(name, {})
            stats = {k: v for k, v in meta.items() if k != "stage" and not k.startswith("t_")}
            for key in ("kept", "dropped"):
                stats[key] = int(meta[key]) + before.get(key, 0)
            self.stages[name] = stats
        elif kind == "replay":  # its store's counters carry on across its restarts; its process's do not
            name = f"replay{int(meta['replay'])}"
            stats = {k: v for k, v in meta.items() if k != "replay" and not k.startswith("t_")}
            refused_before = self._replay_rejected_before.get(name, 0)
            stats["rejected_segments"] = int(meta.get("rejected_segments", 0)) + refused_before
            self.replays[name] = stats
        elif kind == "error":
            worker, traceback = str(meta.get("worker", "?")), str(meta.get("traceback", ""))
            self.worker_failed(worker, str(meta.get("message", "failed")), traceback)

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
        """Write to the run directory; a lost one (deleted, a full disk) ends the run with one line."""
        if self.run_dir is not None:
            try:
                write(self.run_dir)
            except RunDirError as exc:
                self.fail(str(exc))

    @property
    def trainer(self) -> Mapping[str, Any]:
        """The newest report of the first policy's lead trainer (rank 0, which publishes), or of any before it
        reports."""
        if 0 in self.trainers:
            return self.trainers[0]
        return next(iter(self.trainers.values()), {})

    def lead_trainer(self, policy: int) -> Mapping[str, Any]:
        """The newest report of policy ``policy``'s lead trainer (empty before it reports)."""
        return self.trainers.get(policy * self.cfg.workers.trainers, {})

    @property
    def policy_version(self) -> int:
        """The version every policy has reached (the one policy's version in a run of one)."""
        if len(self.names) == 1:
            return int(self.trainer.get("version", self.start_versions[0]))
        return min(self.version_of(k) for k in range(len(self.names)))

    def version_of(self, policy: int) -> int:
        """Policy ``policy``'s newest version: its lead trainer's report, or the one this process started at."""
        return int(self.lead_trainer(policy).get("version", self.start_versions[policy]))

    @property
    def dropped_segments(self) -> int:
        """Segments dropped as too stale by trainers, unfinished ones of actors that died, and those sent across
        nodes that no trainer took."""
        stale = sum(int(t.get("dropped_segments", 0)) for t in self.trainers.values())
        return stale + self.restart_dropped_segments + sum(self.actor_lost.values())

    def actor_env_steps(self, actor: int) -> int:
        """Env steps actor ``actor`` took in this process, over all its starts (as reported)."""
        return self._actor_steps_before.get(actor, 0) + self.actor_steps.get(actor, 0)

    @property
    def env_steps(self) -> int:
        return self.env_steps_offset + sum(self._actor_steps_before.values()) + sum(self.actor_steps.values())

    def note_restart(self, worker: str, cause: str, dropped_segments: int, actor: int | None = None) -> None:
        """The runtime restarted ``worker`` after ``cause``. When it is actor ``actor``, its new process counts its
        steps from 0 again: the steps of the one before are kept."""
        self.restarts[worker] = self.restarts.get(worker, 0) + 1
        self.restart_dropped_segments += dropped_segments
        if actor is not None:  # its new process counts its lost segments from 0 again too
            self.restart_dropped_segments += self.actor_lost.pop(actor, 0)
            self._actor_steps_before[actor] = self._actor_steps_before.get(actor, 0) + self.actor_steps.pop(actor, 0)
        if worker in self.stages:  # its new process counts from 0 again
            self._stage_before[worker] = {key: int(self.stages[worker][key]) for key in ("kept", "dropped")}
        if worker in self.replays:  # so does a replay worker's count of refused messages
            self._replay_rejected_before[worker] = int(self.replays[worker].get("rejected_segments", 0))
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

    @property
    def wall_seconds(self) -> float:
        """Seconds the run has run: this process's since its start, and those of the processes it resumes."""
        return self.wall_offset + time.time() - self.start_time

    def counters(self) -> RunCounters:
        """What a resumed run continues from (:meth:`restore`)."""
        returns = {name: list(window) for name, window in zip(self.names, self.policy_windows)}
        return RunCounters(self.wall_seconds, self.env_steps, self.episodes, list(self.window), returns)

    def restore(self, counters: RunCounters) -> None:
        """Continue the wall time, the episode count and the return windows of the run's earlier processes."""
        self.wall_offset, self.episodes = counters.wall_seconds, counters.episodes
        self.window.extend(counters.returns)
        for name, window in zip(self.names, self.policy_windows):
            window.extend(counters.policy_returns.get(name, []))

    @property
    def return_mean(self) -> float:
        return float(np.mean(self.window)) if self.window else float("nan")

    def _solving_window(self) -> tuple[float, int]:
        """The return the target is held against and how many episodes it is the mean of: the run's window, or a
        population's best member's (its members' episodes are no one policy's)."""
        if not self.cfg.population.enabled:
            return self.return_mean, len(self.window)
        windows = [w for w in self.policy_windows if w]
        if not windows:
            return float("nan"), 0
        full = [w for w in windows if len(w) >= self.cfg.run.return_window] or windows
        best = max(full, key=lambda w: float(np.mean(w)))
        return float(np.mean(best)), len(best)

    def _check_solved(self) -> None:
        target = self.cfg.run.target_return
        mean, seen = self._solving_window()
        if self.solved_at is not None or target is None or not mean >= target:
            return
        untrained = self.policy_version == 0 and self.env_steps_offset == 0
        if not untrained and seen >= self.cfg.run.return_window:
            self.solved_at = time.time()
            self.solved_env_steps = self.env_steps
            self.solved_return_mean = mean
        elif not self._warned_early:
            # A mean over fewer episodes than the window is noise; a target the untrained policy meets (every policy
            # still at version 0, nothing resumed) says nothing of learning, and was most likely set for another env.
            self._warned_early = True
            early = ["by the untrained policy"] if untrained else []
            if seen < self.cfg.run.return_window:
                early.append(f"after {seen} of run.return_window={self.cfg.run.return_window} episodes")
            hint = f" (is the target meant for {self.cfg.env.id}?)" if untrained else ""
            self.warn(
                f"run.target_return {target:g} met {', '.join(early)}: not counted as solved{hint}; training goes on"
            )

    # ------------------------------------------------------------------ periodic
    def should_stop(self) -> str | None:
        """Why the run should stop now, or None."""
        if self.stop_reason is not None:
            return self.stop_reason
        run = self.cfg.run
        if self.stop_request is not None and self.stop_request.is_set():
            self.stop_reason = "requested"
        elif self.solved_at is not None:
            self.stop_reason = "solved"
        elif self.env_steps >= run.total_env_steps:
            self.stop_reason = "env_steps"
        elif run.max_wall_seconds is not None and time.time() - self.start_time >= run.max_wall_seconds:
            self.stop_reason = "wall_time"
        elif (
            run.max_train_seconds is not None
            and self._train_start is not None
            and time.time() - self._train_start >= run.max_train_seconds
        ):
            self.stop_reason = "train_time"
        return self.stop_reason

    def tick(self, force: bool = False) -> None:
        """A metrics record when one is due (:meth:`record_interval`), and the progress line every
        ``log_interval_seconds``."""
        now = time.time()
        if not force and now - self._last_tick < self.record_interval(now):
            return
        steps = self.env_steps
        dt = now - self._last_tick
        self._fps = (steps - self._last_steps) / dt if dt > 0 else 0.0
        self._last_tick, self._last_steps = now, steps
        record = self.record()
        self._write(lambda rd: rd.log(record, steps))
        self._write(lambda rd: rd.write_counters(self.counters()))  # after the record: never older than it
        if self.progress is not None and (force or now - self._last_shown >= self.cfg.run.log_interval_seconds):
            self._last_shown = now
            self.line.show(
                f"[{record['wall_seconds']:7.1f}s] steps {steps:>10,d}  fps {self._fps:>9,.0f}  "
                f"return {_mean_text(record['return_mean']):>8s}  {vs_random_text(record)}"
                f"episodes {self.episodes:>6d}  "
                f"version {record['policy_version']:>5d}  lag {record.get('lag_mean', 0.0):5.2f}  "
                f"waits on {record.get('bottleneck', '-'):<7s}  "
            )

    def record_interval(self, now: float) -> float:
        """Seconds between metrics records: ``log_interval_seconds``, but while training is young an eighth of its
        time so far (at least :data:`MIN_RECORD_SECONDS`), so that a run of a few seconds (the quick start's)
        draws its curves from a dozen records, not two."""
        interval = self.cfg.run.log_interval_seconds
        if self._train_start is None:
            return interval
        return min(interval, max(MIN_RECORD_SECONDS, (now - self._train_start) / 8))

    def record(self) -> dict[str, Any]:
        """The current metrics record."""
        rec: dict[str, Any] = {
            "wall_seconds": self.wall_seconds,
            "env_steps": self.env_steps,
            "fps": self._fps,
            "episodes": self.episodes,
            "return_mean": self.return_mean,
            "policy_version": self.policy_version,
        }
        rec.update(
            {k: v for k, v in self.trainer.items() if k not in ("trainer", "version") and not k.startswith("t_")}
        )
        if len(self.names) > 1:  # each policy's own, as ``<policy>/<metric>``
            for k, name in enumerate(self.names):
                window = self.policy_windows[k]
                rec[f"{name}/return_mean"] = float(np.mean(window)) if window else float("nan")
                rec.update(
                    {
                        f"{name}/{key}": v
                        for key, v in self.lead_trainer(k).items()
                        if key != "trainer" and not key.startswith("t_")
                    }
                )
        rec["dropped_segments"] = self.dropped_segments  # all trainers', and those of actors that died
        rec.update(self._bytes_per_version())
        rec["nonfinite_steps"] = sum(self.actor_nonfinite.values())
        rec["restarts"] = sum(self.restarts.values())
        if self.evals:
            rec["eval_return_mean"] = float(self.evals[-1]["return_mean"])
            rec["eval_version"] = int(self.evals[-1]["version"])
            rec.update({f"eval_{k}": float(v) for k, v in self.evals[-1].items() if k.startswith("vs_random_")})
        rec.update({f"league_{k}": float(v) for k, v in self.league.items() if k not in ("version", "froze")})
        rec.update({k if "/" in k else f"population_{k}": float(v) for k, v in self.population.items()})
        rec["lag_histogram"] = self.lag_hist.tolist()  # samples per policy lag so far (TensorBoard: lag_mean/max)
        rec.update(self.time_fractions())
        now_load = {w: busy_fraction(times, self._timing_at_tick.get(w)) for w, times in sorted(self.timing.items())}
        self._timing_at_tick = {w: dict(times) for w, times in self.timing.items()}
        rec.update({f"busy/{w}": b for w, b in now_load.items() if b is not None})
        slowest = bottleneck(now_load)
        if slowest is not None:
            rec["bottleneck"] = slowest
        for stats in self.policy.values():
            batches = max(1, int(stats.get("batches", 0)))
            rec[f"policy{stats['policy']}_mean_batch"] = float(stats.get("samples", 0)) / batches
            rec[f"policy{stats['policy']}_version_lag"] = rec["policy_version"] - int(stats.get("version", -1))
            if "batch_cap" in stats:  # slots per forward pass at most (measured as the worker started)
                rec[f"policy{stats['policy']}_batch_cap"] = int(stats["batch_cap"])
        for name, stats in self.param_service.items():
            for key in ("sends", "bytes_sent", "rejected"):
                if key in stats:
                    rec[f"{name}_{key}"] = int(stats[key])
        for key in sorted({k for stats in self.actor_explore.values() for k in stats}):
            rec[key] = float(np.mean([s[key] for s in self.actor_explore.values() if key in s]))
        for name, stats in (*self.stages.items(), *self.replays.items()):
            rec.update({f"{name}_{k}": v for k, v in stats.items()})
        return rec

    def time_fractions(self) -> dict[str, float]:
        """Where each worker's time went, as fractions of its lifetime: ``actor0/env``, ``trainer0/train``, ..."""
        out = {}
        for worker, times in sorted(self.timing.items()):
            total = times.get("total", 0.0)
            if total > 0:
                out.update({f"{worker}/{k}": v / total for k, v in times.items() if k != "total"})
        return out

    def _eval_summary(self) -> dict[str, Any]:
        """Evaluations during training: how many, and the best one (kept in ``checkpoints/best.pt``)."""
        best = next((e for e in reversed(self.evals) if e.get("best")), None)  # what ``best.pt`` holds
        if best is None:
            return {"evaluations": len(self.evals)} if self.evals else {}
        return {
            "evaluations": len(self.evals),
            "best_eval_return_mean": float(best["return_mean"]),
            "best_eval_version": int(best["version"]),
            **{f"best_eval_{k}": float(v) for k, v in best.items() if k.startswith("vs_random_")},
        }

    def _policies_summary(self, final_eval: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
        """Per policy: its version, its agents' recent training return and their final evaluation return."""
        out = {}
        per_policy = (final_eval or {}).get("policies", {})
        for k, name in enumerate(self.names):
            window = self.policy_windows[k]
            if len(self.names) == 1:  # the run's own numbers (its evaluation has no per-policy part)
                version = self.policy_version
                final = None if final_eval is None else final_eval.get("return_mean")
            else:
                version = self.version_of(k)
                final = per_policy.get(name, {}).get("return_mean")
            out[name] = {
                "policy_version": version,
                "train_return_mean": float(np.mean(window)) if window else None,
                "final_eval_return_mean": final,
            }
        return out

    def _bytes_per_version(self) -> dict[str, float]:
        """Parameter bytes published per snapshot, and gradient bytes all-reduced per update with the seconds the
        reductions took (per trainer, its waits for its peers included)."""
        t = self.trainer  # counters of the reporting trainer process (from 0 again after a resume or restart)
        out = {}
        if int(t.get("snapshots_published", 0)) > 0:
            out["bytes_published_per_version"] = float(t["bytes_published"]) / int(t["snapshots_published"])
        if int(t.get("updates", 0)) > 0 and "bytes_reduced" in t:
            out["bytes_reduced_per_update"] = float(t["bytes_reduced"]) / int(t["updates"])
        if int(t.get("updates", 0)) > 0 and "seconds_reduced" in t:
            out["reduce_seconds_per_update"] = float(t["seconds_reduced"]) / int(t["updates"])
        return out

    def warn(self, message: str) -> None:
        """Record a warning for ``summary.json`` and print it on its own line; the run goes on."""
        self.warnings.append(message)
        self.line.note(f"warning: {message}")

    def summary(self, final_eval: Mapping[str, float] | None) -> dict[str, Any]:
        """``summary.json`` content (see DESIGN.md for the contract).

        ``wall_seconds``, ``solved_wall_seconds`` and ``episodes`` count the whole run, a resumed run's earlier
        processes included; ``train_fps`` and ``trained_samples_per_second`` are this process's rates (its env
        steps and trained samples over its seconds since its first env step), as ``srl bench`` and ``srl tune``
        measure them."""
        now = time.time()
        train_seconds = now - (self._train_start or now)
        new_steps = self.env_steps - self.env_steps_offset
        # samples that reached an update: counted by policy lag on-policy, by items drawn from a replay
        trained = int(self.lag_hist.sum()) or sum(int(t.get("trained_items", 0)) for t in self.trainers.values())
        out: dict[str, Any] = {
            "name": self.cfg.name,
            "env_id": self.cfg.env.id,
            "runtime": self.cfg.runtime,
            "stop_reason": self.stop_reason or "interrupted",
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "wall_seconds": self.wall_offset + now - self.start_time,
            "train_fps": new_steps / train_seconds if train_seconds > 0 else 0.0,
            # samples that reached an update (this process), per second: below train_fps when the trainer binds
            # and segments too stale for it are dropped, or are still in flight at the end
            "trained_samples": trained,
            "trained_samples_per_second": trained / train_seconds if train_seconds > 0 else 0.0,
            "train_return_mean": self.return_mean,
            "policy_version": self.policy_version,
            "dropped_segments": self.dropped_segments,
            # messages a network sample stream refused, at trainers and at replays (a dropped insert)
            "rejected_segment_messages": sum(int(t.get("rejected_segment_messages", 0)) for t in self.trainers.values())
            + sum(int(r.get("rejected_segments", 0)) for r in self.replays.values()),
            "nonfinite_steps": sum(self.actor_nonfinite.values()),
            **self._eval_summary(),
            "warnings": self.warnings[-20:],
            "restarts": dict(sorted(self.restarts.items())),
            "lag_histogram": self.lag_hist.tolist(),
            **self._bytes_per_version(),
            "param_service": {
                name: {k: v for k, v in stats.items() if k != "service"}
                for name, stats in sorted(self.param_service.items())
            },
            "stages": dict(sorted(self.stages.items())),
            "replays": dict(sorted(self.replays.items())),
            "time_fractions": self.time_fractions(),
        }
        whole_run = bottleneck({w: busy_fraction(times) for w, times in self.timing.items()})
        if whole_run is not None:
            out["bottleneck"] = whole_run
        if self.league:
            out["league"] = dict(self.league)
        if self.population:
            out["population"] = dict(self.population)
            # the copies each trainer took (each of a member's data-parallel trainers takes every one)
            out["population"]["adopted"] = {f"trainer{i}": sum(n) for i, n in sorted(self.adopted.items())}
        out["final_eval_return_mean"] = None  # part of the contract: null when no evaluation ran
        if final_eval is not None:
            out.update({f"final_eval_{k}": v for k, v in final_eval.items() if k not in ("policies", "best")})
            if "best" in final_eval:  # a population's: the best member's evaluation is the run's
                out.setdefault("population", {})["best"] = final_eval["best"]
        out["policies"] = self._policies_summary(final_eval)
        if self.cfg.run.target_return is not None:
            out["target_return"] = self.cfg.run.target_return
            out["solved"] = self.solved_at is not None
            if self.solved_at is not None:
                out["solved_wall_seconds"] = self.wall_offset + self.solved_at - self.start_time
                out["solved_env_steps"] = self.solved_env_steps
                out["solved_return_mean"] = self.solved_return_mean
        if self.error is not None:
            out["error"] = self.error
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in out.items()}


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


def vs_random_text(record: Mapping[str, Any]) -> str:
    """The progress line's part for the eval worker's games against a uniform random player (the learning signal
    of self-play, whose returns average 0): ``win 0.62 draw 0.10 loss 0.28 vs random``; empty before any."""
    if "eval_vs_random_win_rate" not in record:
        return ""
    rates = (record[f"eval_vs_random_{k}_rate"] for k in ("win", "draw", "loss"))
    return "win {:.2f} draw {:.2f} loss {:.2f} vs random  ".format(*rates)


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


def bottleneck(load: Mapping[str, float | None]) -> str | None:
    """The kind of worker (``actor``, ``policy``, ``trainer``, ``stage``) the run waits on: the one whose workers
    are busiest on average (the others wait for it); None before any worker reported time."""
    by_kind: dict[str, list[float]] = {}
    for worker, busy in load.items():
        if busy is not None:
            by_kind.setdefault(worker.rstrip("0123456789"), []).append(busy)
    if not by_kind:
        return None
    return max(sorted(by_kind), key=lambda kind: sum(by_kind[kind]) / len(by_kind[kind]))
