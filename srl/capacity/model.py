"""Capacity model for scaling out: predicted env steps/s, the bottleneck, and a recommended layout.

Why a model: a cluster of 1k-100k cores cannot be rented for every question,
but what each piece of the pipeline costs can be measured on one machine
(``srl bench costs``, in ``srl/bench/costs.py``). This module turns those
costs into a throughput prediction for a cluster; ``srl/capacity/recommend.py``
searches it for values of the Ray runtime's layout settings (``ray.actor_nodes``,
``ray.actors_per_node``, ``ray.policy_workers_per_node``, ``workers.trainers``,
``workers.ring_size``, ``workers.envs_per_slot``, ``params.mode``, ``params.fan_out``).

It is a pipeline-throughput model and nothing more:

- every stage has a capacity in env steps/s: the processes in it divided by the
  seconds one process needs per sample (``env``: actors stepping environments,
  with inference when it is inline; ``inference``: policy workers; ``trainer``,
  whose seconds include its share of the gradient all-reduce among data-parallel
  trainers (:func:`allreduce_seconds`: a ring over this machine's loopback as
  measured, or across trainer nodes over their links);
  ``replay``: with a replay, each trainer's replay worker inserts every env
  step and samples its items ``samples_per_insert`` times, and the trainer
  updates on every item sampled;
  ``network``: links carrying segments from actor nodes to trainer nodes;
  ``params``: the parameter service must deliver each version to every reader
  before the next one is published);
- processes on one node share its cores (``cores``): a node cannot do more than
  its cores divided by the CPU seconds per sample of all the work it hosts (and
  nodes that share one machine, ``shared_cores``, no more than its cores divided
  by all the work of every node);
- the pipeline runs at the smallest capacity, and that stage is the bottleneck;
- the recommended layout is the integer split of the cores that maximises it.

Not modelled (see docs/scaling.md): queueing and latency (a ring of two slots is
assumed to hide each inference round trip), trainers waiting for their slowest
peer at each all-reduce, policy workers on GPUs, relay, stage and controller CPU
time, stragglers and failures, and how many samples learning needs; with a
replay, its filling up to ``min_size`` and the rate limiter's error buffer (the
model charges samples per insert at its setting, which the limiter holds on
average).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from srl.api.config import ConfigError

if TYPE_CHECKING:
    from srl.runtime.plan import Plan

STAGES = ("env", "inference", "trainer", "replay", "network", "params", "cores")
"""Stage names, in the order ties are broken when naming the bottleneck."""
RING_SIZE = 2
"""Slots per actor: one steps while the other waits for its actions (the layout sweep in docs/benchmarks.md:
a ring of 1 halves throughput, 2 and 4 are equal)."""


@dataclass(frozen=True, kw_only=True)
class Costs:
    """What one experiment config costs on the machine it was measured on (seconds are on one core).

    Per-sample costs come from the real code paths (``srl bench costs``); the shape fields are the
    config's, because the per-message costs are amortised over them.
    """

    env_id: str
    """The environment measured (informational)."""
    envs_per_slot: int
    """Environments per slot in the measurement (one inference request covers them all)."""
    agents_per_env: int = 1
    """Columns per environment: a multi-agent env's step is one sample (inference, update) per agent. Every other
    cost, and every rate the model predicts, is per env step."""
    segment_length: int
    """Steps per trajectory segment."""
    samples_per_version: float
    """Env steps one trainer consumes per parameter version: on-policy ``batch_segments x segment_length x
    envs_per_slot``; with a replay, the env steps its batch of ``batch_size`` sampled items stands for,
    ``batch_size / (samples_per_insert x`` :func:`replay_items_per_step` ``)``, whatever the slot size."""
    max_inference_batch: int
    """The config's cap on slots per forward pass of a policy worker."""
    env_seconds_per_step: float
    """Seconds per env step of a plain loop over one slot (the configured backend)."""
    actor_seconds_per_step: float
    """The actor's own work per env step beyond the env: reward transform, writes into the segment pool,
    non-finite checks, episode bookkeeping, handing over segments."""
    inline_actor_seconds_per_step: float | None = None
    """The real actor with the acting policy inline, all its work per env step at ``envs_per_slot``: env,
    bookkeeping and forward pass interleaved. More than the three measured apart (each of those loops runs in warm
    caches): HalfCheetah 89 us against 67 us, as in a run. None (a costs file measured before it): their sum."""
    inference_seconds_per_sample: float
    """Policy forward pass: seconds per sample (slope of two batch sizes)."""
    inference_seconds_per_batch: float
    """Policy forward pass: fixed seconds per call (intercept of the same fit)."""
    request_seconds: float
    """The actor's CPU seconds per inference request on the stream: post it, take the reply (named pipes)."""
    serve_seconds_per_batch: float
    """The policy worker's stream work per batch beyond the forward pass: gather and validate the requests,
    copy the observations, write the answers (fixed part)."""
    serve_seconds_per_request: float
    """The same, per request in the batch (the reply record and per-slot copies)."""
    update_seconds_per_sample: float
    """One update of the config's algorithm over a full batch, divided by its samples (CPU, ``trainer_threads``
    threads): on-policy (PPO) all epochs over ``samples_per_version`` env steps' columns; with a replay one
    ``train`` call on ``batch_size`` sampled items, per item."""
    trainer_threads: int
    """Torch threads (cores) one CPU trainer used in the measurement."""
    gpu_update_speedup: float | None = None
    """How much faster the update runs on one GPU than on ``trainer_threads`` CPU cores, given by the user; read
    only for trainers on GPUs when the costs hold no measured ``device_update_seconds_per_sample``."""
    device: str | None = None
    """The accelerator the ``device_*`` costs were measured on (``srl bench costs --device``), e.g.
    ``cuda:0 (NVIDIA H200)``; None: none was."""
    device_update_seconds_per_sample: float | None = None
    """The update of :attr:`update_seconds_per_sample` on :attr:`device` (its batch already there, as the
    trainer's prefetching puts it): what a trainer on a GPU costs per sample. None: not measured."""
    device_inference_seconds_per_sample: float | None = None
    """The policy forward pass on :attr:`device`, copies in and out included: seconds per sample (the model does
    not place policy workers on GPUs yet; recorded for that)."""
    device_inference_seconds_per_batch: float | None = None
    """The same forward pass's fixed seconds per call on :attr:`device`."""
    segment_send_seconds: float
    """One segment through ZeroMQ TCP on loopback: encode, send, receive, decode (split between the two ends)."""
    bytes_per_sample: float
    """Segment bytes per env step on the wire (every agent's column of it)."""
    param_bytes: int
    """One parameter snapshot on the wire (``params.transfer_dtype``)."""
    param_hop_seconds: float
    """Fixed time of one parameter-service hop (server wakes, sends, reader loads), from two snapshot sizes."""
    param_bytes_per_second: float
    """How fast one parameter server pushes snapshot bytes to its readers on this machine."""
    gradient_bytes: int | None = None
    """Bytes of one gradient all-reduce among data-parallel trainers (float32, every parameter the update
    reduces). None (a costs file measured before it existed): the layout may have one trainer only."""
    reductions_per_update: int | None = None
    """All-reduces per update (PPO: ``epochs x minibatches``), counted in a real update."""
    allreduce_hop_seconds: float | None = None
    """Fixed time of one step of a ring all-reduce on this machine (two trainer processes on loopback, gloo)."""
    allreduce_bytes_per_second: float | None = None
    """How fast one ring step moves gradient bytes on this machine (the same measurement)."""
    samples_per_insert: float = 0.0
    """Items sampled per item inserted (``replay.samples_per_insert``), so each env step's items are trained on
    this many times. 0: no replay, the trainer consumes each env step once (on-policy)."""
    item_length: int = 1
    """Steps per replay item (``replay.item_length``): a chunk of ``segment_length`` steps (one agent's column of a
    segment) holds ``(segment_length - item_length) // item_stride + 1`` items."""
    item_stride: int = 1
    """Steps between the starts of a chunk's consecutive items (``replay.item_stride``)."""
    replay_insert_seconds_per_step: float = 0.0
    """The replay worker's CPU per env step inserted (every agent's column of it): one segment into the real store,
    full at ``replay.max_size``, divided by its env steps. 0 without a replay."""
    replay_sample_seconds_per_item: float = 0.0
    """The replay worker's CPU per item sampled for its trainer, n-step targets included, and the item's priority
    update with a prioritized sampler. 0 without a replay."""
    reanalyze_share: float = 0.0
    """Stored steps re-searched per step trained on (``reanalyze.share`` of a run with reanalyze workers; 0: none).
    Each is the acting policy's search again (its forward pass: a search's simulations over their leaf batch)."""
    reanalyze_batch: int = 64
    """Steps the reanalyze workers search together (``reanalyze.batch``): the forward pass's fixed part is paid
    once per batch of them."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "env_id":
                _require(isinstance(value, str), f.name, f"expected a string, got {value!r}")
            elif f.name == "device":
                _require(value is None or isinstance(value, str), f.name, f"expected a string or null, got {value!r}")
            elif f.name in _OPTIONAL:
                fits = _is_int(value) if f.type == "int | None" else _is_number(value)
                positive = fits and (value > 0 or (value == 0 and f.name in _MAY_BE_ZERO))
                _require(
                    value is None or positive,
                    f.name,
                    f"must be {'an integer' if f.type == 'int | None' else 'a number'} > 0 or null, got {value!r}",
                )
            elif f.type == "int":
                _require(
                    isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                    f.name,
                    f"must be an integer >= 1, got {value!r}",
                )
            elif f.name in _MAY_BE_ZERO:
                _require(_is_number(value) and value >= 0, f.name, f"must be a number >= 0, got {value!r}")
            else:
                _require(_is_number(value) and value > 0, f.name, f"must be a number > 0, got {value!r}")
        given = [name for name in ALLREDUCE if getattr(self, name) is not None]
        if given and len(given) < len(ALLREDUCE):
            missing = next(name for name in ALLREDUCE if getattr(self, name) is None)
            _require(False, missing, f"missing, while {given[0]} is given (one all-reduce measurement has all four)")
        on_device = ("device", *DEVICE_SECONDS)
        given = [name for name in on_device if getattr(self, name) is not None]
        if given and len(given) < len(on_device):
            missing = next(name for name in on_device if getattr(self, name) is None)
            _require(False, missing, f"missing, while {given[0]} is given (one device measurement has all four)")
        self._check_replay()

    def _check_replay(self) -> None:
        """The replay terms: all measured with a replay, all 0 without one; items that fit in a segment."""
        _require(
            self.item_length <= self.segment_length,
            "item_length",
            f"{self.item_length} steps do not fit in segments of {self.segment_length}",
        )
        _require(
            self.item_stride <= self.item_length,
            "item_stride",
            f"{self.item_stride} is longer than the items ({self.item_length} steps): some steps are never sampled",
        )
        for name in REPLAY_SECONDS:
            value = getattr(self, name)
            if self.samples_per_insert:
                _require(value > 0, name, f"must be > 0 with a replay (samples_per_insert {self.samples_per_insert:g})")
            else:
                _require(value == 0, name, f"given ({value:g}) without a replay: samples_per_insert is 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, source: str = "costs") -> Costs:
        """Build from parsed JSON; any problem raises ConfigError naming ``source`` and the field."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in data.items() if k not in _INFORMATIONAL}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"{source}: {unknown[0]}: unknown field")
        # files measured before agents_per_env: single-agent; without the replay or reanalyze terms: none
        optional = _OPTIONAL | {"agents_per_env", *REPLAY, "reanalyze_share", "reanalyze_batch"}
        missing = sorted(n for n in names - set(data) if n not in optional)
        if missing:
            raise ConfigError(f"{source}: {missing[0]}: missing")
        values: dict[str, Any] = {
            k: float(v) if isinstance(v, int) and not isinstance(v, bool) and k in _FLOATS else v
            for k, v in data.items()
        }
        try:
            return cls(**values)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None


_INFORMATIONAL = {"bench"}
"""Keys ``srl bench costs`` adds that are not costs."""
_MAY_BE_ZERO = {
    "device_inference_seconds_per_sample",
    "device_inference_seconds_per_batch",
    "actor_seconds_per_step",
    "inference_seconds_per_sample",
    "inference_seconds_per_batch",
    "request_seconds",
    "serve_seconds_per_batch",
    "serve_seconds_per_request",
    "segment_send_seconds",
    "param_hop_seconds",
    "allreduce_hop_seconds",
    "samples_per_insert",
    "replay_insert_seconds_per_step",
    "replay_sample_seconds_per_item",
    "reanalyze_share",
}
_FLOATS = {f.name for f in dataclasses.fields(Costs) if f.type in ("float", "float | None")}
DEVICE_SECONDS = (
    "device_update_seconds_per_sample",
    "device_inference_seconds_per_sample",
    "device_inference_seconds_per_batch",
)
"""The costs measured on an accelerator (``srl bench costs --device``): all present with ``device``, or none."""
_OPTIONAL = {"gpu_update_speedup", "gradient_bytes", "reductions_per_update", "allreduce_hop_seconds",
             "allreduce_bytes_per_second", "inline_actor_seconds_per_step", "device", *DEVICE_SECONDS}  # fmt: skip
ALLREDUCE = ("gradient_bytes", "reductions_per_update", "allreduce_hop_seconds", "allreduce_bytes_per_second")
"""The fields of one all-reduce measurement (``srl bench costs``): all present, or all None."""
REPLAY_SECONDS = ("replay_insert_seconds_per_step", "replay_sample_seconds_per_item")
"""The replay worker's measured costs: > 0 with a replay (``samples_per_insert`` > 0), 0 without one."""
REPLAY = ("samples_per_insert", "item_length", "item_stride", *REPLAY_SECONDS)
"""The replay terms, which a costs file without a replay may leave out."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(cond: bool, name: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{name}: {msg}")


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Identical nodes joined by links of one bandwidth."""

    nodes: int
    cores_per_node: int
    gpus_per_node: int = 0
    """GPUs are used by trainers only (one trainer per GPU on trainer nodes)."""
    link_gbps: float = 10.0
    """Each node's network link, Gbit/s, each direction."""
    link_latency_us: float = 50.0
    """One message's latency between two nodes, microseconds (an assumption: nothing here measures it); a
    step of an all-reduce ring that crosses nodes costs at least this."""
    shared_cores: int | None = None
    """When every node runs on one machine with this many cores (network namespaces, ``ray.cluster_utils``,
    VMs on one host), every process of every node competes for them; None: each node has its own."""

    def __post_init__(self) -> None:
        for name in ("nodes", "cores_per_node"):
            _require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        _require(self.gpus_per_node >= 0, "gpus_per_node", f"must be >= 0, got {self.gpus_per_node}")
        shared = self.shared_cores
        _require(shared is None or shared >= 1, "shared_cores", f"must be >= 1, got {shared}")
        _require(_is_number(self.link_gbps) and self.link_gbps > 0, "link_gbps", f"must be > 0, got {self.link_gbps}")
        _require(
            _is_number(self.link_latency_us) and self.link_latency_us >= 0,
            "link_latency_us",
            f"must be >= 0, got {self.link_latency_us}",
        )

    @property
    def link_bytes_per_second(self) -> float:
        return self.link_gbps * 1e9 / 8


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Where the workers go. On a one-node cluster ``trainer_nodes`` is 0 and the trainers share the node."""

    actor_nodes: int
    trainer_nodes: int
    actors_per_node: int
    policy_workers_per_node: int
    """0: each actor runs the policy itself (inline inference)."""
    trainers: int
    trainer_device: Literal["cpu", "gpu"] = "cpu"
    ring_size: int = RING_SIZE
    envs_per_slot: int
    params_mode: Literal["hierarchical", "flat"] = "hierarchical"
    fan_out: int = 8
    batch_segments: int | None = None
    """Segments per trainer batch (``workers.batch_segments``). None: as many as keep the measured config's batch
    at this slot size (:func:`trainer_batch`)."""
    replay_placement: Literal["trainer", "node"] = "trainer"
    """With a replay (``replay.placement``): a replay worker per trainer, or one per trainer node group."""

    @property
    def replays(self) -> int:
        """Replay workers (with a replay): each does the same work per env step it takes in."""
        return self.trainers if self.replay_placement == "trainer" else max(1, self.trainer_nodes)


def layout_of(plan: Plan) -> Layout:
    """The layout a config runs, read from its topology table: how many workers of each role each node group
    holds. Under Ray the trainers have nodes of their own; on one machine they share it (``trainer_nodes`` 0)."""
    from srl.runtime.topology import ACTOR, POLICY, TRAINER

    plan.only("srl plan")  # its cost model has one policy's trainers and inference
    topology, cfg = plan.topology, plan.cfg
    first = min(w.group for w in topology.of(ACTOR))  # actor node groups are alike (checked by the config)
    trainers = topology.of(TRAINER)
    return Layout(
        actor_nodes=len({w.group for w in topology.of(ACTOR)}),
        trainer_nodes=len({w.group for w in trainers}) if cfg.runtime == "ray" else 0,
        actors_per_node=sum(1 for w in topology.of(ACTOR) if w.group == first),
        policy_workers_per_node=sum(1 for w in topology.of(POLICY) if w.group == first),
        trainers=len(trainers),
        trainer_device="cpu" if cfg.workers.trainer_device == "cpu" else "gpu",
        ring_size=cfg.workers.ring_size,
        envs_per_slot=cfg.workers.envs_per_slot,
        params_mode=cfg.params.mode,
        fan_out=cfg.params.fan_out,
        batch_segments=cfg.workers.batch_segments,
        replay_placement=cfg.replay.placement,
    )


@dataclass(frozen=True)
class ParamDelivery:
    """How one parameter version reaches every reader (policy workers, or actors inferring inline)."""

    mode: str
    fan_out: int
    readers: int
    relays: int
    """Relays (one per actor node) in hierarchical mode; 0 in flat mode."""
    depth: int
    """Server hops from the root to the farthest relay or reader (0: shared memory only)."""
    root_sends: int
    root_bytes: int
    """Bytes the root sends per version."""
    seconds: float
    """From publication until every reader can load the version."""


@dataclass(frozen=True)
class Prediction:
    steps_per_second: float
    bottleneck: str
    stages: Mapping[str, float]
    """Capacity of each stage in env steps/s (``inf``: it cannot bind in this layout)."""
    params: ParamDelivery


# ---------------------------------------------------------------------------------------------- per-sample costs
def actor_seconds(costs: Costs, layout: Layout) -> float:
    """CPU seconds of one actor per env step: the env, its bookkeeping, the policy itself when inline (else its
    side of each inference request), and across nodes its half of sending each segment."""
    s = costs.env_seconds_per_step + costs.actor_seconds_per_step
    if layout.policy_workers_per_node == 0:
        s += _inline_parts(costs, layout.envs_per_slot)
        if costs.inline_actor_seconds_per_step is not None:  # interleaved as measured, scaled to the layout's slot
            measured_parts = costs.env_seconds_per_step + costs.actor_seconds_per_step
            s *= costs.inline_actor_seconds_per_step / (measured_parts + _inline_parts(costs, costs.envs_per_slot))
    else:
        s += costs.request_seconds / layout.envs_per_slot
    if layout.trainer_nodes:
        s += segment_end_seconds(costs)
    return s


def _inline_parts(costs: Costs, envs_per_slot: int) -> float:
    """The forward pass per env step when the actor runs it on slots of ``envs_per_slot`` envs, timed on its own."""
    return costs.agents_per_env * costs.inference_seconds_per_sample + costs.inference_seconds_per_batch / envs_per_slot


def segment_end_seconds(costs: Costs) -> float:
    """One end's half of sending a segment across nodes, per env step of it (sender: an actor; receiver: the
    trainer, or the replay worker that keeps the segments)."""
    return costs.segment_send_seconds / 2 / (costs.segment_length * costs.envs_per_slot)


def inference_batch(costs: Costs, layout: Layout) -> float:
    """Env steps per forward pass of a policy worker when inference binds: every actor it serves has about half
    its ring waiting (the other half is being stepped), capped by ``max_inference_batch`` slots. When inference
    does not bind, batches are smaller, which costs spare cores only."""
    actors = layout.actors_per_node / layout.policy_workers_per_node
    slots = min(float(costs.max_inference_batch), max(1.0, actors * layout.ring_size / 2))
    return slots * layout.envs_per_slot


def policy_seconds(costs: Costs, layout: Layout) -> float:
    """CPU seconds of a policy worker per env step: the forward pass (one sample per agent) and its stream work,
    fixed costs amortised over the batch, per-request costs over the slot."""
    per_batch = costs.inference_seconds_per_batch + costs.serve_seconds_per_batch
    return (
        costs.agents_per_env * costs.inference_seconds_per_sample
        + per_batch / inference_batch(costs, layout)
        + costs.serve_seconds_per_request / layout.envs_per_slot
    )


def trained_per_step(costs: Costs) -> float:
    """Samples the update trains on per env step: one per agent on-policy; with a replay, the items the step
    inserts, each sampled ``samples_per_insert`` times."""
    if not costs.samples_per_insert:
        return costs.agents_per_env
    return costs.samples_per_insert * replay_items_per_step(costs)


def replay_items_per_step(costs: Costs) -> float:
    """Replay items one env step inserts: each agent's column of a segment is a chunk of ``segment_length`` steps
    holding ``(segment_length - item_length) // item_stride + 1`` items (1 per step for transitions)."""
    T = costs.segment_length
    return costs.agents_per_env * ((T - costs.item_length) // costs.item_stride + 1) / T


def trainer_seconds(costs: Costs, layout: Layout) -> float:
    """Seconds one trainer needs per env step: the update on what the step gives it (:func:`trained_per_step`;
    divided by the GPU speed-up on a GPU) and, across nodes without a replay, its half of receiving segments
    (a replay receives them instead)."""
    s = trained_per_step(costs) * (
        gpu_update_seconds(costs) if layout.trainer_device == "gpu" else costs.update_seconds_per_sample
    )
    if layout.trainer_nodes and not costs.samples_per_insert:
        s += segment_end_seconds(costs)
    return s


def gpu_update_seconds(costs: Costs) -> float:
    """Seconds per sample of the update on one GPU: measured there (``device_update_seconds_per_sample``) when the
    costs hold it, else the CPU's divided by ``gpu_update_speedup``."""
    if costs.device_update_seconds_per_sample is not None:
        return costs.device_update_seconds_per_sample
    if costs.gpu_update_speedup is None:
        raise ConfigError(
            "gpu_update_speedup: needed for trainers on GPUs when the costs hold no device_update_seconds_per_sample "
            "(measure it with srl bench costs --device cuda)"
        )
    return costs.update_seconds_per_sample / costs.gpu_update_speedup


def replay_seconds(costs: Costs, layout: Layout) -> float:
    """CPU seconds of a trainer's replay worker per env step: inserting it, sampling its items
    ``samples_per_insert`` times (priority updates included) and, across nodes, its half of receiving segments.
    0 without a replay."""
    if not costs.samples_per_insert:
        return 0.0
    sampled = costs.samples_per_insert * replay_items_per_step(costs)
    s = costs.replay_insert_seconds_per_step + sampled * costs.replay_sample_seconds_per_item
    if layout.trainer_nodes:
        s += segment_end_seconds(costs)
    return s


def reanalyze_seconds(costs: Costs) -> float:
    """CPU seconds of reanalysis per env step: ``reanalyze_share`` of the steps trained on (the items trained per
    env step, each of ``item_length`` steps), each searched again as the acting policy searches. 0 without it."""
    if not costs.reanalyze_share:
        return 0.0
    steps = costs.reanalyze_share * trained_per_step(costs) * costs.item_length
    return steps * (costs.inference_seconds_per_sample + costs.inference_seconds_per_batch / costs.reanalyze_batch)


def samples_per_version(costs: Costs, layout: Layout) -> float:
    """Samples behind one parameter version: every data-parallel trainer contributes its batch."""
    return layout.trainers * trainer_batch(costs, layout)


def batch_segments(costs: Costs, layout: Layout) -> int:
    """Segments per trainer batch: the layout's, or the count that keeps the measured config's batch closest at
    the layout's slot size (at least one: a larger slot than the batch holds grows it)."""
    if layout.batch_segments is not None:
        return layout.batch_segments
    return max(1, int(costs.samples_per_version / (costs.segment_length * layout.envs_per_slot) + 0.5))


def trainer_batch(costs: Costs, layout: Layout) -> float:
    """Env steps one trainer updates on per version: its segments of ``segment_length x envs_per_slot``, or with
    a replay the env steps its sampled batch stands for (``samples_per_version``, whatever the slot size)."""
    if costs.samples_per_insert:
        return costs.samples_per_version
    return batch_segments(costs, layout) * costs.segment_length * layout.envs_per_slot


def allreduce_seconds(costs: Costs, cluster: Cluster, layout: Layout) -> float:
    """Seconds of one gradient all-reduce among the ``p`` data-parallel trainers, as a ring: ``2 (p - 1)`` steps,
    each moving ``1/p`` of the gradient bytes, at this machine's measured hop time and byte rate (loopback). When
    the trainers span several nodes every step waits on the ring's slowest hop, a node link: at least the
    link's latency, at most its bandwidth. 0 for one trainer."""
    p = layout.trainers
    if p == 1:
        return 0.0
    if costs.gradient_bytes is None or costs.allreduce_hop_seconds is None or costs.allreduce_bytes_per_second is None:
        raise ConfigError(
            f"gradient_bytes: this costs file has no all-reduce measurement, needed for {p} trainers "
            "(measure again with srl bench costs)"
        )
    hop, rate = costs.allreduce_hop_seconds, costs.allreduce_bytes_per_second
    if layout.trainer_nodes > 1:
        hop = max(hop, cluster.link_latency_us * 1e-6)
        rate = min(rate, cluster.link_bytes_per_second)
    return 2 * (p - 1) * (hop + costs.gradient_bytes / p / rate)


def allreduce_per_step(costs: Costs, cluster: Cluster, layout: Layout) -> float:
    """Seconds each trainer spends all-reducing per env step of its batch (every reduction of an update)."""
    if layout.trainers == 1:
        return 0.0
    one = allreduce_seconds(costs, cluster, layout)  # refuses a costs file without the measurement
    assert costs.reductions_per_update is not None  # given with the other all-reduce fields (ALLREDUCE)
    return costs.reductions_per_update * one / trainer_batch(costs, layout)


# ---------------------------------------------------------------------------------------------- parameter service
def tree_depth(relays: int, fan_out: int) -> int:
    """Levels of a relay tree in which every server feeds ``fan_out`` children (the root is level 0)."""
    depth, level, covered = 0, 1, 0
    while covered < relays:
        level *= fan_out
        covered += level
        depth += 1
    return depth


def param_delivery(
    costs: Costs, cluster: Cluster, layout: Layout, mode: str | None = None, fan_out: int | None = None
) -> ParamDelivery:
    """Root egress and delivery time of one version. Flat: the root sends to every reader in turn.
    Hierarchical: one relay per actor node, in a tree of ``fan_out``; each level sends ``fan_out`` copies in
    turn, in parallel across the level's servers; readers on a node load from its shared memory."""
    mode = mode or layout.params_mode
    fan_out = fan_out or layout.fan_out
    per_node = layout.policy_workers_per_node or layout.actors_per_node
    readers = layout.actor_nodes * per_node
    if not layout.trainer_nodes:  # one node: readers share the trainer's buffer
        return ParamDelivery(mode, fan_out, readers, 0, 0, 0, 0, 0.0)
    per_copy = costs.param_bytes / min(costs.param_bytes_per_second, cluster.link_bytes_per_second)
    if mode == "flat":
        return ParamDelivery(
            mode,
            fan_out,
            readers,
            0,
            1,
            readers,
            readers * costs.param_bytes,
            costs.param_hop_seconds + readers * per_copy,
        )
    relays = layout.actor_nodes
    depth, sends = tree_depth(relays, fan_out), min(relays, fan_out)
    return ParamDelivery(
        mode,
        fan_out,
        readers,
        relays,
        depth,
        sends,
        sends * costs.param_bytes,
        depth * (costs.param_hop_seconds + sends * per_copy),
    )


def fan_out_candidates(relays: int) -> list[int]:
    """For each possible tree depth, the smallest fan-out that reaches ``relays`` relays in that many levels:
    at a given depth a smaller fan-out means fewer copies per server, so only these can be fastest."""
    out: list[int] = []
    for depth in range(1, max(1, relays).bit_length() + 1):
        f = max(2, math.ceil(relays ** (1 / depth)))
        while f > 2 and tree_depth(relays, f - 1) <= depth:
            f -= 1
        if tree_depth(relays, f) == depth and f not in out:
            out.append(f)
    return out or [2]


def best_params(costs: Costs, cluster: Cluster, layout: Layout) -> ParamDelivery:
    """The mode and fan-out that deliver a version soonest (ties: fewer hops, then hierarchical)."""
    options = [
        param_delivery(costs, cluster, layout, "hierarchical", f) for f in fan_out_candidates(layout.actor_nodes)
    ]
    options.append(param_delivery(costs, cluster, layout, "flat", layout.fan_out))
    return min(options, key=lambda d: (round(d.seconds, 12), d.depth, d.mode == "flat"))


# ---------------------------------------------------------------------------------------------- prediction
def predict(costs: Costs, cluster: Cluster, layout: Layout) -> Prediction:
    """Capacity of every stage; the pipeline runs at the smallest."""
    check_layout(cluster, layout)
    a_s, t_s, r_s = actor_seconds(costs, layout), trainer_seconds(costs, layout), replay_seconds(costs, layout)
    reduce_s = allreduce_per_step(costs, cluster, layout)  # waiting on the ring: no core of the node's busy
    pws = layout.actor_nodes * layout.policy_workers_per_node
    p_s = policy_seconds(costs, layout) if pws else 0.0
    delivery = param_delivery(costs, cluster, layout)
    stages = {
        "env": layout.actor_nodes * layout.actors_per_node / a_s,
        "inference": rate(pws, p_s) if pws else math.inf,  # inline inference is part of the env stage
        "trainer": layout.trainers / (t_s + reduce_s),
        "replay": rate(layout.replays, r_s),
        "network": _network(costs, cluster, layout),
        "params": samples_per_version(costs, layout) / delivery.seconds if delivery.seconds else math.inf,
        "cores": _cores(costs, cluster, layout, a_s + p_s, t_s, r_s),
    }
    bottleneck = min(STAGES, key=lambda s: stages[s])
    return Prediction(stages[bottleneck], bottleneck, stages, delivery)


def rate(processes: float, seconds_per_sample: float) -> float:
    """Samples per second of ``processes`` each needing ``seconds_per_sample`` (a free stage never binds)."""
    return processes / seconds_per_sample if seconds_per_sample > 0 else math.inf


def _network(costs: Costs, cluster: Cluster, layout: Layout) -> float:
    """Segments leave actor nodes and enter trainer nodes, each through its own link."""
    if not layout.trainer_nodes:
        return math.inf
    links = min(layout.actor_nodes, layout.trainer_nodes)
    return links * cluster.link_bytes_per_second / costs.bytes_per_sample


def _cores(costs: Costs, cluster: Cluster, layout: Layout, acting_s: float, t_s: float, replay_s: float) -> float:
    """Each sample costs every process it passes through CPU time; a node has only its cores for all of it.
    A GPU trainer keeps one core for itself and puts no update work on the others. A replay worker runs beside
    its trainer, on the CPU, and so do its reanalyze workers."""
    C = cluster.cores_per_node
    cpu_train = (t_s * costs.trainer_threads if layout.trainer_device == "cpu" else 0.0) + replay_s
    cpu_train += reanalyze_seconds(costs)
    gpu_cores = layout.trainers if layout.trainer_device == "gpu" else 0
    if not layout.trainer_nodes:
        free = C - gpu_cores
        return free / (acting_s + cpu_train) if free > 0 else 0.0
    acting = layout.actor_nodes * C / acting_s
    training = layout.trainer_nodes * C / cpu_train if cpu_train else math.inf
    if cluster.shared_cores is None:
        return min(acting, training)
    shared = cluster.shared_cores - gpu_cores  # nodes on one machine: every sample's work on the same cores
    return min(acting, training, shared / (acting_s + cpu_train) if shared > 0 else 0.0)


def check_layout(cluster: Cluster, layout: Layout) -> None:
    """A layout must fit the cluster's nodes and GPUs and give every trainer an actor."""
    _require(
        layout.actor_nodes >= 1 and layout.actors_per_node >= 1,
        "actors_per_node",
        "needs at least one actor node and one actor per node",
    )
    _require(layout.trainers >= 1, "trainers", f"must be >= 1, got {layout.trainers}")
    _require(layout.policy_workers_per_node >= 0, "policy_workers_per_node", "must be >= 0")
    _require(
        layout.actor_nodes + layout.trainer_nodes <= cluster.nodes,
        "actor_nodes",
        f"{layout.actor_nodes} actor + {layout.trainer_nodes} trainer nodes exceed {cluster.nodes} nodes",
    )
    _require(
        layout.trainer_nodes > 0 or (cluster.nodes == 1 or layout.actor_nodes == 1),
        "trainer_nodes",
        "trainers may share a node with actors only on a one-node cluster",
    )
    _require(
        layout.actor_nodes * layout.actors_per_node >= layout.trainers,
        "trainers",
        f"each trainer needs an actor: {layout.trainers} trainers",
    )
    if layout.trainer_device == "gpu":
        gpus = cluster.gpus_per_node * max(1, layout.trainer_nodes)
        _require(layout.trainers <= gpus, "trainers", f"{layout.trainers} GPU trainers, {gpus} GPUs")
