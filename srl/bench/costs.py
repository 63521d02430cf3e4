"""``srl bench costs``: what each stage of one config costs on this machine, as the capacity model's ``Costs``.

Every number comes from the real code path, one piece at a time, so that the
model (``srl/capacity/model.py``) can recombine them for a cluster:

- env: ``bench_env`` (a plain loop over one slot, the configured backend);
- actor bookkeeping: the real ``ActorWorker`` (built by ``build_worker``) stepping
  its ring with a stand-in policy that hands out precomputed actions, minus its
  own env time;
- the inline actor: the same actor with the acting policy inline, all its work
  per env step (the pieces interleaved, as a run has them);
- inference: the acting policy's forward pass at one slot (``bench_compute``) and
  at a larger batch, fitted as a fixed cost per call plus a cost per sample;
- update: one ``train`` call of the config's algorithm over a full batch: on-policy
  (PPO) ``batch_segments`` random segments, all epochs; with a replay a batch of
  the algorithm's ``batch_size`` items sampled from the replay's store;
- replay (configs whose algorithm learns from one): ``srl bench replay``'s
  measurements of the real store, full at the config's ``max_size``: one
  segment inserted, one batch sampled (with its priority update when
  prioritized);
- inference stream: the real ``InferenceClient`` and ``InferenceServer`` over
  named pipes in one process (no context switches, no forward pass), with
  batches of one slot and of several;
- segment send: the real ``SampleSender`` -> ``SampleReceiver`` over ZeroMQ TCP on loopback;
- parameter transfer: ``srl.bench.params.measure`` (a root server and one reader
  process) at two snapshot sizes, fitted as a fixed hop time plus a byte rate;
- gradient all-reduce: the reductions of one real update counted (how many, how
  many bytes) by a collective that only counts, and the ring's hop time and byte
  rate from two real trainer processes (``srl.bench.allreduce.ring_fit``);
- with ``--device``: the update and the inference fit again on that device (the
  update with its batch already there, as the trainer prefetches it; each timing
  waits for the device), as ``device_update_seconds_per_sample`` and
  ``device_inference_seconds_per_*``, which ``srl plan`` charges trainers on GPUs.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import zmq

from srl.api.config import ExperimentConfig
from srl.api.device import torch_device
from srl.api.schema import Field
from srl.api.worker import Policy
from srl.base import transfer
from srl.base.channel import FifoChannel
from srl.base.shm import new_tag
from srl.bench.allreduce import gradient_reductions, ring_fit
from srl.bench.params import measure as measure_params
from srl.bench.replay import NUMBER, REPEATS, batch_buffers, full_store, open_spec, random_segment, store_rates
from srl.bench.throughput import (
    CPU,
    bench_env,
    device_name,
    device_policy,
    prefetched,
    random_batch,
    random_obs,
    segment_batch,
    timed_rate,
    update_rate,
)
from srl.capacity.model import Costs
from srl.replay.role import sampling, team
from srl.runtime.build import build_worker
from srl.runtime.fabric import InlineFabric
from srl.runtime.plan import Plan, make_plan
from srl.runtime.topology import ACTOR, stop, submitted_state
from srl.system.remote_samples import SampleReceiver, SampleSender, segment_bytes
from srl.system.streams import (
    REPLY_WIDTH,
    REQUEST_WIDTH,
    InferenceClient,
    InferenceServer,
    InlineInference,
    SampleConsumer,
    SegmentPool,
)
from srl.wiring import learns_on_policy, make_algorithm

ACTION_SETS = 64
"""Precomputed action batches the stand-in policy cycles through (as ``bench_env`` does)."""
LARGE_BATCH_SLOTS = 8
"""The second inference measurement covers this many slots per forward pass (capped by the config)."""
LARGE_SNAPSHOT_FLOATS = 2_000_000
"""Snapshot length of the second parameter measurement (8 MB in float32): large enough that bytes dominate."""


class _CannedPolicy:
    """Stands in for the network inside the actor: hands out precomputed actions, so the actor's own work is timed."""

    def __init__(self, answers: list[Mapping[str, np.ndarray]], fields: tuple[Field, ...]) -> None:
        self.answers, self.fields, self.i = answers, fields, 0

    def output_fields(self) -> tuple[Field, ...]:
        return self.fields

    def act(self, obs: Mapping[str, np.ndarray], deterministic: bool = False) -> Mapping[str, np.ndarray]:
        self.i = (self.i + 1) % len(self.answers)
        return self.answers[self.i]

    def load_flat(self, flat: np.ndarray) -> None:
        """Never called: the stand-in version source never has a newer snapshot."""

    def flat_size(self) -> int:
        return 0

    def flat_state(self) -> np.ndarray:
        return np.zeros(0, np.float32)


class _FixedVersion:
    """A parameter source that never changes: no snapshot traffic inside the actor measurement."""

    current = 0

    def refresh(self) -> bool:
        return False

    def wait_first(self, should_stop: Callable[[], bool]) -> bool:
        return True


def _canned_policy(plan: Plan, n: int) -> _CannedPolicy:
    """Real answers of the acting policy for ``n`` random slot observations (dtypes and shapes as in a run)."""
    one = plan.only("srl bench costs")
    policy = one.acting_policy()
    rng = np.random.default_rng(plan.cfg.seed)
    answers = [policy.act(random_obs(one, rng, (one.columns_per_slot,))) for _ in range(n)]
    return _CannedPolicy(answers, policy.output_fields())


def actor_overhead(plan: Plan, seconds: float, warmup: float = 0.5) -> float:
    """Seconds per env step the real actor spends beyond its env steps (its own ``t_env`` is subtracted), with a
    stand-in policy that hands out precomputed actions. Only ``actor.poll`` is timed; releasing the finished
    segments (the trainer's part) is not."""
    busy, env = _actor_pass(plan, _canned_policy(plan, ACTION_SETS), seconds, warmup)
    return max(0.0, busy - env)


def inline_actor_seconds(plan: Plan, seconds: float, warmup: float = 0.5) -> float:
    """Seconds per env step of the real actor with the acting policy inline: env, bookkeeping and inference
    interleaved as in a run. Timed apart, each piece runs its loop in warm caches; interleaved they do not
    (HalfCheetah on an AVX-512 EPYC: the pieces add up to 67 us per step, the actor takes 89 us, as in a run)."""
    busy, _ = _actor_pass(plan, plan.only("srl bench costs").acting_policy(), seconds, warmup)
    return busy


def _actor_pass(plan: Plan, policy: Policy, seconds: float, warmup: float) -> tuple[float, float]:
    """The real actor stepping its ring with ``policy`` inline for ``seconds`` after ``warmup``: seconds of its
    ``poll`` per env step, and of its env within them."""
    fabric = InlineFabric(plan, lambda kind, meta, arrays: None)
    actor: Any = build_worker(plan, fabric, plan.topology.get(ACTOR, 0), None, wait_timeout=0.0, report_interval=3600.0)
    actor.inference = InlineInference(0, [fabric.pool()], [policy], [_FixedVersion()])
    consumer = SampleConsumer(fabric.pool(), fabric.channel(stop(plan, 0, 0)), accepts=submitted_state(plan, 0))
    actor.setup()
    try:
        busy, steps0, env0 = 0.0, 0, 0.0
        start = time.perf_counter()
        while (now := time.perf_counter()) - start < warmup + seconds:
            if not steps0 and now - start >= warmup:
                busy, steps0, env0 = 0.0, actor.env_steps, actor.t_env
            t0 = time.perf_counter()
            actor.poll()
            busy += time.perf_counter() - t0
            for a, b in consumer.receive(64, 0.0).tolist():
                consumer.release(a, b)
        steps, env = max(1, actor.env_steps - steps0), actor.t_env - env0
    finally:
        actor.teardown()
    return busy / steps, env / steps


def inference_fit(plan: Plan, seconds: float, rounds: int = 5, device: torch.device = CPU) -> dict[str, float]:
    """Fixed seconds per forward pass and seconds per sample, fitted from one slot's batch and from several
    slots' batch, timed in alternation (medians of ``rounds``) so that the machine's noise hits both alike. On a
    GPU each pass counts its copies in and out (``act`` waits for its answers)."""
    cfg, one = plan.cfg, plan.only("srl bench costs")
    B = one.columns_per_slot  # samples per slot
    slots = max(2, min(LARGE_BATCH_SLOTS, cfg.workers.max_inference_batch))
    policy = device_policy(one, device)
    rng = np.random.default_rng(cfg.seed)
    small, large = random_obs(one, rng, (B,)), random_obs(one, rng, (slots * B,))
    per_call: dict[int, list[float]] = {B: [], slots * B: []}
    for _ in range(rounds):
        for n, obs in ((B, small), (slots * B, large)):
            rate = timed_rate(functools.partial(_act, policy, obs), n, seconds / (2 * rounds), warmup=0.05)
            per_call[n].append(n / rate)
    t_small, t_large = (float(np.median(per_call[n])) for n in (B, slots * B))
    per_sample = max(0.0, (t_large - t_small) / ((slots - 1) * B))
    return {
        "inference_seconds_per_sample": per_sample,
        "inference_seconds_per_batch": max(0.0, t_small - per_sample * B),
    }


def _stream_pass(
    client: InferenceClient, server: InferenceServer, k: int, T: int, answer: Mapping[str, np.ndarray], seconds: float
) -> tuple[float, float]:
    """Requests from ``k`` slots, served as one batch, for ``seconds``: the actor's seconds per request (post,
    take the reply) and the server's seconds per batch (gather, observations, answer)."""
    actor = serve = 0.0
    n, start = 0, time.perf_counter()
    B = len(answer["actions"])
    outputs = {name: np.concatenate([a] * k) for name, a in answer.items()}
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        for slot in range(k):
            client.request(0, slot, 0, n % T)
        t1 = time.perf_counter()
        for policy, got in server.gather(64, 0.0):
            server.observations(policy, got)
            server.answer(policy, got, {name: a[: len(got) * B] for name, a in outputs.items()}, 0)
        t2 = time.perf_counter()
        client.ready(k, 0.0)
        actor += (t1 - t0) + (time.perf_counter() - t2)
        serve += t2 - t1
        n += 1
    return actor / (n * k), serve / n


def stream_costs(plan: Plan, seconds: float) -> dict[str, float]:
    """CPU seconds of the inference stream through named pipes, both ends in this process (context switches
    not included): the actor's side per request, and the policy worker's side as a fixed cost per batch plus
    a cost per request (from batches of one slot and of several)."""
    k = max(2, min(LARGE_BATCH_SLOTS, plan.cfg.workers.max_inference_batch))
    pool = SegmentPool.in_process(dataclasses.replace(plan.only("srl bench costs").layout, slots=k))
    answer = _canned_policy(plan, 1).answers[0]
    T = plan.cfg.workers.segment_length
    with tempfile.TemporaryDirectory(prefix="srl-bench-") as folder:
        requests = FifoChannel.create(os.path.join(folder, "requests"), REQUEST_WIDTH)
        replies = FifoChannel.create(os.path.join(folder, "replies"), REPLY_WIDTH)
        try:
            client = InferenceClient(0, [pool], requests, replies)
            server = InferenceServer([pool], requests, {0: replies})
            actor, one = _stream_pass(client, server, 1, T, answer, seconds / 2)
            _, many = _stream_pass(client, server, k, T, answer, seconds / 2)
        finally:
            for ch in (requests, replies):
                ch.close()
                ch.unlink()
    per_request = max(0.0, (many - one) / (k - 1))
    return {
        "request_seconds": actor,
        "serve_seconds_per_request": per_request,
        "serve_seconds_per_batch": max(0.0, one - per_request),
    }


def segment_send(plan: Plan, seconds: float) -> dict[str, float]:
    """One segment through the real cross-node sample stream, both ends in this process: ``SampleSender``
    (encode, send) -> ZeroMQ TCP on loopback -> ``SampleReceiver`` (receive, check the token, decode).
    Also the segment's bytes per sample, as stored and sent."""
    cfg, planned = plan.cfg, plan.only("srl bench costs")
    layout = dataclasses.replace(planned.layout, actors=1, buffers=1)
    pool = SegmentPool.in_process(layout)
    for name, values in random_batch(planned, np.random.default_rng(cfg.seed), planned.columns_per_slot).items():
        pool.arrays[name][0, 0] = values
    ctx = zmq.Context()
    token = new_tag()
    receiver = SampleReceiver(layout.fields, "tcp://127.0.0.1:*", token, ctx)
    sender = SampleSender(pool, 0, 0, receiver.address, token, ctx)
    try:

        def one(i: int) -> None:
            while (buffer := sender.acquire()) is None:  # until the previous segment's credit is back
                pass
            sender.submit(buffer)
            while not len(records := receiver.receive(1, 0.01)):  # returns as soon as the segment arrives
                sender.flush()  # the first send may find the connection not yet up
            ((handle, buf),) = records.tolist()
            receiver.segment(handle, buf)
            receiver.release(handle, buf)

        per_segment = 1.0 / timed_rate(one, 1, seconds)
    finally:
        sender.close()
        receiver.close()
        ctx.term()
    if receiver.rejected:
        raise RuntimeError(f"segment_send: {receiver.rejected} segments rejected by the receiver")
    steps = cfg.workers.segment_length * cfg.workers.envs_per_slot  # env steps (every agent's column in each)
    return {"segment_send_seconds": per_segment, "bytes_per_sample": segment_bytes(layout.fields) / steps}


def param_transfer(floats: int, dtype: str, versions: int = 6, interval: float = 0.15) -> dict[str, float]:
    """Fixed hop time and byte rate of the parameter service (root server -> one reader process), fitted
    from the delivery latency of the real snapshot size and of a large one."""
    itemsize = transfer.itemsize(dtype)
    sizes = (floats, max(LARGE_SNAPSHOT_FLOATS, 4 * floats))
    lat = [
        measure_params("flat", 1, size=n, versions=versions, interval=interval, dtype=dtype)[
            "last_reader_latency_ms_median"
        ]
        / 1000
        for n in sizes
    ]
    small, large = (n * itemsize for n in sizes)
    if lat[1] > lat[0]:
        rate = (large - small) / (lat[1] - lat[0])
        hop = max(0.0, lat[0] - small / rate)
    else:  # noise swamped the difference: charge the large transfer's time to bytes, the small one's to the hop
        rate, hop = large / lat[1], lat[0]
    return {"param_hop_seconds": hop, "param_bytes_per_second": rate}


def replay_costs(plan: Plan, rng: np.random.Generator) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The replay terms of ``Costs``, and a batch drawn from the store: what the trainer trains on.

    The store is the config's, full at ``replay.max_size`` of random segments, its rate limiter open; an insert
    of one segment and a sample of the algorithm's ``batch_size`` items at its n-step targets (with their
    priority update when prioritized) are timed as ``srl bench replay`` times them. A fifo queue is timed as
    uniform sampling: the same reads, where a queue read that far ahead of its inserts would run dry."""
    cfg, one = plan.cfg, plan.only("srl bench costs")
    targets = sampling(plan, 0)
    replay = cfg.replay if cfg.replay.sampler != "fifo" else dataclasses.replace(cfg.replay, sampler="uniform")
    spec = open_spec(replay, one.layout, targets.batch_size, team(plan, 0))
    segments = [random_segment(one.layout.fields, rng, replay.frame_stacks) for _ in range(4)]
    store = full_store(spec, segments)
    rows = store_rates(store, segments, targets, REPEATS, NUMBER, rng, _timing)
    timed = {row["measure"]: row["seconds"] for row in rows}
    batch = batch_buffers(spec)
    store.sample_into(batch, rng, n=targets.nstep, gamma=targets.gamma)
    steps = spec.steps * cfg.workers.envs_per_slot  # env steps of one segment (every agent's column)
    insert = timed.pop("insert")
    (sample,) = timed.values()
    items_per_step = spec.max_insert_batch / steps
    return {
        "samples_per_insert": replay.samples_per_insert,
        "item_length": replay.item_length,
        "item_stride": replay.item_stride,
        "replay_insert_seconds_per_step": insert / steps,
        "replay_sample_seconds_per_item": sample / targets.batch_size,
        "samples_per_version": targets.batch_size / (replay.samples_per_insert * items_per_step),
        "reanalyze_share": cfg.reanalyze.share if cfg.reanalyze.workers else 0.0,
        "reanalyze_batch": cfg.reanalyze.batch,
    }, batch


def trainer_batch(plan: Plan, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], int, dict[str, Any]]:
    """What the config's trainer trains on (random content), the samples it holds, and the costs that follow from
    it: on-policy ``batch_segments`` segments side by side, ``samples_per_version`` their env steps; with a replay
    (the algorithm's ``on_policy`` says which) a batch sampled from its store, its items, and the replay terms
    (:func:`replay_costs`)."""
    cfg, one = plan.cfg, plan.only("srl bench costs")
    if not learns_on_policy(cfg):
        terms, batch = replay_costs(plan, rng)
        return batch, len(batch["keys"]), terms
    w = cfg.workers
    batch = segment_batch(one, cfg, rng)
    return (
        batch,
        int(batch["rewards"].size),
        {"samples_per_version": w.batch_segments * w.segment_length * w.envs_per_slot},
    )


def _timing(measure: str, impl: str, items: int, seconds: float) -> dict[str, Any]:
    """A result of :func:`srl.bench.replay.store_rates` as the seconds per call of its measure."""
    return {"measure": measure, "seconds": seconds}


def update_seconds(
    plan: Plan, batch: Mapping[str, np.ndarray], samples: int, seconds: float, device: torch.device = CPU
) -> float:
    """Seconds per sample of the config's algorithm training on ``batch`` (``samples`` samples: env steps' columns,
    or replay items), timed for about ``seconds`` after one untimed update, on ``device`` (the batch already
    there, each update waited for)."""
    cfg, one = plan.cfg, plan.only("srl bench costs")
    algo = make_algorithm(
        one.obs_space,
        one.action_space,
        cfg,
        cfg.seed,
        device=str(device),
        state_space=one.state_space,
        agents=one.agents_per_env,
    )
    return 1.0 / update_rate(algo, prefetched(batch, device), samples, seconds, device)


def bench_costs(cfg: ExperimentConfig, seconds: float, device: str | None = None) -> dict[str, Any]:
    """Measure every cost of ``Costs`` for ``cfg`` (each measurement runs about ``seconds``); with ``device``, the
    update and the inference there too (:func:`device_costs`)."""
    return {"bench": "costs", **_rounded(measure_costs(cfg, seconds, device=device).to_dict())}


def device_costs(plan: Plan, batch: Mapping[str, np.ndarray], samples: int, seconds: float, device: str) -> dict:
    """The ``device_*`` terms of ``Costs``: the update and the inference fit on ``device``."""
    dev = torch_device(device, "--device")
    fit = inference_fit(plan, seconds, device=dev)
    return {
        "device": device_name(dev),
        "device_update_seconds_per_sample": update_seconds(plan, batch, samples, seconds / 2, dev),
        "device_inference_seconds_per_sample": fit["inference_seconds_per_sample"],
        "device_inference_seconds_per_batch": fit["inference_seconds_per_batch"],
    }


def measure_costs(cfg: ExperimentConfig, seconds: float, one_node: bool = False, device: str | None = None) -> Costs:
    """``cfg``'s costs, each measured for about ``seconds``. ``one_node``: only those that matter with every
    worker on one machine and one trainer (``srl tune``); the cross-node ones (segments over TCP, the parameter
    service's hops, the all-reduce) are then not measured, since the model never reads them there. ``device``:
    also the update and the inference on that device (``device_*``). The CPU terms are the CPU's whatever the
    config's devices say."""
    workers = dataclasses.replace(
        cfg.workers, actors=1, trainers=1, policy_workers=0, policy_device="cpu", trainer_device="cpu"
    )
    plan = make_plan(dataclasses.replace(cfg, workers=workers))
    w, one = cfg.workers, plan.only("srl bench costs")
    env = bench_env(cfg, seconds)
    torch.set_num_threads(w.torch_threads)  # the trainer's threads, for the update and the forward passes
    batch, samples, per_batch = trainer_batch(plan, np.random.default_rng(cfg.seed))
    measured: dict[str, Any] = {**inference_fit(plan, seconds), **stream_costs(plan, max(0.4, seconds / 2))}
    cross: dict[str, Any]
    if one_node:
        cross = {
            "segment_send_seconds": 0.0,
            "bytes_per_sample": segment_bytes(one.layout.fields) / (w.segment_length * w.envs_per_slot),
            "param_hop_seconds": 0.0,  # readers share the trainer's buffer on one node
            "param_bytes_per_second": 1.0,  # not read on one node (the delivery there takes no time)
        }
    else:
        reduced = gradient_reductions(plan, batch)
        cross = {
            **segment_send(plan, max(0.2, seconds / 4)),
            **param_transfer(one.param_size, cfg.params.transfer_dtype),
            **reduced,
            **ring_fit(reduced["gradient_bytes"] // 4),
        }
    return Costs(
        env_id=cfg.env.id,
        envs_per_slot=w.envs_per_slot,
        agents_per_env=plan.agents_per_env,
        segment_length=w.segment_length,
        max_inference_batch=w.max_inference_batch,
        env_seconds_per_step=1.0 / env[f"{cfg.env.backend}_steps_per_second"],
        actor_seconds_per_step=actor_overhead(plan, seconds, warmup=min(0.5, seconds)),
        inline_actor_seconds_per_step=inline_actor_seconds(plan, seconds, warmup=min(0.5, seconds)),
        **measured,
        update_seconds_per_sample=update_seconds(plan, batch, samples, seconds / 2),
        trainer_threads=w.torch_threads,
        param_bytes=one.param_size * transfer.itemsize(cfg.params.transfer_dtype),
        **cross,
        **per_batch,
        **({} if device is None else device_costs(plan, batch, samples, seconds, device)),
    )


def _rounded(values: Mapping[str, Any]) -> dict[str, Any]:
    """Four significant digits: the machine's noise is far larger."""
    return {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in values.items()}


def _act(policy: Policy, obs: Mapping[str, np.ndarray], i: int) -> None:
    policy.act(obs)
