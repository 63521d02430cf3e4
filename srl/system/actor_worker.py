"""The actor worker: a ring of environment slots, stepped whenever their actions are back.

Each slot is one vector env of B environments. A slot posts its observations
for inference and waits; meanwhile the actor steps any other slot whose
actions have arrived, so environment stepping overlaps with inference.
Observations are written once, into the slot's current segment buffer in the
sample stream; after T steps the segment is submitted to the trainer and the
slot moves on to a fresh buffer (or parks until one is free: back-pressure).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

import gymnasium as gym
import numpy as np

from srl.api.worker import Reporter, Worker
from srl.system.streams import SampleProducer, SegmentPool


class Inference(Protocol):
    """``InferenceClient`` (remote policy worker) or ``InlineInference`` (policy in the actor)."""

    def connect(self, should_stop: Callable[[], bool]) -> None: ...

    def request(self, slot: int, buffer: int, t: int) -> None: ...

    def ready(self, max_slots: int, timeout: float | None) -> np.ndarray: ...


class ActorWorker(Worker):
    """Steps ``ring_size`` slots of ``envs_per_slot`` environments and cuts segments of T steps."""

    def __init__(
        self,
        index: int,
        make_slot: Callable[[int], gym.vector.VectorEnv],
        ring_size: int,
        pool: SegmentPool,
        inference: Inference,
        producer: SampleProducer,
        reporter: Reporter,
        seed: int,
        wait_timeout: float = 0.05,
        report_interval: float = 0.1,
    ) -> None:
        self.name = f"actor{index}"
        self.index = index
        self._make_slot = make_slot
        self.ring_size = ring_size
        self.pool, self.inference, self.producer, self.reporter = pool, inference, producer, reporter
        self.seed = seed
        self.wait_timeout = wait_timeout
        self.report_interval = report_interval
        self.T = pool.layout.fields["actions"].shape[0]
        self.has_final_obs = "final_obs" in pool.layout.fields
        self.env_steps = 0
        self.segments = 0

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> None:
        self.slots: list[gym.vector.VectorEnv] = []
        self.buffer = np.full(self.ring_size, -1, np.int64)
        self.t = np.zeros(self.ring_size, np.int64)
        self.obs: list[Any] = []
        self.parked: list[int] = []
        for slot in range(self.ring_size):
            venv = self._make_slot(slot)
            obs, _ = venv.reset(seed=self.seed + slot * 10_007)
            self.slots.append(venv)
            self.obs.append(obs)
            self.parked.append(slot)
        B = self.slots[0].num_envs
        self.ep_return = np.zeros((self.ring_size, B), np.float64)
        self.ep_length = np.zeros((self.ring_size, B), np.int64)
        self._done_returns: list[float] = []
        self._done_lengths: list[int] = []
        self._last_report = time.monotonic()
        self.inference.connect(self.should_stop)
        self._unpark()

    def teardown(self) -> None:
        self._report(force=True)
        for venv in getattr(self, "slots", []):
            venv.close()
        self.slots = []

    # ------------------------------------------------------------------ loop
    def poll(self) -> int:
        if self.parked:
            self._unpark()
        ready = self.inference.ready(self.ring_size, self.wait_timeout if not self.parked else 0.001)
        steps = 0
        for slot in ready.tolist():
            steps += self._step_slot(slot)
        self._report()
        return steps

    def _unpark(self) -> None:
        """Give parked slots a fresh buffer and post their pending observations."""
        still = []
        arrays = self.pool.arrays
        for slot in self.parked:
            buf = self.producer.acquire()
            if buf is None:
                still.append(slot)
                continue
            self.buffer[slot], self.t[slot] = buf, 0
            arrays["obs"][self.index, buf, 0] = self.obs[slot]
            self.inference.request(slot, buf, 0)
        self.parked = still

    def _step_slot(self, slot: int) -> int:
        arrays, a = self.pool.arrays, self.index
        buf, t = int(self.buffer[slot]), int(self.t[slot])
        obs, reward, terminated, truncated, info = self.slots[slot].step(arrays["actions"][a, buf, t])
        arrays["rewards"][a, buf, t] = reward
        arrays["terminated"][a, buf, t] = terminated
        arrays["truncated"][a, buf, t] = truncated
        done = terminated | truncated
        if done.any():
            self._finish_episodes(slot, reward, done)
            if self.has_final_obs and truncated.any():
                final = info["final_obs"]
                for b in np.flatnonzero(truncated):
                    arrays["final_obs"][a, buf, t, b] = final[b]
        else:
            self.ep_return[slot] += reward
            self.ep_length[slot] += 1
        self.obs[slot] = obs
        t += 1
        arrays["obs"][a, buf, t] = obs
        if t == self.T:
            self.producer.submit(buf)
            self.segments += 1
            self.parked.append(slot)
            self._unpark()
        else:
            self.t[slot] = t
            self.inference.request(slot, buf, t)
        n = len(reward)
        self.env_steps += n
        return n

    def _finish_episodes(self, slot: int, reward: np.ndarray, done: np.ndarray) -> None:
        ret, length = self.ep_return[slot], self.ep_length[slot]
        ret += reward
        length += 1
        self._done_returns.extend(ret[done].tolist())
        self._done_lengths.extend(length[done].tolist())
        ret[done] = 0.0
        length[done] = 0

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_report < self.report_interval:
            return
        self._last_report = now
        self.reporter.report(
            "actor",
            {"actor": self.index, "env_steps": self.env_steps, "segments": self.segments},
            {"episode_returns": np.asarray(self._done_returns, np.float32),
             "episode_lengths": np.asarray(self._done_lengths, np.int32)},
        )
        self._done_returns, self._done_lengths = [], []
