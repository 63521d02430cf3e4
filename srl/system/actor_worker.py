"""The actor worker: a ring of environment slots, stepped whenever their actions are back.

Each slot is one vector env of B environments. A slot posts its observations
for inference and waits; meanwhile the actor steps any other slot whose
actions have arrived, so environment stepping overlaps with inference.
Observations are written once, into the slot's current segment buffer in the
sample stream; after T steps the segment is submitted to the trainer and the
slot moves on to a fresh buffer (or parks until one is free: back-pressure).
While every slot it could step is parked, it blocks on its pool rows' bells
(rung when a buffer comes back) and on its replies, never polling the flags.

When the run has several policies (``agents`` rules), each slot's columns are
split into one group per policy (:class:`~srl.api.env.GroupedSlot`): each group
has a buffer in its policy's pool, asks for its own actions, and its segment
goes to its policy's trainer. The slot steps once every group is answered.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from srl.api.env import GroupedSlot, SlotStep
from srl.api.explore import Explorer
from srl.api.report import Counts, RunFacts
from srl.api.schema import MEMORY
from srl.api.spaces import FINAL_PREFIX, OBS, Observation
from srl.api.worker import Reporter, Worker
from srl.base.channel import Channel, wait_any
from srl.base.fileio import atomic_save
from srl.base.timing import Every
from srl.system.rewards import RewardTransform
from srl.system.streams import SegmentPool, SegmentSink, episode_records


class Inference(Protocol):
    """``InferenceClient`` (remote policy worker) or ``InlineInference`` (policy in the actor)."""

    def connect(self, should_stop: Callable[[], bool]) -> None: ...

    def request(self, policy: int, slot: int, buffer: int, t: int) -> None: ...

    def ready(self, max_slots: int, timeout: float | None) -> np.ndarray: ...

    def wakes(self) -> Sequence[Channel]:
        """The channels that become readable when an answer may have come (none when answers come at once)."""


class ActorWorker(Worker):
    """Steps ``ring_size`` slots of ``envs_per_slot`` environments and cuts segments of T steps."""

    def __init__(
        self,
        index: int,
        make_slot: Callable[[int], GroupedSlot],
        ring_size: int,
        pools: Sequence[SegmentPool],
        inference: Inference,
        producers: Sequence[SegmentSink],
        reporter: Reporter,
        seed: int,
        make_reward_transform: Callable[[int], RewardTransform] | None = None,
        wait_timeout: float = 0.05,
        report_interval: float = 0.1,
        nonfinite: str = "fail",
        env_name: str = "env",
        request_timeout: float = 10.0,
        reward_stats: Path | None = None,
        restore_reward_stats: bool = False,
        save_interval: float = 120.0,
        row: int | None = None,
        explorers: Sequence[Explorer | None] = (),
        explored_steps: int = 0,
        episodes: Sequence[Channel] = (),
    ) -> None:
        """``reward_stats``: where the reward-scaling statistics are saved every ``save_interval`` seconds and at
        teardown, and loaded from at setup when ``restore_reward_stats`` (a resumed run, a restarted actor).
        ``row``: this actor's row in its node's pool (its index when one pool serves the whole run).
        ``explorers``: per policy group, what replaces some of its answered actions before each step (the
        algorithm's per-column exploration), or None; ``explored_steps``: the env steps this actor's schedule
        counts on from (its earlier starts', and its share of a resumed run's). ``episodes``: the run's episode
        sinks (the episode tap: a population worker's): with each report, every policy's env steps and finished
        episodes go to each of them too."""
        self.index = index
        self.row = index if row is None else row
        self._make_slot = make_slot
        self.ring_size = ring_size
        self.pools, self.inference, self.producers, self.reporter = pools, inference, producers, reporter
        self.seed = seed
        self.explorers = list(explorers) + [None] * (len(pools) - len(explorers))
        self.explored_steps = explored_steps
        self._explore_rng = np.random.default_rng([seed, 7_919])
        self._make_reward_transform = make_reward_transform
        self.wait_timeout = wait_timeout
        self._reports = Every(report_interval)
        self.T = pools[0].layout.fields["actions"].shape[0]
        self.G = len(pools)  # policy groups
        self.has_final_obs = [FINAL_PREFIX + p.layout.obs_fields[0] in p.layout.fields for p in pools]
        self.nonfinite, self.env_name = nonfinite, env_name
        # Only float parts are checked for NaN and inf: integers cannot be NaN.
        self._float_obs = [
            tuple(n for n in p.layout.obs_fields if np.issubdtype(p.layout.fields[n].dtype, np.floating)) for p in pools
        ]
        self.nonfinite_steps = 0
        self.request_timeout = request_timeout
        self.reward_stats, self.restore_reward_stats = reward_stats, restore_reward_stats
        self._saves = Every(save_interval)
        self.reposts = 0  # requests asked again after ``request_timeout`` without an answer
        self.env_steps = 0
        self.segments = 0
        self.t_env = self.t_wait = self.t_post = 0.0  # seconds stepping envs, waiting for actions, posting requests
        self.slots: list[GroupedSlot] = []
        self.reward_transforms: list[list[RewardTransform]] | None = None  # per slot and group; built in setup
        self.deferred_rewards = False  # the slots' rewards are written downstream (set in setup)
        self._done_returns: list[float] = []
        self._done_lengths: list[int] = []
        self._done_policies: list[int] = []
        self._shares: list[float] = []  # set in setup
        self.episodes = episodes
        self._sent_steps = 0  # env steps already reported on ``episodes``
        self._t_start = time.perf_counter()

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> None:
        G, R = self.G, self.ring_size
        # Per-slot state in Python lists: read and written once per step, where numpy scalar access costs more.
        self.buffer = [[-1] * G for _ in range(R)]  # each group's buffer in its policy's pool (-1: none yet)
        self.t = [0] * R
        self.pending = [[False] * G for _ in range(R)]  # a request of this group of this slot is out
        self.waiting = [0] * R  # groups of the slot still waiting for their actions
        self._actions = [pool.arrays["actions"] for pool in self.pools]
        self.posted_at = [[0.0] * G for _ in range(R)]  # when it went out (perf_counter seconds)
        self.obs: list[list[Observation]] = []
        self.parked: list[int] = []
        for slot in range(R):
            env = self._make_slot(slot)
            self.slots.append(env)
            self.obs.append(env.reset_groups(seed=self.seed + slot * 10_007))
            self.parked.append(slot)
        groups = self.slots[0].groups
        self.deferred_rewards = bool(getattr(self.slots[0], "deferred_rewards", False))  # a reward worker reports
        assert len(groups) == G, f"{len(groups)} groups of agents, {G} policy pools"
        self.envs = self.slots[0].env_count
        columns = [g.columns(self.envs) for g in groups]
        self._shares = [(g.envs or self.envs) / self.envs for g in groups]  # of every env step: a member's envs
        make_rt = self._make_reward_transform
        self.reward_transforms = [[make_rt(n) for n in columns] for _ in self.slots] if make_rt else None
        if (
            self.reward_transforms is not None
            and self.restore_reward_stats
            and self.reward_stats is not None
            and self.reward_stats.exists()
        ):
            self._load_reward_stats(self.reward_stats)
        self._saves.restart()
        # a policy with memory: each slot's state at the end of its last segment, per group ``[columns, S]``
        self.memory = [
            [
                np.zeros(p.layout.fields[MEMORY].shape[1:], np.float32) if MEMORY in p.arrays else None
                for p in self.pools
            ]
            for _ in range(R)
        ]
        self.ep_return = [np.zeros((R, n), np.float64) for n in columns]  # per group: [slot, column]
        self.ep_length = [np.zeros((R, n), np.int64) for n in columns]
        self._reports.restart()
        self.inference.connect(self.should_stop)
        self._t_start = time.perf_counter()
        self._unpark()

    def teardown(self) -> None:
        self._save_reward_stats()
        self._report(force=True)
        for env in self.slots:
            env.close()
        self.slots = []
        for producer in self.producers:
            producer.close()

    # ------------------------------------------------------------------ loop
    def poll(self) -> int:
        if self.parked:
            self._unpark()
        t0 = time.perf_counter()
        ready = self.inference.ready(self.ring_size * self.G, 0.0 if self.parked else self.wait_timeout)
        if self.parked and not len(ready):
            self._wait_parked()
        self.t_wait += time.perf_counter() - t0
        steps = 0
        R = self.ring_size
        for asked in ready.tolist():
            k, slot = divmod(asked, R)
            if 0 <= k < self.G and self.pending[slot][k]:  # ignore malformed or duplicate replies
                self.pending[slot][k] = False
                left = self.waiting[slot] = self.waiting[slot] - 1
                if left == 0:
                    steps += self._step_slot(slot)
        if not steps and any(self.waiting):
            self._repost_overdue()
        self._report()
        if self._saves.due():
            self._save_reward_stats()
        return steps

    def _wait_parked(self) -> None:
        """Block until a buffer comes back to a parked slot (its pool row's bell, or across nodes its sender's
        socket) or an answer comes, at most ``wait_timeout`` (the loop looks at its stop flag); within a millisecond
        for a sink without a bell."""
        bells = [producer.bell for producer in self.producers]
        channels = [*self.inference.wakes(), *(bell for bell in bells if bell is not None)]
        timeout = self.wait_timeout if None not in bells else min(self.wait_timeout, 0.001)
        if channels:
            wait_any(channels, timeout)
        elif timeout > 0:
            time.sleep(timeout)

    def _save_reward_stats(self) -> None:
        if self.reward_transforms is None or self.reward_stats is None:
            return
        stats = np.stack([rt.stats() for groups in self.reward_transforms for rt in groups])
        try:
            atomic_save(self.reward_stats, lambda f: np.save(f, stats, allow_pickle=False))
        except OSError as exc:  # e.g. a full disk: the previous file stays; acting goes on
            self.reporter.report("info", {"message": f"{self.reward_stats.name} not written: {exc}"})

    def _load_reward_stats(self, path: Path) -> None:
        try:
            stats = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: unreadable reward statistics ({exc})") from None
        assert self.reward_transforms is not None
        flat = [rt for groups in self.reward_transforms for rt in groups]  # slot by slot, group by group
        if stats.shape != (len(flat), 3):
            raise ValueError(
                f"{path}: reward statistics of shape {stats.shape}, expected ({len(flat)}, 3) (was ring_size changed?)"
            )
        for rt, row in zip(flat, stats):
            rt.load_stats(row)

    def _repost_overdue(self) -> None:
        """Ask again for slots waiting longer than ``request_timeout`` (the new ask supersedes the lost one)."""
        late = time.perf_counter() - self.request_timeout
        for slot, (pending, posted) in enumerate(zip(self.pending, self.posted_at)):
            for k in range(self.G):
                if pending[k] and posted[k] < late:
                    self.reposts += 1
                    self._post(k, slot, self.buffer[slot][k], self.t[slot])

    def _unpark(self) -> None:
        """Give parked slots a fresh buffer in each policy's pool and post their pending observations (a slot
        keeps the buffers it got while it waits for the others)."""
        still = []
        for slot in self.parked:
            buffers = self.buffer[slot]
            for k, producer in enumerate(self.producers):
                if buffers[k] < 0:
                    buf = producer.acquire()
                    buffers[k] = -1 if buf is None else buf
            if min(buffers) < 0:
                still.append(slot)
                continue
            self.t[slot] = 0
            for k, pool in enumerate(self.pools):
                arrays = pool.arrays
                for name, x in self.obs[slot][k].items():
                    arrays[name][self.row, buffers[k], 0] = x
                memory = self.memory[slot][k]
                if memory is not None:  # the state the last segment ended with (zeros at the start)
                    arrays[MEMORY][self.row, buffers[k], 0] = memory
            self._post_all(slot)
        self.parked = still

    def _step_slot(self, slot: int) -> int:
        a, t = self.row, self.t[slot]
        buffers = self.buffer[slot]
        t0 = time.perf_counter()
        self._explore(slot, buffers, t)
        try:
            steps = self.slots[slot].step_groups([actions[a, buf, t] for actions, buf in zip(self._actions, buffers)])
        except Exception as exc:  # name the env and where, keep its own message
            raise RuntimeError(
                f"{self.env_name}: step failed at actor {self.index} slot {slot} after "
                f"{self.env_steps} env steps: {type(exc).__name__}: {exc}"
            ) from exc
        self.t_env += time.perf_counter() - t0
        t += 1
        for k, step in enumerate(steps):
            self._record(k, slot, buffers[k], t, step)
        if t == self.T:
            for producer, buf in zip(self.producers, buffers):
                producer.submit(buf)
            self.buffer[slot] = [-1] * self.G
            self.segments += 1
            self.parked.append(slot)
            self._unpark()
        else:
            self.t[slot] = t
            self._post_all(slot)
        self.env_steps += self.envs  # environment transitions: one per env, however many agents it has
        return self.envs

    def _explore(self, slot: int, buffers: list[int], t: int) -> None:
        """Let each group's explorer replace some of the slot's answered actions in place (so the segment records
        the actions taken)."""
        for k, explorer in enumerate(self.explorers):
            if explorer is None:
                continue
            arrays, buf = self.pools[k].arrays, buffers[k]
            obs = {n: arrays[n][self.row, buf, t] for n in self.pools[k].layout.obs_fields}
            rows = len(self._actions[k][self.row, buf, t])
            columns = slice(slot * rows, (slot + 1) * rows)
            explorer.explore(
                self._actions[k][self.row, buf, t],
                obs,
                columns,
                self.explored_steps + self.env_steps,
                self._explore_rng,
            )

    def _record(self, k: int, slot: int, buf: int, t: int, step: SlotStep) -> None:
        """Group ``k``'s step results into row ``t - 1`` of its buffer, and its next observations into row ``t``."""
        arrays, a = self.pools[k].arrays, self.row
        if not self._finite(step, k):
            step = self._sanitize(step, slot, k)
        reward, s = step.reward, t - 1
        if self.reward_transforms is not None:
            arrays["rewards"][a, buf, s] = self.reward_transforms[slot][k](reward, step.terminated | step.truncated)
        else:
            arrays["rewards"][a, buf, s] = reward
        arrays["terminated"][a, buf, s] = step.terminated
        arrays["truncated"][a, buf, s] = step.truncated
        if self.has_final_obs[k] and step.final_obs is not None:
            for name, x in step.final_obs.items():
                arrays[FINAL_PREFIX + name][a, buf, s] = x
        self.ep_return[k][slot] += reward
        if step.alive is None:
            self.ep_length[k][slot] += 1
        else:  # a column whose agent is done (or not yet there) counts no steps
            arrays["alive"][a, buf, s] = step.alive
            self.ep_length[k][slot] += step.alive
        if step.episode_end.any():
            self._finish_episodes(k, slot, step.episode_end)
        obs = self.obs[slot][k] = step.obs
        for name, x in obs.items():  # row T too: the segment's last observation, its bootstrap value's input
            arrays[name][a, buf, t] = x
        memory = self.memory[slot][k]
        if memory is not None:  # the answer wrote the next state to row t: idle columns keep row t - 1's, a new
            row = arrays[MEMORY][a, buf, t]  # episode starts from zeros
            step.carry(arrays[MEMORY][a, buf, s], row)
            if t == self.T:
                memory[:] = row  # the next segment starts from it (this buffer goes to the trainer)

    def _finite(self, step: SlotStep, k: int) -> bool:
        """One reduction per array (a NaN or inf poisons the sum); the exact check runs only when it fails."""
        if not math.isfinite(float(step.reward.sum())):
            return False
        for name in self._float_obs[k]:
            if not math.isfinite(float(step.obs[name].sum())):
                return False
            if step.final_obs is not None and not math.isfinite(float(step.final_obs[name].sum())):
                return False
        return True

    def _sanitize(self, step: SlotStep, slot: int, k: int) -> SlotStep:
        """Fail naming the env and step, or replace non-finite values by 0 and count the env steps affected."""
        bad = np.zeros(len(step.reward), bool)  # environments with a non-finite value
        changed: list[str] = []
        floats = self._float_obs[k]
        checked = [(_what("observation", n), step.obs[n]) for n in floats] + [("reward", step.reward)]
        if step.final_obs is not None:
            checked += [(_what("final observation", n), step.final_obs[n]) for n in floats]
        for what, value in checked:
            rows = ~np.isfinite(value.reshape(len(bad), -1)).all(axis=1)
            if rows.any():
                changed.append(what)
                bad |= rows
        if not changed:  # a finite sum overflowed: nothing to do
            return step
        if self.nonfinite == "fail":
            raise ValueError(
                f"{self.env_name}: non-finite {' and '.join(changed)} at actor {self.index} slot {slot}, "
                f"after {self.env_steps} env steps (env.nonfinite: sanitize replaces them by 0)"
            )
        self.nonfinite_steps += int(bad.sum())
        return dataclasses.replace(
            step,
            obs=_finite_obs(step.obs),
            reward=_zero_nonfinite(step.reward),
            final_obs=None if step.final_obs is None else _finite_obs(step.final_obs),
        )

    def _post_all(self, slot: int) -> None:
        """Ask for the slot's next actions, each group its policy's."""
        self.waiting[slot] = self.G
        t = self.t[slot]
        for k, buf in enumerate(self.buffer[slot]):
            self._post(k, slot, buf, t)

    def _post(self, k: int, slot: int, buf: int, t: int) -> None:
        """Ask for group ``k``'s next actions (its observations are already at ``obs[actor, buf, t]`` of its
        pool)."""
        self.pending[slot][k] = True
        t0 = time.perf_counter()
        self.inference.request(k, slot, buf, t)
        t1 = self.posted_at[slot][k] = time.perf_counter()
        self.t_post += t1 - t0

    def _finish_episodes(self, k: int, slot: int, done: np.ndarray) -> None:
        ret, length = self.ep_return[k][slot], self.ep_length[k][slot]
        if not self.deferred_rewards:  # else the returns are known only downstream, which reports them
            self._done_returns.extend(ret[done].tolist())
            self._done_lengths.extend(length[done].tolist())
            self._done_policies.extend([k] * int(done.sum()))
        ret[done] = 0.0
        length[done] = 0

    def _report(self, force: bool = False) -> None:
        if not self._reports.due(force):
            return
        self.reporter.report(
            "actor",
            {
                "actor": self.index,
                "env_steps": self.env_steps,
                "segments": self.segments,
                "nonfinite_steps": self.nonfinite_steps,
                "lost_segments": sum(p.lost for p in self.producers),
                "reposts": self.reposts,
                "t_total": time.perf_counter() - self._t_start,
                "t_env": self.t_env,
                "t_wait": self.t_wait,
                "t_post": self.t_post,
                **self._explore_stats(),
            },
            {
                "episode_returns": np.asarray(self._done_returns, np.float32),
                "episode_lengths": np.asarray(self._done_lengths, np.int32),
                "episode_policies": np.asarray(self._done_policies, np.int32),
            },
        )
        if self.episodes:
            self._send_episodes()
        self._done_returns, self._done_lengths, self._done_policies = [], [], []

    def _explore_stats(self) -> dict[str, float]:
        """The explorers' statistics, once this start has stepped. Before its first step an explorer still shows
        the rate it was made with (``epsilon_start``), not its schedule's at ``explored_steps``: a restarted actor
        that waits for a buffer would report a fresh run's rate."""
        if not self.env_steps:
            return {}
        return {f"explore_{key}": float(v) for e in self.explorers if e is not None for key, v in e.stats().items()}

    def _send_episodes(self) -> None:
        """Each policy's share of the env steps since the last report (its columns of every step) and the returns
        of its finished episodes, to each episode sink."""
        steps, self._sent_steps = self.env_steps - self._sent_steps, self.env_steps
        owners = np.asarray(self._done_policies, np.int64)
        returns = np.asarray(self._done_returns, np.float64)
        sums = np.bincount(owners, weights=returns, minlength=self.G) if len(owners) else np.zeros(self.G)
        counts = np.bincount(owners, minlength=self.G) if len(owners) else np.zeros(self.G, np.int64)
        records = episode_records([round(steps * share) for share in self._shares], sums.tolist(), counts.tolist())
        if len(records):
            for sink in self.episodes:
                sink.send(records)


def _zero_nonfinite(x: np.ndarray) -> np.ndarray:
    return np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0) if np.issubdtype(x.dtype, np.floating) else x


def _finite_obs(obs: Observation) -> Observation:
    """Observation parts with NaN and inf replaced by 0."""
    return {name: _zero_nonfinite(x) for name, x in obs.items()}


def _what(kind: str, part: str) -> str:
    """``observation`` for a plain observation, ``observation 'obs.goal'`` for a part of a nested one."""
    return kind if part == OBS else f"{kind} {part!r}"


class ActorReports:
    """The actors' reports (the :class:`~srl.api.report.Aggregator` of their kind): their env steps and ended
    episodes go to the run's counts; non-finite steps, segments lost across nodes and exploration statistics
    (averaged over the actors, ``explore_epsilon``) to its records."""

    def __init__(self, facts: RunFacts) -> None:
        self.facts = facts
        self.counts = Counts()
        self.explore: dict[str, dict[str, float]] = {}

    def handle(self, worker: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.facts.add_env_steps(worker, int(meta["env_steps"]))  # first: episodes ending now count at these steps
        returns = arrays.get("episode_returns")
        if returns is not None and len(returns):
            self.facts.add_episodes(returns, arrays.get("episode_policies"))
        lost = int(meta.get("lost_segments", 0))
        self.counts.set(worker, {"nonfinite_steps": int(meta.get("nonfinite_steps", 0)), "dropped_segments": lost})
        explore = {k: float(v) for k, v in meta.items() if k.startswith("explore_")}
        if explore:  # an algorithm's exploration (epsilon)
            self.explore[worker] = explore

    def record(self) -> dict[str, Any]:
        rec: dict[str, Any] = self.summary()
        for key in sorted({k for stats in self.explore.values() for k in stats}):
            rec[key] = float(np.mean([s[key] for s in self.explore.values() if key in s]))
        return rec

    def summary(self) -> dict[str, Any]:
        return {key: int(self.counts.total(key)) for key in ("nonfinite_steps", "dropped_segments")}

    def restarted(self, worker: str) -> None:
        self.counts.restarted(worker)
        self.explore.pop(worker, None)  # its dead start's rate; the new start reports its own once it steps
