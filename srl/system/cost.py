"""What a run spends: CPU core-seconds per role, GPU-seconds, energy and money, as it runs and up to its target.

Where the seconds come from: every worker process stamps its reports with its own CPU seconds
(``time.process_time``: all its threads, from its start, imports included) and, once it has initialised CUDA, its
seconds since its reporter began (a GPU held); in the inline runtime, whose workers share one process, each
worker is charged the CPU of its own polls. The driver's process (the controller, the supervisor, the control
channel; inline, what the polls leave) is the role ``driver``. A worker's seconds are as of its last report: a
process sends one more (kind ``spent``) as it ends, whatever its role reports, so only a worker killed with
SIGKILL loses what it spent since its last (every 0.1 s under the local and Ray runtimes for most roles); each
start of a restarted worker adds its own. Ray's own daemons are not counted.

Energy, for the CPUs and the GPUs each (``cost.cpu_energy``, ``cost.gpu_energy``): the machine's own counters
(:mod:`srl.base.energy`: RAPL, NVML), which measure the whole packages and GPUs of the driver's machine while the
run ran, or the model (``watts_per_core`` x core-seconds, ``watts_per_gpu`` x GPU-seconds), labelled
``estimate``. Money: the config's prices of core-hours, GPU-hours and kWh.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from srl.api.config import ConfigError, CostConfig, ExperimentConfig
from srl.base.energy import EnergyUnavailable, Nvml, Rapl

CPU_SECONDS, GPU_SECONDS = "cpu_seconds", "gpu_seconds"
"""Report entries a worker process adds to every report: its CPU seconds and its seconds holding a GPU."""
DRIVER = "driver"
"""The role the driver's own process is charged to."""


def holds_gpu() -> bool:
    """Whether this process has initialised CUDA (without importing torch where nothing did)."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_initialized())


def process_spent(since: float) -> dict[str, float]:
    """This process's report entries: its CPU seconds, and its wall seconds since ``since`` when it holds a GPU."""
    out = {CPU_SECONDS: time.process_time()}
    if holds_gpu():
        out[GPU_SECONDS] = time.time() - since
    return out


def uses_gpu(cfg: ExperimentConfig) -> bool:
    """Whether the run's trainers or policy workers are placed on a CUDA device."""
    return any(str(d).startswith("cuda") for d in (cfg.workers.trainer_device, cfg.workers.policy_device))


def open_meters(cfg: ExperimentConfig) -> tuple[Rapl | None, Nvml | None]:
    """The energy counters the run reads: RAPL for the CPUs, NVML for the GPUs of a run that uses one, each where
    its method is ``auto`` and it can be read, or where it is asked for. One line naming the setting where a
    method asked for cannot be had here (what is missing)."""
    cost = cfg.cost
    meters: list[Any] = []
    for name, method, make, wanted in (
        ("cpu_energy", cost.cpu_energy, Rapl, "rapl"),
        ("gpu_energy", cost.gpu_energy, Nvml, "nvml"),
    ):
        if method == "estimate" or (name == "gpu_energy" and not uses_gpu(cfg) and method == "auto"):
            meters.append(None)
            continue
        try:
            meters.append(make())
        except EnergyUnavailable as exc:
            if method == wanted:
                raise ConfigError(f"cost.{name}: {wanted}: {exc} (use estimate)") from None
            meters.append(None)
    return meters[0], meters[1]


class CostLedger:
    """A run's spending, fed by the controller (reports, restarts) and the inline runtime (its polls)."""

    def __init__(self, cfg: ExperimentConfig, earlier: Mapping[str, float] | None = None) -> None:
        """``earlier``: what the run's earlier processes spent (:meth:`spent`), for a resumed run."""
        self.cfg: CostConfig = cfg.cost
        self.gpu_run = uses_gpu(cfg)
        self.rapl, self.nvml = open_meters(cfg)
        self.earlier = dict(earlier or {})
        self.earlier_cores = {k.split("/", 1)[1]: v for k, v in self.earlier.items() if k.startswith("core_seconds/")}
        """The earlier processes' core-seconds by role."""
        self.started = time.time()
        self.latest: dict[str, dict[str, float]] = {}
        """Each worker's newest entries in this start."""
        self.ended: dict[str, dict[str, float]] = {}
        """Each worker's entries summed over its earlier starts."""
        self.polls: dict[str, float] = {}
        """CPU seconds of in-process workers' polls (the inline runtime), by worker."""
        self.to_target: dict[str, Any] | None = None

    # ------------------------------------------------------------------ feeding
    def take(self, worker: str, meta: Mapping[str, Any]) -> Mapping[str, Any]:
        """Keep ``worker``'s entries of a report; the report without them."""
        if CPU_SECONDS not in meta:
            return meta
        self.latest[worker] = {k: float(meta[k]) for k in (CPU_SECONDS, GPU_SECONDS) if k in meta}
        return {k: v for k, v in meta.items() if k not in (CPU_SECONDS, GPU_SECONDS)}

    def charge(self, worker: str, cpu_seconds: float) -> None:
        """An in-process worker's poll took ``cpu_seconds`` of this process's CPU."""
        self.polls[worker] = self.polls.get(worker, 0.0) + cpu_seconds

    def restarted(self, worker: str) -> None:
        """``worker`` starts again: what its last start spent is kept, and its new start counts from 0."""
        done = self.ended.setdefault(worker, {})
        for key, value in self.latest.pop(worker, {}).items():
            done[key] = done.get(key, 0.0) + value

    # ------------------------------------------------------------------ figures
    def seconds(self, roles: Mapping[str, str]) -> tuple[dict[str, float], float]:
        """Core-seconds by role (``total`` too) and GPU-seconds, over the whole run (earlier processes included)."""
        by_role: dict[str, float] = {}
        gpu = self.earlier.get(GPU_SECONDS, 0.0)
        for worker in {*self.latest, *self.ended}:
            role = roles.get(worker, worker)
            for part in (self.latest.get(worker, {}), self.ended.get(worker, {})):
                by_role[role] = by_role.get(role, 0.0) + part.get(CPU_SECONDS, 0.0)
                gpu += part.get(GPU_SECONDS, 0.0)
        for worker, cpu in self.polls.items():
            role = roles.get(worker, worker)
            by_role[role] = by_role.get(role, 0.0) + cpu
        by_role[DRIVER] = by_role.get(DRIVER, 0.0) + time.process_time() - sum(self.polls.values())
        if holds_gpu():
            gpu += time.time() - self.started
        for role, value in self.earlier_cores.items():
            by_role[role] = by_role.get(role, 0.0) + value
        by_role = dict(sorted(by_role.items()))
        by_role["total"] = sum(by_role.values())
        return by_role, gpu

    def figures(self, roles: Mapping[str, str]) -> dict[str, Any]:
        """The run's spending so far: ``core_seconds`` by role and ``total``, ``gpu_seconds``, ``energy_joules``
        with the method of each part (``energy_method``), and ``money`` when a price is set."""
        cores, gpu = self.seconds(roles)
        now_cores = cores["total"] - sum(self.earlier_cores.values())
        now_gpu = gpu - self.earlier.get(GPU_SECONDS, 0.0)
        cpu_model, gpu_model = self.cfg.estimate_joules(now_cores, now_gpu)
        cpu_j = self.earlier.get("cpu_joules", 0.0) + (self.rapl.poll() if self.rapl is not None else cpu_model)
        gpu_j = self.earlier.get("gpu_joules", 0.0) + (self.nvml.poll() if self.nvml is not None else gpu_model)
        methods = {"cpu": "rapl" if self.rapl is not None else "estimate"}
        if self.gpu_run or gpu > 0:
            methods["gpu"] = "nvml" if self.nvml is not None else "estimate"
        return {
            "core_seconds": cores,
            "gpu_seconds": gpu,
            "energy_joules": cpu_j + gpu_j,
            "cpu_joules": cpu_j,
            "gpu_joules": gpu_j,
            "energy_method": methods,
            "money": self.cfg.money(cores["total"], gpu, cpu_j + gpu_j),
        }

    def reached_target(self, roles: Mapping[str, str], wall_seconds: float, env_steps: int) -> None:
        """The run met its target now: keep the figures to it (once)."""
        if self.to_target is None:
            figures = self.figures(roles)
            self.to_target = {
                "wall_seconds": wall_seconds,
                "env_steps": env_steps,
                "core_seconds": figures["core_seconds"]["total"],
                **{k: figures[k] for k in ("gpu_seconds", "energy_joules", "money")},
            }

    def summary(self, roles: Mapping[str, str]) -> dict[str, Any]:
        """``summary.json``'s ``cost``: the figures, and ``to_target`` once the target was met."""
        out = self.figures(roles)
        if self.to_target is not None:
            out["to_target"] = self.to_target
        return out

    def record(self, roles: Mapping[str, str]) -> dict[str, float]:
        """A metrics record's entries: ``cost/core_seconds`` (and per role), ``cost/energy_joules``, ``cost/money``."""
        figures = self.figures(roles)
        out = {f"cost/core_seconds/{role}": s for role, s in figures["core_seconds"].items() if role != "total"}
        out.update(
            {"cost/core_seconds": figures["core_seconds"]["total"], "cost/energy_joules": figures["energy_joules"]}
        )
        if figures["gpu_seconds"] > 0:
            out["cost/gpu_seconds"] = figures["gpu_seconds"]
        if figures["money"] is not None:
            out["cost/money"] = figures["money"]
        return out

    def spent(self, roles: Mapping[str, str]) -> dict[str, float]:
        """What a resumed run takes over (``earlier``): core-seconds per role, GPU-seconds, each part's joules."""
        figures = self.figures(roles)
        out = {f"core_seconds/{r}": s for r, s in figures["core_seconds"].items() if r != "total"}
        out.update({k: figures[k] for k in (GPU_SECONDS, "cpu_joules", "gpu_joules")})
        return out


def cost_text(figures: Mapping[str, Any]) -> str:
    """One line for the end of a run's progress: core-seconds by role, energy and its method, money."""
    cores = figures["core_seconds"]
    roles = ", ".join(f"{r} {s:.1f}" for r, s in cores.items() if r != "total")
    methods = "/".join(sorted(set(figures["energy_method"].values())))
    text = f"cost: {cores['total']:.1f} core-s ({roles}), {figures['energy_joules']:,.0f} J ({methods})"
    if figures["gpu_seconds"] > 0:
        text += f", {figures['gpu_seconds']:.1f} GPU-s"
    if figures["money"] is not None:
        text += f", {figures['money']:.4g} in money"
    target = figures.get("to_target")
    if target is not None:
        text += f"; to target: {target['core_seconds']:.1f} core-s, {target['energy_joules']:,.0f} J"
    return text
