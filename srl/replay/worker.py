"""The replay worker: keeps its actors' segments and serves its trainers sampled batches.

It stands last on the sample path (``workers.path: [..., replay]``). Its actors
hand it finished segment buffers exactly as they would a trainer; it copies
each into its store (shared memory, so that a restarted replay worker finds
every item again) and frees the buffer. Each trainer it feeds (one, or the
trainers of a node group: ``replay.placement``) reads batches from its own small
pool of batch buffers in shared memory: the replay fills a free one with a
sampled batch and sends its record; the trainer trains on it in place, writes
the new priorities into it and hands it back (:data:`TRAINED`); the replay
applies them by item key, so an update for an item overwritten meanwhile is
dropped. Trainers that share a replay take turns at its batches.

The store's rate limiter decides, on both sides, whether the replay may insert
or sample now. What it may not insert stays in the actors' buffers, and an
actor with no free buffer waits: so the trainer's pace holds the actors back,
and the actors' pace holds the trainer, at the configured samples per insert,
however many actors or cores there are.

One process writes the store (this worker): inserts, samples and priority
updates never race. Refreshed search targets come the same way, by message to
its mailbox (:data:`srl.replay.role.REFRESH`, :func:`refresh_message`): a
reanalyze worker reads stored steps (attached to the store, writing nothing)
and sends their new targets by step key; this worker writes them to the steps
whose chunk still holds them, and counts those that came too late or malformed.

With nothing to do it blocks until something it waits for can have happened:
a trainer handed a batch back (each feed's bell rings), or, while it has room
for them, segments came (their channel). The limiter's counters move only by
its own inserts and samples, so nothing else can let it on; the trainer's next
batch is sampled as soon as the trainer hands one back, while it trains on the
other.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from srl.api.report import Counts, RunFacts
from srl.api.schema import FieldSpec
from srl.api.worker import Reporter, TrainResult, Worker
from srl.base.channel import Channel, wait_any
from srl.base.timing import Every
from srl.replay.file import sweep_partial_saves
from srl.replay.store import ReplayStore
from srl.system.batches import Trained
from srl.system.remote_records import Mail, Mailbox
from srl.system.streams import FILLING, FREE, READY, SampleConsumer, SegmentPool, SegmentSource, clear

TRAINED = 4
"""A batch buffer's state once its trainer trained on it and wrote its priorities: the replay applies them and
frees it (FREE -> FILLING by the replay -> READY to the trainer -> TRAINED, or FREE without priorities)."""
PRIORITIES = "priorities"
"""The batch buffer's field the trainer writes its new priorities into, aligned with ``keys``."""
INSERTED = "inserted_env_steps"
"""The batch buffer's field that carries the trainer's share of the env steps the replay has taken in (its
progress): all of them, or an equal part for each trainer that shares the replay."""
REFRESH_COUNTS = ("refreshed_steps", "stale_refreshes", "refused_refreshes")
"""What a replay counts of the refreshed targets that came (:meth:`ReplayWorker._refresh`): steps written, steps
whose chunk had been overwritten since they were read, and messages refused."""


@dataclass(frozen=True)
class Sampling:
    """How batches are drawn: what the algorithm's settings say."""

    batch_size: int
    nstep: int
    gamma: float
    beta: Callable[[float], float] = lambda progress: 0.4
    """Importance-weight exponent at run progress in [0, 1] (prioritized sampling)."""


def refresh_message(keys: np.ndarray, fields: Mapping[str, np.ndarray]) -> tuple[dict[str, Any], bytes]:
    """A replay's refresh mail: step ``keys`` ``[N]`` and each step field's new values ``[N, ...]`` (in the
    store's dtype), as a meta and one payload: the keys (int64), then each field's values, in the meta's order."""
    keys = np.ascontiguousarray(keys, np.int64)
    payload = [keys.tobytes(), *(np.ascontiguousarray(v).tobytes() for v in fields.values())]
    return {"steps": len(keys), "fields": list(fields)}, b"".join(payload)


def _refreshed(store: ReplayStore, mail: Mail) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
    """The keys and values of a refresh mail, or None when it does not fit the store (never raised: a message is
    input from another process)."""
    meta, payload = mail
    steps, names = meta.get("steps"), meta.get("fields")
    carried = store.spec.carried
    if not isinstance(steps, int) or steps < 0 or not isinstance(names, list) or not names:
        return None
    if not all(isinstance(n, str) and n in carried for n in names) or len(set(names)) != len(names):
        return None
    shapes = {n: (steps, *store.spec.fields[n].shape[2:]) for n in names}
    dtypes = {n: np.dtype(store.spec.fields[n].dtype) for n in names}
    sizes = [steps * 8, *(int(np.prod(shapes[n])) * dtypes[n].itemsize for n in names)]
    if sum(sizes) != len(payload):
        return None
    offsets = np.cumsum([0, *sizes])
    keys = np.frombuffer(payload, np.int64, steps)
    values = {
        n: np.frombuffer(payload, dtypes[n], int(np.prod(shapes[n])), int(offsets[i + 1])).reshape(shapes[n])
        for i, n in enumerate(names)
    }
    return keys, values


MAX_PENDING = 4
"""Segments a replay worker takes from its source ahead of the rate limiter; a bound, so that actors feeding it
across nodes wait for it as actors on its node do."""


class ReplayWorker(Worker):
    """Inserts what its actors submit; fills its trainer's free batch buffers as the rate limiter allows."""

    def __init__(
        self,
        index: int,
        store: ReplayStore,
        source: SegmentSource,
        feeds: Sequence[tuple[SegmentPool, Channel, Channel]],
        reporter: Reporter,
        sampling: Sampling,
        total_env_steps: int,
        agents_per_env: int = 1,
        seed: int = 0,
        wait_timeout: float = 0.05,
        report_interval: float = 1.0,
        save_path: Path | None = None,
        save_interval: float = 120.0,
        load: bool = False,
        refreshed: Mailbox | None = None,
    ) -> None:
        """``feeds``: per trainer it serves, that trainer's batch buffers (one row), its batch stream, and the
        buffers' bell, which that trainer rings when it hands a batch back.
        ``total_env_steps``: the env steps this replay takes in over the run (its share of the run's), which the
        importance-weight exponent anneals over.
        ``save_path``: where the store is written every ``save_interval`` seconds and at teardown (``replay.save``);
        ``load``: read it back at setup into the empty store (a resumed run, not a restarted worker, which finds
        its store in shared memory).
        ``refreshed``: the mailbox refreshed step targets come to (:func:`refresh_message`)."""
        self.index = index
        self.store, self.source, self.feeds = store, source, list(feeds)
        self._turn = 0  # the feed served first next time: trainers sharing the replay take turns
        self.reporter, self.sampling = reporter, sampling
        self.total_env_steps, self.agents_per_env = total_env_steps, agents_per_env
        self.rng = np.random.default_rng(seed)
        self.wait_timeout = wait_timeout
        self._reports = Every(report_interval)
        self._pending: deque[tuple[int, int]] = deque()
        self.save_path, self.load = save_path, load
        self._saves = Every(save_interval)
        self.refreshed = refreshed
        self.refreshes = dict.fromkeys(REFRESH_COUNTS, 0)
        self.t_insert = self.t_sample = 0.0
        self._t_start = time.perf_counter()

    def setup(self) -> None:
        self.store.repair()  # what a kill of the last incarnation left half done
        if self.load and self.save_path is not None and self.save_path.exists():
            self.store.load(self.save_path)
        self._reports.restart()
        self._saves.restart()
        self._t_start = time.perf_counter()

    def poll(self) -> int:
        for _, _, bell in self.feeds:  # before the flags are read: a hand-back after that read rings again
            clear(bell)
        work = self._apply_trained()
        work += self._refresh()
        work += self._insert()
        work += self._serve()
        if not work:
            self._wait()
        self._report()
        if self.save_path is not None and self._saves.due():
            self._save()
        return work

    def teardown(self) -> None:
        self._report(force=True)
        if self.save_path is not None:
            self._save()

    def _save(self) -> None:
        """Write the store beside the checkpoints (atomically: a kill leaves the previous file whole)."""
        try:
            sweep_partial_saves(self.save_path)  # type: ignore[arg-type]  # what a kill during an earlier save left
            self.store.save(self.save_path)  # type: ignore[arg-type]
        except OSError as exc:  # e.g. a full disk: the previous file stays; the run goes on
            self.reporter.report("info", {"message": f"replay not saved: {exc}"})

    # ------------------------------------------------------------------ internals
    def _apply_trained(self) -> int:
        """Apply the priorities of every batch its trainers handed back, and free those buffers."""
        applied = 0
        for batches, _, _ in self.feeds:
            state = batches.state[0]
            done = np.flatnonzero(state == TRAINED)
            for buf in done.tolist():
                batch = batches.segment(0, buf)
                self.store.update_priorities(batch["keys"], batch[PRIORITIES])
                state[buf] = FREE
            applied += len(done)
        return applied

    def _refresh(self) -> int:
        """Write the refreshed targets that came to the steps whose chunk still holds them."""
        if self.refreshed is None:
            return 0
        mails = self.refreshed.recv(0.0)
        for mail in mails:
            got = _refreshed(self.store, mail)
            if got is None:
                self.refreshes["refused_refreshes"] += 1
                continue
            keys, fields = got
            counts = [self.store.write_steps(keys, name, values) for name, values in fields.items()]
            self.refreshes["refreshed_steps"] += counts[0][0]  # the same steps for every field
            self.refreshes["stale_refreshes"] += counts[0][1]
        return len(mails)

    def _wait(self) -> None:
        """Block until a trainer hands a batch back or, with room for them, segments come; at most
        ``wait_timeout`` (the loop looks at its stop flag). Segments that come over a socket are looked for again
        within a millisecond."""
        channels, timeout = [bell for _, _, bell in self.feeds], self.wait_timeout
        if len(self._pending) < MAX_PENDING:
            if self.source.channel is not None:
                channels.append(self.source.channel)
            else:
                timeout = min(timeout, 0.001)
        wait_any(channels, timeout)

    def _take(self) -> None:
        """Queue the records of the segments that came, up to :data:`MAX_PENDING`: the rest stay with their
        senders, which holds the actors back (a node's pool keeps them READY; across nodes ZeroMQ's queues fill and
        the senders keep their buffers)."""
        room = MAX_PENDING - len(self._pending)
        if room > 0:
            records = self.source.receive(room, 0.0)
            self._pending.extend((int(a), int(b)) for a, b in records.tolist())

    def _insert(self) -> int:
        """Insert the segments that came while the rate limiter lets them in; the rest wait in their actors'
        buffers, which holds the actors back."""
        self._take()
        t0, inserted = time.perf_counter(), 0
        while self._pending and self.store.can_insert(self.store.items_per_segment):
            actor, buf = self._pending.popleft()
            if not self.source.holds(actor, buf):  # a record that outlived its hand-over (SegmentSource.holds)
                continue
            self.store.insert(self.source.segment(actor, buf))
            self.source.release(actor, buf)
            inserted += 1
            self._take()
        self.source.ring()
        self.t_insert += time.perf_counter() - t0
        return inserted

    def _serve(self) -> int:
        """Fill free batch buffers with sampled batches while the rate limiter allows, and send them: one per
        trainer in turn, so that trainers sharing the replay share its samples."""
        served, t0, n = 0, time.perf_counter(), len(self.feeds)
        free = [np.flatnonzero(batches.state[0] == FREE).tolist() for batches, _, _ in self.feeds]
        while any(free) and self.store.can_sample(self.sampling.batch_size):
            i = next(j % n for j in range(self._turn, self._turn + n) if free[j % n])
            self._fill(i, free[i].pop(0))
            self._turn = (i + 1) % n
            served += 1
        self.t_sample += time.perf_counter() - t0
        return served

    def _fill(self, feed: int, buf: int) -> None:
        """Sample a batch into buffer ``buf`` of trainer ``feed``'s batch buffers, and send its record."""
        batches, channel, _ = self.feeds[feed]
        state = batches.state[0]
        state[buf] = FILLING
        batch = batches.segment(0, buf)
        s = self.sampling
        progress = min(1.0, self.env_steps / self.total_env_steps)
        self.store.sample_into(batch, self.rng, n=s.nstep, gamma=s.gamma, beta=s.beta(progress))
        batch[INSERTED][...] = self.env_steps // len(self.feeds)  # each trainer's share of the env steps
        state[buf] = READY
        channel.send((0, buf))

    @property
    def env_steps(self) -> int:
        """Env steps the store has taken in (one per env, however many agents)."""
        return self.store.inserted_steps // self.agents_per_env

    def _report(self, force: bool = False) -> None:
        if not self._reports.due(force):
            return
        meta: dict[str, float | int] = {k: float(v) for k, v in self.store.stats().items()}
        meta.update(
            replay=self.index,
            pending_segments=len(self._pending),
            # messages its sample stream refused (malformed, or no run token across nodes): inserts dropped
            rejected_segments=self.source.rejected,
            t_total=time.perf_counter() - self._t_start,
            t_insert=self.t_insert,
            t_sample=self.t_sample,
        )
        if any(self.refreshes.values()):  # a run with reanalysis (this incarnation's counts; the run adds them up)
            meta.update(self.refreshes)
        self.reporter.report("replay", meta)


class ReplayBatches:
    """A trainer's batches from its replay: each batch buffer is one whole batch, read in place (no copy); the
    update's priorities go back in it."""

    answers_upstream = True
    """:meth:`done` writes the update's priorities back: the batch is kept until the update ends."""

    def __init__(
        self, batches: SegmentPool, channel: Channel, bell: Channel, agents_per_env: int = 1, fresh: bool = True
    ) -> None:
        """``bell``: the batch buffers' bell, which wakes the replay when a batch is handed back.
        ``fresh``: the trainer starts the run (its env-step count is 0): every step its replay took in before its
        first batch counts. A restarted or resumed trainer counts on from its checkpoint's count with the steps
        taken in after its first batch."""
        self.consumer = SampleConsumer(batches, channel, bells={0: bell})
        self.fields: Mapping[str, FieldSpec] = {
            k: v for k, v in batches.layout.fields.items() if k not in (PRIORITIES, INSERTED)
        }
        self.agents_per_env = agents_per_env
        self.dropped = self.rejected = 0
        self.t_copy = 0.0
        self._buf: int | None = None
        self._inserted = 0
        self._counted: int | None = 0 if fresh else None  # the replay's env steps counted so far

    def setup(self) -> None:
        self._buf = None

    def discard_older(self, version: int) -> None:
        """Off-policy: what the old weights collected stays in the replay, a sample like any other."""

    def fill(self, version: int, timeout: float) -> int:
        if self._buf is not None:
            return 0
        records = self.consumer.receive(1, timeout)
        if len(records):
            self._buf = int(records[0, 1])
        return len(records)

    def full(self) -> bool:
        return self._buf is not None

    def batch(self) -> Mapping[str, np.ndarray]:
        assert self._buf is not None
        views = self.consumer.segment(0, self._buf)
        self._inserted = int(views[INSERTED].reshape(-1)[0])
        return {k: views[k] for k in self.fields}

    def done(self, result: TrainResult) -> Trained:
        """Write the update's priorities into the buffer and hand it back (or just free it, without any)."""
        assert self._buf is not None
        buf, self._buf = self._buf, None
        views = self.consumer.segment(0, buf)
        counted = self._inserted if self._counted is None else self._counted
        trained = Trained(max(0, self._inserted - counted), int(views["keys"].shape[0]))
        self._counted = max(counted, self._inserted)
        if result.priorities is None:
            self._hand_back(buf, FREE)
            return trained
        if not np.array_equal(result.priorities.keys, views["keys"]):
            self._hand_back(buf, FREE)
            raise ValueError("train: priorities must name the batch's items in order (Priorities.keys = batch['keys'])")
        views[PRIORITIES][...] = result.priorities.values
        self._hand_back(buf, TRAINED)
        return trained

    def _hand_back(self, buf: int, state: int) -> None:
        """Give batch buffer ``buf`` back to the replay in ``state`` and wake it."""
        self.consumer.release(0, buf, state)
        self.consumer.ring()


class ReplayReports:
    """The replay workers' reports (the :class:`~srl.api.report.Aggregator` of their kind): each store's size
    and counters (``replay0_size``, ...; they live in shared memory, so they carry on across its restarts), and what
    its process counts (the messages it refused, the refreshed steps it wrote), kept across restarts here."""

    COUNTED = ("rejected_segments", *REFRESH_COUNTS)
    """What a replay worker's process counts from its own start."""

    def __init__(self, facts: RunFacts) -> None:
        self.counts = Counts()
        self.stats: dict[str, dict[str, Any]] = {}

    def handle(self, worker: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.counts.set(worker, {k: int(meta[k]) for k in self.COUNTED if k in meta})
        stats = {k: v for k, v in meta.items() if k not in ("replay", "worker") and not k.startswith("t_")}
        counted = {k: int(self.counts.of(worker, k)) for k in self.COUNTED if k in stats or self.counts.of(worker, k)}
        self.stats[worker] = {**stats, **counted}

    def record(self) -> dict[str, Any]:
        return {f"{worker}_{k}": v for worker, stats in self.stats.items() for k, v in stats.items()}

    def summary(self) -> dict[str, Any]:
        # a message a replay refused is a dropped insert: counted with the trainers' refused messages
        refused = int(self.counts.total("rejected_segments"))
        return {"replays": dict(sorted(self.stats.items())), "rejected_segment_messages": refused}

    def restarted(self, worker: str) -> None:
        self.counts.restarted(worker)
