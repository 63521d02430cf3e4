"""``train``: run one experiment under the runtime its config names and write the run directory."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from srl.api.config import ConfigError, ExperimentConfig, load_config, to_dict
from srl.api.spaces import obs_parts
from srl.base.channel import sweep_stale_pipe_dirs
from srl.base.shm import sweep_stale
from srl.base.stop_signals import held
from srl.evaluate import eval_seed, evaluate
from srl.runtime.plan import Plan, make_plan
from srl.runtime.topology import keeper
from srl.system.controller import Controller
from srl.system.run_dir import RunDir, RunDirError, default_run_dir, policy_checkpoints, read_counters
from srl.system.trainer_worker import checkpoints, load_checkpoint
from srl.wiring import prepare_algorithm

FIXED_ON_RESUME = (
    "env",
    "model",
    "ppo.critic",
    "ppo.normalize_values",
    "text.model",
    "text.advantage",
    "replay.placement",  # the saved replays are one file per replay
    "population.members",  # one checkpoint folder per member
    "population.hyperparameters",  # the population's state holds each member's values of these
)
"""Settings the checkpoints were made under (the networks were built with them, the saved replays are one file
per replay): a resumed run may not change them."""


def _lookup(data: Mapping[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[part]
    return data


def resume_config(run_dir: Path, overrides: list[str]) -> tuple[ExperimentConfig, tuple[Path, ...], dict[str, Any]]:
    """The config of ``run_dir`` with ``overrides``, its newest checkpoint of each policy and the first policy's
    checkpoint's content.

    Raises ConfigError (one line) when the directory holds no run or no readable checkpoint, or when an
    override touches a setting in :data:`FIXED_ON_RESUME`.
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
    return cfg, tuple(newest), states[0]


def _say_refilled(plan: Plan, controller: Controller, run_dir: Path) -> None:
    """A resumed run whose replays start empty says so (in the log, and in ``summary.json``'s warnings)."""
    from srl.runtime.replay import saved_replay
    from srl.runtime.topology import replays_per_policy

    replays = range(replays_per_policy(plan) * len(plan.policies))
    missing = [r for r in replays if not (plan.cfg.replay.save and saved_replay(run_dir, r).exists())]
    if missing:
        said = "replay.save is off" if not plan.cfg.replay.save else "no saved replay was found"
        controller.warn(f"replay: the resumed run refills {len(missing)} replay(s) from empty ({said})")


def _has_image(space: Any) -> bool:
    """Whether an observation space has a uint8 image part (what the Nature CNN encodes)."""
    return any(p.kind == "image" for p in obs_parts(space))


@held()  # a signal while the run starts is kept for the runtime, which stops at once
def train(
    cfg: ExperimentConfig,
    run_dir: Path | None = None,
    start_time: float | None = None,
    progress: TextIO | None = sys.stderr,
    resume: tuple[tuple[Path, ...], Mapping[str, Any]] | None = None,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Train, evaluate the final policy, write ``summary.json``; return the summary.

    ``resume`` (each policy's checkpoint and the first one's content, from :func:`resume_config`) continues the run in
    ``run_dir``: trainers restore networks, optimizer, RNG state, version and step counters, the step count
    and metrics carry on from the checkpoint, and wall time, episodes and the return window from the
    controller's counters (:func:`~srl.system.run_dir.read_counters`). Setting ``stop`` (from another thread)
    ends the run as requested (``stop_reason: requested``), evaluated and summarized like any other end.
    """
    start_time = time.time() if start_time is None else start_time
    sweep_stale()  # segments left by runs that were killed with SIGKILL
    sweep_stale_pipe_dirs()  # and their named pipes' folders
    prepare_algorithm(cfg)  # its settings checked, then its own work before the plan (lm_ppo: missing models)
    plan = make_plan(cfg)
    offset = 0
    if resume is not None:
        paths, state = resume
        offset = int(state.get("trained_samples", state["samples"]))
        plan = dataclasses.replace(
            plan, resume=tuple(map(str, paths)), start_version=int(state["version"]), start_env_steps=offset
        )
    path = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    if resume is not None and keeper(plan) is not None and cfg.replay.save:
        from srl.runtime.replay import check_saved_replays

        check_saved_replays(plan, path)  # before the run directory is touched: a misfit is one line, nothing lost
    counters = None if resume is None else read_counters(path)
    rd = RunDir(path, cfg, resume=resume is not None)
    controller = Controller(cfg, rd, start_time, progress, env_steps_offset=offset, stop_request=stop)
    if counters is not None:  # wall time, episodes and the return window go on
        controller.restore(counters)
    if resume is not None and keeper(plan) is not None:
        _say_refilled(plan, controller, path)
    if any(p.cfg.model.cnn_dtype == "bfloat16" and _has_image(p.obs_space) for p in plan.policies):
        from srl.nets.cnn import bfloat16_is_native

        if bfloat16_is_native() is False:
            controller.warn(
                "model.cnn_dtype=bfloat16: this CPU has no bfloat16 kernels (oneDNN needs AVX-512 or newer), so the "
                "Nature CNN runs emulated bfloat16 (10x slower than float32 on an AVX2 EPYC; "
                "set model.cnn_dtype=float32)"
            )
    try:
        if cfg.runtime == "inline":
            from srl.runtime.inline import run_inline as runner
        elif cfg.runtime == "ray":
            from srl.runtime.ray_runtime import run_ray as runner
        else:
            from srl.runtime.local import run_local as runner
        try:
            snapshots = runner(plan, controller, rd.path)
        except RunDirError as exc:  # e.g. workers.json at a restart: the runner stopped and cleaned up on its way out
            controller.fail(str(exc))
            snapshots = None
        controller.tick(force=True)
        controller.line.end()
        final_eval = None
        if (
            snapshots is not None
            and cfg.run.eval_episodes > 0
            and controller.stop_reason not in ("error", "interrupted")
        ):
            final_eval = evaluate(plan, snapshots, cfg.run.eval_episodes, seed=eval_seed(cfg))
        summary = controller.summary(final_eval)
        if final_eval is not None and cfg.run.eval_initial and resume is None:
            initial = [p.acting_policy().flat_state() for p in plan.policies]
            before = evaluate(plan, initial, cfg.run.eval_episodes, seed=eval_seed(cfg))
            summary["initial_eval_return_mean"] = before["return_mean"]
        summary["run_dir"] = str(rd.path)
        if resume is not None:
            summary["resumed_from"] = str(resume[0][0]) if len(resume[0]) == 1 else [str(p) for p in resume[0]]
        try:
            rd.write_counters(controller.counters())  # the final evaluation's time included
            rd.write_summary(summary)
        except RunDirError as exc:  # the summary still goes to the caller (``srl train`` prints it)
            summary["error"] = summary.get("error") or str(exc)
        return summary
    finally:
        rd.close()
