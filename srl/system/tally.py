"""What the whole run counts, whichever workers report it: env steps, episodes and their returns, policy versions,
and whether the target is met.

Reports feed it through the controller (:class:`~srl.api.report.RunFacts`); the controller's stop conditions,
progress line, records and summary read it, and ``checkpoints/controller.json`` saves it for a resumed run. It
knows workers only by the names the plan gave them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from srl.api.config import ExperimentConfig
from srl.api.report import Counts
from srl.system.run_dir import Resume, RunCounters


class Tally:
    """The run's counts (``resume``: what the processes before this one counted)."""

    def __init__(self, cfg: ExperimentConfig, warn: Callable[[str], None], resume: Resume | None = None) -> None:
        self.cfg, self.warn = cfg, warn
        self.names = cfg.policy_names
        self.window: deque[float] = deque(maxlen=cfg.run.return_window)
        self.policy_windows: list[deque[float]] = [deque(maxlen=cfg.run.return_window) for _ in self.names]
        """Each policy's recent episode returns (its agents')."""
        self.episodes = 0
        self.steps_offset = 0 if resume is None else resume.env_steps
        """Env steps taken before this process: the run counts on from them."""
        self._steps = Counts()  # each worker's env steps, over its starts
        self.versions = list((0,) * len(self.names) if resume is None else resume.versions)
        """Each policy's newest version (as this process started, until its lead trainer reports)."""
        self.by_best_policy = False
        """The policies are alternatives (a population's members): the best one's window is held to the target."""
        self.solved_at: float | None = None
        self.solved_env_steps: int | None = None
        self.solved_return_mean: float | None = None
        self._warned_early = False  # a target met too early to count is said once
        self.first_step_at: float | None = None
        """When the first env step of this process was reported: training rates count from here."""
        if resume is not None and resume.counters is not None:
            self.restore(resume.counters)

    # ------------------------------------------------------------------ fed by reports
    def add_steps(self, worker: str, steps: int) -> None:
        self._steps.set(worker, {"env_steps": steps})
        if self.first_step_at is None and self.env_steps > self.steps_offset:
            self.first_step_at = time.time()

    def add_episodes(self, returns: np.ndarray, owners: np.ndarray | None) -> None:
        if not len(returns):
            return
        self.window.extend(float(r) for r in returns)
        self.episodes += len(returns)
        if owners is None:  # a worker that serves one policy's run (a stage)
            self.policy_windows[0].extend(float(r) for r in returns)
        elif len(owners) == len(returns):
            for k, r in zip(owners.tolist(), returns.tolist()):
                if 0 <= k < len(self.names):
                    self.policy_windows[k].append(float(r))
        self._check_solved()

    def restarted(self, worker: str) -> None:
        """``worker`` starts again and counts its steps from 0: the steps of its earlier starts are kept."""
        self._steps.restarted(worker)

    # ------------------------------------------------------------------ read
    @property
    def env_steps(self) -> int:
        return self.steps_offset + int(self._steps.total("env_steps"))

    def worker_steps(self, worker: str) -> int:
        """Env steps ``worker`` took in this process, over all its starts (as reported)."""
        return int(self._steps.of(worker, "env_steps"))

    @property
    def policy_version(self) -> int:
        """The version every policy has reached."""
        return min(self.versions)

    @property
    def return_mean(self) -> float:
        return float(np.mean(self.window)) if self.window else float("nan")

    def policy_return_mean(self, policy: int) -> float:
        window = self.policy_windows[policy]
        return float(np.mean(window)) if window else float("nan")

    # ------------------------------------------------------------------ the target
    def _solving_window(self) -> tuple[float, int]:
        """The return the target is held against and how many episodes it is the mean of: the run's window, or
        the best policy's when the policies are alternatives (their episodes are no one policy's)."""
        if not self.by_best_policy:
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
        untrained = self.policy_version == 0 and self.steps_offset == 0
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

    # ------------------------------------------------------------------ across processes
    def counters(self, wall_seconds: float, spent: dict[str, float]) -> RunCounters:
        """What a resumed run continues from (:meth:`restore`); ``spent``: what the run spent so far."""
        returns = {name: list(window) for name, window in zip(self.names, self.policy_windows)}
        return RunCounters(wall_seconds, self.env_steps, self.episodes, list(self.window), returns, spent)

    def restore(self, counters: RunCounters) -> None:
        """Continue the episode count and the return windows of the run's earlier processes."""
        self.episodes = counters.episodes
        self.window.extend(counters.returns)
        for name, window in zip(self.names, self.policy_windows):
            window.extend(counters.policy_returns.get(name, []))
