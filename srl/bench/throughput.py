"""Throughput measurements behind ``srl bench``: env ceiling, sampling path, compute bound, training, solve time.

``sampling`` runs the full actor -> policy worker -> sample stream path under
the local runtime with a trainer that discards segments, and a plain
single-process loop that does the same environment steps and the same batched
forward passes (one forward per slot of ``envs_per_slot`` observations), on the
same machine, one after the other, and reports both and their ratio.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch

from srl.api.config import ConfigError, ExperimentConfig
from srl.api.device import DeviceBatch, batch_tensor, torch_device
from srl.api.env import Slot
from srl.api.schema import MEMORY
from srl.api.spaces import ACTION_MASK, Observation, ObsPart, action_spec, flatten_obs, obs_parts
from srl.api.worker import Algorithm, DevicePolicy, Policy, is_device_policy
from srl.envs.factory import make_env
from srl.envs.slots import make_slot
from srl.nets.memory import Remembering, remembering
from srl.runtime.local import run_local
from srl.runtime.plan import Plan, PolicyPlan, make_plan
from srl.system.controller import Controller
from srl.system.device import synchronize
from srl.system.policy_worker import batch_cap, cap_sizes, measure_curve
from srl.wiring import learns_on_policy, make_algorithm


class _RateController(Controller):
    """Measures the env-step rate from actor reports over ``seconds`` after a warm-up, then stops.

    The warm-up starts once every actor has reported (its envs are built and stepping), not at process start:
    building many envs on a busy machine can take longer than the warm-up itself."""

    GIVE_UP = 300.0
    """Seconds to wait for every actor's first report before stopping with nothing measured."""

    def __init__(self, cfg: ExperimentConfig, warmup: float, seconds: float) -> None:
        super().__init__(cfg, None, time.time(), progress=None)
        self.warmup, self.seconds = warmup, seconds
        self.actors = cfg.workers.actors
        self.reported: set[str] = set()
        self.started: float | None = None  # when the last actor first reported
        self.samples: list[tuple[float, int]] = []

    def handle(self, kind: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        super().handle(kind, meta, arrays)
        if kind == "actor":
            now = time.time()
            self.reported.add(str(meta["worker"]))
            if self.started is None and len(self.reported) >= self.actors:
                self.started = now
            self.samples.append((now, self.env_steps))

    def should_stop(self) -> str | None:
        now = time.time()
        if self.stop_reason is None and (
            (self.started is not None and now - self.started >= self.warmup + self.seconds)
            or (self.started is None and now - self.start_time >= self.GIVE_UP)
        ):
            self.stop_reason = "bench_done"
        return self.stop_reason

    def rate(self) -> float:
        if self.started is None:
            raise RuntimeError(f"srl bench sampling: the actors did not all report within {self.GIVE_UP:.0f} s")
        after = [(t, s) for t, s in self.samples if t - self.started >= self.warmup]
        if len(after) < 2 or after[-1][0] <= after[0][0]:
            raise RuntimeError("srl bench sampling: fewer than two actor reports after the warm-up")
        return (after[-1][1] - after[0][1]) / (after[-1][0] - after[0][0])


def sampling_full_path(plan: Plan, seconds: float, warmup: float = 3.0) -> dict[str, Any]:
    """Env steps/s of actors -> policy workers -> sample stream with a discarding trainer (local runtime)."""
    controller = _RateController(plan.cfg, warmup, seconds)
    run_local(dataclasses.replace(plan, null_trainer=True), controller, None)
    if controller.error:
        raise RuntimeError(controller.error)
    batches = [v for k, v in controller.record().items() if k.endswith("_mean_batch")]  # each policy worker's
    return {"steps_per_second": controller.rate(), "mean_inference_batch": float(np.mean(batches)) if batches else None}


def sampling_plain_loop(plan: Plan, seconds: float, warmup: float = 1.0) -> float:
    """Env steps/s of one process stepping the same slots with the same batched forward passes."""
    cfg = plan.cfg
    w = cfg.workers
    torch.set_num_threads(w.torch_threads)
    acting = plan.only("srl bench sampling").acting_policy()
    slots = [make_slot(cfg.env, w.envs_per_slot) for i in range(w.actors * w.ring_size)]
    policies = [remembering(acting) for _ in slots]  # with memory: each slot's envs keep their own state
    obs = [slot.reset(cfg.seed + i) for i, slot in enumerate(slots)]
    steps, start = 0, time.perf_counter()
    t0, s0 = start, 0
    try:
        while True:
            for i, slot in enumerate(slots):
                policy = policies[i]
                step = slot.step(policy.act(obs[i])["actions"])
                obs[i] = step.obs
                if isinstance(policy, Remembering):
                    policy.reset(step.terminated | step.truncated)
                steps += w.envs_per_slot
            now = time.perf_counter()
            if s0 == 0 and now - start >= warmup:
                t0, s0 = now, steps
            if s0 and now - t0 >= seconds:
                return (steps - s0) / (now - t0)
    finally:
        for slot in slots:
            slot.close()


CPU = torch.device("cpu")

VECTOR_ENV_COUNTS = (8, 32, 64)
"""Env counts the single-process vector-env baseline tries; its best one is the reference."""


def sampling_vector_loop(plan: Plan, num_envs: int, seconds: float, warmup: float = 1.0) -> float:
    """Env steps/s of the simplest fast single-process loop: one Gymnasium ``SyncVectorEnv`` of ``num_envs``
    stepped with one batched forward pass of the same network per step (as a CleanRL-style script samples)."""
    cfg = plan.cfg
    torch.set_num_threads(cfg.workers.torch_threads)
    policy = remembering(plan.only("srl bench sampling").acting_policy())
    venv = gym.vector.SyncVectorEnv([functools.partial(make_env, cfg.env) for _ in range(num_envs)])
    parts = obs_parts(venv.single_observation_space)
    obs = [venv.reset(seed=cfg.seed)[0]]

    def step(i: int) -> None:
        obs[0], _, terminated, truncated, _ = venv.step(policy.act(flatten_obs(parts, obs[0]))["actions"])
        if isinstance(policy, Remembering):  # a throughput baseline: the state costs what it costs in a run
            policy.reset(terminated | truncated)

    try:
        with torch.inference_mode():
            return timed_rate(step, num_envs, seconds, warmup)
    finally:
        venv.close()


def bench_sampling(cfg: ExperimentConfig, seconds: float) -> dict[str, Any]:
    """One JSON-ready measurement: full path, the same slots in one loop, the best single vector-env loop."""
    plan = make_plan(cfg)
    if plan.agents_per_env > 1 or cfg.league.pool or "alive" in plan.policies[0].layout.fields:
        raise ConfigError(
            f"srl bench sampling: {cfg.env.id!r} is a multi-agent env, and the baseline it compares with is a "
            "single-agent Gymnasium vector-env loop; measure it with srl bench train"
        )
    full = sampling_full_path(plan, seconds)
    plain = sampling_plain_loop(plan, seconds)
    vector = {n: sampling_vector_loop(plan, n, seconds) for n in VECTOR_ENV_COUNTS}
    best = max(vector, key=lambda n: vector[n])
    w = cfg.workers
    return {
        "bench": "sampling",
        "env": cfg.env.id,
        "layout": {
            "actors": w.actors,
            "ring_size": w.ring_size,
            "envs_per_slot": w.envs_per_slot,
            "policy_workers": w.policy_workers,
            "max_inference_batch": w.max_inference_batch,
        },
        "seconds": seconds,
        "full_path_steps_per_second": round(full["steps_per_second"], 1),
        "plain_loop_steps_per_second": round(plain, 1),
        "ratio": round(full["steps_per_second"] / plain, 3) if plain else None,
        "vector_loop_steps_per_second": {str(n): round(r, 1) for n, r in vector.items()},
        "vector_loop_best_envs": best,
        "vector_ratio": round(full["steps_per_second"] / vector[best], 3) if vector[best] else None,
        "mean_inference_batch": full["mean_inference_batch"],
    }


def bench_solve(config: str, runs: int, overrides: list[str]) -> dict[str, Any]:
    """Time from the program's start (``wall_seconds``) to solved, and what it cost (core-seconds, energy and its
    method, money where priced: ``summary.json``'s ``cost.to_target``), for ``runs`` seeds, each ``srl train`` in
    a fresh process. The seeds are 1 to ``runs``: an override of ``seed`` would be reported under the wrong one,
    so it is refused."""
    if any(o.partition("=")[0].strip() == "seed" for o in overrides):
        raise ConfigError("--set seed: srl bench solve runs seeds 1 to --runs itself")
    results = []
    for seed in range(1, runs + 1):
        summary, _ = train_in_fresh_process(config, [f"seed={seed}", *overrides])
        target = summary["cost"].get("to_target") or {}
        results.append(
            {
                "seed": seed,
                "solved": bool(summary.get("solved")),
                "solved_wall_seconds": summary.get("solved_wall_seconds"),
                "solved_env_steps": summary.get("solved_env_steps"),
                "wall_seconds": summary["wall_seconds"],
                "lag_mean": _mean_lag(summary.get("lag_histogram") or []),
                "solved_core_seconds": target.get("core_seconds"),
                "solved_energy_joules": target.get("energy_joules"),
                "solved_money": target.get("money"),
                "core_seconds": summary["cost"]["core_seconds"],
                "energy_method": summary["cost"]["energy_method"],
            }
        )

    def median(key: str) -> float:
        return float(np.median([r[key] if r["solved"] else float("inf") for r in results]))

    median_wall, median_steps = median("solved_wall_seconds"), median("solved_env_steps")
    median_cores, median_joules = median("solved_core_seconds"), median("solved_energy_joules")
    return {
        "bench": "solve",
        "config": config,
        "overrides": overrides,
        "runs": runs,
        "solved": sum(r["solved"] for r in results),
        "median_solved_wall_seconds": round(median_wall, 2) if np.isfinite(median_wall) else None,
        "median_solved_env_steps": int(median_steps) if np.isfinite(median_steps) else None,
        "median_solved_core_seconds": round(median_cores, 2) if np.isfinite(median_cores) else None,
        "median_solved_energy_joules": round(median_joules, 1) if np.isfinite(median_joules) else None,
        "per_run": results,
    }


def _mean_lag(histogram: list[int]) -> float | None:
    """The mean policy lag of the samples a run trained on, from its ``lag_histogram`` (None: it trained none)."""
    total = sum(histogram)
    return round(sum(lag * n for lag, n in enumerate(histogram)) / total, 3) if total else None


def bench_env(cfg: ExperimentConfig, seconds: float) -> dict[str, Any]:
    """Env-only ceiling on this machine: a plain loop over one slot of each available backend, random actions.

    Actions are drawn up front (``action_space.sample()`` per step would halve a cheap env's rate); where the
    observation has a legal-action mask, each step picks a random legal action from it instead. Rates are env
    steps (a multi-agent env's step moves all its agents).
    """
    B = cfg.workers.envs_per_slot
    rates: dict[str, float | None] = {}
    for backend in ("gymnasium", "envpool"):
        try:
            slot = make_slot(dataclasses.replace(cfg.env, backend=backend), B)
        except ConfigError:
            if backend == "gymnasium":
                raise  # a bad env id is an error, not a ceiling of 0
            rates[backend] = None  # EnvPool not installed, or this env not available there
            continue
        try:
            space = slot.single_action_space
            space.seed(cfg.seed)
            obs = slot.reset(cfg.seed)
            if ACTION_MASK in obs:
                step = functools.partial(_step_legal, slot, [obs], np.random.default_rng(cfg.seed))
            else:
                actions = [np.stack([space.sample() for _ in range(slot.num_envs)]) for _ in range(64)]
                step = functools.partial(_step_nth, slot, actions)
            rates[backend] = timed_rate(step, B, seconds)
        finally:
            slot.close()
    best = max((r for r in rates.values() if r), default=0.0)
    return {
        "bench": "env",
        "env": cfg.env.id,
        "envs": B,
        "seconds": seconds,
        **{f"{k}_steps_per_second": None if v is None else round(v, 1) for k, v in rates.items()},
        "ceiling_steps_per_second": round(best, 1),
    }


def timed_rate(step: Callable[[int], Any], per_call: int, seconds: float, warmup: float = 0.5) -> float:
    """Calls per second of ``step(i)`` times ``per_call``, after a warm-up."""
    i, start = 0, time.perf_counter()
    while time.perf_counter() - start < warmup:
        step(i)
        i += 1
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step(i + n)
        n += 1
    return n * per_call / (time.perf_counter() - t0)


def bench_compute(cfg: ExperimentConfig, seconds: float, device: str = "cpu") -> dict[str, Any]:
    """This machine's compute bound for a config on ``device``: inference and PPO update cost per sample, measured.

    bound = 1 / (inference seconds per sample + update seconds per sample), where the update cost
    already contains all epochs (one ``train`` call over a full batch divided by its samples). A sample is one
    column step (an agent's); the bound is in env steps (a multi-agent env's step is one sample per agent).
    Also the forward pass's cost curve over batch sizes (``workers.max_inference_batch`` slots at most) and the
    cap a policy worker would take from it (:func:`srl.system.policy_worker.batch_cap`). On a GPU the forward
    pass counts its copies in and out, and the update starts with its batch on the device (as prefetched).
    """
    if not learns_on_policy(cfg):
        raise ConfigError(
            f"srl bench compute: algorithm {cfg.algorithm} learns from a replay, so its update cost per env step "
            "follows replay.samples_per_insert: measure it with srl bench costs"
        )
    plan = make_plan(cfg)
    one = plan.only("srl bench compute")
    w, ppo = cfg.workers, cfg.ppo
    dev = torch_device(device, "--device")
    torch.set_num_threads(w.torch_threads)
    rng = np.random.default_rng(cfg.seed)
    policy = device_policy(one, dev)
    C = one.columns_per_slot
    batch_obs = random_obs(one, rng, (C,))  # one slot per forward pass, as in the sampling path
    infer = timed_rate(lambda i: policy.act(batch_obs), C, seconds / 2)
    curve = inference_curve(policy, one, rng, cap_sizes(w.max_inference_batch))
    algo = make_algorithm(
        one.obs_space,
        one.action_space,
        cfg,
        cfg.seed,
        device=device,
        state_space=one.state_space,
        agents=one.agents_per_env,
    )
    batch = segment_batch(one, cfg, rng)
    samples = int(batch["rewards"].size)
    update = update_rate(algo, prefetched(batch, dev), samples, seconds / 2, dev)
    bound = 1.0 / (1.0 / infer + 1.0 / update) / plan.agents_per_env
    return {
        "bench": "compute",
        "env": cfg.env.id,
        "device": device_name(dev),
        "trainer_dtype": w.trainer_dtype,
        "torch_threads": w.torch_threads,
        "inference_batch": C,
        "inference_samples_per_second": round(infer, 1),
        "inference_curve_seconds": {str(n): float(f"{t:.4g}") for n, t in curve.items()},
        "inference_batch_cap": batch_cap(curve),
        "update_batch": samples,
        "epochs": ppo.epochs,
        "minibatches": ppo.minibatches,
        "update_samples_per_second": round(update, 1),
        "compute_bound_steps_per_second": round(bound, 1),
    }


def device_policy(plan: PolicyPlan, device: torch.device) -> Policy:
    """The acting policy on ``device`` (one that cannot act there is refused, naming the setting)."""
    policy = plan.acting_policy()
    if device.type == "cpu":
        return policy
    if not is_device_policy(policy):
        raise ConfigError(
            f"--device {device}: the acting policy of algorithm {plan.cfg.algorithm} acts on the CPU only"
        )
    cast(DevicePolicy, policy).to_device(device)
    return policy


def device_name(device: torch.device) -> str:
    """``cpu``, or ``cuda:0 (NVIDIA H200)``: what a measurement ran on."""
    if device.type != "cuda":
        return str(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def inference_curve(policy: Policy, plan: PolicyPlan, rng: np.random.Generator, sizes: list[int]) -> dict[int, float]:
    """Seconds per forward pass of ``n`` slots' random observations, for each ``n`` of ``sizes``
    (:func:`srl.system.policy_worker.measure_curve`; ``policy.act`` waits for its answers)."""
    obs = {n: random_obs(plan, rng, (n * plan.columns_per_slot,)) for n in sizes}
    return measure_curve(lambda n: policy.act(obs[n]), sizes)


def prefetched(batch: Mapping[str, np.ndarray], device: torch.device) -> Mapping[str, np.ndarray]:
    """``batch`` with its fields also on ``device``, as the trainer's prefetching hands it to the update."""
    return DeviceBatch(batch, {name: batch_tensor(x, device) for name, x in batch.items()})


def update_rate(
    algo: Algorithm,
    batch: Mapping[str, np.ndarray],
    samples: int,
    seconds: float,
    device: torch.device = CPU,
) -> float:
    """Samples per second of ``algo`` training on ``batch`` (which holds ``samples``), timed for about ``seconds``
    after one untimed update; a sample is what the algorithm's batch counts (a column step, a replay item). Each
    update waits for ``device`` to finish it."""

    def update(i: int) -> None:
        algo.train(batch, 0.0)
        synchronize(device)

    update(0)
    return timed_rate(update, samples, seconds, warmup=0.0)


def segment_batch(plan: PolicyPlan, cfg: ExperimentConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """An on-policy trainer's batch: ``workers.batch_segments`` segments of one slot side by side, random content."""
    return random_batch(plan, rng, cfg.workers.batch_segments * plan.columns_per_slot)


def random_obs(plan: PolicyPlan, rng: np.random.Generator, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Observations of every part, ``[*lead, ...]``, in their stream dtypes (with a policy with memory, the
    recurrent state too, as the streams hand it in)."""
    out = {p.name: _random_part(p, rng, lead) for p in obs_parts(plan.obs_space)}
    memory = plan.layout.fields.get(MEMORY)
    if memory is not None:
        out[MEMORY] = rng.standard_normal((*lead, *memory.shape[2:])).astype(np.float32)
    return out


def _random_part(p: ObsPart, rng: np.random.Generator, lead: tuple[int, ...]) -> np.ndarray:
    shape = (*lead, *p.shape)
    if p.kind == "image":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    if p.kind in ("discrete", "multi_discrete"):
        return (
            rng.integers(0, np.asarray(p.nvec).reshape(p.shape), shape) + np.asarray(p.start).reshape(p.shape)
        ).astype(p.dtype)
    if p.kind == "binary":
        return rng.integers(0, 2, shape).astype(p.dtype)
    return rng.standard_normal(shape).astype(p.dtype)


def random_batch(plan: PolicyPlan, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """A training batch ``[T(+1), n, ...]`` with the real schema and random content."""
    parts = {p.name: p for p in obs_parts(plan.obs_space)}
    parts.update({p.final_name: p for p in parts.values()})
    action = action_spec(plan.action_space)
    out = {}
    for name, spec in plan.layout.fields.items():
        shape = (spec.shape[0], n, *spec.shape[2:])
        if name in parts:
            out[name] = _random_part(parts[name], rng, shape[:2])
        elif name == "actions" and action.kind != "box":
            high = 2 if action.kind == "binary" else np.asarray(action.nvec).reshape(action.shape or ())
            out[name] = rng.integers(0, high, shape).astype(spec.dtype)
        elif spec.dtype == "bool":
            out[name] = rng.random(shape) < 0.01
        elif name == "version":
            out[name] = np.zeros(shape, np.int64)
        elif name == "logp":
            out[name] = np.full(shape, -1.0, np.float32)
        else:
            out[name] = rng.standard_normal(shape).astype(spec.dtype)
    return out


def bench_train(config: str, seconds: float, overrides: list[str]) -> dict[str, Any]:
    """End-to-end training throughput: ``srl train`` in a fresh process for ``seconds`` from its first env step
    (``run.max_train_seconds``: start-up on top, as the rates leave it out); FPS and time shares."""
    summary, records = train_in_fresh_process(
        config, ["run.target_return=null", "run.eval_episodes=0", f"run.max_train_seconds={seconds}", *overrides]
    )
    lags = np.asarray(summary["lag_histogram"], np.float64)  # trained samples by policy lag (versions)
    lag_mean = float(lags @ np.arange(len(lags)) / lags.sum()) if lags.sum() else None
    return {
        **_spent_per_sample(records, summary["cost"]),
        "bench": "train",
        "config": config,
        "overrides": overrides,
        "seconds": seconds,
        "env_steps": summary["env_steps"],
        "train_fps": round(summary["train_fps"], 1),
        "trained_samples_per_second": round(summary["trained_samples_per_second"], 1),
        "policy_version": summary["policy_version"],
        "lag_mean": None if lag_mean is None else round(lag_mean, 3),
        "time_fractions": {k: round(v, 3) for k, v in summary["time_fractions"].items()},
    }


def _spent_per_sample(records: list[dict[str, Any]], cost: Mapping[str, Any]) -> dict[str, Any]:
    """Core-seconds and joules per sample trained, from the first record with a trained sample to the last (what
    training costs once it runs, start-up left out, as the rates leave it out), and the energy's method."""
    trained = [r for r in records if r.get("samples")]
    out: dict[str, Any] = {"energy_method": cost["energy_method"]}
    if len(trained) < 2 or trained[-1]["samples"] <= trained[0]["samples"]:
        return {**out, "core_seconds_per_trained_sample": None, "joules_per_trained_sample": None}
    first, last = trained[0], trained[-1]
    samples = last["samples"] - first["samples"]
    return {
        **out,
        "core_seconds_per_trained_sample": (last["cost/core_seconds"] - first["cost/core_seconds"]) / samples,
        "joules_per_trained_sample": (last["cost/energy_joules"] - first["cost/energy_joules"]) / samples,
    }


def train_in_fresh_process(config: str, overrides: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``srl train`` in a new process (so start-up counts) in a temporary run directory.

    Returns its summary and its metrics records.
    """
    with tempfile.TemporaryDirectory(prefix="srl-bench-") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-m",
            "srl.cli.main",
            "train",
            config,
            "--quiet",
            "--run-dir",
            str(run_dir),
            *[a for o in overrides for a in ("--set", o)],
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"srl train {' '.join(overrides)} failed: {proc.stderr.strip().splitlines()[-1:]}")
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return json.loads((run_dir / "summary.json").read_text()), records


def _step_legal(slot: Slot, last: list[Observation], rng: np.random.Generator, i: int) -> None:
    """Step ``slot`` with a random legal action per column, from the mask of its last observation."""
    mask = last[0][ACTION_MASK]
    last[0] = slot.step((rng.random(mask.shape) * mask).argmax(axis=1)).obs


def _step_nth(slot: Slot, actions: list[np.ndarray], i: int) -> None:
    """Step ``slot`` with the ``i``-th of its prepared actions (cycled)."""
    slot.step(actions[i % len(actions)])
