"""Inference and sample streams over one pool of segment buffers.

Observations are written once, by the actor, into a segment buffer; the
policy worker reads them there and writes actions, log-probs and the policy
version back in place; the trainer reads the finished segment from the same
memory. Only small integer records travel through channels:

- inference request  ``(actor, slot, buffer, t, ticket)``  actor -> policy worker
- inference reply    ``(slot, ticket)``                    policy worker -> actor
- sample ready       ``(actor, buffer)``                   actor -> trainer (or -> stage -> trainer)

With several policies each has its own pool (its agents' columns, its spaces), and the slot
field of a request and its reply names the policy too: ``policy * ring_size + slot``.

Tickets make requests safe to repeat and actors safe to restart: each post
of a slot takes the next ticket from ``tickets[actor, slot]`` in the pool, a
policy worker serves a request only while its ticket is still the slot's
current one, and an actor steps a slot only on a reply with that ticket. So a
request re-sent after a policy worker died, or one left behind by an actor
process that died, is dropped instead of answered twice.

Each buffer has a state flag (FREE -> FILLING by its actor -> READY when
submitted -> FREE when the trainer released it). A full pool is back-pressure:
an actor whose slot finds no free buffer parks that slot until one frees up.
When the run has a stage between actors and trainers (``stage:`` in the
config), an actor submits as STAGED to the stage instead; the stage forwards
a buffer (READY, its record sent on to the trainer: the segment itself does
not move) or drops it (FREE).

A state flag in shared memory wakes nobody when it changes, so each pool row
has a bell: whoever hands buffers of the row back rings it once they are all
back (one record down the row's pipe), and the worker that fills the row blocks
on it while it has no free buffer, instead of polling the flags (see
``docs/architecture.md``, "How workers wait").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from srl.api.schema import MEMORY, FieldSpec, SampleSchema, Scope
from srl.api.worker import Policy
from srl.base.channel import Channel
from srl.base.shm import ShmArray

FREE, FILLING, READY, STAGED = 0, 1, 2, 3
"""Buffer states; who holds a buffer in each is the rule by which a dead worker's buffers are freed. A buffer
handed to the stop at position ``p`` of a sample path with several hops is ``STAGED + p`` (see
``srl.runtime.topology.submitted_state``)."""

REQUEST_WIDTH, REPLY_WIDTH, SAMPLE_WIDTH, BELL_WIDTH = 5, 2, 2, 1
"""Words per record: an inference request, its reply, a segment (or batch) handed on, a pool row's bell rung (its
buffers handed back)."""
EPISODE_WIDTH = 5
"""An episode tap's record (actors -> an episode sink, ``Stream.EPISODES``): (policy, env steps, episodes
finished, the sum of their returns as two words of a float64)."""


def episode_records(policy_steps: Sequence[int], sums: Sequence[float], counts: Sequence[int]) -> np.ndarray:
    """The episode tap's records of one report: one per policy with env steps or finished episodes to report."""
    rows = []
    for m, (steps, total, n) in enumerate(zip(policy_steps, sums, counts)):
        if steps or n:
            hi, lo = np.array([total], np.float64).view(np.int32).tolist()
            rows.append((m, steps, n, hi, lo))
    return np.array(rows, np.int32).reshape(-1, EPISODE_WIDTH)


def episode_sum(hi: int, lo: int) -> float:
    """The sum of returns an episode record carries in its two last words (see :func:`episode_records`)."""
    return float(np.array([hi, lo], np.int32).view(np.float64)[0])


@dataclass(frozen=True)
class PoolLayout:
    """Shape of the pool: ``actors`` x ``buffers`` segments of a schema's fields (see :mod:`srl.api.schema`)."""

    actors: int
    buffers: int
    fields: Mapping[str, FieldSpec]
    slots: int = 1
    """Environment slots per actor (the ring size): one request ticket each."""
    obs_fields: tuple[str, ...] = ("obs",)
    """The observation parts: what the actor writes each step and the policy reads."""
    segment_scoped: frozenset[str] = frozenset()
    """Fields with one row per segment, written at its first step."""

    @classmethod
    def of(cls, schema: SampleSchema, T: int, B: int, actors: int, buffers: int, slots: int = 1) -> PoolLayout:
        """The layout of ``schema``'s fields for segments of T steps of B environments."""
        return cls(
            actors,
            buffers,
            schema.segment(T, B),
            slots,
            tuple(f.name for f in schema.fields.values() if f.scope is Scope.OBSERVATION and f.acting),
            frozenset(f.name for f in schema.fields.values() if f.scope is Scope.SEGMENT),
        )

    def shape(self, name: str) -> tuple[int, ...]:
        return (self.actors, self.buffers, *self.fields[name].shape)


class SegmentPool:
    """Every actor's segment buffers, as ``arrays[name][actor, buffer, ...]`` plus ``state[actor, buffer]``,
    and the request tickets ``tickets[actor, slot]``."""

    def __init__(
        self,
        layout: PoolLayout,
        arrays: dict[str, np.ndarray],
        state: np.ndarray,
        tickets: np.ndarray,
        handles: list[ShmArray] | None = None,
    ) -> None:
        self.layout = layout
        self.arrays = arrays
        self.state = state
        self.tickets = tickets
        self._handles = handles or []

    @classmethod
    def in_process(cls, layout: PoolLayout) -> SegmentPool:
        arrays = {n: np.zeros(layout.shape(n), f.dtype) for n, f in layout.fields.items()}
        return cls(
            layout,
            arrays,
            np.zeros((layout.actors, layout.buffers), np.int32),
            np.zeros((layout.actors, layout.slots), np.int32),
        )

    @classmethod
    def shared(cls, layout: PoolLayout, tag: str, create: bool) -> SegmentPool:
        """Create (owner) or attach (worker) the pool's shared-memory segments, named by ``tag``."""
        open_ = ShmArray.create if create else ShmArray.attach
        handles: list[ShmArray] = []
        try:
            for name, spec in layout.fields.items():  # fields apart from the flags: a field may be named "state"
                handles.append(open_(f"{tag}_field_{name}", layout.shape(name), spec.dtype))
            handles.append(open_(f"{tag}_pool_state", (layout.actors, layout.buffers), "int32"))
            handles.append(open_(f"{tag}_pool_tickets", (layout.actors, layout.slots), "int32"))
        except BaseException:
            for h in handles:
                h.close()
                if create:
                    h.unlink()
            raise
        arrays = {name: h.array for name, h in zip(layout.fields, handles)}
        return cls(layout, arrays, handles[-2].array, handles[-1].array, handles)

    def segment(self, actor: int, buffer: int) -> dict[str, np.ndarray]:
        """Views (no copies) of one segment's fields."""
        return {name: arr[actor, buffer] for name, arr in self.arrays.items()}

    def close(self, unlink: bool = False) -> None:
        self.arrays = {}
        self.state = np.zeros((0, 0), np.int32)
        self.tickets = np.zeros((0, 0), np.int32)
        for h in self._handles:
            h.close()
            if unlink:
                h.unlink()
        self._handles = []


class SegmentSink(Protocol):
    """Actor side of the sample stream, within a node (:class:`SampleProducer`) or across nodes."""

    lost: int
    """Segments handed on that never reached a trainer (across nodes: the connection dropped before the trainer
    took them, and their buffers came back); 0 within a node, where a trainer's death is the supervisor's to
    count."""

    @property
    def bell(self) -> Channel | None:
        """Readable when a buffer of this sink's row may have come back, to wait on beside other channels; None
        when buffers come back without a notice (across nodes, as ZeroMQ takes their copies): then poll
        :meth:`acquire`."""

    def acquire(self) -> int | None:
        """A free buffer of this actor's pool row, now FILLING; None under back-pressure."""

    def submit(self, buffer: int) -> None:
        """The segment in ``buffer`` is complete: hand it on to the trainer."""

    def close(self) -> None:
        """Release what this end holds (not the pool)."""


class SegmentSource(Protocol):
    """Trainer side of the sample stream, within a node (:class:`SampleConsumer`) or across nodes."""

    @property
    def channel(self) -> Channel | None:
        """The channel its records arrive on, to wait on beside other channels; None when they come over a socket
        (across nodes): then only :meth:`receive` waits for them."""

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """The segment fields."""

    def receive(self, max_segments: int, timeout: float | None) -> np.ndarray:
        """Up to ``max_segments`` records of received segments."""

    def segment(self, actor: int, buffer: int) -> dict[str, np.ndarray]:
        """The fields of a received segment."""

    def release(self, actor: int, buffer: int) -> None:
        """Done with a received segment."""

    def ring(self) -> None:
        """Wake whoever waits for the buffers released since the last call (once each)."""

    def holds(self, actor: int, buffer: int) -> bool:
        """Whether a received record's segment is still handed over to this consumer. A record can outlive its
        segment: one left in a pipe by a consumer that died names a buffer its restart's cleanup freed, which the
        actor may have filled and handed over again, with a record of its own; so a record is checked when it is
        used, and a second record of one hand-over finds the buffer released."""

    @property
    def rejected(self) -> int:
        """Messages refused so far (malformed, or without the run's token across nodes), counted, never silent."""


class SampleProducer:
    """Actor side of the sample stream: takes free buffers, hands full ones to a trainer."""

    lost = 0  # within a node: see SegmentSink.lost

    def __init__(
        self, pool: SegmentPool, actor: int, channel: Channel, submitted: int = READY, bell: Channel | None = None
    ) -> None:
        """``submitted``: the state a finished buffer is handed over in (READY to a trainer, STAGED to a stage).
        ``bell``: the pool row's bell, rung by :meth:`SampleConsumer.ring` once its buffers are handed back."""
        self.pool, self.actor, self.channel, self.submitted, self.bell = pool, actor, channel, submitted, bell
        self._state = pool.state[actor]

    def acquire(self) -> int | None:
        """A free buffer now marked FILLING, or None when all are in use (back-pressure).

        The bell is emptied before the flags are read: a hand-back after that read rings it again, so a caller that
        then waits on it is woken, and the pipe never holds more rings than the row has buffers."""
        if self.bell is not None:
            clear(self.bell)
        free = np.flatnonzero(self._state == FREE)
        if free.size == 0:
            return None
        buf = int(free[0])
        self._state[buf] = FILLING
        return buf

    def submit(self, buffer: int) -> None:
        """The segment in ``buffer`` is complete: mark it submitted and notify the trainer (or stage)."""
        self._state[buffer] = self.submitted
        self.channel.send((self.actor, buffer))

    def close(self) -> None:
        """Nothing to close: the pool and channel belong to the fabric."""


class SampleConsumer:
    """Trainer (or stage) side of the sample stream."""

    def __init__(
        self, pool: SegmentPool, channel: Channel, accepts: int = READY, bells: Mapping[int, Channel] | None = None
    ) -> None:
        """``accepts``: the state its buffers arrive in (STAGED for a stage). ``bells``: per pool row, the bell its
        filler waits on (a row without one is polled by its filler)."""
        self.pool, self.channel, self.accepts = pool, channel, accepts
        self.bells: Mapping[int, Channel] = bells or {}
        self._released: set[int] = set()  # rows with a bell that had buffers released since the last ring
        self.rejected = 0
        """Records naming no buffer of the pool (a duplicate of a record already taken is not one)."""

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """The segment fields (shapes ``[T(+1), B, ...]``)."""
        return self.pool.layout.fields

    def receive(self, max_segments: int, timeout: float | None) -> np.ndarray:
        """Up to ``max_segments`` ready ``(actor, buffer)`` records; validated against the pool."""
        records = self.channel.recv(max_segments, timeout)
        layout = self.pool.layout
        ok = (
            (records[:, 0] >= 0)
            & (records[:, 0] < layout.actors)
            & (records[:, 1] >= 0)
            & (records[:, 1] < layout.buffers)
        )
        if not ok.all():
            self.rejected += int(ok.size - np.count_nonzero(ok))
            records = records[ok]
        return records[self.pool.state[records[:, 0], records[:, 1]] == self.accepts]  # a duplicate is ignored

    def segment(self, actor: int, buffer: int) -> dict[str, np.ndarray]:
        """Views of a received segment's fields."""
        return self.pool.segment(actor, buffer)

    def release(self, actor: int, buffer: int, state: int = FREE) -> None:
        """Give a consumed buffer back to its actor (FREE), or to whoever fills it in the state that one expects
        it back in; :meth:`ring` wakes it."""
        self.pool.state[actor, buffer] = state
        if actor in self.bells:
            self._released.add(actor)

    def ring(self) -> None:
        """Ring once the bell of each row that had buffers released since the last call. After the flags are set, so
        a filler woken finds them; once per hand-over, so it wakes once, with every buffer of it back (an actor then
        unparks its slots together)."""
        for row in self._released:
            self.bells[row].send((row,))
        self._released.clear()

    def holds(self, actor: int, buffer: int) -> bool:
        return bool(self.pool.state[actor, buffer] == self.accepts)


class SegmentForwarder(Protocol):
    """A stage's way on to the trainers: hands a kept buffer on (the segment is not copied inside a node)."""

    def forward(self, actor: int, buffer: int) -> None:
        """Send kept segment ``(actor, buffer)`` to the trainer its actor feeds."""

    def flush(self) -> bool:
        """Retry what could not go out yet (across nodes, while a trainer is behind); True when nothing waits."""

    def close(self) -> None: ...


class PoolForwarder:
    """Inside a node: a kept buffer is handed to the next stop (its state says to whom) and its record goes down
    that stop's channel."""

    def __init__(self, pool: SegmentPool, channels: Mapping[int, Channel], state: int = READY) -> None:
        """``channels``: the next stop's channel of each pool row this hop serves; ``state``: the state the next
        stop accepts."""
        self.pool, self.channels, self.state = pool, channels, state

    def forward(self, actor: int, buffer: int) -> None:
        self.pool.state[actor, buffer] = self.state
        self.channels[actor].send((actor, buffer))

    def flush(self) -> bool:
        """Records never wait: a channel takes them at once."""
        return True

    def close(self) -> None:
        """The pool and channels belong to the fabric."""


def clear(bell: Channel) -> None:
    """Take every ring waiting in ``bell`` (never waits); what they named is read from the flags."""
    while len(bell.recv(64, 0.0)) == 64:
        pass


TICKET_MASK = 0x7FFFFFFF
"""Tickets are int32 words on the wire; they wrap around (only equality is ever tested)."""


class InferenceClient:
    """Actor side of the inference stream (a remote policy worker answers). A slot asks once per policy whose
    agents it holds; the request's slot field says which: ``policy * ring_size + slot``."""

    def __init__(self, actor: int, pools: Sequence[SegmentPool], requests: Channel, replies: Channel) -> None:
        self.actor, self.requests, self.replies = actor, requests, replies
        self._tickets = [pool.tickets[actor] for pool in pools]
        self._ring = pools[0].layout.slots

    def connect(self, should_stop: Callable[[], bool]) -> None:
        """Nothing to wait for: the policy worker waits for parameters itself."""

    def wakes(self) -> tuple[Channel, ...]:
        """The replies: readable when an answer may have come."""
        return (self.replies,)

    def request(self, policy: int, slot: int, buffer: int, t: int) -> None:
        """Ask for policy ``policy``'s actions for the observations at ``obs[actor, buffer, t]`` of its pool (a
        repeat supersedes the last ask)."""
        tickets = self._tickets[policy]
        ticket = (int(tickets[slot]) + 1) & TICKET_MASK
        tickets[slot] = ticket
        self.requests.send((self.actor, policy * self._ring + slot, buffer, t, ticket))

    def ready(self, max_slots: int, timeout: float | None) -> np.ndarray:
        """The requests answered, as ``policy * ring_size + slot`` (replies to superseded requests are dropped)."""
        replies = self.replies.recv(max_slots, timeout)
        asked = replies[:, 0]
        ok = (asked >= 0) & (asked < len(self._tickets) * self._ring)
        policy, slot = np.divmod(asked, self._ring)
        for k, tickets in enumerate(self._tickets):
            mine = ok & (policy == k)
            ok[mine] = replies[mine, 1] == tickets[slot[mine]]
        return asked[ok]


class InlineInference:
    """Actor-side inference without a server: the actor evaluates each policy itself (IMPALA-style).

    Same interface as :class:`InferenceClient`, so the actor does not know which one it has.
    """

    def __init__(
        self, actor: int, pools: Sequence[SegmentPool], policies: Sequence[Policy], versions: Sequence[VersionSource]
    ) -> None:
        self.actor, self.pools, self.policies, self.versions = actor, pools, policies, versions
        self._obs = [acting_inputs(pool) for pool in pools]
        self._ring = pools[0].layout.slots
        self._ready: list[int] = []

    def connect(self, should_stop: Callable[[], bool]) -> None:
        """Wait for each policy's first snapshot so no step is taken with untrained, unversioned weights."""
        for version in self.versions:
            version.wait_first(should_stop)

    def wakes(self) -> tuple[Channel, ...]:
        """None: every request is answered when it is made."""
        return ()

    def request(self, policy: int, slot: int, buffer: int, t: int) -> None:
        version, pool = self.versions[policy], self.pools[policy]
        version.refresh()
        index = (self.actor, buffer, t)
        arrays = pool.arrays
        outputs = self.policies[policy].act({name: arrays[name][index] for name in self._obs[policy]})
        write_answer(pool, index, outputs, version.current)
        self._ready.append(policy * self._ring + slot)

    def ready(self, max_slots: int, timeout: float | None) -> np.ndarray:
        """The answers made since the last call; never waits (nothing can arrive meanwhile)."""
        out, self._ready = self._ready[:max_slots], self._ready[max_slots:]
        return np.asarray(out, np.int32)


class VersionSource(Protocol):
    """Keeps a policy at the newest published parameters (``params.ParamSubscriber``)."""

    current: int

    def refresh(self) -> bool:
        """Load a newer snapshot if there is one; True when it did."""

    def wait_first(self, should_stop: Callable[[], bool]) -> bool:
        """Block until the first snapshot is loaded (False if stopped first; raises on time-out)."""


class InferenceServer:
    """Policy-worker side: gathers pending requests (auto-batching) and answers them in place, one batch per
    policy (each policy's observations are in its own pool)."""

    def __init__(self, pools: Sequence[SegmentPool], requests: Channel, replies: Mapping[int, Channel]) -> None:
        self.pools, self.requests, self.replies = pools, requests, replies
        self._served = np.array(sorted(replies), np.int32)  # the actors this server answers
        layout = pools[0].layout
        self._ring, self._buffers, self._T = layout.slots, layout.buffers, layout.fields["actions"].shape[0]
        self._obs = [acting_inputs(pool) for pool in pools]
        self.superseded = 0  # requests dropped because their slot had asked again since

    def gather(self, max_requests: int, timeout: float | None) -> list[tuple[int, np.ndarray]]:
        """Pending ``(actor, policy * ring + slot, buffer, t, ticket)`` requests, at most ``max_requests``, as
        ``(policy, its requests)``; malformed and superseded ones dropped."""
        records = self.requests.recv(max_requests, timeout)
        ok = (
            np.isin(records[:, 0], self._served)
            & (records[:, 1] >= 0)
            & (records[:, 1] < len(self.pools) * self._ring)
            & (records[:, 2] >= 0)
            & (records[:, 2] < self._buffers)
            & (records[:, 3] >= 0)
            & (records[:, 3] < self._T)
        )
        records = records[ok]
        policy = records[:, 1] // self._ring
        out = []
        for k, pool in enumerate(self.pools):
            mine = records[policy == k] if len(self.pools) > 1 else records
            if not len(mine):
                continue
            current = pool.tickets[mine[:, 0], mine[:, 1] % self._ring] == mine[:, 4]
            if not current.all():
                self.superseded += int((~current).sum())
                mine = mine[current]
            if len(mine):
                out.append((k, mine))
        return out

    def observations(self, policy: int, requests: np.ndarray) -> dict[str, np.ndarray]:
        """The requested observations of policy ``policy`` as one batch ``[n * B, ...]`` per part (one gather,
        one copy each)."""
        index = (requests[:, 0], requests[:, 2], requests[:, 3])
        arrays, out = self.pools[policy].arrays, {}
        for name in self._obs[policy]:
            obs = arrays[name][index]
            out[name] = obs.reshape(-1, *obs.shape[2:])
        return out

    def gather_into(self, policy: int, requests: np.ndarray, out: Mapping[str, np.ndarray]) -> None:
        """:meth:`observations` gathered straight into ``out`` (``[n, B, ...]`` per part, e.g. a staging buffer's
        views): one copy, from the pool into ``out``."""
        arrays = self.pools[policy].arrays
        for name in self._obs[policy]:
            source = arrays[name]
            rows = np.ravel_multi_index((requests[:, 0], requests[:, 2], requests[:, 3]), source.shape[:3])
            # ``clip`` writes into ``out`` directly (``raise`` would buffer); the requests were checked in gather
            np.take(source.reshape(-1, *source.shape[3:]), rows, axis=0, out=out[name], mode="clip")

    def answer(self, policy: int, requests: np.ndarray, outputs: Mapping[str, np.ndarray], version: int) -> None:
        """Write policy ``policy``'s outputs (``[n * B, ...]`` each) in place and wake each requesting actor."""
        index = (requests[:, 0], requests[:, 2], requests[:, 3])
        n = len(requests)
        outs = {k: v.reshape(n, -1, *v.shape[1:]) for k, v in outputs.items()}
        write_answer(self.pools[policy], index, outs, version)
        for actor, slot, ticket in zip(requests[:, 0].tolist(), requests[:, 1].tolist(), requests[:, 4].tolist()):
            self.replies[actor].send((slot, ticket))


def acting_inputs(pool: SegmentPool) -> tuple[str, ...]:
    """What a request hands the policy: the observation parts, and a policy's recurrent state when it has one."""
    return pool.layout.obs_fields + ((MEMORY,) if MEMORY in pool.arrays else ())


def write_answer(pool: SegmentPool, index: tuple, outputs: Mapping[str, np.ndarray], version: int) -> None:
    """Write an inference answer in place at ``(actor, buffer, t)`` (one step, or arrays of them for a batch).

    Step-scoped outputs go to row ``t``; a segment-scoped output (one row per segment) only at ``t == 0``; the
    next recurrent state (:data:`~srl.api.schema.MEMORY`) to row ``t + 1``, the row its step reads.
    """
    arrays = pool.arrays
    for name, value in outputs.items():
        if name == MEMORY:
            actor, buffer, t = index
            arrays[name][actor, buffer, np.asarray(t) + 1] = value
        elif name in pool.layout.segment_scoped:
            actor, buffer, t = index
            first = np.asarray(t) == 0
            if first.ndim == 0:
                if first:
                    arrays[name][actor, buffer, 0] = value
            elif first.any():
                arrays[name][np.asarray(actor)[first], np.asarray(buffer)[first], 0] = value[first]
        else:
            arrays[name][index] = value
    arrays["version"][index] = version
