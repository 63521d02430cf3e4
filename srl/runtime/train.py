"""``train``: run one experiment under the runtime its config names and write the run directory."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from srl.api.config import FIXED_ON_RESUME, ConfigError, ExperimentConfig, load_config, to_dict
from srl.api.plugins import resolve
from srl.api.spaces import obs_parts
from srl.base.channel import sweep_stale_pipe_dirs
from srl.base.fileio import with_room
from srl.base.shm import sweep_stale
from srl.base.stop_signals import held, shielded
from srl.evaluate import eval_seed, evaluate
from srl.runtime.plan import Plan, make_plan
from srl.runtime.topology import staffed
from srl.system import run_dir as run_files
from srl.system.checkpoint import checkpoints, load_checkpoint
from srl.system.controller import Controller
from srl.system.cost import cost_text, open_meters
from srl.system.run_dir import Resume, RunDir, RunDirError, default_run_dir, policy_checkpoints, read_counters
from srl.wiring import prepare_algorithm, unread_sections


def _lookup(data: Mapping[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[part]
    return data


def resume_config(run_dir: Path, overrides: list[str]) -> tuple[ExperimentConfig, Resume]:
    """The config of ``run_dir`` with ``overrides``, and what the run continues from: each policy's newest
    checkpoint and the controller's counters.

    Raises ConfigError (one line) when the directory holds no run or no readable checkpoint, when an override
    touches a setting in :data:`~srl.api.config.FIXED_ON_RESUME`, or when the run has nothing left to do (its
    budget spent, or its target met).
    """
    saved = Path(run_dir) / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml)")
    before, cfg = to_dict(load_config(saved)), load_config(saved, overrides)
    after = to_dict(cfg)
    for key in FIXED_ON_RESUME:
        if _lookup(before, key) != _lookup(after, key):
            raise ConfigError(f"{key}: cannot change when resuming (the run's checkpoints were made with it)")
    newest = []
    for name in cfg.policy_names:
        found = checkpoints(policy_checkpoints(Path(run_dir), cfg, name))
        if not found:
            of = "" if len(cfg.policy_names) == 1 else f" of policy {name!r}"
            raise ConfigError(f"{run_dir}: no checkpoint{of} to resume from")
        newest.append(found[-1])
    try:
        states = [load_checkpoint(path) for path in newest]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    counters = read_counters(Path(run_dir))
    counted = None if counters is None else counters.env_steps
    steps = counted if counted is not None else _trained_env_steps(cfg, states)
    resume = Resume(tuple(newest), tuple(int(s["version"]) for s in states), steps, counters)
    _check_work_left(cfg, resume, Path(run_dir))
    return cfg, resume


def _trained_env_steps(cfg: ExperimentConfig, states: Sequence[Mapping[str, Any]]) -> int:
    """The env steps a run whose controller saved no count had taken, as its checkpoints count them: several
    members (``cfg.members``) each trained on their share of the envs, so theirs add up (one base policy's
    members: the members of the others played the same steps); every other policy saw every step."""
    trained = [int(s.get("trained_samples", s["samples"])) for s in states]
    return sum(trained[:: len(cfg.base_policies)]) if cfg.members > 1 else trained[0]


def _check_work_left(cfg: ExperimentConfig, resume: Resume, run_dir: Path) -> None:
    """One line when resuming would stop at once: the env-step budget is spent, or the return window the run
    saved already meets its target."""
    run = cfg.run
    if resume.env_steps >= run.total_env_steps:
        raise ConfigError(
            f"run.total_env_steps: {run_dir} has taken {resume.env_steps:,} of its {run.total_env_steps:,} env "
            "steps; nothing to do (raise it with --set run.total_env_steps=N to train on)"
        )
    if run.target_return is None or resume.counters is None:
        return
    counters = resume.counters
    windows = list(counters.policy_returns.values()) if cfg.members > 1 else [counters.returns]
    means = [float(np.mean(w[-run.return_window :])) for w in windows if len(w) >= run.return_window]
    if means and max(means) >= run.target_return:
        raise ConfigError(
            f"run.target_return: the run's last {run.return_window} episodes already average {max(means):g} >= "
            f"{run.target_return:g}; nothing to do (raise it, or set it to null, to train on)"
        )


RUNNERS = {
    "inline": "srl.runtime.inline:run_inline",
    "local": "srl.runtime.local:run_local",
    "ray": "srl.runtime.ray_runtime:run_ray",
}
"""Each runtime's ``run(plan, controller, run_dir) -> snapshots``: where the run's workers are placed."""


def check_devices(cfg: ExperimentConfig) -> None:
    """A CUDA device named for trainers or policy workers exists here (one line naming the field, before anything
    starts). A Ray cluster's devices are its nodes', which Ray checks as it places the run."""
    if cfg.runtime == "ray" and cfg.ray.address is not None:
        return
    from srl.api.device import torch_device

    for name in ("trainer_device", "policy_device"):
        try:
            torch_device(getattr(cfg.workers, name), f"workers.{name}")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def _warn_emulated_bfloat16(plan: Plan, controller: Controller) -> None:
    """A Nature CNN asked to run in bfloat16 on a CPU without bfloat16 kernels says what that costs."""
    if not any(p.cfg.model.cnn_dtype == "bfloat16" and _has_image(p.obs_space) for p in plan.policies):
        return
    from srl.nets.cnn import bfloat16_is_native

    if bfloat16_is_native() is False:
        controller.warn(
            "model.cnn_dtype=bfloat16: this CPU has no bfloat16 kernels (oneDNN needs AVX-512 or newer), so the "
            "Nature CNN runs emulated bfloat16 (10x slower than float32 on an AVX2 EPYC; set model.cnn_dtype=float32)"
        )


def _has_image(space: Any) -> bool:
    """Whether an observation space has a uint8 image part (what the Nature CNN encodes)."""
    return any(p.kind == "image" for p in obs_parts(space))


@held()  # a signal while the run starts is kept for the runtime, which stops at once
def train(
    cfg: ExperimentConfig,
    run_dir: Path | None = None,
    start_time: float | None = None,
    progress: TextIO | None = sys.stderr,
    resume: Resume | None = None,
    stop: threading.Event | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """Train, evaluate the final policy, write ``summary.json``; return the summary.

    ``resume`` (from :func:`resume_config`) continues the run in ``run_dir``: trainers restore networks,
    optimizer, RNG state, version and step counters from each policy's checkpoint, and the env steps, wall time,
    episodes and return windows go on from the controller's counters. Setting ``stop`` (from another thread)
    ends the run as requested (``stop_reason: requested``), evaluated and summarized like any other end.
    ``notes``: what reading the config had to say (``ConfigNotice``), given as the run's first warnings.
    """
    start_time = time.time() if start_time is None else start_time
    sweep_stale()  # segments left by runs that were killed with SIGKILL
    sweep_stale_pipe_dirs()  # and their named pipes' folders
    check_devices(cfg)
    open_meters(cfg)  # an energy counter asked for that this machine lacks is one line, before anything starts
    prepare_algorithm(cfg)  # its settings checked, then its own work before the plan (lm_ppo: missing models)
    plan = make_plan(cfg)
    if resume is not None:
        plan = dataclasses.replace(
            plan,
            resume=tuple(map(str, resume.checkpoints)),
            start_version=resume.versions[0],
            start_env_steps=resume.env_steps,
        )
    path = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    said: list[str] = []  # before the run directory is touched: a misfit is one line, nothing lost
    for role in staffed(plan) if resume is not None else ():
        if role.resumed is not None:
            said += role.hook("resumed")(plan, path)
    rd = RunDir(path, cfg, resume=resume is not None)
    controller = Controller(cfg, rd, start_time, progress, resume=resume, stop_request=stop)
    for note in (*notes, *unread_sections(cfg), *said):
        controller.warn(note)
    _warn_emulated_bfloat16(plan, controller)
    try:
        runner = resolve(RUNNERS[cfg.runtime], {}, "runtime")
        interrupted = False  # a second signal: the runtime stopped waiting for its workers, killed them, cleaned up
        try:
            snapshots = runner(plan, controller, rd.path)
        except RunDirError as exc:  # e.g. workers.json at a restart: the runner stopped and cleaned up on its way out
            controller.fail(str(exc))
            snapshots = None
        except KeyboardInterrupt:
            controller.stop_reason, snapshots, interrupted = controller.stop_reason or "interrupted", None, True
        final_eval: dict[str, Any] = {}
        try:
            with shielded():  # the last record: a signal now waits until it is written
                controller.tick(force=True)
                controller.line.end()
            final_eval = _evaluations(plan, controller, snapshots, resume is None)
        except KeyboardInterrupt:  # the summary goes without the evaluations
            controller.warn("interrupted: the summary has no final evaluation")
            interrupted = True
        with shielded():  # a signal now waits until the summary is whole
            summary = _summary(controller, final_eval, resume, rd)
        if interrupted:  # the summary is written: now the command (or the caller's script) stops
            raise KeyboardInterrupt
        return summary
    finally:
        rd.close()


def _evaluations(plan: Plan, controller: Controller, snapshots: list[Any] | None, fresh: bool) -> dict[str, Any]:
    """The final evaluation of ``snapshots`` (none after an error or an interruption) and, with
    ``run.eval_initial`` on a fresh run, the starting policy's on the same episodes (``initial``)."""
    cfg = plan.cfg
    if snapshots is None or cfg.run.eval_episodes == 0 or controller.stop_reason in ("error", "interrupted"):
        return {}
    final = evaluate(plan, snapshots, cfg.run.eval_episodes, seed=eval_seed(cfg))
    if not (cfg.run.eval_initial and fresh):
        return {"final": final}
    initial = [p.acting_policy().flat_state() for p in plan.policies]
    return {"final": final, "initial": evaluate(plan, initial, cfg.run.eval_episodes, seed=eval_seed(cfg))}


def _summary(controller: Controller, evals: Mapping[str, Any], resume: Resume | None, rd: RunDir) -> dict[str, Any]:
    """The run's summary, written to ``summary.json`` (with the counters a resume continues from) and returned;
    a run directory that cannot take it is the summary's ``error``, and the caller still gets it."""
    summary = controller.summary(evals.get("final"))
    controller.line.note(cost_text(summary["cost"]))
    if "initial" in evals:
        summary["initial_eval_return_mean"] = evals["initial"]["return_mean"]
    summary["run_dir"] = str(rd.path)
    if resume is not None:
        paths = [str(p) for p in resume.checkpoints]
        summary["resumed_from"] = paths[0] if len(paths) == 1 else paths
    try:  # the final evaluation's time included; a disk full for a moment is waited out
        with_room(lambda: rd.write_counters(controller.counters()), run_files.FINAL_WAIT)
        with_room(lambda: rd.write_summary(summary), run_files.FINAL_WAIT)
    except RunDirError as exc:  # the summary still goes to the caller (``srl train`` prints it)
        summary["error"] = summary.get("error") or str(exc)
    return summary
